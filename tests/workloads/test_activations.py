"""Activation memory per transformer layer against Korthikanti et al. 2022 (Table 2, eq. 1-4)."""

from __future__ import annotations

import dataclasses

import pytest

from trainsim.workloads.model import build_graph
from trainsim.workloads.zoo import get_model

CASES = [("gpt3-1.3b", 1, 2048), ("aceso-gpt-1.3b", 4, 1024), ("gpt3-175b", 1, 2048),
         ("gpt3-125m", 8, 512)]


def _block(name: str, b: int, s: int):
    # Korthikanti et al. 2022 count unfused attention (s² softmax/dropout tensors kept): the
    # "eager" kernel; flash attention is tested in test_attention_kernel.py
    spec = dataclasses.replace(get_model(name), attention="eager")
    graph = build_graph(spec, micro_batch_size=b, seq_len=s)
    return spec, graph.layers[1]


@pytest.mark.parametrize(("name", "b", "s"), CASES)
def test_no_parallelism_no_recompute(name: str, b: int, s: int) -> None:
    """Eq. (1): s·b·h·(34 + 5·a·s/h) bytes per layer."""
    spec, block = _block(name, b, s)
    h, a = spec.hidden, spec.num_heads
    assert block.activation_bytes() == pytest.approx(s * b * h * (34 + 5 * a * s / h))


@pytest.mark.parametrize(("name", "b", "s"), CASES)
@pytest.mark.parametrize("t", [2, 4, 8])
def test_tensor_parallel_only(name: str, b: int, s: int, t: int) -> None:
    """Eq. (2): with TP t and no SP, s·b·h·(10 + 24/t + 5·a·s/(h·t))."""
    spec, block = _block(name, b, s)
    h, a = spec.hidden, spec.num_heads
    want = s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
    assert block.activation_bytes(tp=t) == pytest.approx(want)


@pytest.mark.parametrize(("name", "b", "s"), CASES)
@pytest.mark.parametrize("t", [2, 8])
def test_tensor_and_sequence_parallel(name: str, b: int, s: int, t: int) -> None:
    """Eq. (3): TP + SP divide the whole layer by t: s·b·h/t·(34 + 5·a·s/h)."""
    spec, block = _block(name, b, s)
    h, a = spec.hidden, spec.num_heads
    assert block.activation_bytes(tp=t, sp=True) == pytest.approx(
        s * b * h / t * (34 + 5 * a * s / h))


@pytest.mark.parametrize(("name", "b", "s"), CASES)
@pytest.mark.parametrize("t", [1, 4])
def test_selective_recompute(name: str, b: int, s: int, t: int) -> None:
    """Eq. (4): selective recompute with TP + SP keeps s·b·h·34/t."""
    spec, block = _block(name, b, s)
    assert block.activation_bytes(tp=t, sp=True, recompute="selective") == pytest.approx(
        34 * s * b * spec.hidden / t)


@pytest.mark.parametrize("t", [1, 8])
def test_full_recompute_keeps_layer_input(t: int) -> None:
    """Full recompute keeps only the layer input: 2·s·b·h, divided by t under SP only."""
    spec, block = _block("gpt3-6.7b", 2, 2048)
    sbh2 = 2 * 2048 * 2 * spec.hidden
    assert block.activation_bytes(tp=t, recompute="full") == sbh2
    assert block.activation_bytes(tp=t, sp=True, recompute="full") == sbh2 / t


def test_model_total_sums_layers() -> None:
    """The graph's activation bytes are the sum over layers, repeated blocks included."""
    graph = build_graph(get_model("gpt3-350m"), micro_batch_size=2)
    assert graph.activation_bytes(tp=2, sp=True, recompute="selective") == pytest.approx(
        sum(layer.activation_bytes(2, True, "selective") for layer in graph.layers))
    assert graph.activation_bytes_per_token == pytest.approx(
        graph.activation_bytes() / (2 * 2048))


def test_llama_block_without_dropout() -> None:
    """LLaMA-2-7B block (no dropout, SwiGLU f=11008): 16·sbh + 6·sbf + 2·a·s²·b bytes —
    two norms 4sbh, QKV input 2sbh, Q and K 4sbh, softmax output 2as²b, V 2sbh, projection
    input 2sbh, MLP input 2sbh, both SwiGLU inputs 4sbf, down-projection input 2sbf."""
    spec, block = _block("llama2-7b", 1, 4096)
    s, b, h, f, a = 4096, 1, spec.hidden, spec.ffn_hidden, spec.num_heads
    assert block.activation_bytes() == pytest.approx(16 * s * b * h + 6 * s * b * f
                                                     + 2 * a * s * s * b)


def test_cross_entropy_keeps_fp32_logits() -> None:
    """The head saves fp32 logits, 4·s·b·V bytes, plus its two 2·s·b·h inputs."""
    spec = get_model("gpt3-125m")
    head = build_graph(spec).layers[-1]
    s, h, V = spec.seq_len, spec.hidden, spec.vocab_size
    assert head.activation_bytes() == 4 * s * V + 2 * (2 * s * h)
