"""`sim hw ...`: inspect the hardware catalog and clusters."""

from __future__ import annotations

import json
from typing import Any

import typer

app = typer.Typer(
    help="GPUs, nodes, NICs and clusters in the hardware catalog.", no_args_is_help=True
)

_JSON_OPTION = typer.Option(False, "--json", help="Print JSON instead of a table.")


def _print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, sort_keys=False))


def _table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in columns:
        table.add_column(col)
    for row in rows:
        table.add_row(*("" if v is None else str(v) for v in row))
    Console().print(table)


def _gb(x: float | None) -> str:
    return "-" if x is None else f"{x / 1e9:g} GB/s"


@app.command("list")
def list_command(as_json: bool = _JSON_OPTION) -> None:
    """List GPU types with peak throughput, memory, power and clock range."""
    from trainsim.hwmodels.gpus import get_gpu, list_gpus

    gpus = [get_gpu(n) for n in list_gpus()]
    if as_json:
        _print_json([g.to_dict() for g in gpus])
        return
    rows = [
        [g.name, g.architecture, g.sm_count, f"{g.peak_flops('fp16') / 1e12:.1f}",
         f"{g.peak_flops('fp32') / 1e12:.1f}", f"{g.memory_bytes / 2**30:g} GiB",
         _gb(g.memory_bandwidth_bytes_per_s), f"{g.tdp_w:g} W",
         f"{g.sm_clock_min_mhz:g}-{g.sm_clock_max_mhz:g}", _gb(g.nvlink_bandwidth_bytes_per_s),
         g.default_node_type]
        for g in gpus
    ]  # fmt: skip
    _table(
        "GPU types (dense peaks at max clock)",
        ["name", "arch", "SMs", "fp16 TFLOPS", "fp32 TFLOPS", "memory", "mem BW", "TDP",
         "SM clock MHz", "NVLink", "default node"],
        rows,
    )  # fmt: skip


@app.command("show")
def show_command(name: str = typer.Argument(..., help="GPU type, node type or NIC."),
                 as_json: bool = _JSON_OPTION) -> None:  # fmt: skip
    """Show every field of a GPU type, node type or NIC, with sources."""
    from trainsim.hwmodels.datafiles import unknown
    from trainsim.hwmodels.gpus import get_gpu, list_gpus
    from trainsim.hwmodels.nodes import get_nic, get_node_type, list_nics, list_node_types
    from trainsim.hwmodels.power import power_model

    lowered = name.strip().lower()
    data: dict[str, Any]
    if lowered in {n.lower() for n in list_gpus()}:
        gpu = get_gpu(name)
        data = {"kind": "gpu", **gpu.to_dict()}
        pm = power_model(gpu)
        data["power_model"] = {
            "v_min_ratio": pm.v_min_ratio,
            "dynamic_power_max_w": pm.dynamic_power_max_w,
            "memory_bound_activity": pm.memory_bound_activity,
        }
    elif lowered in {n.lower() for n in list_node_types()}:
        data = get_node_type(name).to_dict()
    elif lowered in {n.lower() for n in list_nics()}:
        data = get_nic(name).to_dict()
    else:
        raise unknown(
            "GPU, node type or NIC", name, [*list_gpus(), *list_node_types(), *list_nics()]
        )
    if as_json:
        _print_json(data)
        return
    sources = data.pop("sources", {})
    rows = [[k, json.dumps(v) if isinstance(v, dict | list) else v] for k, v in data.items()]
    _table(f"{data['kind']} {data['name']}", ["field", "value"], rows)
    _table("sources", ["field", "source"], [[k, v] for k, v in sources.items()])


@app.command("cluster")
def cluster_command(spec: str = typer.Argument(..., help="e.g. 2x8xA100-SXM4-80GB or a YAML file."),
                    as_json: bool = _JSON_OPTION) -> None:  # fmt: skip
    """Describe a cluster: node groups, GPUs, links with bandwidths, price per hour."""
    from collections import Counter

    from trainsim.hwmodels.cluster import parse_cluster

    cluster = parse_cluster(spec)
    groups = cluster.describe()
    link_kinds = Counter((link.kind, link.bandwidth_bytes_per_s) for link in cluster.links())
    links = [
        {"kind": kind, "bandwidth_bytes_per_s": bw, "count": n}
        for (kind, bw), n in sorted(link_kinds.items())
    ]
    summary = {
        "spec": spec,
        "num_nodes": cluster.num_nodes,
        "num_gpus": cluster.num_gpus,
        "peak_fp16_flops": cluster.peak_flops("fp16"),
        "price_per_hour_usd": cluster.price_per_hour_usd,
    }
    if as_json:
        _print_json({**summary, "node_groups": groups, "links": links, "yaml": cluster.to_dict()})
        return
    _table(
        f"cluster {spec}: {cluster.num_nodes} nodes, {cluster.num_gpus} GPUs, "
        f"{summary['peak_fp16_flops'] / 1e15:.2f} PFLOPS fp16, ${cluster.price_per_hour_usd:.2f}/h",
        ["group", "GPU", "nodes", "GPUs/node", "ranks", "node type", "intra-node", "NICs",
         "NIC BW/node", "$/GPU-h", "$/h"],
        [[g["group"], g["gpu"], g["nodes"], g["gpus_per_node"], g["ranks"], g["node_type"],
          f"{g['intra_node']} {_gb(g['intra_node_bytes_per_s'])}", g["nic"],
          _gb(g["nic_bytes_per_s"]), f"{g['price_per_gpu_hour_usd']:.4f}",
          f"{g['price_per_hour_usd']:.2f}"] for g in groups],
    )  # fmt: skip
    _table("links (per direction)", ["kind", "bandwidth", "count"],
           [[x["kind"], _gb(x["bandwidth_bytes_per_s"]), x["count"]] for x in links])  # fmt: skip
