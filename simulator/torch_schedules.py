"""Import the pipeline orders PyTorch itself generates (`torch.distributed.pipelining.schedules`).

`from_torch("ScheduleInterleavedZeroBubble", num_ranks=4, num_micro_batches=8, stages_per_rank=2)`
returns the per-rank compute order torch would run, as trainsim `Action`s, so users can simulate
exactly what `torch.distributed.pipelining` executes.

How the order is obtained, without a process group:

- Multi-stage classes (`ScheduleInterleaved1F1B`, `ScheduleLoopedBFS`,
  `ScheduleInterleavedZeroBubble`, `ScheduleZBVZeroBubble`, `ScheduleDualPipeV`) compute
  ``pipeline_order`` -- the compute-only IR their runtime lowers and executes -- for every rank
  in their constructor. The constructor only reads a few plain attributes of its stages
  (``num_stages``, ``group_size``, ``group_rank``, ``submod``), so lightweight stand-in stages
  (`types.SimpleNamespace`) for rank 0 are enough; the order is then read from the object.
- Single-stage classes (`ScheduleGPipe`, `Schedule1F1B`) execute their hand-written
  ``_step_microbatches`` loop, not their ``pipeline_order`` IR. Their IR is descriptive only and
  in torch 2.13 mislabels `Schedule1F1B`'s last rank (it starts at micro-batch 1 and ends at
  ``m``). So for these we run ``_step_microbatches`` once per rank with a recording stand-in
  stage (no tensors, no communication: its p2p-op getters return nothing) and record the order
  of ``forward_one_chunk`` / ``backward_one_chunk`` calls -- what torch really runs.

Mapping: torch's FORWARD/FULL_BACKWARD/BACKWARD_INPUT/BACKWARD_WEIGHT become F/B/I/W; idle slots
(``None``) are kept where torch has them; REDUCE_GRAD, UNSHARD/RESHARD and SEND/RECV actions are
dropped (the lowering adds trainsim's own communication); DualPipeV's OVERLAP_F_B (a forward and
a backward of two stages run overlapped) is expanded into its two sub-actions in order.
"""

from __future__ import annotations

import types
from typing import Any

from trainsim.errors import SpecError, unknown_name
from trainsim.simulator.actions import Action, Schedule

SINGLE_STAGE_CLASSES: tuple[str, ...] = ("Schedule1F1B", "ScheduleGPipe")
"""Classes that run one stage per rank."""

MULTI_STAGE_CLASSES: dict[str, tuple[int, ...] | None] = {
    "ScheduleInterleaved1F1B": None,
    "ScheduleLoopedBFS": None,
    "ScheduleInterleavedZeroBubble": None,
    "ScheduleZBVZeroBubble": (2,),
    "ScheduleDualPipeV": (2,),
}
"""Multi-stage classes and the stages_per_rank they accept (None: any >= 1)."""

_V_SHAPED = {"ScheduleZBVZeroBubble", "ScheduleDualPipeV"}
"""Classes placing stages in a V: rank r holds stages r and 2p − 1 − r."""

_KIND_OF = {"F": "F", "B": "B", "I": "I", "W": "W"}


def supported_classes() -> list[str]:
    """Torch schedule classes `from_torch` reads (those present in the installed torch)."""
    try:
        from torch.distributed.pipelining import schedules as torch_schedules
    except ImportError:
        return sorted([*SINGLE_STAGE_CLASSES, *MULTI_STAGE_CLASSES])
    return sorted(
        name for name in (*SINGLE_STAGE_CLASSES, *MULTI_STAGE_CLASSES)
        if hasattr(torch_schedules, name)
    )


def resolve_class_name(class_name: str) -> str:
    """Accept ``Schedule1F1B`` or torch's short names (``1F1B``), case-insensitively."""
    wanted = class_name.strip().lower()
    for name in supported_classes():
        if wanted in (name.lower(), name.lower().removeprefix("schedule")):
            return name
    raise SpecError(str(unknown_name("torch pipeline schedule class", class_name,
                                     supported_classes())))


def _stand_in_stage(index: int, num_stages: int, num_ranks: int, rank: int) -> Any:
    return types.SimpleNamespace(
        stage_index=index,
        num_stages=num_stages,
        group_size=num_ranks,
        group_rank=rank,
        submod=None,
        is_first=index == 0,
        is_last=index == num_stages - 1,
    )


class _RecordingStage(types.SimpleNamespace):
    """A stand-in `_PipelineStageBase` that records the compute calls torch's loop makes."""

    def __init__(self, index: int, num_stages: int, num_ranks: int) -> None:
        super().__init__(
            stage_index=index, num_stages=num_stages, group_size=num_ranks, group_rank=index,
            submod=None, is_first=index == 0, is_last=index == num_stages - 1,
            has_backward=True, output_chunks=[],
        )
        self.recorded: list[Action] = []

    def forward_one_chunk(self, mb: int, *args: Any, **kwargs: Any) -> None:
        self.recorded.append(Action(self.stage_index, "F", mb))

    def backward_one_chunk(self, mb: int, *args: Any, **kwargs: Any) -> None:
        self.recorded.append(Action(self.stage_index, "B", mb))

    def _no_ops(self, *args: Any, **kwargs: Any) -> list[Any]:
        return []

    get_fwd_recv_ops = get_fwd_send_ops = get_bwd_recv_ops = get_bwd_send_ops = _no_ops

    def perform_reduce_grad(self, *args: Any, **kwargs: Any) -> None:
        return None

    def clear_runtime_states(self) -> None:
        return None


def _convert(torch_action: Any) -> list[Action | None]:
    if torch_action is None:
        return [None]
    subs = getattr(torch_action, "sub_actions", None)
    if subs:
        return [a for sub in subs for a in _convert(sub) if a is not None]
    kind = _KIND_OF.get(torch_action.computation_type.value)
    if kind is None:  # REDUCE_GRAD, UNSHARD, RESHARD, SEND_*/RECV_*: not compute
        return []
    return [Action(int(torch_action.stage_index), kind, int(torch_action.microbatch_index))]  # type: ignore[arg-type]


def convert_torch_order(pipeline_order: dict[int, list[Any]]) -> Schedule:
    """Turn a torch ``pipeline_order`` (``dict[rank, list[_Action | None]]``) into a Schedule."""
    return {
        int(rank): [a for act in actions for a in _convert(act)]
        for rank, actions in sorted(pipeline_order.items())
    }


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] + ("…" if len(text) > 300 else "")


def from_torch(
    class_name: str,
    num_ranks: int,
    num_micro_batches: int,
    stages_per_rank: int = 1,
) -> Schedule:
    """The per-rank order torch's pipelining schedule `class_name` runs (see module docstring).

    Args:
        class_name: e.g. ``"Schedule1F1B"``, ``"ScheduleInterleavedZeroBubble"`` (the
            ``Schedule`` prefix and case are optional).
        num_ranks: pipeline ranks ``p``.
        num_micro_batches: micro-batches ``m``.
        stages_per_rank: stages (model chunks) per rank; 1 for single-stage classes, 2 for the
            V-shaped ZBV and DualPipeV.

    Raises:
        SpecError: torch is missing, the class is unknown (the supported ones are listed),
            `stages_per_rank` does not suit it, or torch rejects (p, m) -- torch's message in one
            line.
    """
    for name, value in (("num_ranks", num_ranks), ("num_micro_batches", num_micro_batches),
                        ("stages_per_rank", stages_per_rank)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SpecError(f"torch schedule {name}={value!r} must be an integer >= 1")
    try:
        from torch.distributed.pipelining import schedules as torch_schedules
    except ImportError as exc:  # pragma: no cover - torch is installed in the dev venv
        raise SpecError(
            f"schedule 'torch:{class_name}' needs PyTorch (pip install 'trainsim[torch]'): {exc}"
        ) from exc
    name = resolve_class_name(class_name)
    cls = getattr(torch_schedules, name)
    try:
        if name in SINGLE_STAGE_CLASSES:
            if stages_per_rank != 1:
                raise SpecError(f"torch schedule {name} runs one stage per rank; got "
                                f"stages_per_rank={stages_per_rank}")
            return _record_single_stage(cls, num_ranks, num_micro_batches)
        allowed = MULTI_STAGE_CLASSES[name]
        if allowed is not None and stages_per_rank not in allowed:
            raise SpecError(f"torch schedule {name} needs stages_per_rank in {list(allowed)}; "
                            f"got {stages_per_rank}")
        num_stages = num_ranks * stages_per_rank
        if name in _V_SHAPED:
            indices = [0, num_stages - 1]
        else:
            indices = [k * num_ranks for k in range(stages_per_rank)]
        stages = [_stand_in_stage(i, num_stages, num_ranks, 0) for i in indices]
        schedule = cls(stages, num_micro_batches)
        return convert_torch_order(schedule.pipeline_order)
    except SpecError:
        raise
    except (ValueError, AssertionError, RuntimeError, ZeroDivisionError, IndexError) as exc:
        raise SpecError(
            f"torch {name} rejects num_ranks={num_ranks}, num_micro_batches={num_micro_batches}, "
            f"stages_per_rank={stages_per_rank}: {_one_line(exc)}"
        ) from exc


def _record_single_stage(cls: Any, num_ranks: int, num_micro_batches: int) -> Schedule:
    order: Schedule = {}
    for rank in range(num_ranks):
        stage = _RecordingStage(rank, num_ranks, num_ranks)
        schedule = cls(stage, num_micro_batches)
        # skip shape inference and p2p warm-up (they need tensors and a process group)
        schedule._stage_forward_initialized = True
        schedule._stage_backward_initialized = True
        schedule._has_backward = True
        schedule._step_microbatches()
        order[rank] = list(stage.recorded)
    return order


def torch_printed_order(
    class_name: str, num_ranks: int, num_micro_batches: int, stages_per_rank: int = 1
) -> dict[int, list[str]]:
    """Torch's own ``pipeline_order`` IR as strings (``str(_Action)``, ``""`` for idle),
    compute actions only -- what torch's ``_format_pipeline_order`` prints. For tests and
    for comparing against `from_torch`."""
    from torch.distributed.pipelining import schedules as torch_schedules

    name = resolve_class_name(class_name)
    cls = getattr(torch_schedules, name)
    num_stages = num_ranks * stages_per_rank
    if name in SINGLE_STAGE_CLASSES:
        pipeline_order = cls(_stand_in_stage(0, num_stages, num_ranks, 0),
                             num_micro_batches).pipeline_order
    else:
        indices = ([0, num_stages - 1] if name in _V_SHAPED
                   else [k * num_ranks for k in range(stages_per_rank)])
        stages = [_stand_in_stage(i, num_stages, num_ranks, 0) for i in indices]
        pipeline_order = cls(stages, num_micro_batches).pipeline_order
    printed: dict[int, list[str]] = {}
    for rank, actions in sorted(pipeline_order.items()):
        row = []
        for act in actions:
            if act is None:
                row.append("")
            elif act.sub_actions:
                row.extend(str(s) for s in act.sub_actions)
            elif act.computation_type.value in _KIND_OF:
                row.append(str(act))
        printed[rank] = row
    return printed
