"""How each method turns one global batch of variable-length samples into micro-batches.

A `Batching` is what the engine replays: each data-parallel replica's micro-batches (shapes),
with the real and the padded token counts so padding efficiency can be shown.

Baselines (as DynaPipe compares against them):
* `packing` -- Megatron-LM's --pack-dataset, DynaPipe's baseline: whole samples, in data
  order, concatenated into rows while they fit max_len (encoder-decoder: (input, target) pairs
  while both fit max_len / max_target), each row padded to max_len; rows grouped into fixed
  micro-batches, the rows split evenly over the replicas. The batch's last, part-filled row
  is left to the next batch (Megatron packs the dataset, not each batch).
* `token_budget` -- greedy: in data order, a micro-batch takes samples while its padded size
  (samples x longest) stays within a token budget.
* `fixed` -- a fixed number of samples per micro-batch, in data order, each padded to its
  longest sample.
* `dynapipe` -- dynapipe.py's ordered dynamic-programming split (faithful or exact t_max).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from trainsim.errors import SpecError
from trainsim.search.microbatch.costs import MicroBatchCosts, pad
from trainsim.search.microbatch.dynapipe import splits
from trainsim.workloads.plan import MicroBatch


@dataclass(frozen=True, slots=True)
class Batching:
    """Micro-batches per replica and the tokens they carry."""

    replicas: tuple[tuple[MicroBatch, ...], ...]
    real_tokens: int
    """Tokens of the samples (inputs + targets), padding excluded."""
    padded_tokens: int
    """Tokens the micro-batches compute on (padding included)."""
    note: str
    """The method's setting (micro-batch size, budget, t_max)."""

    @property
    def padding_efficiency(self) -> float:
        return self.real_tokens / self.padded_tokens if self.padded_tokens else 0.0

    def shapes(self) -> list[tuple[int, int, int, int]]:
        """(replica, batch, length, target) of every micro-batch."""
        return [(d, m.batch_size, m.seq_len, m.target_len)
                for d, ms in enumerate(self.replicas) for m in ms]


def _mb(b: int, s: int, t: int) -> MicroBatch:
    return MicroBatch(batch_size=int(b), seq_len=max(int(s), 1), target_len=int(t))


def _even(items: Sequence[int], parts: int) -> list[list[int]]:
    """`items` cut into `parts` contiguous runs as even as possible."""
    bounds = np.linspace(0, len(items), parts + 1).round().astype(int)
    return [list(items[bounds[d]:bounds[d + 1]]) for d in range(parts)]


def _tokens(inputs: np.ndarray, targets: np.ndarray) -> int:
    return int(inputs.sum() + targets.sum())


def packing(inputs: np.ndarray, targets: np.ndarray, *, max_len: int, max_target: int,
            micro_batch_size: int, dp: int) -> Batching:
    """Megatron-style packing into max-length rows (module docstring)."""
    enc_dec = bool(np.any(targets))
    # next fit, whole samples, as Megatron-LM's --pack-dataset in DynaPipe's artifact
    # (chenyu-jiang/Megatron-LM, megatron/data/t5_dataset.py `run_pack_samples`, which GPT
    # reuses with input + target as one sequence): a sample that does not fit starts a new row
    rows, used_in, used_t = 0, max_len, max_target
    for i, t in zip(inputs, targets):
        if used_in + i > max_len or (enc_dec and used_t + t > max_target):
            rows, used_in, used_t = rows + 1, 0, 0
        used_in, used_t = used_in + int(i), used_t + int(t)
    real = _tokens(inputs, targets)
    if rows > dp and used_in < max_len:
        # Megatron packs the whole dataset and takes whole rows per batch, so a batch's last,
        # part-filled row is the next batch's first: leave it (and its samples) to it
        rows, real = rows - 1, real - used_in - used_t
    if rows < dp:
        raise SpecError(f"packing: the batch fills {rows} rows of {max_len} tokens but dp={dp} "
                        f"replicas each need one; raise --tokens-per-batch or lower --dp")
    per = _even(list(range(rows)), dp)
    replicas = []
    for share in per:
        ms, left = [], len(share)
        while left > 0:
            b = min(micro_batch_size, left)
            ms.append(_mb(b, max_len, max_target if enc_dec else 0))
            left -= b
        replicas.append(tuple(ms))
    return Batching(replicas=tuple(replicas), real_tokens=real,
                    padded_tokens=rows * (max_len + (max_target if enc_dec else 0)),
                    note=f"rows of {max_len}" + (f"+{max_target}" if enc_dec else "")
                    + f", {micro_batch_size} rows per micro-batch")


def _padded(inputs: np.ndarray, targets: np.ndarray, dp_groups: list[list[list[int]]]) -> tuple[tuple[tuple[MicroBatch, ...], ...], int]:
    enc_dec = bool(np.any(targets))
    replicas, padded = [], 0
    for rep in dp_groups:
        ms = []
        for g in rep:
            s = int(pad(inputs[g].max()))
            t = int(pad(targets[g].max())) if enc_dec else 0
            ms.append(_mb(len(g), s, t))
            padded += len(g) * (s + t)
        replicas.append(tuple(ms))
    return tuple(replicas), padded


def token_budget(inputs: np.ndarray, targets: np.ndarray, *, budget: int, dp: int) -> Batching:
    """Greedy micro-batches within `budget` padded tokens, in data order, per replica."""
    reps = []
    for share in _even(list(range(len(inputs))), dp):
        groups: list[list[int]] = []
        cur: list[int] = []
        longest = 0
        for i in share:
            size = int(pad(inputs[i] + targets[i]))
            if cur and (len(cur) + 1) * max(longest, size) > budget:
                groups.append(cur)
                cur, longest = [], 0
            cur.append(i)
            longest = max(longest, size)
        if cur:
            groups.append(cur)
        reps.append(groups)
    replicas, padded = _padded(inputs, targets, reps)
    return Batching(replicas=replicas, real_tokens=_tokens(inputs, targets),
                    padded_tokens=padded, note=f"budget {budget} tokens")


def fixed(inputs: np.ndarray, targets: np.ndarray, *, micro_batch_size: int, dp: int
          ) -> Batching:
    """`micro_batch_size` samples per micro-batch in data order, padded to the longest."""
    reps = []
    for share in _even(list(range(len(inputs))), dp):
        reps.append([share[k:k + micro_batch_size]
                     for k in range(0, len(share), micro_batch_size)])
    replicas, padded = _padded(inputs, targets, reps)
    return Batching(replicas=replicas, real_tokens=_tokens(inputs, targets),
                    padded_tokens=padded, note=f"{micro_batch_size} samples per micro-batch")


def dynapipe(costs: MicroBatchCosts, inputs: np.ndarray, targets: np.ndarray, *, dp: int,
             memory_bytes: float, modes: tuple[str, ...] = ("exact",)
             ) -> list[Batching | None]:
    """DynaPipe's split (dynapipe.py) for each t_max search of `modes` ("exact",
    "thinned"); None where a sample does not fit alone."""
    found = splits(costs, inputs, targets if np.any(targets) else None, dp=dp,
                   memory_bytes=memory_bytes, modes=modes)
    out: list[Batching | None] = []
    for mode in modes:
        one = found[mode]
        if one is None:
            out.append(None)
            continue
        reps = [[list(mb) for mb in rep] for rep in one.replicas]
        replicas, padded = _padded(inputs, targets, reps)
        out.append(Batching(replicas=replicas, real_tokens=_tokens(inputs, targets),
                            padded_tokens=padded,
                            note=f"{mode} t_max {one.t_max * 1e3:.1f} ms, "
                                 f"{sum(len(r) for r in replicas)} micro-batches"))
    return out


__all__ = ["Batching", "dynapipe", "fixed", "packing", "token_budget"]
