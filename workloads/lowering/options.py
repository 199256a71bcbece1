"""`LoweringOptions`: the switches of one lowering (what-if analyses and tests)."""

from __future__ import annotations

from dataclasses import dataclass

from trainsim.hwmodels.opcost import OpCostModel


@dataclass(frozen=True, kw_only=True, slots=True)
class LoweringOptions:
    """Switches for what-if analyses and tests; the defaults model a real run."""

    fold: bool = True
    """Fold identical ranks (tp members, dp replicas of one GPU type and batch share) into one
    program rank per stage and replica class. Exact on
    one homogeneous node; across nodes, different folded collectives meeting on one NIC share
    it per task rather than per copy (lowering/comm.py), a small approximation."""
    communication: bool = True
    """Model communication (False: every collective and transfer is free)."""
    embedding_and_head: bool = True
    """Place the embedding and LM-head layers on the first/last stage (False drops them, which
    makes stages exactly uniform — used to check textbook bubble formulas)."""
    optimizer_step: bool = True
    """End the iteration with the optimizer step."""
    dp_bucket_bytes: float = 25 * 2**20
    """Gradient bucket size for the overlapped data-parallel reduction (PyTorch DDP default)."""
    collective_algorithm: str = "auto"
    """Collective algorithm (auto picks the fastest alone per collective)."""
    cost_model: OpCostModel | None = None
    """Op cost model; the roofline (hwmodels/opcost.py) when None."""
    comm_sm_sharing: bool = True
    """Slow compute while a collective runs on the same GPU: an NCCL kernel holds some SMs
    (hwmodels/comm_sm.py, `Program.comm_sm_fraction`). False: compute runs at full speed beside
    any collective (the behaviour before issue 13, item 4)."""
    tp_communication: bool = True
    """Emit the tensor-parallel collectives. False when the cost model's op times already
    include them (Aceso's profiles measure each op with its all-reduce, search/aceso/profile.py),
    so they are not counted twice."""


DEFAULT_OPTIONS = LoweringOptions()
"""The options `lower` uses when given none (one object, so a `LoweringCache` bound to them
serves every call that passes none)."""
