"""Attention kernels (flash vs eager) and framework profiles (issue 13, item 5).

Flash: FlashAttention-2 (Dao 2023, arXiv:2307.08691) keeps Q, K, V, O and the fp32 logsumexp
for the backward, no s×s tensor; its backward is 2.5x the forward FLOPs. Eager: Korthikanti et
al. 2022, eq. (1), s·b·h·(34 + 5·a·s/h) bytes per GPT layer.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
import yaml

from trainsim import api
from trainsim.errors import DataFileError, SpecError, TrainsimError, UnknownNameError
from trainsim.workloads.framework import (
    apply_framework,
    get_framework,
    list_frameworks,
    parse_profiles,
)
from trainsim.workloads.model import ModelSpec, build_graph
from trainsim.workloads.transformer_block import FLASH_BACKWARD_FACTOR, LSE_BYTES
from trainsim.workloads.zoo import get_model


def _spec(name: str, attention: str) -> ModelSpec:
    return dataclasses.replace(get_model(name), attention=attention)


LONG = ModelSpec(name="long-llama", family="llama", num_layers=4, hidden=512, num_heads=8,
                 vocab_size=1024, seq_len=16384, norm="rmsnorm", activation="swiglu",
                 bias=False, dropout=False, position_embedding="rotary", tied_embeddings=False,
                 dtype="bf16", source="a small rotary model for long-sequence tests")


@pytest.mark.parametrize(("name", "b", "s"), [("gpt3-1.3b", 1, 2048), ("gpt3-125m", 8, 512),
                                              ("gpt3-175b", 1, 2048)])
def test_eager_block_is_korthikanti_eq1(name: str, b: int, s: int) -> None:
    """Eager attention is today's graph: s·b·h·(34 + 5·a·s/h) bytes per GPT layer."""
    spec = _spec(name, "eager")
    block = build_graph(spec, b, s).layers[1]
    h, a = spec.hidden, spec.num_heads
    assert block.activation_bytes() == pytest.approx(s * b * h * (34 + 5 * a * s / h))


@pytest.mark.parametrize(("name", "b", "s"), [("gpt3-1.3b", 1, 2048), ("gpt3-125m", 8, 512),
                                              ("gpt3-175b", 1, 2048)])
def test_flash_block_keeps_no_s_squared_term(name: str, b: int, s: int) -> None:
    """Flash: s·b·h·34 + the fp32 logsumexp (4·a·s·b bytes); the 5·a·s²·b term is gone."""
    spec = _spec(name, "flash")
    block = build_graph(spec, b, s).layers[1]
    h, a = spec.hidden, spec.num_heads
    assert block.activation_bytes() == pytest.approx(34 * s * b * h + LSE_BYTES * a * s * b)
    assert not any(op.kind in ("softmax", "attention_score", "attention_context")
                   for op in block.ops)


def test_flash_is_the_default_and_eager_unchanged() -> None:
    """Zoo models default to flash; the eager graph keeps the unfused ops of before."""
    assert get_model("llama2-13b").attention == "flash"
    eager = build_graph(_spec("gpt3-1.3b", "eager"), 1, 2048).layers[1]
    assert [op.name for op in eager.ops][1:6] == ["attn.qkv", "attn.score", "attn.softmax",
                                                  "attn.attn_dropout", "attn.context"]
    flash = build_graph(get_model("gpt3-1.3b"), 1, 2048).layers[1]
    assert [op.name for op in flash.ops][1:3] == ["attn.qkv", "attn.flash"]


def test_flash_flops_forward_equal_and_backward_two_and_a_half() -> None:
    """Forward FLOPs = the two attention GEMMs (eager score + context); backward 2.5x."""
    b, s = 2, 4096
    eager = build_graph(_spec("llama2-7b", "eager"), b, s).layers[1]
    flash = build_graph(_spec("llama2-7b", "flash"), b, s).layers[1]
    gemms = sum(op.fwd_flops for op in eager.ops
                if op.kind in ("attention_score", "attention_context"))
    (core,) = [op for op in flash.ops if op.kind == "flash_attention"]
    spec = get_model("llama2-7b")
    assert core.fwd_flops == pytest.approx(gemms)
    assert core.fwd_flops == pytest.approx(4 * b * spec.num_heads * s * s * int(spec.head_dim or 0))
    assert core.bwd_flops == pytest.approx(FLASH_BACKWARD_FACTOR * core.fwd_flops)
    assert FLASH_BACKWARD_FACTOR == 2.5
    assert core.is_matmul


def test_flash_under_tensor_parallelism_and_selective_recompute() -> None:
    """The fused core splits by heads; selective recompute keeps Q, K, V (drops only L)."""
    spec, b, s = get_model("gpt3-1.3b"), 1, 2048
    block = build_graph(spec, b, s).layers[1]
    h, a = spec.hidden, spec.num_heads
    assert block.activation_bytes(tp=4, sp=True) == pytest.approx(
        (34 * s * b * h + LSE_BYTES * a * s * b) / 4)
    assert block.activation_bytes(recompute="selective") == pytest.approx(34 * s * b * h)


def test_long_sequence_peak_memory_falls_by_at_least_the_s_squared_term() -> None:
    """A 16k-token run: flash's simulated peak is lower than eager's by at least the eager s²
    activations of every layer (no dropout: the softmax output, 2·a·s²·b bytes each)."""
    spec = LONG
    s, b = 16384, 1
    kwargs: dict[str, Any] = {"dp": 1, "tp": 1, "pp": 1, "micro_batch_size": b,
                              "global_batch": 1, "seq_len": s, "recompute": "none",
                              "dtype": "bf16"}
    eager = api.simulate(spec, "1xA100-SXM4-80GB", attention="eager", **kwargs)
    flash = api.simulate(spec, "1xA100-SXM4-80GB", attention="flash", **kwargs)
    # without dropout eager keeps the softmax output, 2·a·s²·b bytes per layer
    s2_term = spec.num_layers * 2 * spec.num_heads * s * s * b
    assert eager.peak_memory_bytes - flash.peak_memory_bytes >= s2_term * 0.999
    assert flash.iteration_time_s < eager.iteration_time_s


def test_framework_profiles_set_flash_with_sources() -> None:
    """Every shipped profile exists, runs flash and cites a source for every value."""
    assert {"default", "megatron", "deepspeed", "torchtitan", "hf-eager"} <= set(list_frameworks())
    for name in list_frameworks():
        profile = get_framework(name)
        assert profile.attention.value == "flash"
        assert profile.attention.source
        assert all(f.source for f in profile.fusions.values())
    assert get_framework("megatron").fusions["bias_gelu"].value is True


def test_apply_framework_and_attention_override() -> None:
    spec = get_model("llama2-7b")
    assert apply_framework(spec) is spec
    assert apply_framework(spec, "torchtitan").attention == "flash"
    assert apply_framework(spec, "megatron", "eager").attention == "eager"
    with pytest.raises(UnknownNameError, match="framework 'megatrn'.*megatron"):
        apply_framework(spec, "megatrn")
    with pytest.raises(SpecError, match="attention='fused'"):
        apply_framework(spec, None, "fused")


def test_model_spec_refuses_an_unknown_attention_kernel() -> None:
    with pytest.raises(ValueError, match="attention='sdpa' is not one of flash, eager"):
        dataclasses.replace(get_model("gpt3-125m"), attention="sdpa")


GOOD = {"profiles": {"default": {"attention": {"value": "flash", "source": "assumed"}},
                     "other": {"attention": {"value": "eager", "source": "assumed"}}}}


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda d: d["profiles"].pop("default"), "misses the 'default' profile"),
    (lambda d: d["profiles"]["default"].pop("attention"), "misses field 'attention'"),
    (lambda d: d["profiles"]["default"]["attention"].update(value="fast"),
     r"profiles.default.attention.value='fast' is not one of flash, eager"),
    (lambda d: d["profiles"]["default"]["attention"].pop("source"),
     "profiles.default.attention: must be a mapping with exactly 'value' and 'source'"),
    (lambda d: d["profiles"]["default"]["attention"].update(source=""),
     "profiles.default.attention.source: must be a non-empty string"),
    (lambda d: d["profiles"]["default"].update(speedup=1.2), "unknown field 'speedup'"),
    (lambda d: d["profiles"]["default"].update(
        fusions={"bias_gelu": {"value": "yes", "source": "x"}}),
     "profiles.default.fusions.bias_gelu.value='yes' must be a bool"),
    (lambda d: d["profiles"]["default"].update(
        fusions={"everything": {"value": True, "source": "x"}}),
     "profiles.default.fusions.everything: unknown fusion"),
    (lambda d: d["profiles"]["default"].update(
        logged_memory_factor={"value": 3, "source": "x"}),
     r"profiles.default.logged_memory_factor.value=3 must be a ratio in \[1, 2\]"),
])
def test_profile_file_errors_are_one_line_naming_the_field(mutate, message) -> None:
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    assert parse_profiles(data)["default"].attention.value == "flash"
    mutate(data)
    with pytest.raises(DataFileError, match=message) as info:
        parse_profiles(data, where="frameworks.yaml")
    assert "\n" not in str(info.value)
    assert isinstance(info.value, TrainsimError)


def test_cli_framework_and_attention_flags(tmp_path) -> None:
    """`sim simulate --framework/--attention` reach the model; a bad name is exit code 2."""
    from typer.testing import CliRunner

    from trainsim.cli import app

    runner = CliRunner()
    model = tmp_path / "long.yaml"
    fields = {k: v for k, v in LONG.to_dict().items() if k != "name"}
    model.write_text(yaml.safe_dump({"long-llama": fields}))
    base = ["simulate", "-m", str(model), "-c", "1xA100-SXM4-80GB", "--seq-len", "8192",
            "--micro-batch", "1", "--global-batch", "1", "--dtype", "bf16", "--json",
            "--allow-oom"]

    eager = runner.invoke(app, [*base, "--framework", "megatron", "--attention", "eager"])
    flash = runner.invoke(app, [*base, "--framework", "megatron"])
    assert eager.exit_code == 0 and flash.exit_code == 0, eager.output + flash.output
    peak = {k: json.loads(r.stdout)["peak_memory_bytes"] for k, r in
            (("eager", eager), ("flash", flash))}
    assert peak["flash"] < peak["eager"]
    bad = runner.invoke(app, [*base, "--framework", "jax"])
    assert bad.exit_code == 2


def test_profiles_carry_a_sourced_sequence_parallel_default() -> None:
    from trainsim.workloads.framework import get_framework, parse_profiles

    assert get_framework("torchtitan").sequence_parallel.value is True
    assert get_framework("nemo").sequence_parallel.value is True
    assert get_framework("megatron").sequence_parallel.value is False
    assert "SequenceParallel" in get_framework("torchtitan").sequence_parallel.source
    bad = {"profiles": {"default": {"attention": {"value": "flash", "source": "x"},
                                    "sequence_parallel": {"value": "yes", "source": "x"}}}}
    with pytest.raises(DataFileError, match="sequence_parallel"):
        parse_profiles(bad)


def test_framework_turns_sequence_parallel_on_with_tp_unless_told() -> None:
    model, hw = api.load_model("gpt3-125m"), api.load_cluster("4xA100-SXM4-40GB")
    common = {"tp": 2, "dp": 2, "pp": 1, "global_batch": 8}
    assert api.make_plan(model, hw, framework="torchtitan", **common).sp is True
    assert api.make_plan(model, hw, framework="megatron", **common).sp is False
    assert api.make_plan(model, hw, framework="torchtitan", sp=False, **common).sp is False
    assert api.make_plan(model, hw, framework="torchtitan", **{**common, "tp": 1,
                                                                "dp": 4}).sp is False
