"""Reading Kineto / torch.profiler Chrome traces and trainsim traces; bad input."""

from __future__ import annotations

import json

import pytest

from trainsim.cli import main
from trainsim.errors import TraceError
from trainsim.validate.trace_import import load_kineto, parse_kineto
from trainsim.validate.trace_record import MeasuredTrace, import_kineto


def _kineto() -> dict:
    """A hand-written Kineto trace: a forward range holding an aten op, a backward node, an
    optimizer step, and memory events peaking at 3000 bytes."""
    ev = [
        {"ph": "X", "name": "op:matmul:attn.qkv", "pid": 1, "tid": 1, "ts": 0.0, "dur": 100.0},
        {"ph": "X", "name": "aten::addmm", "pid": 1, "tid": 1, "ts": 10.0, "dur": 80.0},
        {"ph": "X", "name": "op:attention_score:attn.score", "pid": 1, "tid": 1, "ts": 100.0,
         "dur": 50.0},
        {"ph": "X", "name": "autograd::engine::evaluate_function: AddmmBackward0", "pid": 1,
         "tid": 2, "ts": 200.0, "dur": 200.0},
        {"ph": "X", "name": "Optimizer.step#Adam.step", "pid": 1, "tid": 1, "ts": 500.0,
         "dur": 40.0},
        {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 5.0,
         "args": {"Total Allocated": 1000, "Bytes": 1000}},
        {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 6.0,
         "args": {"Total Allocated": 3000, "Bytes": 2000}},
        {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 7.0,
         "args": {"Total Allocated": 500, "Bytes": -2500}},
    ]
    return {"schemaVersion": 1, "traceEvents": ev}


def test_kineto_spans_fold_into_op_kinds():
    """Top-level spans map to kinds (nested aten ops are not counted twice); the attention
    GEMMs fold into "attention"; the trace spans 0..540 µs; peak memory is the largest
    Total Allocated."""
    k = parse_kineto(_kineto())
    assert k["kind_s"] == pytest.approx({"matmul": 300e-6, "attention": 50e-6,
                                         "optimizer": 40e-6})
    assert k["span_s"] == pytest.approx(540e-6)
    assert k["peak_allocated_bytes"] == 3000


def test_import_of_a_kineto_file(tmp_path):
    """`import_kineto` turns a Kineto file into a trace of the given model and plan."""
    path = tmp_path / "k.json"
    path.write_text(json.dumps(_kineto()))
    trace = import_kineto(path, "micro-gpt", {"dp": 1, "tp": 1, "pp": 1, "micro_batch_size": 1,
                                              "num_micro_batches": 1})
    assert trace.iteration_time_s == pytest.approx(540e-6)
    assert trace.ranks[0]["kind_s"]["matmul"] == pytest.approx(300e-6)
    back = MeasuredTrace.from_dict(trace.to_dict())
    assert back.iteration_times_s == trace.iteration_times_s


@pytest.mark.slow  # imports torch and runs torch.profiler
def test_real_torch_profiler_trace_imports(tmp_path):
    """A trace exported by torch.profiler itself parses, with CPU memory events."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(64, 64, requires_grad=True)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        y = torch.nn.functional.linear(x, x).sum()
        y.backward()
    path = tmp_path / "real.json"
    prof.export_chrome_trace(str(path))
    k = load_kineto(path)
    assert k["kind_s"].get("matmul", 0) > 0
    assert k["peak_allocated_bytes"] >= 64 * 64 * 4


def test_truncated_and_wrong_files_are_trace_errors(tmp_path):
    """A truncated JSON file, a non-trace JSON and a plain Kineto trace given where a
    trainsim trace is expected all raise TraceError."""
    bad = tmp_path / "t.json"
    bad.write_text('{"format": "trainsim-trace", "ver')
    with pytest.raises(TraceError, match="not valid JSON"):
        MeasuredTrace.load(bad)
    bad.write_text('{"hello": 1}')
    with pytest.raises(TraceError, match="not a trainsim trace"):
        MeasuredTrace.load(bad)
    bad.write_text(json.dumps(_kineto()))
    with pytest.raises(TraceError, match="sim trace --import"):
        MeasuredTrace.load(bad)
    with pytest.raises(TraceError, match="no complete"):
        parse_kineto({"traceEvents": []})


def test_cli_bad_trace_is_one_line_exit_2(tmp_path, capsys):
    """`sim validate` on a truncated file or a trace of an unknown model prints one error
    line and exits 2."""
    bad = tmp_path / "t.json"
    bad.write_text('{"format": "trainsim-tr')
    with pytest.raises(SystemExit) as exc:
        main(["validate", str(bad), "--profile", str(bad)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:")
    trace = {"format": "trainsim-trace", "version": 1, "model": "no-such-model",
             "plan": {"dp": 1, "tp": 1, "pp": 1, "micro_batch_size": 1,
                      "num_micro_batches": 1}, "iteration_times_s": [0.1],
             "ranks": [{"rank": 0, "stage": 0, "compute_s": 0.05}]}
    good = tmp_path / "u.json"
    good.write_text(json.dumps(trace))
    from trainsim.validate.profile_db import ProfileDB, ProfileRow

    prof = tmp_path / "p.csv"
    ProfileDB(meta={"device": "cpu"}, rows=(
        ProfileRow(kind="matmul", shape=(8, 8, 8), flops=1024.0, time_s=1e-5),
        ProfileRow(kind="layernorm", shape=(64,), flops=320.0, bytes_moved=512.0, time_s=1e-6),
        ProfileRow(kind="all_reduce", pass_="comm", group_size=2, size_bytes=4096.0,
                   time_s=1e-4),
        ProfileRow(kind="all_reduce", pass_="comm", group_size=2, size_bytes=2.0**20,
                   time_s=1e-3))).save(prof)
    with pytest.raises(SystemExit) as exc:
        main(["validate", str(good), "--profile", str(prof)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown model 'no-such-model'" in err[0]


def test_communication_is_counted_once_and_out_of_the_op_it_is_nested_in():
    """gloo runs an all-reduce on its worker thread (tid 2, 20..150 µs) while the caller sits
    in c10d::allreduce_ (tid 1, 0..100 µs): comm is their union, 150 µs, not 230. An
    all-reduce nested in the embedding's range (250..280 µs of 200..300) is comm, so the
    embedding keeps 70 µs."""
    ev = [
        {"ph": "X", "name": "c10d::allreduce_", "pid": 1, "tid": 1, "ts": 0.0, "dur": 100.0},
        {"ph": "X", "name": "gloo:all_reduce", "pid": 1, "tid": 2, "ts": 20.0, "dur": 130.0},
        {"ph": "X", "name": "op:embedding:embedding", "pid": 1, "tid": 1, "ts": 200.0,
         "dur": 100.0},
        {"ph": "X", "name": "c10d::allreduce_", "pid": 1, "tid": 1, "ts": 250.0, "dur": 30.0},
    ]
    k = parse_kineto({"traceEvents": ev})
    assert k["kind_s"]["comm"] == pytest.approx(180e-6)
    assert k["kind_s"]["embedding"] == pytest.approx(70e-6)


def test_an_isend_in_flight_does_not_hide_the_ops_computed_meanwhile():
    """gloo records an isend as a span on the caller's thread from enqueue (0 µs) to the
    peer's receipt (500 µs); the matmul computed meanwhile (100..300 µs) keeps its 200 µs and
    comm is only the time no op covers: 500 − 200 = 300 µs."""
    ev = [
        {"ph": "X", "name": "gloo:send", "pid": 1, "tid": 1, "ts": 0.0, "dur": 500.0},
        {"ph": "X", "name": "op:matmul:mlp.fc1", "pid": 1, "tid": 1, "ts": 100.0, "dur": 200.0},
    ]
    k = parse_kineto({"traceEvents": ev})
    assert k["kind_s"]["matmul"] == pytest.approx(200e-6)
    assert k["kind_s"]["comm"] == pytest.approx(300e-6)
