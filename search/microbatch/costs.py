"""What a micro-batch of b samples padded to length s (target t) costs, fast enough to weigh
every contiguous segment of a batch's samples (DynaPipe's cost model, on trainsim's op costs).

The figures are exact op costs (workloads/stage_costs.py, the lowering's own path) at the
points of a grid -- lengths in multiples of 8, batch sizes in powers of two, and for
encoder-decoder models target lengths -- computed on first use and interpolated between them
(per-sample time and activation linear in length and in log2 batch size). The planner only
ranks micro-batchings with them; every plan it keeps is replayed by the engine on the exact
shapes.

Per micro-batch it gives the bottleneck stage's compute time (forward + backward + recompute,
uniform layer split over `pp` stages), the activation bytes the first stage keeps per
in-flight micro-batch (it holds the most micro-batches under 1F1B: pp), and `extra_bytes`:
what a GPU needs beyond the fullest stage's model states and pp of those, with the micro-batch
in every in-flight slot of 1F1B -- the backward's transient, and where a later stage needs
more (the last one holds one micro-batch but the LM head's logits and the loss's workspace;
an encoder-decoder's decoder stages keep what a long target makes) its excess. So
static + pp x kept + extra is the most memory any stage needs for a run of such micro-batches.
Per stage (`stage_figures`, `stage_static`), what each stage keeps and needs transiently, for
micro-batches of different shapes whose needs peak on different stages (T5: a long input on
the encoder's, a long target on the decoder's).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import cast

import numpy as np
from numpy.typing import ArrayLike

from trainsim.hwmodels.gpus import GpuSpec
from trainsim.hwmodels.opcost import OpCostModel, RooflineCostModel
from trainsim.workloads.lowering.layout import partition_layers
from trainsim.workloads.model import ModelSpec, build_graph, trained_in
from trainsim.workloads.plan import uniform_split
from trainsim.workloads.stage_costs import instruction_costs, state_bytes_per_param

PAD = 8
"""Lengths are padded to a multiple of this (DynaPipe rounds segment lengths up to 8)."""


def pad(n: np.ndarray | int) -> np.ndarray:
    """Lengths rounded up to a multiple of PAD."""
    return (np.asarray(n) + PAD - 1) // PAD * PAD


@dataclass(frozen=True, slots=True)
class Figures:
    """One micro-batch shape's costs."""

    time_s: float
    """Bottleneck stage compute time of the micro-batch (forward + backward + recompute)."""
    kept_bytes: float
    """Activation bytes stage 0 keeps until the micro-batch's backward."""
    extra_bytes: float
    """Bytes beyond the fullest stage's model states and pp x `kept_bytes` the neediest stage
    needs under 1F1B (stage k holds pp - k micro-batches and its backward's transient:
    recompute's materialised layer, the loss workspace): max over k of (pp - k) kept_k +
    extra_k + static_k, less pp kept_0 and the largest static_k (may be negative where the
    fullest stage is not the neediest)."""
    stage_kept: tuple[float, ...] = ()
    """Activation bytes each stage keeps until the micro-batch's backward."""
    stage_extra: tuple[float, ...] = ()
    """Each stage's backward transient for the micro-batch."""


class MicroBatchCosts:
    """Interpolated micro-batch costs of one model, GPU, tp, pp and recompute policy."""

    def __init__(self, model: ModelSpec, gpu: GpuSpec, *, tp: int = 1, pp: int = 1,
                 recompute: str = "none", dtype: str | None = None, max_len: int,
                 max_target_len: int = 0, cost_model: OpCostModel | None = None,
                 max_batch: int = 1024, zero: int = 0, dp: int = 1, sp: bool = False) -> None:
        self.model, self.gpu, self.tp, self.pp, self.recompute = model, gpu, tp, pp, recompute
        self.sp = sp
        """Sequence parallelism (tp > 1): the activations the plans keep, as the lowering."""
        self.dtype = dtype or ("bf16" if model.dtype == "bf16" else "fp16")
        model = self.model = trained_in(model, self.dtype)  # the plans' bytes, as the lowering
        self.cost_model = cost_model or RooflineCostModel()
        self.encoder_decoder = model.family == "t5"
        self.s_grid = np.unique(pad(np.geomspace(PAD, max(max_len, PAD), 14).astype(int)))
        self.b_grid = 2 ** np.arange(int(np.log2(max_batch)) + 1)
        self.t_grid = (np.unique(pad(np.geomspace(PAD, max(max_target_len, PAD), 7)
                                     .astype(int)))
                       if self.encoder_decoder else np.array([0]))
        self._grid: dict[str, np.ndarray] | None = None
        self.build_s = 0.0
        """Seconds spent computing the grid (a one-off per model, GPU and degrees, kept out
        of per-iteration planning times)."""
        blocks = (model.num_layers + (model.decoder_layers if self.encoder_decoder else 0))
        self.counts = uniform_split(blocks, pp)
        w, g, o = state_bytes_per_param(self.dtype, model.grad_buffer, model.grad_reduce_dtype)
        # ZeRO-1 shards the optimizer states over dp, ZeRO-2 the gradients too (as the lowering)
        o, g = o / (dp if zero >= 1 else 1), g / (dp if zero >= 2 else 1)
        graph = build_graph(model, 1, PAD) if not self.encoder_decoder else \
            build_graph(dataclasses.replace(model, decoder_seq_len=PAD), 1, PAD)
        stages = partition_layers(graph, self.counts)
        self.stage_static = np.array([
            instruction_costs([graph.layers[i] for i in idx], tp=tp, sp=False, ep=1,
                              recompute="none", cost_model=self.cost_model, gpu=gpu,
                              freq_mhz=None, dtype=self.dtype).params * (w + g + o)
            for idx in stages])
        """Weights, gradients and Adam states of each stage (ZeRO-1/2: sharded)."""
        self.static_bytes = float(self.stage_static.max())
        """Those of the fullest stage."""

    # ------------------------------------------------------------------ exact
    def exact(self, b: int, s: int, t: int = 0) -> Figures:
        """Op costs of a micro-batch of b samples of length s (target t), no interpolation."""
        model = self.model
        if self.encoder_decoder:
            model = dataclasses.replace(model, decoder_seq_len=max(int(t), 1))
        graph = build_graph(model, int(b), int(s))
        stages = partition_layers(graph, self.counts)
        best = 0.0
        kept, extra = [], []
        for idx in stages:
            c = instruction_costs([graph.layers[i] for i in idx], tp=self.tp, sp=self.sp, ep=1,
                                  recompute=self.recompute, cost_model=self.cost_model,
                                  gpu=self.gpu, freq_mhz=None, dtype=self.dtype)
            best = max(best, c.forward.time_s + c.backward.time_s + c.recompute.time_s)
            kept.append(c.kept_activation_bytes)
            extra.append(c.recompute_activation_bytes)
        pp = len(stages)
        need = max((pp - k) * kept[k] + extra[k] + self.stage_static[k] for k in range(pp))
        return Figures(time_s=best, kept_bytes=kept[0],
                       extra_bytes=float(need - pp * kept[0] - self.static_bytes),
                       stage_kept=tuple(kept), stage_extra=tuple(extra))

    # ------------------------------------------------------------------ interpolated
    def _table(self) -> dict[str, np.ndarray]:
        if self._grid is None:
            t0 = time.perf_counter()
            shape = (len(self.b_grid), len(self.s_grid), len(self.t_grid))
            table = {k: np.zeros(shape) for k in ("time", "kept")}
            for k in range(self.pp):
                table[f"kept{k}"], table[f"extra{k}"] = np.zeros(shape), np.zeros(shape)
            for i, b in enumerate(self.b_grid):
                for j, s in enumerate(self.s_grid):
                    for k, t in enumerate(self.t_grid):
                        f = self.exact(int(b), int(s), int(t))
                        table["time"][i, j, k] = f.time_s / b
                        table["kept"][i, j, k] = f.kept_bytes / b
                        for q, (kq, eq) in enumerate(zip(f.stage_kept, f.stage_extra)):
                            table[f"kept{q}"][i, j, k] = kq / b
                            table[f"extra{q}"][i, j, k] = eq / b
            self._grid = table
            self.build_s += time.perf_counter() - t0
        return self._grid

    def _interp(self, what: str, b: ArrayLike, s: ArrayLike, t: ArrayLike | None
                ) -> np.ndarray:
        return self._interp_many((what,), b, s, t)[0]

    def _interp_many(self, whats: tuple[str, ...], b: ArrayLike, s: ArrayLike,
                     t: ArrayLike | None) -> list[np.ndarray]:
        """Several figures at the same points, the interpolation weights computed once."""
        tables = self._table()
        lb = np.log2(np.clip(np.asarray(b, dtype=float), 1, self.b_grid[-1]))
        ib = np.clip(np.floor(lb).astype(int), 0, len(self.b_grid) - 2) \
            if len(self.b_grid) > 1 else np.zeros_like(lb, dtype=int)
        wb = np.clip(lb - ib, 0.0, 1.0) if len(self.b_grid) > 1 else np.zeros_like(lb)
        s = np.clip(np.asarray(s, dtype=float), self.s_grid[0], self.s_grid[-1])
        js = np.clip(np.searchsorted(self.s_grid, s) - 1, 0, len(self.s_grid) - 2)
        ws = (s - self.s_grid[js]) / (self.s_grid[js + 1] - self.s_grid[js])
        ib1 = np.minimum(ib + 1, len(self.b_grid) - 1)
        if self.encoder_decoder and len(self.t_grid) > 1:
            tt = np.clip(np.asarray(t if t is not None else 0, dtype=float),
                         self.t_grid[0], self.t_grid[-1])
            kt = np.clip(np.searchsorted(self.t_grid, tt) - 1, 0, len(self.t_grid) - 2)
            wt = (tt - self.t_grid[kt]) / (self.t_grid[kt + 1] - self.t_grid[kt])
            t_corners: tuple[tuple[np.ndarray, np.ndarray], ...] = ((kt, 1 - wt), (kt + 1, wt))
        else:  # one target point: its weight is 1
            t_corners = ((np.zeros_like(js), np.ones_like(ws)),)
        corners = [(bi, si, ti, bw * sw * tw)
                   for bi, bw in ((ib, 1 - wb), (ib1, wb))
                   for si, sw in ((js, 1 - ws), (js + 1, ws))
                   for ti, tw in t_corners]
        scale = np.asarray(b, dtype=float)
        shape = np.broadcast(lb, s).shape
        outs = []
        for what in whats:
            grid, out = tables[what], np.zeros(shape)
            for bi, si, ti, w in corners:
                out = out + w * grid[bi, si, ti]
            outs.append(out * scale)
        return outs

    def all(self, b: ArrayLike, s: ArrayLike, t: ArrayLike | None = None
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(time, kept, extra) of micro-batches, interpolated in one pass."""
        time_s, = self._interp_many(("time",), b, s, t)
        stage_kept, stage_extra = self.stage_figures(b, s, t)
        return time_s, stage_kept[0], self._extra(stage_kept, stage_extra)

    def _extra(self, stage_kept: np.ndarray, stage_extra: np.ndarray) -> np.ndarray:
        """`Figures.extra_bytes` from the stages' interpolated figures (which scale with the
        batch; the model states, which do not, are added whole)."""
        shape = stage_kept.shape[1:]  # the micro-batches' (stage figures lead with pp)
        kept, extra = stage_kept.reshape(self.pp, -1), stage_extra.reshape(self.pp, -1)
        held = np.arange(self.pp, 0, -1)[:, None]  # pp - k micro-batches on stage k
        need = (held * kept + extra + self.stage_static[:, None]).max(axis=0)
        return cast(np.ndarray, (need - self.static_bytes - self.pp * kept[0]).reshape(shape))

    def stage_figures(self, b: ArrayLike, s: ArrayLike, t: ArrayLike | None = None
                      ) -> tuple[np.ndarray, np.ndarray]:
        """Interpolated (kept, transient) bytes of each stage for micro-batches, arrays of
        shape (pp, micro-batches)."""
        names = tuple(f"{w}{k}" for w in ("kept", "extra") for k in range(self.pp))
        out = self._interp_many(names, b, s, t)
        return np.array(out[:self.pp]), np.array(out[self.pp:])

    def time(self, b: ArrayLike, s: ArrayLike, t: ArrayLike | None = None) -> np.ndarray:
        """Interpolated bottleneck-stage time of micro-batches (b samples, length s, target t)."""
        return self._interp("time", b, s, t)

    def kept(self, b: ArrayLike, s: ArrayLike, t: ArrayLike | None = None) -> np.ndarray:
        """Interpolated activation bytes stage 0 keeps per micro-batch."""
        return self._interp("kept", b, s, t)

    def extra(self, b: ArrayLike, s: ArrayLike, t: ArrayLike | None = None) -> np.ndarray:
        """Interpolated bytes beyond the fullest stage's model states and pp x kept that the
        neediest stage needs (`Figures.extra_bytes`)."""
        return self._extra(*self.stage_figures(b, s, t))


__all__ = ["PAD", "Figures", "MicroBatchCosts", "pad"]
