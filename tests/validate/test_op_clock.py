"""validate/op_clock.py: per-kind seconds by clocks around forwards, autograd nodes and
communication."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from trainsim.validate import op_clock
from trainsim.validate import torch_model as tm
from trainsim.validate.op_clock import OpClock
from trainsim.validate.small_models import get_validation_model


def _clocked(fn) -> dict[str, float]:
    with op_clock.running() as clock:
        fn(clock)
    return clock.kind_s


class _FakeClock:
    """A perf_counter that moves only when told to (the tests assert no wall-clock time)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_communication_inside_an_op_counts_as_comm_not_as_the_op(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeClock()
    monkeypatch.setattr(op_clock.time, "perf_counter", fake)

    def run(clock: OpClock) -> None:
        with tm.op_range("embedding", "e"):
            fake.now += 2.0
            with op_clock.comm():
                fake.now += 20.0
            fake.now += 1.0

    kinds = _clocked(run)
    assert kinds == {"embedding": pytest.approx(3.0), "comm": pytest.approx(20.0)}


def test_pipeline_actions_are_containers_not_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole pipeline instruction's range holds ops: only the ops inside it are timed."""
    fake = _FakeClock()
    monkeypatch.setattr(op_clock.time, "perf_counter", fake)

    def run(clock: OpClock) -> None:
        with tm.op_range("action", "0F0"):
            fake.now += 5.0
            with tm.op_range("gelu", "g"):
                fake.now += 2.0

    assert _clocked(run) == {"gelu": pytest.approx(2.0)}


def test_a_model_iteration_gives_forward_and_backward_kinds() -> None:
    spec = get_validation_model("tiny-gpt")
    model = tm.build_stage(spec, stage=0, pp=1, tp=1, tp_rank=0)
    batch = tm.batch(spec, 1, seed=0)

    def run(clock: OpClock) -> None:
        out = model(batch["ids"], 1, spec.seq_len, None, targets=batch["targets"])
        clock.hook_backward(out)
        out.backward()

    first = _clocked(run)
    for kind in ("matmul", "layernorm", "softmax", "gelu", "embedding", "cross_entropy"):
        assert first.get(kind, 0.0) > 0, kind
    # the backward is timed too: matmul's nodes take about twice its forwards
    forward_only = _clocked(lambda clock: model(batch["ids"], 1, spec.seq_len, None,
                                                targets=batch["targets"]))
    assert first["matmul"] > 1.5 * forward_only["matmul"]
