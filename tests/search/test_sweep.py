"""`sim sweep`: spec checks and expansion, content keys, failed scenarios as rows, resumption
after a stop or a SIGKILL, Ray giving the table local processes give, the missing-Ray line, and
the dashboard."""

from __future__ import annotations

import builtins
import hashlib
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainsim.errors import SpecError, TrainsimError
from trainsim.search.sweep import (
    EXAMPLE_NAME,
    MAX_SCENARIOS,
    RAY_INSTALL,
    load_spec,
    read_table,
    run_sweep,
    table_rows,
    write_report,
)
from trainsim.search.sweep import runner as runner_module
from trainsim.search.sweep import spec as spec_module
from trainsim.search.sweep.report import DIV_ID, pareto_flags

Sim = Callable[[list[str]], tuple[int, str, str]]
"""The `sim` fixture (conftest.py): run `sim argv`, get (exit code, stdout, stderr)."""

pq = pytest.importorskip("pyarrow.parquet")

SMALL: dict[str, Any] = {
    "models": ["gpt3-125m"],
    "clusters": ["4xV100-SXM2-32GB"],
    "plans": [{"pp": 4}, {"tp": 2}, {"dp": 3}],
    "knobs": {"global_batch": [16, 32], "recompute": ["none", "full"]},
}
"""12 scenarios, 4 of them a bad plan (dp=3 does not divide the batch or the cluster)."""


def _write_spec(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


# --- spec -----------------------------------------------------------------------------------


def test_expansion_order_count_and_fields() -> None:
    """models × clusters × (plans + planners) × knob values, the last knob fastest; a
    scenario's fields are its plan entry then its knob values."""
    spec = load_spec({**SMALL, "clusters": ["4xV100-SXM2-32GB", "8xA100-SXM4-40GB"]})
    scenarios = spec.scenarios()
    assert spec.size == len(scenarios) == 24
    assert [s.index for s in scenarios] == list(range(24))
    first, second, fifth = scenarios[0], scenarios[1], scenarios[4]
    assert (first.cluster, first.plan, first.knobs) == (
        "4xV100-SXM2-32GB", {"pp": 4}, {"global_batch": 16, "recompute": "none"})
    assert second.knobs == {"global_batch": 16, "recompute": "full"}
    assert fifth.plan == {"tp": 2} and fifth.fields() == {"tp": 2, "global_batch": 16,
                                                          "recompute": "none"}
    assert scenarios[12].cluster == "8xA100-SXM4-40GB"
    assert len({s.key for s in scenarios}) == 24
    # No plans and no planners: the default plan, once per knob setting.
    bare = load_spec({"models": "gpt3-125m", "clusters": ["4xV100-SXM2-32GB"],
                      "knobs": {"zero": [0, 1]}})
    assert [s.fields() for s in bare.scenarios()] == [{"zero": 0}, {"zero": 1}]


@pytest.mark.parametrize(("change", "words"), [
    ({"modles": ["gpt3-125m"]}, "unknown key 'modles'"),
    ({"models": []}, "'models' must be a non-empty list"),
    ({"models": ["gpt3-nope"]}, "models[0]: unknown model 'gpt3-nope'"),
    ({"clusters": ["4xV100-SXM2-32GB", "banana"]}, "clusters[1]"),
    ({"plans": [{"pp": 4}, {"ppp": 2}]}, "plans[1]: unknown plan field 'ppp'"),
    ({"plans": [{"pp": 4}, {"pp": 4}]}, "plans lists"),
    ({"plans": [{"global_batch": 8}]}, "plans[0] sets 'global_batch', which is also a knob"),
    ({"knobs": {"frequency": [1000]}}, "knobs: unknown plan field 'frequency'"),
    ({"knobs": {"global_batch": []}}, "knobs.global_batch must list at least one value"),
    ({"knobs": {"global_batch": [16, 16]}}, "knobs.global_batch lists 16 twice"),
    ({"knobs": {"freq_mhz": [float("nan")]}}, "knobs.freq_mhz[0]: nan is not a finite number"),
    ({"planners": [{"method": "gird"}]}, "planners[0]: unknown search method 'gird'"),
    ({"planners": [{"method": "grid", "time_budget_s": -1}]}, "planners[0]: time_budget_s"),
    ({"planners": [{"method": "grid"}]}, "knobs.recompute: with planners, the only knob"),
    ({"planners": [{"method": "grid", "max_evals": 5}]},
     "planners[0]: max_evals applies to hetero, fasop, uniform"),
    ({"planners": [{"method": "hetero", "max_evals": 0}]}, "planners[0]: max_evals=0 must be"),
    ({"knobs": {"global_batch": list(range(1, 40_000))}}, f"at most {MAX_SCENARIOS:,}"),
])
def test_spec_errors_name_the_key(change: dict[str, Any], words: str) -> None:
    with pytest.raises(TrainsimError) as info:
        load_spec({**SMALL, **change})
    message = str(info.value)
    assert words in message and "\n" not in message, message


def test_spec_files(tmp_path: Path) -> None:
    """A YAML file, the built-in example, and one line for a missing, non-YAML or wrong-shaped
    file."""
    assert load_spec(_write_spec(tmp_path / "s.yaml", SMALL)).size == 12
    assert load_spec(EXAMPLE_NAME).size == 48
    (tmp_path / "bad.yaml").write_text("models: [gpt3-125m\n")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    for path, words in ((tmp_path / "none.yaml", "does not exist"),
                        (tmp_path / "bad.yaml", "is not valid YAML at line"),
                        (tmp_path / "list.yaml", "expected a mapping"),
                        (tmp_path, "is not a file")):
        with pytest.raises(TrainsimError, match=words):
            load_spec(path)


def test_keys_are_content_hashes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A key is sha256 of the scenario's canonical JSON with trainsim's version: independent
    of key order in the YAML, changed by any input, by a model file's bytes, by the version."""
    scenario = load_spec(SMALL).scenarios()[1]
    doc = {"model": "gpt3-125m", "cluster": "4xV100-SXM2-32GB", "plan": {"pp": 4},
           "planner": None, "knobs": {"global_batch": 16, "recompute": "full"}, "files": {},
           "trainsim": spec_module.TRAINSIM_VERSION}
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    assert scenario.key == hashlib.sha256(text.encode()).hexdigest()
    swapped = {**SMALL, "knobs": {"recompute": ["full", "none"], "global_batch": [32, 16]}}
    assert {s.key for s in load_spec(swapped).scenarios()} == \
        {s.key for s in load_spec(SMALL).scenarios()}
    other = {**SMALL, "knobs": {"global_batch": [16, 48], "recompute": ["none", "full"]}}
    assert len({s.key for s in load_spec(other).scenarios()}
               & {s.key for s in load_spec(SMALL).scenarios()}) == 6
    monkeypatch.setattr(spec_module, "TRAINSIM_VERSION", "9.9.9")
    assert load_spec(SMALL).scenarios()[1].key != scenario.key
    monkeypatch.undo()
    model = tmp_path / "m.yaml"
    model.write_text("family: gpt\nnum_layers: 4\nhidden: 256\nnum_heads: 4\nseq_len: 256\n"
                     "vocab_size: 1000\n")
    first = load_spec({**SMALL, "models": [str(model)]}).scenarios()[0].key
    model.write_text(model.read_text().replace("num_layers: 4", "num_layers: 8"))
    assert load_spec({**SMALL, "models": [str(model)]}).scenarios()[0].key != first


# --- running ---------------------------------------------------------------------------------


def test_failed_scenarios_are_rows(tmp_path: Path) -> None:
    """A bad plan, an unknown recompute policy and an OOM plan are rows: errors set, the OOM
    row with its figures and oom=True; the good rows have every figure."""
    spec = load_spec({"models": ["gpt3-6.7b"], "clusters": ["4xV100-SXM2-32GB"],
                      "plans": [{"pp": 4}, {"tp": 2}, {"dp": 3}],
                      "knobs": {"global_batch": [32], "recompute": ["full", "bogus"]}})
    run = run_sweep(spec, tmp_path / "t.parquet", workers=1)
    rows = table_rows(read_table(run.path))
    assert run.rows == run.total == len(rows) == 6
    by = {(r["plan"], r["recompute"]): r for r in rows}
    good = by[('{"pp":4}', "full")]
    assert good["error"] is None and not good["oom"]
    for col in ("iteration_time_s", "samples_per_s", "tokens_per_s", "mfu", "peak_memory_gib",
                "energy_j", "cost_usd", "num_gpus", "resolved_plan"):
        assert good[col] is not None and good[col] > 0 if col != "resolved_plan" else \
            json.loads(good[col])["pp"] == 4
    oom = by[('{"tp":2}', "full")]
    assert oom["oom"] and oom["error"].startswith("out of memory: peak")
    assert oom["tokens_per_s"] > 0 and oom["peak_memory_gib"] > 32
    bad = by[('{"dp":3}', "full")]
    assert bad["error"].startswith("PlanError") and bad["tokens_per_s"] is None
    assert "bogus" in by[('{"pp":4}', "bogus")]["error"]
    assert run.failed == 5 and run.oom == 1  # all but the good row


def test_planner_scenarios_record_the_best_plan(tmp_path: Path) -> None:
    spec = load_spec({"models": ["gpt3-125m"], "clusters": ["4xV100-SXM2-32GB"],
                      "planners": [{"method": "grid", "time_budget_s": 30}],
                      "knobs": {"global_batch": [16]}})
    (row,) = table_rows(read_table(run_sweep(spec, tmp_path / "p.parquet", workers=1).path))
    assert json.loads(row["planner"])["method"] == "grid" and row["plan"] is None
    assert json.loads(row["resolved_plan"])["global_batch"] == 16
    assert row["error"] is None and row["tokens_per_s"] > 0


def test_planner_scenarios_take_max_evals(tmp_path: Path) -> None:
    """A hetero/fasop planner entry takes `max_evals` (refused before: "unknown planner option
    'max_evals'"), passed to the planner as `sim search --max-evals` is: the row's plan is
    api.search's best under the same count, whatever the machine's speed."""
    from trainsim import api

    cluster = "1x4xA100-SXM4-40GB+1x4xA10"
    spec = load_spec({"models": ["gpt3-125m"], "clusters": [cluster],
                      "planners": [{"method": "hetero", "max_evals": 6,
                                    "time_budget_s": 600}],
                      "knobs": {"global_batch": [32]}})
    (row,) = table_rows(read_table(run_sweep(spec, tmp_path / "e.parquet", workers=1).path))
    assert json.loads(row["planner"])["max_evals"] == 6 and row["error"] is None
    best = api.search("gpt3-125m", cluster, global_batch=32, method="hetero", max_evals=6,
                      time_budget_s=600, top=1).best
    assert best is not None and best.plan is not None
    assert json.loads(row["resolved_plan"]) == json.loads(best.plan.to_json())
    assert best.summary.tokens_per_s == pytest.approx(row["tokens_per_s"])


def test_a_table_in_a_missing_folder_gets_the_folder(tmp_path: Path) -> None:
    spec = load_spec({"models": ["gpt3-125m"], "clusters": ["4xV100-SXM2-32GB"],
                      "plans": [{"pp": 4}], "knobs": {"global_batch": [16]}})
    run = run_sweep(spec, tmp_path / "a" / "b" / "t.parquet", workers=1)
    assert run.path.is_file() and run.rows == 1


def test_stop_and_resume_computes_only_missing_rows(tmp_path: Path) -> None:
    """A run stopped after 5 scenarios, rerun, computes the other 7; the table equals a
    one-shot run's row for row (and a rerun of a finished table computes nothing and
    rewrites the same bytes)."""
    spec = load_spec(SMALL)
    whole = run_sweep(spec, tmp_path / "whole.parquet", workers=2)
    part = run_sweep(spec, tmp_path / "part.parquet", workers=2, limit=5)
    assert (part.computed, part.rows, part.finished) == (5, 5, False)
    assert [r["scenario"] for r in table_rows(read_table(part.path))] == [0, 1, 2, 3, 4]
    rest = run_sweep(spec, tmp_path / "part.parquet", workers=2)
    assert (rest.computed, rest.skipped, rest.rows) == (7, 5, 12)
    assert pq.read_table(whole.path).equals(pq.read_table(rest.path), check_metadata=True)
    before = whole.path.read_bytes()
    again = run_sweep(spec, whole.path, workers=2)
    assert (again.computed, again.skipped) == (0, 12) and whole.path.read_bytes() == before


def test_changed_spec_reuses_rows_and_drops_stale_ones(tmp_path: Path) -> None:
    """A table holding rows the spec no longer has is refused (they are the user's results)
    unless --drop-stale, which drops them and reuses the rest."""
    out = tmp_path / "t.parquet"
    run_sweep(load_spec(SMALL), out, workers=1)
    before = out.read_bytes()
    changed = {**SMALL, "knobs": {"global_batch": [32, 64], "recompute": ["none", "full"]}}
    with pytest.raises(SpecError, match=r"holds 6 rows of scenarios this spec does not have"):
        run_sweep(load_spec(changed), out, workers=1)
    assert out.read_bytes() == before
    run = run_sweep(load_spec(changed), out, workers=1, drop_stale=True)
    assert (run.skipped, run.computed, run.dropped, run.rows) == (6, 6, 6, 12)
    assert sorted({r["global_batch"] for r in table_rows(read_table(out))}) == [32, 64]
    fresh = run_sweep(load_spec(changed), tmp_path / "fresh.parquet", workers=1)
    assert pq.read_table(fresh.path).equals(pq.read_table(out), check_metadata=True)


def test_internal_errors_are_rows_and_are_retried(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "t.parquet"

    def broken(self: Any, plan: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(runner_module.Oracle, "evaluate", broken)
    runner_module._ORACLES.clear()
    run = run_sweep(load_spec(SMALL), out, workers=1)
    errors = [r["error"] for r in table_rows(read_table(out))]
    assert run.rows == 12 and sum(e.startswith("internal error (RuntimeError)") for e in errors) == 8
    monkeypatch.undo()
    runner_module._ORACLES.clear()
    rerun = run_sweep(load_spec(SMALL), out, workers=1)
    assert (rerun.computed, rerun.skipped) == (8, 4)


def test_one_run_at_a_time_per_table(tmp_path: Path) -> None:
    """While another run holds the table's lock, a second run is refused (one line)."""
    import fcntl

    out = tmp_path / "t.parquet"
    with open(tmp_path / ".t.parquet.lock", "a+b") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        with pytest.raises(SpecError, match="another sweep is writing"):
            run_sweep(load_spec(SMALL), out, workers=1)
    assert not out.exists()
    assert run_sweep(load_spec(SMALL), out, workers=1, limit=1).rows == 1


_KILLED_RUN = """
import sys, time
from trainsim.search.sweep import load_spec, run_sweep

run_sweep(load_spec(sys.argv[1]), sys.argv[2], workers=1, checkpoint_s=0.0,
          on_progress=lambda done, total: time.sleep(0.25))
"""


@pytest.mark.slow
def test_sigkill_halfway_then_rerun_computes_only_missing(tmp_path: Path) -> None:
    """A sweep killed with SIGKILL mid-run leaves a valid table of finished rows; the rerun
    computes exactly the rest, and the table equals a one-shot run's."""
    doc = {**SMALL, "knobs": {"global_batch": [8, 16, 24, 32, 40],
                              "recompute": ["none", "selective", "full"]}}
    spec_path = _write_spec(tmp_path / "spec.yaml", doc)
    total = load_spec(spec_path).size
    out = tmp_path / "killed.parquet"
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_RUN, str(spec_path), str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and proc.poll() is None:
            if out.exists() and 0 < read_table(out).num_rows < total // 2:
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    kept = read_table(out).num_rows
    assert 0 < kept < total
    rerun = run_sweep(load_spec(spec_path), out, workers=2)
    assert (rerun.computed, rerun.skipped, rerun.rows) == (total - kept, kept, total)
    whole = run_sweep(load_spec(spec_path), tmp_path / "whole.parquet", workers=2)
    assert pq.read_table(whole.path).equals(pq.read_table(out), check_metadata=True)


# --- the command -----------------------------------------------------------------------------




def test_cli_run_forms_resume_and_existing_files(tmp_path: Path,
                                                 sim: Sim) -> None:
    """`sim sweep SPEC` and `sim sweep run SPEC` are the same command; a rerun resumes; a file
    that is not a sweep table needs --force."""
    spec = str(_write_spec(tmp_path / "s.yaml", SMALL))
    out = str(tmp_path / "t.parquet")
    code, text, _ = sim(["sweep", spec, "--out", out, "--workers", "1", "--limit", "4"])
    assert code == 0 and "4 scenarios computed" in text and "8 scenarios left" in text
    code, text, _ = sim(["sweep", "run", spec, "--out", out, "--workers", "1"])
    assert code == 0 and "8 scenarios computed, 4 already in the table" in text
    user = tmp_path / "mine.parquet"
    user.write_text("not parquet")
    code, _, err = sim(["sweep", spec, "--out", str(user), "--workers", "1"])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--force" in err
    code, _, _ = sim(["sweep", spec, "--out", str(user), "--workers", "1", "--force"])
    assert code == 0 and read_table(user).num_rows == 12
    for argv, words in ((["sweep", spec, "--out", out, "--workers", "-1"], "--workers"),
                        (["sweep", spec, "--out", out, "--address", "auto"],
                         "--address needs --executor ray"),
                        (["sweep", spec, "--out", out, "--executor", "dask"], "local or ray"),
                        (["sweep", str(tmp_path / "no.yaml")], "does not exist")):
        code, _, err = sim(argv)
        assert code == 2 and len(err.strip().splitlines()) == 1 and words in err, err


def test_missing_ray_is_one_line(tmp_path: Path, sim: Sim,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_ray(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "ray" or name.startswith("ray."):
            raise ImportError("No module named 'ray'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    code, _, err = sim(["sweep", EXAMPLE_NAME, "--out", str(tmp_path / "t.parquet"),
                         "--executor", "ray"])
    assert code == 2 and err.strip() == f"error: {RAY_INSTALL}"
    assert not (tmp_path / "t.parquet").exists()


def test_unreachable_ray_address_is_one_line(tmp_path: Path,
                                             sim: Sim) -> None:
    pytest.importorskip("ray")
    for address, words in (("127.0.0.1:1", "no Ray head answers there"),
                           ("not an address", "must be auto or HOST:PORT")):
        code, _, err = sim(["sweep", EXAMPLE_NAME, "--out", str(tmp_path / "t.parquet"),
                             "--executor", "ray", "--address", address])
        assert code == 2 and len(err.strip().splitlines()) == 1 and words in err, err


def test_ray_connection_failures_name_rays_complaint() -> None:
    """Ray's C++ log lines (captured while it connects) become the tail of the one line."""
    from trainsim.search.sweep.executors import _ray_complaint

    line = ("[2026-01-01 00:00:00,000 W 1 1] gcs_client.cc:210: Failed to get cluster ID from "
            "GCS server: Unauthenticated: RPC error: InvalidAuthToken")
    tail = _ray_complaint(["", line, "  "])
    assert tail.startswith("; Ray: Failed to get cluster ID") and "RAY_AUTH_MODE=token" in tail
    assert _ray_complaint([]) == ""


# --- report ----------------------------------------------------------------------------------


def test_pareto_flags_per_model() -> None:
    def p(model: str, tps: float, usd: float, j: float) -> dict[str, Any]:
        return {"model": model, "tokens_per_s": tps, "usd_per_1m_tokens": usd, "j_per_token": j}

    points = [p("a", 10, 1.0, 1.0), p("a", 5, 0.5, 2.0), p("a", 4, 0.6, 2.5),
              p("a", 10, 1.0, 1.0), p("b", 1, 9.0, 9.0)]
    # (4, 0.6, 2.5) is beaten by (5, 0.5, 2.0); equal points both stay; b has its own front.
    assert pareto_flags(points) == [True, True, False, True, True]


def test_report_writes_a_self_contained_page(tmp_path: Path,
                                             sim: Sim) -> None:
    table = run_sweep(load_spec(SMALL), tmp_path / "t.parquet", workers=1).path
    code, text, _ = sim(["sweep", "report", str(table)])
    page = tmp_path / "t.html"
    assert code == 0 and str(page) in text
    html = page.read_text()
    assert 'content="trainsim"' in html and f'id="{DIV_ID}"' in html
    assert re.findall(r"<script[^>]*\bsrc=", html) == [] and len(html) > 1_000_000
    assert "vs global_batch" in html and "vs recompute" in html and "PlanError" in html
    first = page.read_bytes()
    code, _, _ = sim(["sweep", "report", str(table), "--out", str(page)])
    assert code == 0 and page.read_bytes() == first  # its own page: replaced, same bytes
    mine = tmp_path / "mine.html"
    mine.write_text("<html>mine</html>")
    code, _, err = sim(["sweep", "report", str(table), "--out", str(mine)])
    assert code == 2 and "--force" in err
    code, _, err = sim(["sweep", "report", str(mine), "--out", str(tmp_path / "x.html")])
    assert code == 2 and "not a sweep table" in err and len(err.strip().splitlines()) == 1


def test_report_renders_in_headless_chromium(tmp_path: Path, render_dom) -> None:
    """No uncaught JS error; plotly drew the panels, with one star per Pareto point."""
    table = run_sweep(load_spec(SMALL), tmp_path / "t.parquet", workers=1).path
    page = write_report(table, tmp_path / "t.html")
    dom, errors = render_dom(page, 1600)
    assert not errors, errors
    assert 'class="main-svg"' in dom
    # 8 scenarios ran: each drawn in the top panel and 2 knobs × 3 panels = 7 times.
    assert len(re.findall(r'<path class="point"', dom)) == 8 * 7


# --- Ray -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_ray_gives_the_local_table(tmp_path: Path) -> None:
    """A local Ray instance (in this process, 2 CPUs) writes the table local processes write,
    row for row."""
    ray = pytest.importorskip("ray", reason="ray not installed (pip install 'trainsim[ray]')")
    spec = load_spec(SMALL)
    local = run_sweep(spec, tmp_path / "local.parquet", workers=2)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        remote = run_sweep(spec, tmp_path / "ray.parquet", executor="ray", workers=2)
    finally:
        ray.shutdown()
    assert (remote.rows, remote.computed) == (12, 12)
    assert pq.read_table(local.path).equals(pq.read_table(remote.path), check_metadata=True)
    assert local.path.read_bytes() == remote.path.read_bytes()


def test_no_spec_error_is_a_bare_exception() -> None:
    """Every refusal is a TrainsimError (one line in the CLI), never a KeyError/TypeError."""
    for doc in (None, [], {"models": 3, "clusters": []}, {"models": ["gpt3-125m"],
                                                           "clusters": [None]},
                {**SMALL, "plans": "pp4"}, {**SMALL, "knobs": [1]},
                {**SMALL, "planners": [{"method": "grid", "memory_limit_gb": "x"}],
                 "knobs": {}}):
        with pytest.raises(SpecError):
            load_spec(doc) if isinstance(doc, dict) else spec_module.parse_spec(doc)


def test_zero_workers_means_one_per_cpu_as_in_pareto() -> None:
    from trainsim.search.sweep.executors import check_workers, default_workers

    assert check_workers(0) == check_workers(None) == default_workers()
    with pytest.raises(SpecError, match="0 \\(one per CPU\\)"):
        check_workers(-1)


def test_cli_refuses_stale_rows_unless_drop_stale(tmp_path: Path, sim: Sim) -> None:
    """Another spec's table is refused with one line naming --drop-stale and --force; with
    --drop-stale the rows the spec still has are kept and the rest dropped."""
    out = str(tmp_path / "t.parquet")
    first = str(_write_spec(tmp_path / "a.yaml", {**SMALL, "knobs": {"global_batch": [32]}}))
    code, _, _ = sim(["sweep", first, "--out", out, "--workers", "1"])
    assert code == 0
    second = str(_write_spec(tmp_path / "b.yaml", {**SMALL, "knobs": {"global_batch": [64]}}))
    code, _, err = sim(["sweep", second, "--out", out, "--workers", "1"])
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "--drop-stale" in err and "--force" in err
    code, text, _ = sim(["sweep", second, "--out", out, "--workers", "1", "--drop-stale"])
    assert code == 0 and "dropped" in text
    assert sorted({r["global_batch"] for r in table_rows(read_table(Path(out)))}) == [64]
