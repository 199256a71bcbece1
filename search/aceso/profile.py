"""Aceso's op-profile database (EuroSys'24 artifact) as a trainsim op cost model.

Aceso profiles one transformer layer's ops (plus embedding and head) on V100s for each
micro-batch size and tensor-parallel degree into CSV files
``<model>_<size>_mbs<m>_tp<t>_algo<a>.csv`` (op_name, forward-compute, backward-compute in µs,
sizes in MB), plus collective timings ``prim_*`` and point-to-point bandwidths ``p2p_*``
(schema: ../shared/data/aceso/SOURCES.md). `load_aceso_profile(folder)` parses every file of a
folder; `AcesoCostModel(db, model)` implements `OpCostModel.estimate` (hwmodels/opcost.py) from
it, so the lowering can use measured V100 op times instead of the roofline.

**Mapping zoo ops to Aceso ops.** `layer_op_map` pairs each zoo layer's ops with Aceso's op
names (GPT/T5 encoder ``enc-*``, T5 decoder ``dec-*-1`` self / ``dec-*-2`` cross attention,
Wide-ResNet ``block-<stage>-<block>-*``). Where one Aceso op covers several zoo ops (T5's
``dec-attention-qkv-2`` is the zoo's cross.q and cross.kv), its time is split by forward FLOPs;
zoo ops Aceso folds into a neighbour (embedding dropout into the embedding, cross-entropy into
``gpt-post-process``) cost nothing on their own. The cost model indexes each zoo op by
(kind, shape, forward FLOPs) for every micro-batch size and tp degree, so an `estimate` query
(which carries no op name) finds its op.

**Interpolation.** Between measured micro-batch sizes an op's time is linear in the batch;
outside them the nearest measurement's time per sample is kept (time ∝ batch). A tp degree the
profile lacks is scaled from the nearest measured one (time ∝ 1/tp).

**Passes.** The lowering costs a forward, a backward, and for weight GEMMs each backward half
(input and weight gradient) separately. A GEMM's forward and backward halves have equal FLOPs,
so the three calls cannot be told apart by their arguments; like trainsim's own profiled cost
model (validate/profiled_cost.py) each returns one third of the measured forward + backward,
which keeps every instruction's total exact.

**Tensor-parallel communication is inside Aceso's op times** (each op was timed on `tp` GPUs
with its all-reduce). `aceso_lowering_options` therefore returns
``LoweringOptions(cost_model=..., tp_communication=False)`` so the lowering does not add the
tensor-parallel collectives a second time. Data-parallel, pipeline and optimizer costs are not
in Aceso's profiles; the lowering keeps modelling them (the optimizer step on the roofline).
"""

from __future__ import annotations

import csv
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainsim.errors import DataFileError
from trainsim.hwmodels.gpus import GpuSpec
from trainsim.hwmodels.opcost import OpEstimate, RooflineCostModel
from trainsim.workloads.layer import Layer
from trainsim.workloads.lowering import LoweringOptions
from trainsim.workloads.model import ModelSpec, build_graph

US = 1e-6
"""Seconds per microsecond (Aceso's op times are µs)."""
MS = 1e-3
"""Seconds per millisecond (Aceso's collective times are ms)."""
MB = 2**20
"""Bytes per MB in Aceso's profiles (torch.cuda memory counters divided by 1024²)."""

OP_COLUMNS = ("op_name", "forward-compute", "backward-compute", "input_size", "output_size",
              "weights", "activations", "fwd_reserved", "bwd_reserved")
_OP_FILE = re.compile(r"^(?P<model>[a-z0-9]+)_(?P<size>.+)_mbs(?P<mbs>\d+)_tp(?P<tp>\d+)"
                      r"_algo(?P<algo>\d+)\.csv$")
_PRIM_FILE = re.compile(r"^prim_(?P<model>[a-z0-9]+)_(?P<size>.+)_(?P<kind>all_gather|all_reduce|"
                        r"reduce_scatter|all_to_all)_(?P<n>\d+)gpus\.csv$")


@dataclass(frozen=True, kw_only=True, slots=True)
class AcesoOp:
    """One row of an op file."""

    name: str
    """Aceso op name (enc-attention-qkv, block-1-0-conv2, ...)."""
    fwd_s: float
    """Forward time (tensor-parallel all-reduce included)."""
    bwd_s: float
    """Backward time (tensor-parallel all-reduce included)."""
    input_bytes: float
    output_bytes: float
    weight_bytes: float
    activation_bytes: float


@dataclass(frozen=True, kw_only=True, slots=True)
class AcesoOpFile:
    """One op file: a model size at one micro-batch size, tp degree and split algorithm."""

    model: str
    """gpt, t5 or resnet."""
    size: str
    """Aceso's size tag (1_3B, 770M, 6_8B, scale-layer ...)."""
    mbs: int
    tp: int
    algo: int
    ops: dict[str, AcesoOp]


@dataclass(frozen=True, kw_only=True, slots=True)
class AcesoProfile:
    """Every file of one Aceso profile folder."""

    folder: str
    op_files: tuple[AcesoOpFile, ...]
    collectives: dict[tuple[str, str, str, int], tuple[tuple[float, float], ...]] = field(
        default_factory=dict)
    """(model, size, kind, gpus) → ((size_bytes, time_s), ...)."""
    p2p: dict[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    """intra_node / inter_node → ((size_bytes, bandwidth_bytes_per_s), ...)."""

    def files_for(self, model: str, size: str, algo: int = 0) -> list[AcesoOpFile]:
        """Op files of one model size and split algorithm."""
        return [f for f in self.op_files if f.model == model and f.size == size
                and f.algo == algo]

    def sizes(self) -> list[tuple[str, str]]:
        """(model, size) pairs with op files."""
        return sorted({(f.model, f.size) for f in self.op_files})


def _float(text: str, where: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise DataFileError(f"{where}: {text!r} is not a number") from None


def parse_op_file(path: Path) -> AcesoOpFile:
    """Parse one ``<model>_<size>_mbs<m>_tp<t>_algo<a>.csv``."""
    m = _OP_FILE.match(path.name)
    if m is None:
        raise DataFileError(f"{path}: not an Aceso op file name (<model>_<size>_mbs<m>_tp<t>_"
                            f"algo<a>.csv)")
    with path.open(newline="") as fh:
        rows = list(csv.reader(fh))
    if not rows or tuple(c.strip() for c in rows[0]) != OP_COLUMNS:
        raise DataFileError(f"{path}: header must be {','.join(OP_COLUMNS)}")
    ops: dict[str, AcesoOp] = {}
    for i, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        if len(row) != len(OP_COLUMNS):
            raise DataFileError(f"{path}:{i}: {len(row)} columns, expected {len(OP_COLUMNS)}")
        w = f"{path}:{i}"
        v = [_float(x, w) for x in row[1:]]
        ops[row[0]] = AcesoOp(name=row[0], fwd_s=v[0] * US, bwd_s=v[1] * US,
                              input_bytes=v[2] * MB, output_bytes=v[3] * MB,
                              weight_bytes=v[4] * MB, activation_bytes=v[5] * MB)
    return AcesoOpFile(model=m["model"], size=m["size"], mbs=int(m["mbs"]), tp=int(m["tp"]),
                       algo=int(m["algo"]), ops=ops)


def _two_column(path: Path) -> tuple[tuple[float, float], ...]:
    with path.open(newline="") as fh:
        rows = [r for r in csv.reader(fh) if r]
    if not rows or len(rows[0]) != 2:
        raise DataFileError(f"{path}: expected the header data_size(MB),time(ms)")
    return tuple((_float(a, str(path)) * MB, _float(b, str(path)) * MS) for a, b in rows[1:])


def _p2p(path: Path) -> tuple[tuple[float, float], ...]:
    with path.open(newline="") as fh:
        rows = [r for r in csv.reader(fh) if r]
    if len(rows) != 2 or len(rows[0]) != len(rows[1]):
        raise DataFileError(f"{path}: expected two rows (sizes in MB, bandwidths in GB/s)")
    return tuple((_float(a, str(path)) * MB, _float(b, str(path)) * 1e9)
                 for a, b in zip(rows[0], rows[1]))


def load_aceso_profile(folder: str | Path) -> AcesoProfile:
    """Parse every file of an Aceso profile folder (op, collective and p2p files).

    Raises:
        DataFileError: the folder is missing, holds no op file, or a file is malformed.
    """
    root = Path(folder)
    if not root.is_dir():
        raise DataFileError(f"Aceso profile folder {str(root)!r} does not exist")
    op_files, collectives, p2p = [], {}, {}
    for path in sorted(root.iterdir()):
        if path.suffix != ".csv":
            continue
        if _OP_FILE.match(path.name):
            op_files.append(parse_op_file(path))
        elif (m := _PRIM_FILE.match(path.name)) is not None:
            key = (m["model"], m["size"], m["kind"], int(m["n"]))
            collectives[key] = _two_column(path)
        elif path.name.startswith("p2p_"):
            p2p[path.stem.removeprefix("p2p_")] = _p2p(path)
        else:
            raise DataFileError(f"{path}: not an Aceso profile file")
    if not op_files:
        raise DataFileError(f"{root}: no Aceso op files (<model>_<size>_mbs<m>_tp<t>_algo<a>.csv)")
    return AcesoProfile(folder=str(root), op_files=tuple(op_files), collectives=collectives,
                        p2p=p2p)


# ------------------------------------------------------------------------- zoo ↔ Aceso names
_GPT_LAYER = [("enc-1st-layernorm", ["attn.norm"]), ("enc-attention-qkv", ["attn.qkv"]),
              ("enc-attention-score", ["attn.score"]),
              ("enc-attention-softmax", ["attn.softmax"]),
              ("enc-attention-dropout", ["attn.attn_dropout"]),
              ("enc-attention-context", ["attn.context"]),
              ("enc-attention-dense", ["attn.proj"]),
              ("enc-post-attention-dropout", ["attn.residual"]),
              ("enc-2nd-layernorm", ["mlp.norm"]), ("enc-MLP-GEMM-1", ["mlp.fc1"]),
              ("enc-MLP-gelu", ["mlp.gelu"]), ("enc-MLP-GEMM-2", ["mlp.fc2"]),
              ("enc-post-MLP-dropout", ["mlp.residual"])]
_T5_DECODER = [("dec-1st-layernorm", ["attn.norm"]), ("dec-attention-qkv-1", ["attn.qkv"]),
               ("dec-attention-score-1", ["attn.score"]),
               ("dec-attention-softmax-1", ["attn.softmax"]),
               ("dec-attention-dropout-1", ["attn.attn_dropout"]),
               ("dec-attention-context-1", ["attn.context"]),
               ("dec-attention-dense-1", ["attn.proj"]),
               ("dec-post-attention-dropout-1", ["attn.residual"]),
               ("dec-2nd-layernorm", ["cross.norm"]),
               ("dec-attention-qkv-2", ["cross.q", "cross.kv"]),
               ("dec-attention-score-2", ["cross.score"]),
               ("dec-attention-softmax-2", ["cross.softmax"]),
               ("dec-attention-dropout-2", ["cross.attn_dropout"]),
               ("dec-attention-context-2", ["cross.context"]),
               ("dec-attention-dense-2", ["cross.proj"]),
               ("dec-post-attention-dropout-2", ["cross.residual"]),
               ("dec-3rd-layernorm", ["mlp.norm"]), ("dec-MLP-GEMM-1", ["mlp.fc1"]),
               ("dec-MLP-gelu", ["mlp.gelu"]), ("dec-MLP-GEMM-2", ["mlp.fc2"]),
               ("dec-post-MLP-dropout", ["mlp.residual"])]


def aceso_family(model: ModelSpec) -> str:
    """Aceso's model tag of a zoo model: gpt, t5 or resnet."""
    return {"gpt": "gpt", "t5": "t5", "wresnet": "resnet"}.get(model.family, model.family)


def aceso_size(model: ModelSpec) -> str:
    """Aceso's size tag from a zoo name: aceso-gpt-1.3b → 1_3B, t5-770m → 770M."""
    tag = model.name.rsplit("-", 1)[-1].upper().replace(".", "_")
    return tag


def layer_op_map(model: ModelSpec, layer: Layer, index: int) -> list[tuple[list[str], list[str]]]:
    """(Aceso op names, zoo op names) groups of one zoo layer (see the module docstring)."""
    fam = aceso_family(model)
    kind, name = layer.kind, layer.name
    if fam == "gpt":
        if kind == "embedding":
            return [(["encoder-embedding"], ["embedding"])]
        if kind == "head":
            return [(["final-layernorm"], ["final_norm"]),
                    (["gpt-post-process"], ["lm_head", "cross_entropy"])]
        return [([a], z) for a, z in _GPT_LAYER]
    if fam == "t5":
        if kind == "embedding":
            return [(["encoder-embedding" if name.startswith("encoder") else
                      "decoder-embedding"], ["embedding"])]
        if kind == "norm":
            return [(["enc-final-layernorm"], ["encoder.final_norm"])]
        if kind == "head":
            return [(["dec-final-layernorm"], ["final_norm"]),
                    (["t5-post-process"], ["lm_head", "cross_entropy"])]
        if kind == "decoder":
            return [([a], z) for a, z in _T5_DECODER]
        return [([a], z) for a, z in _GPT_LAYER]
    if fam == "resnet":
        if kind == "stem":
            return [(["conv1"], ["stem.conv"]), (["bn1"], ["stem.bn"]),
                    (["relu1", "maxpool"], ["stem.maxpool"])]
        if kind == "head":
            return [(["avgpool"], ["avgpool"]), (["fc"], ["fc", "cross_entropy"])]
        m = re.match(r"stage(\d+)\.block(0?)", name)
        if m is None:
            return []
        stage, block = int(m[1]), 0 if m[2] == "0" else 1
        p = f"block-{stage}-{block}-"
        out = [([p + n], [n]) for n in ("conv1", "bn1", "conv2", "bn2", "conv3", "bn3")]
        if block == 0:
            return out + [([p + "downsample"], ["downsample"]), ([p + "relu"], ["residual_relu"])]
        return out + [([p + "downsample", p + "relu"], ["residual_relu"])]
    return []


# ------------------------------------------------------------------------- cost model
@dataclass(slots=True)
class _Entry:
    """Where a zoo op's time comes from: Aceso names × share, at replica batch `b` and `tp`."""

    names: tuple[str, ...]
    share: float
    batch: int
    tp: int
    fwd_flops: float
    bwd_flops: float
    weight_gemm: bool


class AcesoCostModel:
    """`OpCostModel` backed by an Aceso profile for one zoo model (module docstring).

    Args:
        profile: the parsed folder.
        model: the zoo ModelSpec whose ops are costed.
        size: Aceso's size tag; derived from the model name when None.
        algo: Aceso's split algorithm (0 = Megatron's column→row).
        max_batch: largest per-replica micro-batch indexed.
    """

    def __init__(self, profile: AcesoProfile, model: ModelSpec, *, size: str | None = None,
                 algo: int = 0, max_batch: int = 1024) -> None:
        self.model = model
        self.family = aceso_family(model)
        self.size = size or aceso_size(model)
        files = profile.files_for(self.family, self.size, algo)
        if not files:
            have = ", ".join(f"{m}_{s}" for m, s in profile.sizes())
            raise DataFileError(f"Aceso profile {profile.folder} has no files for "
                                f"{self.family}_{self.size} (model {model.name!r}); it has: {have}")
        self.times: dict[int, dict[int, dict[str, tuple[float, float]]]] = {}
        for f in files:
            self.times.setdefault(f.tp, {})[f.mbs] = {n: (o.fwd_s, o.bwd_s)
                                                     for n, o in f.ops.items()}
        self.max_batch = max_batch
        self.roofline = RooflineCostModel()
        self.sources: Counter[str] = Counter()
        """How estimates were made: measured, scaled_tp, roofline."""
        self._index: dict[tuple[str, tuple[int, ...]], list[_Entry]] = {}
        self._indexed: set[tuple[int, int]] = set()

    # ---------------------------------------------------------------- index
    def _candidate_batches(self) -> list[int]:
        small = list(range(1, 129))
        return small + [b for b in range(136, self.max_batch + 1, 8)]

    def _index_batch(self, b: int, tp: int) -> None:
        if (b, tp) in self._indexed:
            return
        self._indexed.add((b, tp))
        graph = build_graph(self.model, b)
        done: set[int] = set()
        for i, layer in enumerate(graph.layers):
            if id(layer) in done:
                continue
            done.add(id(layer))
            ops = {op.name: op for op in layer.sharded_ops(tp, False, 1)}
            for names, zoo in layer_op_map(self.model, layer, i):
                present = [ops[z] for z in zoo if z in ops]
                total = sum(op.fwd_flops for op in present)
                for op in present:
                    share = op.fwd_flops / total if total > 0 else 1.0 / len(present)
                    key = (op.kind, tuple(op.shape or ()))
                    self._index.setdefault(key, []).append(_Entry(
                        names=tuple(names), share=share, batch=b, tp=tp,
                        fwd_flops=op.fwd_flops, bwd_flops=op.bwd_flops,
                        weight_gemm=bool(op.is_matmul and op.params > 0)))

    def _entries(self, kind: str, shape: tuple[int, ...] | None, flops: float) -> list[_Entry]:
        key = (kind, tuple(shape or ()))
        if key not in self._index:
            self._grow_index(key)
        return self._index.get(key, [])

    def _grow_index(self, key: tuple[str, tuple[int, ...]]) -> None:
        """Index batches × tp degrees until `key` appears (each pair once)."""
        tps = sorted({1, 2, 4, 8, *self.times})
        for b in self._candidate_batches():
            for tp in tps:
                self._index_batch(b, tp)
            if key in self._index:
                return

    # ---------------------------------------------------------------- times
    def _measured(self, names: tuple[str, ...], batch: int, tp: int) -> tuple[float, float] | None:
        """(fwd_s, bwd_s) of Aceso ops `names` at replica batch `batch` and degree `tp`."""
        scale = 1.0
        if tp not in self.times:
            near = min(self.times, key=lambda t: (abs(math.log(t / tp)), t))
            scale, tp = near / tp, near
            self.sources["scaled_tp"] += 1
        per_mbs = self.times[tp]
        sizes = sorted(per_mbs)

        def at(m: int) -> tuple[float, float] | None:
            rows = per_mbs[m]
            if any(n not in rows for n in names):
                return None
            return (sum(rows[n][0] for n in names), sum(rows[n][1] for n in names))

        if batch in per_mbs:
            v = at(batch)
        elif batch < sizes[0] or batch > sizes[-1]:
            edge = sizes[0] if batch < sizes[0] else sizes[-1]
            e = at(edge)
            v = None if e is None else (e[0] * batch / edge, e[1] * batch / edge)
        else:
            lo = max(m for m in sizes if m < batch)
            hi = min(m for m in sizes if m > batch)
            a, c = at(lo), at(hi)
            if a is None or c is None:
                return None
            w = (batch - lo) / (hi - lo)
            v = (a[0] + w * (c[0] - a[0]), a[1] + w * (c[1] - a[1]))
        if v is None:
            return None
        return (v[0] * scale, v[1] * scale)

    def time_s(self, kind: str, flops: float, bytes_moved: float,
               shape: tuple[int, ...] | None) -> float | None:
        """Measured seconds of one lowering call, or None when the op is not in the profile."""
        entries = self._entries(kind, shape, flops)
        measured_tp = [e for e in entries if e.tp in self.times]
        entries = measured_tp or entries  # equal-work entries at a profiled tp come first
        picks: list[float] = []
        for e in entries:
            rel = 1e-6 * max(flops, 1.0)
            fb = self._measured(e.names, e.batch, e.tp)
            if fb is None:
                continue
            fwd, bwd = fb[0] * e.share, fb[1] * e.share
            if e.weight_gemm and abs(e.bwd_flops * 0.5 - flops) <= rel:
                picks.append((fwd + bwd) / 3.0)
            elif abs(e.fwd_flops - flops) <= rel:
                picks.append(fwd)
            elif abs(e.bwd_flops - flops) <= rel:
                picks.append(bwd)
        if not picks:
            return None
        return sum(picks) / len(picks)

    def estimate(self, kind: str, flops: float, bytes_moved: float, gpu: GpuSpec,
                 freq_mhz: float | None = None, dtype: str = "fp16",
                 shape: tuple[int, ...] | None = None) -> OpEstimate:
        """`OpCostModel.estimate`: Aceso's measured time where the op is profiled, else the
        roofline (the optimizer step, ops Aceso folds into a neighbour report 0 s)."""
        roof = self.roofline.estimate(kind, flops, bytes_moved, gpu, freq_mhz, dtype, shape)
        t = self.time_s(kind, flops, bytes_moved, shape) if shape is not None else None
        if t is None:
            self.sources["roofline"] += 1
            return roof
        self.sources["measured"] += 1
        return OpEstimate(time_s=t, compute_s=min(roof.compute_s, t),
                          memory_s=min(roof.memory_s, t),
                          overhead_s=max(0.0, t - max(roof.compute_s, roof.memory_s)),
                          power_w=roof.power_w)


def aceso_lowering_options(folder: str | Path, model: ModelSpec, **kwargs: Any
                           ) -> LoweringOptions:
    """LoweringOptions costing ops from an Aceso profile folder, with the tensor-parallel
    collectives left out of the program because Aceso's op times include them."""
    cost = AcesoCostModel(load_aceso_profile(folder), model, **kwargs)
    return LoweringOptions(cost_model=cost, tp_communication=False)


def roofline_error(profile: AcesoProfile, model: ModelSpec, gpu: GpuSpec, *, algo: int = 0
                   ) -> list[dict[str, Any]]:
    """Roofline vs measured op times, per op file of `model` at tp = 1 (no communication in
    the measurement): one row per (mbs, Aceso op group) with forward + backward seconds."""
    cost = AcesoCostModel(profile, model, algo=algo)
    rows: list[dict[str, Any]] = []
    for mbs in sorted(cost.times.get(1, {})):
        graph = build_graph(model, mbs)
        seen: set[int] = set()
        for i, layer in enumerate(graph.layers):
            if id(layer) in seen:
                continue
            seen.add(id(layer))
            ops = {op.name: op for op in layer.sharded_ops(1, False, 1)}
            for names, zoo in layer_op_map(model, layer, i):
                measured = cost._measured(tuple(names), mbs, 1)
                if measured is None:
                    continue
                roof = 0.0
                for z in zoo:
                    if z not in ops:
                        continue
                    op = ops[z]
                    for fl, by in ((op.fwd_flops, op.fwd_bytes), (op.bwd_flops, op.bwd_bytes)):
                        if fl > 0 or by > 0:
                            roof += cost.roofline.estimate(op.kind, fl, by, gpu, None,
                                                           model.dtype, op.shape).time_s
                meas = measured[0] + measured[1]
                rows.append({"model": f"{cost.family}_{cost.size}", "mbs": mbs,
                             "layer": layer.name, "aceso_ops": "+".join(names),
                             "measured_s": meas, "roofline_s": roof,
                             "error": roof / meas - 1.0 if meas > 0 else math.nan})
    return rows


__all__ = ["AcesoCostModel", "AcesoOp", "AcesoOpFile", "AcesoProfile", "aceso_family",
           "aceso_lowering_options", "aceso_size", "layer_op_map", "load_aceso_profile",
           "parse_op_file", "roofline_error"]
