"""`sim validate`'s per-kind table: communication is predicted, unmodelled kinds say n/a.

Uses the traces and profile recorded in traces/ (tiny-gpt on 2 CPU processes), so it runs the
simulator only (about a second), no torch workers.
"""

from __future__ import annotations

import dataclasses

import pytest

from trainsim.validate.compare import compare, format_report, idle_s
from trainsim.validate.contention import COMPUTE_STREAMS
from trainsim.validate.profile_db import ProfileDB
from trainsim.validate.trace_record import MeasuredTrace


@pytest.fixture(scope="module")
def db(traces_dir) -> ProfileDB:
    return ProfileDB.load(traces_dir / "profile.csv")


@pytest.mark.parametrize("plan", ["dp2", "pp2", "tp2"])
def test_comm_is_predicted_as_the_ranks_time_outside_compute(db, traces_dir, plan) -> None:
    """Predicted comm = what measured comm counts (time in torch.distributed outside ops,
    waits for the peer included) on the simulated timeline: each stage's first rank's time
    from the iteration's start to its last task that its compute stream (and the gradient
    copies' streams, the harness's own computation) is idle — not 0 with a fake −100 %; the
    measured tensor-parallel autograd nodes (tp_comm) are folded into measured comm."""
    c = compare(MeasuredTrace.load(traces_dir / f"tiny-gpt-{plan}.json"), db)
    kinds = {k["kind"]: k for k in c.kinds}
    tasks = c.result.tasks
    expected = 0.0
    for s in range(c.plan["pp"]):
        mine = tasks[tasks["rank"] == s]
        compute = mine[mine["stream"].isin(COMPUTE_STREAMS)]
        expected += float(mine["end_s"].max()) - float(compute["duration_s"].sum())
    assert expected > 0
    assert kinds["comm"]["predicted_s"] == pytest.approx(expected)
    assert kinds["comm"]["predicted_s"] == pytest.approx(
        sum(idle_s(tasks, s) for s in range(c.plan["pp"])))
    assert kinds["comm"]["error"] == pytest.approx(
        (expected - kinds["comm"]["measured_s"]) / kinds["comm"]["measured_s"])
    assert "tp_comm" not in kinds


def test_idle_time_of_a_hand_made_timeline() -> None:
    """Compute [0, 1) and [2, 3), a collective [1, 2) on another stream and a transfer that
    ends at 3.5: the rank is idle 1 + 0.5 s; overlapping compute tasks count once; a rank
    without tasks is never idle."""
    import pandas as pd

    tasks = pd.DataFrame({
        "rank": [0, 0, 0, 0, 1],
        "stream": ["compute", "tp", "compute", "pp0>1", "compute"],
        "start_s": [0.0, 1.0, 2.0, 3.0, 0.0],
        "end_s": [1.0, 2.0, 3.0, 3.5, 2.0],
    })
    assert idle_s(tasks, 0) == pytest.approx(1.5)
    assert idle_s(tasks, 1) == 0.0
    both = pd.concat([tasks, pd.DataFrame({"rank": [1], "stream": ["compute"],
                                           "start_s": [1.0], "end_s": [3.0]})])
    assert idle_s(both, 1) == 0.0
    assert idle_s(tasks, 7) == 0.0


def test_unpredicted_kind_reports_n_a(db, traces_dir) -> None:
    """"other" (framework time outside ops) has no prediction: predicted_s and error are None
    and the report prints n/a; no row of the report shows −100.0 %."""
    c = compare(MeasuredTrace.load(traces_dir / "tiny-gpt-dp2.json"), db)
    other = {k["kind"]: k for k in c.kinds}["other"]
    assert other["measured_s"] > 0
    assert other["predicted_s"] is None and other["error"] is None
    report = format_report(c)
    line = next(ln for ln in report.splitlines() if ln.strip().startswith("other"))
    assert line.split()[-2:] == ["n/a", "n/a"]
    assert "-100.0%" not in report


def test_machine_speed_factor_scales_the_profiled_op_times(db, traces_dir) -> None:
    """A trace whose reference GEMM took twice the profile's was recorded on a machine running
    at half the speed: the factor is 2 and every op estimate doubles; without the figure the
    factor is 1; a non-number is a TraceError naming the field."""
    import dataclasses

    from trainsim.errors import TraceError
    from trainsim.validate.compare import profile_reference_s, speed_factor
    from trainsim.validate.profiled_cost import ProfiledCostModel

    trace = MeasuredTrace.load(traces_dir / "tiny-gpt-dp2.json")
    machine = dict(trace.machine, reference_gemm_s=2 * profile_reference_s(db))
    slow = dataclasses.replace(trace, machine=machine)
    assert speed_factor(slow, db) == pytest.approx(2.0)
    assert speed_factor(dataclasses.replace(trace, machine={}), db) == 1.0
    args = ("matmul", 2 * 256 * 1024 * 256, 0.0, (256, 1024, 256))
    assert ProfiledCostModel(db, scale=2.0).time_s(*args) == pytest.approx(
        2 * ProfiledCostModel(db).time_s(*args))
    with pytest.raises(TraceError, match="reference_gemm_s='x'"):
        speed_factor(dataclasses.replace(trace, machine=dict(machine, reference_gemm_s="x")), db)


def test_profile_side_of_the_speed_factor(db) -> None:
    """The profile's reference: the median of its forward rows of the reference GEMM's shape
    (timed like and among the ops it stands for), whatever its ends' figure says, warmed up or
    not; without such a row, the ends' figure."""
    import dataclasses

    from trainsim.validate.compare import profile_reference_s

    shape = tuple(db.meta["reference_gemm"])
    rows = sorted(r.time_s for r in db.ops("matmul", "fwd") if r.shape == shape)
    old = dataclasses.replace(db, meta={k: v for k, v in db.meta.items()
                                        if k != "reference_warmup_s"})
    assert rows and profile_reference_s(old) == pytest.approx(rows[len(rows) // 2])
    warm = dataclasses.replace(db, meta=dict(old.meta, reference_warmup_s=0.5,
                                             reference_gemm_s=7e-3))
    assert profile_reference_s(warm) == pytest.approx(rows[len(rows) // 2])
    tupled = dataclasses.replace(old, meta=dict(old.meta, reference_gemm=shape))
    assert profile_reference_s(tupled) == profile_reference_s(old)
    bare = dataclasses.replace(warm, rows=tuple(r for r in db.rows if r.shape != shape))
    assert profile_reference_s(bare) == pytest.approx(7e-3)


def test_in_model_factor_is_the_whole_model_over_its_ops(db) -> None:
    """A profile's ``model:<name>`` row over the sum of that model's profiled ops (forward and
    backward of one micro-batch) is the factor, all at once and solo (each over its own op
    times; a row without a solo time gives the all-at-once ratio); doubling the row doubles it;
    a row at another micro-batch size, or none, gives 1; the row is not an op anywhere."""
    import dataclasses

    from trainsim.validate.compare import in_model_factor, predicted_kind_s
    from trainsim.validate.cpu_hardware import derive_figures
    from trainsim.validate.profile_db import ProfileRow
    from trainsim.validate.profiled_cost import ProfiledCostModel
    from trainsim.validate.small_models import get_validation_model
    from trainsim.workloads.model import build_graph

    spec = get_validation_model("tiny-t5")
    layers = list(build_graph(spec, 2).layers)

    def op_sum(solo: bool) -> float:
        ops = predicted_kind_s(ProfiledCostModel(db, solo=solo), layers, 1, 1, 0.0)
        ops.pop("optimizer")
        return sum(ops.values())

    total, solo_total = op_sum(False), op_sum(True)
    assert solo_total != pytest.approx(total)
    base = tuple(r for r in db.rows if r.pass_ != "fwdbwd")
    row = ProfileRow(kind="model:tiny-t5", shape=(2,), pass_="fwdbwd", time_s=1.4 * total,
                     p25_s=total, p75_s=2 * total, repeats=10, solo_s=1.25 * solo_total)
    with_row = dataclasses.replace(db, rows=base + (row,))
    assert in_model_factor(with_row, spec, 2, solo=False) == pytest.approx(1.4)
    assert in_model_factor(with_row, spec, 2, solo=True) == pytest.approx(1.25)
    no_solo = dataclasses.replace(db, rows=base + (dataclasses.replace(row, solo_s=0.0),))
    assert in_model_factor(no_solo, spec, 2, solo=True) == pytest.approx(1.4)
    twice = dataclasses.replace(db, rows=base + (dataclasses.replace(row, time_s=2.8 * total),))
    assert in_model_factor(twice, spec, 2, solo=False) == pytest.approx(2.8)
    assert in_model_factor(with_row, spec, 4, solo=False) == 1.0
    assert in_model_factor(dataclasses.replace(db, rows=base), spec, 2, solo=False) == 1.0
    # the row is no op: op answers, kinds, figures and solo detection ignore it
    bare = dataclasses.replace(db, rows=base)
    args = ("matmul", 2 * 256 * 1024 * 256, 0.0, (256, 1024, 256))
    assert ProfiledCostModel(with_row).time_s(*args) == ProfiledCostModel(bare).time_s(*args)
    assert with_row.kinds() == bare.kinds() and "model:tiny-t5" not in with_row.kinds()
    assert derive_figures(with_row) == derive_figures(bare)
    unsolo = tuple(dataclasses.replace(r, solo_s=0.0) for r in base)
    assert not dataclasses.replace(db, rows=unsolo + (row,)).has_solo()


def test_in_model_scales_are_each_kinds_time_inside_the_model_over_back_to_back(db) -> None:
    """`in_model_scales`: each kind's forwards (and backwards, by folded kind) timed inside the
    whole model over the same ops' back-to-back rows, then one factor for what the whole
    micro-batch leaves; None without in-model rows or at another micro-batch size. The
    back-to-back sums are read here straight from the profile's rows."""
    import dataclasses

    from trainsim.validate.compare import in_model_scales
    from trainsim.validate.profile_db import ProfileRow
    from trainsim.validate.small_models import get_validation_model
    from trainsim.validate.trace_import import KIND_ALIASES
    from trainsim.workloads.model import build_graph

    spec = get_validation_model("tiny-gpt")
    plain = dataclasses.replace(db, rows=tuple(
        r for r in db.rows if not r.pass_.endswith("_in_model") and r.pass_ != "fwdbwd"))

    def row_s(kind: str, shape: tuple[int, ...], pass_: str, flops: float,
              bytes_moved: float | None) -> float:
        hits = [r.time_s for r in plain.ops(kind, pass_) if r.shape == tuple(shape)
                and r.flops == pytest.approx(flops)
                and (bytes_moved is None or r.bytes_moved == pytest.approx(bytes_moved))]
        assert len(hits) == 1, (kind, shape, pass_)
        return hits[0]

    fwd: dict[str, float] = {}
    bwd: dict[str, float] = {}
    for layer in build_graph(spec, 2).layers:
        for op in layer.sharded_ops(1):
            gemm = op.kind == "matmul"
            f = row_s(op.kind, op.shape, "fwd", op.fwd_flops, None if gemm else op.fwd_bytes)
            b = row_s(op.kind, op.shape, "bwd", op.bwd_flops, None if gemm else op.bwd_bytes)
            fwd[op.kind] = fwd.get(op.kind, 0.0) + f
            k = KIND_ALIASES.get(op.kind, op.kind)
            bwd[k] = bwd.get(k, 0.0) + b
    fwd_x = {k: (2.0 if k == "layernorm" else 1.0) for k in fwd}
    bwd_x = {k: (3.0 if k == "layernorm" else 1.0) for k in bwd}
    inside = sum(fwd_x[k] * v for k, v in fwd.items()) + sum(bwd_x[k] * v for k, v in bwd.items())

    def row(kind: str, pass_: str, t: float) -> ProfileRow:
        return ProfileRow(kind=kind, shape=(2,), pass_=pass_, time_s=t, repeats=10)

    rows = [row("model:tiny-gpt", "fwdbwd", 1.1 * inside)]
    rows += [row(f"model:tiny-gpt:{k}", "fwd_in_model", fwd_x[k] * v) for k, v in fwd.items()]
    rows += [row(f"model:tiny-gpt:{k}", "bwd_in_model", bwd_x[k] * v) for k, v in bwd.items()]
    with_rows = dataclasses.replace(plain, rows=plain.rows + tuple(rows))
    got = in_model_scales(with_rows, spec, 2)
    assert got is not None
    assert got[0] == pytest.approx(fwd_x) and got[1] == pytest.approx(bwd_x)
    assert got[2][0] == pytest.approx(1.1)  # no solo time in the row: the same figure solo
    assert got[2][1] == pytest.approx(1.1)
    assert in_model_scales(with_rows, spec, 4) is None
    assert in_model_scales(plain, spec, 2) is None
    # the in-model rows are no ops
    assert with_rows.kinds() == plain.kinds()


def test_a_profile_row_is_matched_by_flops_and_bytes(db) -> None:
    """A vocab-parallel embedding's backward at tp 2 has the FLOPs of its forward at tp 1 on
    the same shape; the bytes tell them apart, so each query gets its own row."""
    import dataclasses

    from trainsim.validate.profile_db import ProfileRow
    from trainsim.validate.profiled_cost import ProfiledCostModel

    fwd_tp1 = ProfileRow(kind="embedding", shape=(65536,), pass_="fwd", flops=65536.0,
                         bytes_moved=786432.0, time_s=3e-5, repeats=10)
    bwd_tp2 = ProfileRow(kind="embedding", shape=(65536,), pass_="bwd", flops=65536.0,
                         bytes_moved=655360.0, time_s=3e-4, repeats=10)
    others = tuple(r for r in db.rows if r.kind != "embedding")
    both = dataclasses.replace(db, rows=others + (fwd_tp1, bwd_tp2))
    cost = ProfiledCostModel(both)
    assert cost.time_s("embedding", 65536.0, 655360.0, (65536,)) == pytest.approx(3e-4)
    assert cost.time_s("embedding", 65536.0, 786432.0, (65536,)) == pytest.approx(3e-5)


def test_a_profile_recorded_under_another_cpu_binding_is_named(db, traces_dir, capsys) -> None:
    """The committed trace and profile were both recorded bound: no warning. Against a profile
    without ``cpu_binding`` (recorded unbound, before binding existed) the comparison says so,
    in its JSON and as the report's last line."""
    trace = MeasuredTrace.load(traces_dir / "tiny-gpt-tp2.json")
    assert compare(trace, db).warnings == ()
    unbound = ProfileDB(meta={k: v for k, v in db.meta.items() if k != "cpu_binding"},
                        rows=db.rows)
    c = compare(trace, unbound)
    assert len(c.warnings) == 1 and "profile not recorded (unbound)" in c.warnings[0]
    assert c.to_dict()["warnings"] == list(c.warnings)
    assert format_report(c).splitlines()[-1] == f"warning: {c.warnings[0]}"
    assert "warnings" not in compare(trace, db).to_dict()


def test_unbound_runs_agree_however_they_say_so(db, traces_dir) -> None:
    """A trace that says it ran unbound ("none ...", `devices.cpu_binding(None)`) against a
    profile without the field (unbound, before the field existed) ran alike: no warning. Bound
    runs on other CPUs ran alike too; bound against unbound still warns."""
    from trainsim.validate.devices import cpu_binding

    trace = MeasuredTrace.load(traces_dir / "tiny-gpt-tp2.json")
    no_field = {k: v for k, v in db.meta.items() if k != "cpu_binding"}

    def warns(trace_binding: str, profile_meta: dict) -> bool:
        t = dataclasses.replace(trace, machine={**trace.machine, "cpu_binding": trace_binding})
        return bool(compare(t, ProfileDB(meta=profile_meta, rows=db.rows)).warnings)

    assert not warns(cpu_binding(None), no_field)
    assert not warns(cpu_binding(None), {**db.meta, "cpu_binding": cpu_binding(None)})
    assert not warns(cpu_binding([3, 7]), {**db.meta, "cpu_binding": cpu_binding([0, 1])})
    assert warns(cpu_binding([0, 1]), {**db.meta, "cpu_binding": cpu_binding(None)})
    assert warns(cpu_binding(None), {**db.meta, "cpu_binding": cpu_binding([0, 1])})
