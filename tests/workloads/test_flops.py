"""FLOPs of ops and models against Megatron-LM's formulas."""

from __future__ import annotations

import pytest

from trainsim.workloads.model import build_graph
from trainsim.workloads.ops import column_shardings, matmul_op, row_shardings
from trainsim.workloads.zoo import get_model


def narayanan_flops(B: int, s: int, l: int, h: int, V: int, full_recompute: bool) -> float:
    """Narayanan et al. 2021, eq. (3) and its no-recompute form (3/4 of the layer term)."""
    if full_recompute:
        return 96 * B * s * l * h**2 * (1 + s / (6 * h) + V / (16 * l * h))
    return 72 * B * s * l * h**2 * (1 + s / (6 * h) + V / (12 * l * h))


@pytest.mark.parametrize("name", ["gpt3-1.3b", "gpt3-175b", "aceso-gpt-13b", "gpt3-125m"])
@pytest.mark.parametrize("full", [True, False])
def test_training_matmul_flops_equal_megatron_formula(name: str, full: bool) -> None:
    """Matmul FLOPs per iteration equal 96Bslh²(1+s/6h+V/16lh) (full recompute) or
    72Bslh²(1+s/6h+V/12lh) (none) within 1 %."""
    spec = get_model(name)
    B = 8
    graph = build_graph(spec, micro_batch_size=B)
    got = graph.training_flops("full" if full else "none", matmul_only=True)
    want = narayanan_flops(B, spec.seq_len, spec.num_layers, spec.hidden, spec.vocab_size, full)
    assert abs(got - want) / want < 0.01


def test_gemm_flops_are_2mnk_and_backward_twice() -> None:
    """A GEMM [m,k]×[k,n] costs 2mnk forward and 4mnk backward."""
    op = matmul_op("x", m=4, n=5, k=6, dtype_bytes=2, bias=False,
                   shardings=column_shardings(48.0))
    assert op.fwd_flops == 2 * 4 * 5 * 6
    assert op.bwd_flops == 2 * op.fwd_flops
    assert op.params == 30


def test_selective_recompute_adds_attention_core_forward() -> None:
    """Selective recompute reruns QKᵀ and attention·V: 4·b·s²·h matmul FLOPs per layer."""
    spec = get_model("gpt3-1.3b")
    b, s, h, l = 2, 2048, spec.hidden, spec.num_layers
    graph = build_graph(spec, micro_batch_size=b)
    extra = (graph.training_flops("selective", matmul_only=True)
             - graph.training_flops("none", matmul_only=True))
    assert extra == pytest.approx(4 * b * s * s * h * l, rel=1e-12)


def test_flops_per_token_is_about_6n_for_gpt3_175b() -> None:
    """Training FLOPs per token ≈ 6N plus the attention term 12·l·s·h (Kaplan et al. 2020)."""
    spec = get_model("gpt3-175b")
    graph = build_graph(spec)
    approx = 6 * spec.parameters() + 12 * spec.num_layers * spec.seq_len * spec.hidden
    assert graph.flops_per_token == pytest.approx(approx, rel=0.01)


def test_tensor_parallel_divides_layer_matmul_flops() -> None:
    """At tp=t every GEMM of a GPT block runs 1/t of its FLOPs on each GPU."""
    graph = build_graph(get_model("gpt3-6.7b"))
    one = graph.layer_costs(tp=1)[1]
    four = graph.layer_costs(tp=4)[1]
    assert four.matmul_fwd_flops == pytest.approx(one.matmul_fwd_flops / 4)
    assert four.params < one.params / 3.9


def test_megatron_block_needs_two_all_reduces_each_pass() -> None:
    """Without SP a GPT block all-reduces 2·s·b·h bytes twice forward and twice backward
    (Shoeybi et al. 2019 Fig. 4); with SP these become all-gathers and reduce-scatters."""
    spec = get_model("gpt3-1.3b")
    b, s, h = 1, spec.seq_len, spec.hidden
    block = build_graph(spec, b).layers[1]
    comm = block.costs(tp=8).comm
    assert sorted((c.phase, c.collective) for c in comm) == [
        ("bwd", "all_reduce"), ("bwd", "all_reduce"), ("fwd", "all_reduce"), ("fwd", "all_reduce")]
    assert all(c.size_bytes == 2 * s * b * h for c in comm)
    sp = sorted((c.phase, c.collective) for c in block.costs(tp=8, sp=True).comm)
    assert sp == [("bwd", "all_gather"), ("bwd", "all_gather"), ("bwd", "reduce_scatter"),
                  ("bwd", "reduce_scatter"), ("fwd", "all_gather"), ("fwd", "all_gather"),
                  ("fwd", "reduce_scatter"), ("fwd", "reduce_scatter")]
    assert block.costs(tp=1).comm == ()


def test_row_parallel_all_reduces_output_forward() -> None:
    """A row-parallel GEMM all-reduces its output in the forward pass and splits its weight."""
    op = matmul_op("proj", m=8, n=16, k=32, dtype_bytes=2, bias=False,
                   shardings=row_shardings(2 * 8 * 16))
    shard = op.sharded(tp=4)
    assert shard.params == 16 * 32 // 4
    assert shard.fwd_flops == op.fwd_flops / 4
    assert shard.output_bytes == op.output_bytes
    assert [(c.phase, c.collective) for c in shard.shardings[0].comm] == [("fwd", "all_reduce")]
    assert shard.shape == (8, 16, 8)


def test_expert_parallel_needs_all_to_all_and_splits_experts() -> None:
    """An MoE layer's experts are divided by the expert-parallel degree and need all-to-alls."""
    spec = get_model("gpt-moe-1.3b-64e")
    graph = build_graph(spec)
    moe = next(layer for layer in graph.layers if layer.kind == "moe_transformer")
    fc1 = next(op for op in moe.ops if op.name == "moe.experts.fc1")
    shard = fc1.sharded(ep=8)
    assert shard.params == fc1.params // 8
    assert {c.collective for c in shard.shardings[0].comm} == {"all_to_all"}
    # top-2 routing with capacity factor 1 runs the experts on 2× the tokens
    assert fc1.fwd_flops == 2 * (2 * spec.seq_len) * spec.hidden * spec.ffn_hidden


def test_t5_decoder_has_cross_attention_over_encoder_length() -> None:
    """T5 decoder blocks attend over the 2048 encoder positions from 512 decoder positions."""
    graph = build_graph(get_model("t5-770m"))
    decoder = next(layer for layer in graph.layers if layer.kind == "decoder")
    core = next(op for op in decoder.ops if op.name == "cross.flash")
    assert core.shape == (16, 512, 2048, 64)
    assert core.fwd_flops == 4 * 16 * 512 * 2048 * 64  # QKᵀ and PV
    assert decoder.side_input_bytes == 2 * 2048 * 1024
