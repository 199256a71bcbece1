"""`sim models ...`: inspect the model zoo and user models."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table

from trainsim import api
from trainsim.commands.output import echo_json, user_errors
from trainsim.workloads.model import ModelSpec, build_graph

app = typer.Typer(help="Models in the zoo and user models (YAML, config.json).", no_args_is_help=True)

_FAMILY_TITLES = {"gpt": "GPT", "llama": "LLaMA", "t5": "T5 (encoder-decoder)", "bert": "BERT",
                  "moe": "GPT mixture-of-experts", "wresnet": "Wide-ResNet"}


def _si(value: float, unit: str) -> str:
    """1.32e9 → "1.32 G<unit>"."""
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            scaled = value / factor
            digits = 2 if scaled < 10 else 1 if scaled < 100 else 0
            return f"{scaled:.{digits}f} {prefix}{unit}"
    return f"{value:.0f} {unit}"


def _bytes(value: float) -> str:
    """Bytes in binary units with three significant digits: "456 MiB", "4.00 GiB"."""
    for factor, prefix in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if abs(value) >= factor:
            scaled = value / factor
            digits = 2 if scaled < 10 else 1 if scaled < 100 else 0
            return f"{scaled:.{digits}f} {prefix}"
    return f"{value:.0f} B"


def _layers_text(spec: ModelSpec) -> str:
    if spec.family == "t5":
        return f"{spec.num_layers}+{spec.decoder_layers}"
    if spec.family == "wresnet":
        return f"{spec.num_layers} ({'-'.join(str(b) for b in spec.blocks)})"
    return str(spec.num_layers)


def _heads_text(spec: ModelSpec) -> str:
    if spec.family == "wresnet":
        return "-"
    if spec.num_kv_heads != spec.num_heads:
        return f"{spec.num_heads} ({spec.num_kv_heads} kv)"
    return str(spec.num_heads)


@app.command("list")
@user_errors
def list_command() -> None:
    """List the zoo's models: name, family, parameters, layers, hidden size, heads."""
    table = Table(title="trainsim model zoo")
    for column, justify in (("name", "left"), ("family", "left"), ("params", "right"),
                            ("layers", "right"), ("hidden", "right"), ("heads", "right")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for name, spec in api.list_models().items():
        table.add_row(name, spec.family, _si(spec.parameters(), ""), _layers_text(spec),
                      str(spec.hidden), _heads_text(spec))
    Console().print(table)


@app.command("show")
@user_errors
def show_command(
    model: Annotated[str, typer.Argument(help="Zoo name (e.g. gpt3-1.3b), validation model (tiny-gpt) or a .yaml/.json file.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
    seq_len: Annotated[int | None, typer.Option("--seq-len", min=1,
                                                help="Sequence length (default: the model's).")
                       ] = None,
    micro_batch: Annotated[int, typer.Option("--micro-batch", min=1,
                                             help="Micro-batch size for the per-batch figures.")
                           ] = 1,
) -> None:
    """Show a model's shape, parameters, FLOPs and activation memory."""
    spec = api.load_model(model)
    summary = api.describe_model(spec, micro_batch, seq_len)
    if as_json:
        echo_json(summary)
        return
    _render(spec, summary, micro_batch, seq_len)


def _render(spec: ModelSpec, summary: dict[str, Any], micro_batch: int, seq_len: int | None) -> None:
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold")
    facts.add_column()
    rows = [("parameters", f"{summary['parameters']:,} ({_si(summary['parameters'], '')})"),
            ("layers", _layers_text(spec))]
    if spec.family == "wresnet":
        rows += [("base channels", str(spec.hidden)), ("width factor", str(spec.width_factor)),
                 ("image size", f"{spec.image_size}×{spec.image_size}")]
    else:
        rows += [("hidden", str(spec.hidden)), ("heads", f"{_heads_text(spec)} × {spec.head_dim}"),
                 ("ffn hidden", f"{spec.ffn_hidden} ({spec.activation})"),
                 ("vocabulary", f"{spec.vocab_size:,}"),
                 ("sequence", str(summary["seq_len"]) + (
                     f" (decoder {spec.decoder_seq_len})" if spec.family == "t5" else ""))]
    if spec.family == "moe":
        rows.append(("experts", (f"{spec.num_experts}, top-{spec.top_k}, capacity factor "
                                 f"{spec.capacity_factor}, every {spec.moe_layer_interval} "
                                 "layers")))
    unit = "sample" if spec.family == "wresnet" else "token"
    rows += [("dtype", spec.dtype),
             (f"training FLOPs / {unit}", _si(summary["flops_per_token"], "FLOP")),
             (f"activations / {unit}", _bytes(summary["activation_bytes_per_token"]))]
    if spec.source:
        rows.append(("source", spec.source))
    for key, value in rows:
        facts.add_row(key, value)

    graph = build_graph(spec, micro_batch, seq_len)
    per_kind = Table(title=f"per micro-batch ({micro_batch} × {graph.seq_len}), one GPU; "
                           "activations by recompute policy",
                     title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    per_kind.add_column("layer", no_wrap=True)
    for column in ("×", "params", "fwd FLOP", "act none", "act sel.", "act full"):
        per_kind.add_column(column, justify="right", no_wrap=True,
                            min_width=len(column) if column in ("×", "params") else 8)
    seen: dict[int, int] = {}
    order = []
    for layer in graph.layers:
        if id(layer) not in seen:
            seen[id(layer)] = 0
            order.append(layer)
        seen[id(layer)] += 1
    for layer in order:
        per_kind.add_row(
            layer.name, str(seen[id(layer)]), _si(layer.params, ""),
            _si(sum(op.fwd_flops for op in layer.ops), ""),
            *(_bytes(layer.activation_bytes(recompute=r)) for r in ("none", "selective", "full")))
    title = f"[bold]{spec.name}[/bold] — {_FAMILY_TITLES[spec.family]}"
    Console().print(Panel(Group(facts, "", per_kind), title=title, expand=False))
