"""GPU clocks in plans: per-instruction clocks must name instructions the plan runs
(layout._check_instruction_clocks), and a locked clock holds for every kernel. A key for another
schedule, stage or micro-batch was silently ignored (the bug hunt: a 1F1B frontier plan run
under ZB-H1 clocked its forwards only)."""

from __future__ import annotations

import pytest

from trainsim import api
from trainsim.errors import PlanError

BASE = {"pp": 2, "micro_batch_size": 2, "global_batch": 8, "seq_len": 256}


@pytest.mark.parametrize(("schedule", "key"), [("zb-h1", "1B2"), ("1f1b", "9F9"),
                                               ("1f1b", "0F7")])
def test_a_clock_for_no_instruction_is_refused(schedule: str, key: str) -> None:
    with pytest.raises(PlanError, match=rf"instruction_freq_mhz\['{key}'\] names no instruction"):
        api.simulate("gpt3-125m", "1x2xA100-SXM4-80GB",
                     dict(BASE, schedule=schedule, instruction_freq_mhz={key: 810.0}))


def test_clocks_for_every_instruction_apply_to_every_instruction() -> None:
    clocks = {f"{s}{k}{j}": (1410.0 if k == "F" else 810.0)
              for s in range(2) for k in "FB" for j in range(4)}
    result = api.simulate("gpt3-125m", "1x2xA100-SXM4-80GB",
                          dict(BASE, schedule="1f1b", instruction_freq_mhz=clocks))
    tasks = result.tasks
    backward = tasks[(tasks.stream == "compute") & (tasks.kind == "backward")]
    assert len(backward) and set(backward.freq_mhz) == {810.0}


def test_a_locked_clock_holds_for_the_optimizer_step() -> None:
    """`freq_mhz` / `stage_freq_mhz` lock the GPU's clock, so the optimizer step runs at it
    too (it ran at the maximum: V100 at 135 MHz, optimizer at 1530 MHz, the bug hunt);
    per-instruction clocks (Perseus's) leave it at the default maximum."""
    hw = api.load_cluster("1x2xA100-SXM4-80GB")
    for fields, want in ((dict(BASE, freq_mhz=1005.0), {1005.0}),
                         (dict(BASE, stage_freq_mhz=(1005.0, 1200.0)), {1005.0, 1200.0}),
                         (dict(BASE, instruction_freq_mhz={"0F0": 1005.0}),
                          {hw.gpu(0).sm_clock_max_mhz})):
        tasks = api.simulate("gpt3-125m", hw, fields).tasks
        assert set(tasks[tasks.kind == "optimizer"].freq_mhz) == want
