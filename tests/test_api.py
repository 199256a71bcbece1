"""`trainsim.api` is the one way in: every spec form works, in the API and in every command.

A model is a zoo name, a validation model, a YAML file or a Hugging Face config.json; a cluster
is a short spec, a YAML file or `cpu:N`; a plan is a ParallelPlan, a dict or a JSON file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from trainsim import api
from trainsim.cli import main
from trainsim.errors import TrainsimError
from trainsim.workloads.plan import ParallelPlan

GPT2_CONFIG = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12,
               "vocab_size": 50257, "n_positions": 1024}
"""GPT-2 small as published in its Hugging Face config.json (124,439,808 parameters)."""


def _model_specs(tmp_path: Path) -> dict[str, str]:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(GPT2_CONFIG))
    zoo = api.load_model("gpt3-125m")
    mine = tmp_path / "mine.yaml"
    mine.write_text(yaml.safe_dump({**zoo.to_dict(), "name": "mine"}))
    return {"zoo": "gpt3-125m", "validation": "tiny-gpt", "hf": str(config), "yaml": str(mine)}


def _cluster_specs(tmp_path: Path) -> dict[str, str]:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(api.load_cluster("1x2xA100-SXM4-40GB+1x2xA10").to_dict()))
    return {"short": "2xV100-SXM2-32GB", "mixed": "1x2xA100-SXM4-40GB+1x2xA10",
            "yaml": str(path), "cpu": "cpu:2"}


def test_every_model_form_loads(tmp_path: Path) -> None:
    specs = _model_specs(tmp_path)
    loaded = {k: api.load_model(v) for k, v in specs.items()}
    assert loaded["zoo"].name == "gpt3-125m" and loaded["validation"].name == "tiny-gpt"
    assert api.describe_model(specs["hf"])["parameters"] == 124_439_808
    assert loaded["yaml"].parameters() == loaded["zoo"].parameters()
    assert api.load_model(loaded["zoo"]) is loaded["zoo"]


def test_every_cluster_form_loads(tmp_path: Path) -> None:
    specs = _cluster_specs(tmp_path)
    loaded = {k: api.load_cluster(v) for k, v in specs.items()}
    assert [c.num_gpus for c in loaded.values()] == [2, 4, 4, 2]
    assert loaded["yaml"].to_dict() == loaded["mixed"].to_dict()
    assert loaded["cpu"].gpu(0).name == "cpu"


def test_bad_cpu_spec_names_the_form() -> None:
    with pytest.raises(TrainsimError, match="cpu:N"):
        api.load_cluster("cpu:two")


def test_more_cpu_workers_than_the_profiled_machine_had_cores_is_refused() -> None:
    """The CPU model runs one worker per core: cpu:N beyond the profile's logical cores (the
    packaged reference: 2) is refused, not simulated as N workers' worth of throughput."""
    assert api.load_cluster("cpu:2").num_gpus == 2
    with pytest.raises(TrainsimError, match=r"cpu:100000: the profile was measured on a "
                                            r"machine with 2 logical cores"):
        api.load_cluster("cpu:100000")


@pytest.mark.slow
def test_simulate_accepts_every_form_and_prices_the_run(tmp_path: Path) -> None:
    """Each model form on each cluster form simulates (the fp32 validation model on `cpu:N`,
    whose "GPU" has no fp16); the cost is price × time."""
    models, clusters = _model_specs(tmp_path), _cluster_specs(tmp_path)
    for name, cluster in clusters.items():
        hw = api.load_cluster(cluster)
        forms = ("validation",) if name == "cpu" else ("validation", "hf", "yaml", "zoo")
        for model in (models[f] for f in forms):
            result = api.simulate(model, cluster, dp=hw.num_gpus, global_batch=2 * hw.num_gpus,
                                  seq_len=64)
            assert result.iteration_time_s > 0
            price = hw.price_per_hour_usd
            assert result.cost_usd == pytest.approx(price * result.iteration_time_s / 3600)


def test_plan_forms_agree(tmp_path: Path) -> None:
    """A dict, a ParallelPlan and a saved JSON file of the same plan give the same time."""
    model, hw = api.load_model("gpt3-125m"), api.load_cluster("4xV100-SXM2-32GB")
    plan = api.make_plan(model, hw, pp=2, dp=2, global_batch=8)
    path = tmp_path / "plan.json"
    plan.save(path)
    times = {api.simulate(model, hw, p).iteration_time_s
             for p in (plan, plan.to_dict(), path, str(path))}
    assert len(times) == 1


def test_default_plan_is_a_pipeline_over_every_gpu() -> None:
    """With no degrees, the 4 GPUs form one 4-stage pipeline at global batch 512."""
    plan = api.make_plan(api.load_model("gpt3-1.3b"), api.load_cluster("4xV100-SXM2-32GB"))
    assert (plan.dp, plan.tp, plan.pp, plan.global_batch) == (1, 1, 4, 512)
    assert isinstance(plan, ParallelPlan)


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(list(args))
    out = capsys.readouterr()
    return int(info.value.code or 0), out.out, out.err


def test_models_show_takes_a_validation_model(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(capsys, "models", "show", "tiny-gpt", "--json")
    assert code == 0 and json.loads(out)["name"] == "tiny-gpt"


def test_hw_cluster_takes_cpu_n(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(capsys, "hw", "cluster", "cpu:2", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["num_gpus"] == 2 and doc["node_groups"][0]["gpu"] == "cpu"


@pytest.mark.slow
def test_search_takes_cpu_n_and_a_validation_model(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(capsys, "search", "--model", "tiny-gpt", "--cluster", "cpu:2",
                        "--global-batch", "4", "--time-budget-s", "20", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["best"]["iteration_time_s"] > 0


def test_simulate_json_carries_cost(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(capsys, "simulate", "--model", "gpt3-125m", "--cluster",
                        "2xA100-SXM4-80GB", "--global-batch", "4", "--json")
    doc = json.loads(out)
    price = api.load_cluster("2xA100-SXM4-80GB").price_per_hour_usd
    assert code == 0 and doc["cost_usd"] == pytest.approx(price * doc["iteration_time_s"] / 3600)


def test_energy_on_cpu_n_says_why_it_cannot(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _cli(capsys, "energy", "frontier", "--model", "tiny-gpt", "--cluster",
                          "cpu:2", "--pp", "2", "--microbatches", "2")
    assert code == 2 and out == "" and "DVFS" in err and err.count("\n") == 1


def test_ep_flag_reaches_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    """`--ep` splits a MoE model's experts across the data-parallel ranks (all-to-all)."""
    runs = {}
    for ep in ("1", "8"):
        code, out, _ = _cli(capsys, "simulate", "--model", "gpt-moe-1.3b-8e", "--cluster",
                            "8xA100-SXM4-80GB", "--dp", "8", "--global-batch", "16", "--ep", ep,
                            "--json")
        assert code == 0
        runs[ep] = json.loads(out)
    assert runs["8"]["plan"]["ep"] == 8 and runs["1"]["plan"]["ep"] == 1
    assert runs["8"]["peak_memory_bytes"] < runs["1"]["peak_memory_bytes"]


def test_vision_models_report_images_per_second(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(capsys, "simulate", "--model", "wresnet-500m", "--cluster",
                        "4xA100-SXM4-80GB", "--dp", "4", "--global-batch", "16")
    assert code == 0 and "images/s" in out and "tokens/s" not in out


@pytest.mark.parametrize("gpus", ["1x", "3x", "2x2x", "5x1x", "7x4x"])
def test_the_default_plan_is_valid_on_every_catalog_gpu(gpus: str) -> None:
    """With no degrees or batch given, every GPU type of the catalog, in odd counts too, gets
    a plan that builds (the default batch of 512 rounds to a multiple of the replicas)."""
    model = api.load_model("gpt3-1.3b")
    for gpu in api.catalog_gpus():
        cluster = api.load_cluster(f"{gpus}{gpu.name}")
        plan = api.make_plan(model, cluster)
        assert plan.dp * plan.tp * plan.pp == cluster.num_gpus
        assert plan.global_batch is not None and plan.global_batch % plan.dp == 0


def test_the_default_plan_on_the_readme_mixed_cluster() -> None:
    """36 GPUs, 24 layers: data parallelism over all of them, global batch 504 (was an error:
    512 is not divisible by 36)."""
    plan = api.make_plan(api.load_model("gpt3-1.3b"),
                         api.load_cluster("1x8xA100-SXM4-40GB+7x4xA10"))
    assert (plan.dp, plan.pp, plan.global_batch) == (36, 1, 504)


def test_non_utf8_cluster_and_plan_files_name_themselves(tmp_path: Path) -> None:
    for name, load in (("c.yaml", api.load_cluster), ("p.json", api.read_plan)):
        path = tmp_path / name
        path.write_bytes(b"\xff\xfe\x00bad")
        with pytest.raises(TrainsimError, match=rf"{name.replace('.', '[.]')}: not UTF-8 text"):
            load(str(path))
