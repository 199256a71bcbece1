"""`sim hw ...`: inspect the hardware catalog and clusters."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from trainsim import api
from trainsim.commands.output import echo_json, print_table, user_errors

app = typer.Typer(
    help="GPUs, nodes, NICs and clusters in the hardware catalog.", no_args_is_help=True
)

_JSON_OPTION = typer.Option(False, "--json", help="Print JSON instead of a table.")


def _gb(x: float | None) -> str:
    return "-" if x is None else f"{x / 1e9:g} GB/s"


@app.command("list")
@user_errors
def list_command(as_json: bool = _JSON_OPTION) -> None:
    """List GPU types with peak throughput, memory, power and clock range."""
    gpus = api.catalog_gpus()
    if as_json:
        echo_json([g.to_dict() for g in gpus])
        return
    rows = [
        [g.name, g.architecture, g.sm_count, f"{g.peak_flops('fp16') / 1e12:.1f}",
         f"{g.peak_flops('fp32') / 1e12:.1f}", f"{g.memory_bytes / 2**30:g} GiB",
         _gb(g.memory_bandwidth_bytes_per_s), f"{g.tdp_w:g} W",
         f"{g.sm_clock_min_mhz:g}-{g.sm_clock_max_mhz:g}", _gb(g.nvlink_bandwidth_bytes_per_s),
         g.default_node_type]
        for g in gpus
    ]  # fmt: skip
    print_table(
        "GPU types (dense peaks at max clock)",
        ["name", "arch", "SMs", "fp16 TFLOPS", "fp32 TFLOPS", "memory", "mem BW", "TDP",
         "SM clock MHz", "NVLink", "default node"],
        rows,
    )  # fmt: skip


@app.command("show")
@user_errors
def show_command(name: str = typer.Argument(..., help="GPU type, node type or NIC."),
                 as_json: bool = _JSON_OPTION) -> None:  # fmt: skip
    """Show every field of a GPU type, node type or NIC, with sources."""
    data = api.describe_hardware(name)
    if as_json:
        echo_json(data)
        return
    sources = data.pop("sources", {})
    rows = [[k, json.dumps(v) if isinstance(v, dict | list) else v] for k, v in data.items()]
    print_table(f"{data['kind']} {data['name']}", ["field", "value"], rows)
    print_table("sources", ["field", "source"], [[k, v] for k, v in sources.items()])


@app.command("cluster")
@user_errors
def cluster_command(spec: str = typer.Argument(..., help="e.g. 2x8xA100-SXM4-80GB, a YAML file, "
                                               "or cpu:N (this machine as N processes)."),
                    profile: Path | None = typer.Option(None, "--profile", help="Profile "
                                                        "database describing cpu:N (default: "
                                                        "the packaged reference profile)."),
                    as_json: bool = _JSON_OPTION) -> None:  # fmt: skip
    """Describe a cluster: node groups, GPUs, links with bandwidths, price per hour."""
    summary = api.describe_cluster(spec, profile=profile)
    if as_json:
        echo_json(summary)
        return
    groups, links = summary["node_groups"], summary["links"]
    peak = summary["peak_fp16_flops"]
    print_table(
        f"cluster {spec}: {summary['num_nodes']} nodes, {summary['num_gpus']} GPUs, "
        + ("no fp16" if peak is None else f"{peak / 1e15:.2f} PFLOPS fp16") + ", "
        f"${summary['price_per_hour_usd']:.2f}/h",
        ["group", "GPU", "nodes", "GPUs/node", "ranks", "node type", "intra-node", "NICs",
         "NIC BW/node", "$/GPU-h", "$/h"],
        [[g["group"], g["gpu"], g["nodes"], g["gpus_per_node"], g["ranks"], g["node_type"],
          f"{g['intra_node']} {_gb(g['intra_node_bytes_per_s'])}", g["nic"],
          _gb(g["nic_bytes_per_s"]), f"{g['price_per_gpu_hour_usd']:.4f}",
          f"{g['price_per_hour_usd']:.2f}"] for g in groups],
    )  # fmt: skip
    print_table("links (per direction)", ["kind", "bandwidth", "count"],
                [[x["kind"], _gb(x["bandwidth_bytes_per_s"]), x["count"]] for x in links])
