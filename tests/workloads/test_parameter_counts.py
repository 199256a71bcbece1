"""Parameter counts of the zoo against published figures."""

from __future__ import annotations

import pytest

from trainsim.workloads.model import build_graph
from trainsim.workloads.zoo import get_model


def megatron_params(l: int, h: int, V: int, s: int) -> float:
    """Narayanan et al. 2021 §5.1: P = 12·l·h²·(1 + 13/(12h) + (V + s)/(12·l·h))."""
    return 12 * l * h**2 * (1 + 13 / (12 * h) + (V + s) / (12 * l * h))


def rel(a: float, b: float) -> float:
    return abs(a - b) / b


def test_gpt3_175b_matches_published_174_6b() -> None:
    """GPT-3 175B (96 layers, h 12288, V 50257, s 2048) has ≈174.6 B parameters."""
    params = get_model("gpt3-175b").parameters()
    assert rel(params, 174.6e9) < 0.01
    assert rel(params, megatron_params(96, 12288, 50257, 2048)) < 1e-4


def test_gpt3_1_3b_matches_megatron_formula() -> None:
    """GPT-3 XL: 12lh²(1 + 13/12h + (V+s)/12lh) = 1.316 B, published as "1.3B"."""
    params = get_model("gpt3-1.3b").parameters()
    assert rel(params, megatron_params(24, 2048, 50257, 2048)) < 0.01
    assert round(params / 1e9, 1) == 1.3


@pytest.mark.parametrize(("name", "published"), [
    ("gpt3-125m", 125e6), ("gpt3-350m", 350e6), ("gpt3-760m", 760e6), ("gpt3-2.7b", 2.7e9),
    ("gpt3-6.7b", 6.7e9), ("gpt3-13b", 13e9),
])
def test_gpt3_family_matches_table_2_1(name: str, published: float) -> None:
    """Every GPT-3 size is within 2 % of its name in Brown et al. 2020, Table 2.1."""
    assert rel(get_model(name).parameters(), published) < 0.02


def test_llama2_7b_matches_released_checkpoint() -> None:
    """LLaMA-2-7B: 6,738,415,616 parameters (untied 32000-token embeddings, SwiGLU 11008)."""
    assert get_model("llama2-7b").parameters() == 6_738_415_616


def test_llama2_70b_is_68_98b() -> None:
    """LLaMA-2-70B with 8 KV heads (GQA) and ffn 28672 has ≈68.98 B parameters."""
    assert rel(get_model("llama2-70b").parameters(), 68.98e9) < 0.01


def test_t5_11b_is_11b() -> None:
    """T5-11B (d_ff 65536, 128 heads × d_kv 128, 24+24 layers) has 11.3 B parameters, the
    released checkpoint's 11,307,321,344 within 1 % despite Megatron's vocabulary."""
    params = get_model("t5-11b").parameters()
    assert rel(params, 11_307_321_344) < 0.01
    assert round(params / 1e9) == 11


def test_bert_large_with_mlm_head_is_336m() -> None:
    """BERT-large with pooler, MLM and NSP heads: 336.23 M (DeepSpeed flops-profiler docs)."""
    assert rel(get_model("bert-large").parameters(), 336.23e6) < 0.001


def test_bert_base_is_110m() -> None:
    """BERT-base has 110 M parameters (Devlin et al. 2019 §3)."""
    assert rel(get_model("bert-base").parameters(), 110e6) < 0.01


@pytest.mark.parametrize(("name", "nominal"), [
    ("wresnet-500m", 0.5e9), ("wresnet-1b", 1e9), ("wresnet-2b", 2e9), ("wresnet-4b", 4e9),
    ("wresnet-6.8b", 6.8e9), ("wresnet-13b", 13e9),
])
def test_wide_resnet_sizes_match_aceso_names(name: str, nominal: float) -> None:
    """Aceso's Wide-ResNet configs have about the parameters their names say (within 3 %)."""
    assert rel(get_model(name).parameters(), nominal) < 0.03


@pytest.mark.parametrize(("name", "published"), [
    ("gpt-moe-350m-128e", 13e9), ("gpt-moe-1.3b-128e", 52e9),
])
def test_deepspeed_moe_sizes(name: str, published: float) -> None:
    """DeepSpeed-MoE's 350M+MoE-128 and 1.3B+MoE-128 have ≈13 B and ≈52 B parameters."""
    assert rel(get_model(name).parameters(), published) < 0.02


def test_gqa_shrinks_kv_projection() -> None:
    """With 8 of 64 heads for K/V, the QKV GEMM of LLaMA-2-70B is h × (h + 2·h/8)."""
    from trainsim.workloads.model import build_graph

    graph = build_graph(get_model("llama2-70b"))
    qkv = next(op for op in graph.layers[1].ops if op.name == "attn.qkv")
    assert qkv.params == 8192 * (8192 + 2 * 1024)


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_position_embedding_stays_whole_under_tensor_parallelism(tp: int) -> None:
    """Megatron-LM splits the word embedding over the tensor-parallel ranks (vocab-parallel)
    but keeps the learned position table whole on each (a plain torch.nn.Embedding): a GPT-3
    175B first-stage GPU at tp 8 holds V·h/8 + s·h embedding parameters, not (V + s)·h/8."""
    spec = get_model("gpt3-175b")
    embedding = build_graph(spec).layers[0]
    assert embedding.kind == "embedding"
    h, V, s = spec.hidden, spec.vocab_size, spec.max_position_embeddings
    local = sum(op.params for op in embedding.sharded_ops(tp))
    assert local == -(-V * h // tp) + s * h


def test_rotary_models_replicate_no_embedding_parameters() -> None:
    """Without a learned position table (Llama: rotary) the embedding is all vocab-parallel."""
    spec = get_model("llama2-7b")
    embedding = build_graph(spec).layers[0]
    assert sum(op.params for op in embedding.sharded_ops(8)) == -(-spec.vocab_size
                                                                   * spec.hidden // 8)


def test_intra_op_sharding_splits_the_whole_embedding_table() -> None:
    """Intra-op sharding (CFP, Alpa: workloads/sharding) splits every table over its mesh,
    position rows included, also over more devices than the word table has rows per
    position row (a 32-device mesh once refused the op: Megatron's whole position table
    cannot be larger than the shard)."""
    from trainsim.workloads.sharding.graph import build_spmd_graph
    from trainsim.workloads.sharding.mesh import DeviceMesh
    from trainsim.workloads.sharding.strategies import make_strategy, sharded_op

    graph = build_spmd_graph(build_graph(get_model("gpt3-1.3b"), 1))
    node = next(n for n in graph.nodes if n.op.name == "embedding")
    for n in (8, 32, 64):
        strategy = make_strategy(node, ("vocab",), DeviceMesh((n,)))
        op = sharded_op(node.op, strategy, 1)
        assert op.params == -(-node.op.params // strategy.param_div)
        assert op.replicated_params == 0
