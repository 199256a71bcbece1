"""Published training runs: the CSV is checked (errors name file, line and field), each row
maps to model, cluster and plan or to a one-line reason (never dropped), and the statistics
are what the definitions say on hand-made numbers."""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from trainsim.errors import DataFileError
from trainsim.validate import published_runs as pr
from trainsim.workloads.plan import ParallelPlan

TINY = {  # a small LLaMA-style run on 2 A100s: fast to simulate
    "source": "hand", "name": "tiny", "gpu": "A100-SXM4-80GB", "nodes": "1",
    "gpus_per_node": "2", "params_b": "", "layers": "2", "hidden": "256", "heads": "4",
    "kv_heads": "2", "ffn": "512", "seq": "128", "vocab": "1000", "tp": "1", "pp": "1",
    "cp": "1", "dp": "2", "global_batch": "8", "micro_batch": "2", "virtual_stages": "",
    "sequence_parallel": "", "recompute": "selective", "zero": "3", "dtype": "bf16",
    "framework": "torchtitan", "ref_kind": "tokens_per_s_per_gpu", "ref_value": "1000",
    "notes": "hand-made",
}


def write_csv(path: Path, rows: list[dict[str, str]], columns: tuple[str, ...] = pr.COLUMNS
              ) -> Path:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


def run_of(**changes: str) -> pr.PublishedRun:
    return pr.PublishedRun(line=2, cells={**TINY, **changes})


def test_read_runs_parses_rows_with_their_lines(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "runs.csv", [TINY, {**TINY, "ref_kind": "peak_memory_gib",
                                                    "ref_value": "12.5", "notes": "a\nb"}])
    runs = pr.read_runs(path)
    assert [r.line for r in runs] == [2, 3]
    assert runs[1].ref_value == 12.5 and runs[1].ref_kind == pr.MEMORY
    assert runs[0].config_key == runs[1].config_key
    assert runs[0].gpus == 2


@pytest.mark.parametrize(("rows", "columns", "needles"), [
    ([TINY], tuple(c for c in pr.COLUMNS if c != "dp"), (":1", "'dp'")),
    ([TINY, {**TINY, "tp": "two"}], pr.COLUMNS, (":3", "'tp'", "positive integer")),
    ([{**TINY, "ref_kind": "mfu"}], pr.COLUMNS, (":2", "'ref_kind'")),
    ([{**TINY, "gpu": ""}], pr.COLUMNS, (":2", "'gpu'", "required")),
    ([{**TINY, "ref_value": "-3"}], pr.COLUMNS, (":2", "'ref_value'")),
    ([{**TINY, "recompute": "some"}], pr.COLUMNS, (":2", "'recompute'")),
])
def test_bad_csv_names_file_line_and_field(tmp_path: Path, rows: list[dict[str, str]],
                                           columns: tuple[str, ...],
                                           needles: tuple[str, ...]) -> None:
    path = write_csv(tmp_path / "bad.csv", rows, columns)
    with pytest.raises(DataFileError) as info:
        pr.read_runs(path)
    message = str(info.value)
    assert str(path) in message
    for needle in needles:
        assert needle in message


def test_unknown_column_short_row_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataFileError, match="unknown column 'extra'"):
        pr.read_runs(write_csv(tmp_path / "x.csv", [TINY], (*pr.COLUMNS, "extra")))
    short = tmp_path / "short.csv"
    short.write_text(",".join(pr.COLUMNS) + "\nhand,tiny\n", encoding="utf-8")
    with pytest.raises(DataFileError, match=r"short.csv:2: 2 cells"):
        pr.read_runs(short)
    with pytest.raises(DataFileError, match="no such CSV"):
        pr.read_runs(tmp_path / "absent.csv")
    (tmp_path / "empty.csv").write_text("", encoding="utf-8")
    with pytest.raises(DataFileError, match="empty file"):
        pr.read_runs(tmp_path / "empty.csv")


def test_llama_row_maps_to_model_cluster_and_plan() -> None:
    expressed = pr.express(run_of())
    assert isinstance(expressed, pr.Expressed)
    model, plan = expressed.model, expressed.plan
    assert (model.family, model.num_layers, model.hidden, model.num_kv_heads) == \
        ("llama", 2, 256, 2)
    assert (model.ffn_hidden, model.vocab_size, model.norm) == (512, 1000, "rmsnorm")
    assert expressed.cluster.num_gpus == 2
    assert (plan.dp, plan.tp, plan.pp, plan.global_batch, plan.micro_batch_size) == \
        (2, 1, 1, 8, 2)
    assert (plan.recompute, plan.zero, plan.dtype, plan.seq_len) == \
        ("selective", 3, "bf16", 128)
    assert plan.schedule == "1f1b"


def test_interleaved_and_gpt_shape_and_assumptions() -> None:
    expressed = pr.express(run_of(kv_heads="", vocab="", pp="2", dp="1", virtual_stages="",
                                  recompute="", zero="", framework="nemo", layers="4"))
    assert isinstance(expressed, pr.Expressed)
    assert expressed.model.family == "gpt" and expressed.model.vocab_size > 0
    # NeMo's recipes shard optimizer state (distributed optimizer): an empty zero cell is 1
    assert expressed.plan.zero == 1 and expressed.plan.recompute == "none"
    notes = " ".join(expressed.assumptions)
    for field in ("vocab", "virtual_stages", "recompute", "zero"):
        assert f"{field} not stated" in notes
    interleaved = pr.express(run_of(pp="2", dp="1", virtual_stages="2", layers="4"))
    assert isinstance(interleaved, pr.Expressed)
    assert (interleaved.plan.schedule, interleaved.plan.virtual_stages) == ("interleaved", 2)


@pytest.mark.parametrize(("changes", "needle"), [
    ({"gpu": "B200-SXM-192GB"}, "GPU 'B200-SXM-192GB'"),
    ({"dtype": "fp8"}, "dtype fp8"),
    ({"global_batch": ""}, "global batch not stated"),
    ({"layers": "", "hidden": "", "heads": ""}, "model shape not stated"),
    ({"framework": "jax"}, "framework 'jax'"),
    ({"dp": "4"}, "plan refused"),
])
def test_rows_trainsim_cannot_express_get_a_reason(changes: dict[str, str], needle: str) -> None:
    outcome = pr.express(run_of(**changes))
    assert isinstance(outcome, pr.NotExpressible)
    assert needle in outcome.reason and "\n" not in outcome.reason


def test_context_parallel_row_is_listed_or_modelled() -> None:
    """cp > 1 is a reason until ParallelPlan grows a cp degree; then the row maps to it."""
    outcome = pr.express(run_of(cp="2", dp="1"))
    if "cp" in {f.name for f in dataclasses.fields(ParallelPlan)}:
        assert isinstance(outcome, pr.Expressed)
    else:
        assert isinstance(outcome, pr.NotExpressible) and "cp=2" in outcome.reason


def test_evaluate_shares_one_simulation_per_configuration(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    calls: list[Any] = []
    real = pr.predict

    def counting(*args: Any, **kwargs: Any) -> dict[str, Any]:
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(pr, "predict", counting)
    runs = pr.read_runs(write_csv(tmp_path / "runs.csv", [
        TINY, {**TINY, "ref_kind": "peak_memory_gib", "ref_value": "10"},
        {**TINY, "name": "cp", "cp": "2", "dp": "1"}, {**TINY, "gpu": "Z9"}]))
    seen: list[int] = []
    results, skipped = pr.evaluate(runs, on_row=lambda done, total, run: seen.append(done))
    assert len(calls) == 1 + ("cp" in {f.name for f in dataclasses.fields(ParallelPlan)})
    assert {r.run.line for r in results} | {s.run.line for s in skipped} == {2, 3, 4, 5}
    assert seen[-1] == 4
    throughput = next(r for r in results if r.run.ref_kind == pr.THROUGHPUT)
    assert throughput.predicted > 0 and throughput.generation == "Ampere"
    assert throughput.error == pytest.approx(throughput.predicted / 1000 - 1)


def _result(source: str, kind: str, measured: float, predicted: float,
            gpu: str = "A100-SXM4-80GB") -> pr.RowResult:
    run = run_of(source=source, ref_kind=kind, ref_value=str(measured), gpu=gpu)
    return pr.RowResult(run, predicted, "Hopper" if gpu.startswith("H100") else "Ampere")


def test_group_stats_on_hand_made_numbers() -> None:
    results = [_result("a", pr.THROUGHPUT, 100, 110), _result("b", pr.THROUGHPUT, 200, 180),
               _result("b", pr.MEMORY, 50, 75, gpu="H100-SXM5-80GB")]
    stats = {(s.kind, s.grouping, s.group): s for s in pr.group_stats(results)}
    overall = stats[(pr.THROUGHPUT, "overall", "all")]
    assert overall.count == 2
    assert overall.mape == pytest.approx(0.10)
    assert overall.mean_signed_error == pytest.approx(0.0)
    assert stats[(pr.THROUGHPUT, "source", "b")].mean_signed_error == pytest.approx(-0.10)
    assert stats[(pr.MEMORY, "GPU generation", "Hopper")].mape == pytest.approx(0.5)
    assert (pr.MEMORY, "GPU generation", "Ampere") not in stats
    assert {s.grouping for s in stats.values()} == set(pr.GROUPINGS)
    rows = pr.stats_rows(pr.group_stats(results))
    assert [pr.THROUGHPUT, "overall", "all", "2", "10.0%", "+0.0%"] in rows
    assert pr.result_rows(results)[0][6] == "+10.0%"


def test_default_csv_path_follows_the_environment(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(pr.SHARED_DATA_ENV, str(tmp_path))
    assert pr.default_csv_path() == tmp_path / "published" / "training_runs.csv"


@pytest.mark.slow
def test_every_published_row_is_compared_or_listed(
        shared_subdir: Callable[[str], Path]) -> None:
    """Structure only: each row of the published CSV is either predicted or has a reason."""
    path = shared_subdir("published") / "training_runs.csv"
    runs = pr.read_runs(path)
    results, skipped = pr.evaluate(runs)
    assert sorted([r.run.line for r in results] + [s.run.line for s in skipped]) == \
        [r.line for r in runs]
    assert all(r.predicted > 0 for r in results)
    assert all(s.reason and "\n" not in s.reason for s in skipped)
    kinds = {s.kind for s in pr.group_stats(results)}
    assert kinds <= set(pr.REF_KINDS)


@pytest.mark.parametrize(("framework", "cell", "sp"), [
    ("torchtitan", "", True),    # torchtitan shards the norms with TP (frameworks.yaml)
    ("nemo", "", True),          # NeMo's recipes turn sequence_parallelism on
    ("megatron", "", False),     # Megatron-LM's --sequence-parallel is opt-in
    ("torchtitan", "false", False),  # a stated cell wins
])
def test_empty_sequence_parallel_takes_the_frameworks_default(framework: str, cell: str,
                                                              sp: bool) -> None:
    expressed = pr.express(run_of(framework=framework, sequence_parallel=cell, tp="2", dp="1",
                                  zero="0"))
    assert isinstance(expressed, pr.Expressed), expressed
    assert expressed.plan.sp is sp
    noted = any("sequence_parallel not stated" in n for n in expressed.assumptions)
    assert noted is (cell == "")
    single = pr.express(run_of(framework=framework, sequence_parallel=cell))  # tp = 1
    assert isinstance(single, pr.Expressed) and single.plan.sp is False


def test_torchtitan_local_batch_is_split_over_the_pipeline() -> None:
    piped = pr.express(run_of(framework="torchtitan", pp="2", dp="1", micro_batch="8",
                              global_batch="8", zero="0"))
    assert isinstance(piped, pr.Expressed), piped
    assert (piped.plan.micro_batch_size, piped.plan.num_micro_batches) == (4, 2)
    assert any("split into pp=2" in n for n in piped.assumptions)
    stated = pr.express(run_of(framework="megatron", pp="2", dp="1", micro_batch="8",
                               global_batch="8", zero="0"))
    assert isinstance(stated, pr.Expressed) and stated.plan.micro_batch_size == 8


def test_interleaved_row_without_virtual_stages_takes_the_frameworks_default() -> None:
    """torchtitan builds two model chunks per rank for multi-stage schedules unless told
    (generate_split_points); a row that names the interleaved schedule but leaves the virtual
    stages empty gets them, noted; a 1F1B row and a stack without a default keep one."""
    named = pr.express(run_of(framework="torchtitan", pp="2", dp="1", layers="4", zero="0",
                              name="tiny interleaved", notes="Interleaved 1F1B"))
    assert isinstance(named, pr.Expressed), named
    assert (named.plan.schedule, named.plan.virtual_stages) == ("interleaved", 2)
    assert "virtual_stages not stated: 2" in named.assumptions
    plain = pr.express(run_of(framework="torchtitan", pp="2", dp="1", layers="4", zero="0"))
    assert isinstance(plain, pr.Expressed) and plain.plan.virtual_stages == 1
    megatron = pr.express(run_of(framework="megatron", pp="2", dp="1", layers="4", zero="0",
                                 notes="Interleaved 1F1B"))
    assert isinstance(megatron, pr.Expressed) and megatron.plan.virtual_stages == 1


def test_a_row_that_says_torch_compile_runs_the_compiled_profile() -> None:
    compiled = pr.express(run_of(framework="torchtitan", notes="FSDP + torch.compile"))
    assert isinstance(compiled, pr.Expressed), compiled
    assert dict(compiled.model.unfused_traffic) == {"cross_entropy": 4.6}  # the eager loss
    assert "torch.compile named: profile torchtitan-compile" in compiled.assumptions
    eager = pr.express(run_of(framework="torchtitan", notes="FSDP, eager"))
    assert isinstance(eager, pr.Expressed) and dict(eager.model.unfused_traffic)["rmsnorm"] == 9


def test_an_empty_zero_cell_takes_the_frameworks_distributed_optimizer() -> None:
    nemo = pr.express(run_of(framework="nemo", zero="", recompute="none"))
    assert isinstance(nemo, pr.Expressed) and nemo.plan.zero == 1
    assert "zero not stated: 1" in nemo.assumptions
    megatron = pr.express(run_of(framework="megatron", zero="", recompute="none"))
    assert isinstance(megatron, pr.Expressed) and megatron.plan.zero == 0


def test_as_above_notes_inherit_the_previous_rows_setup(tmp_path: Path) -> None:
    """A row whose notes say "as above" repeats the previous row's setup (here compile)."""
    first = {**TINY, "name": "a", "notes": "Table 4 FSDP + compile + Float8"}
    second = {**TINY, "name": "b", "notes": "Table 4 as above + AsyncTP"}
    other = {**TINY, "source": "elsewhere", "name": "c", "notes": "as above"}
    runs = pr.read_runs(write_csv(tmp_path / "runs.csv", [first, second, other]))
    assert "compile" in runs[1].cells["notes"] and runs[2].cells["notes"] == "as above"
    expressed = pr.express(runs[1])
    assert isinstance(expressed, pr.Expressed)
    assert "torch.compile named: profile torchtitan-compile" in expressed.assumptions


def test_async_tp_rows_overlap_their_tensor_parallel_collectives() -> None:
    asynctp = pr.express(run_of(tp="2", dp="1", notes="Table 4 + AsyncTP (TP comm overlapped)"))
    assert isinstance(asynctp, pr.Expressed) and asynctp.plan.tp_comm_overlap
    assert "AsyncTP named: tensor-parallel collectives overlapped" in asynctp.assumptions
    plain = pr.express(run_of(tp="2", dp="1"))
    assert isinstance(plain, pr.Expressed) and not plain.plan.tp_comm_overlap


def test_torchtitan_keeps_fsdp_parameters_gathered_when_pipelining() -> None:
    piped = pr.express(run_of(framework="torchtitan", pp="2", dp="1", micro_batch="8",
                              global_batch="8", zero="3"))
    assert isinstance(piped, pr.Expressed) and piped.plan.reshard_after_forward is False
    flat = pr.express(run_of(framework="torchtitan", zero="3"))
    assert isinstance(flat, pr.Expressed) and flat.plan.reshard_after_forward is True
    nemo = pr.express(run_of(framework="nemo", pp="2", dp="1", layers="4", zero="3"))
    assert isinstance(nemo, pr.Expressed) and nemo.plan.reshard_after_forward is True
