"""Structure of model graphs: layer order, sharing, validation, sharding bookkeeping."""

from __future__ import annotations

import dataclasses

import pytest

from trainsim.workloads.model import ModelSpec, build_graph
from trainsim.workloads.ops import Op
from trainsim.workloads.zoo import get_model, list_models


def test_gpt_layers_are_embedding_blocks_head() -> None:
    """A GPT graph is embedding, l blocks (one shared immutable Layer object), head."""
    graph = build_graph(get_model("gpt3-175b"))
    kinds = [layer.kind for layer in graph.layers]
    assert kinds == ["embedding"] + ["transformer"] * 96 + ["head"]
    assert len({id(layer) for layer in graph.layers[1:-1]}) == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        graph.layers[1].name = "x"  # type: ignore[misc]


def test_t5_layer_order() -> None:
    """T5: encoder embedding, 24 encoder blocks, encoder norm, decoder embedding, 24 decoder
    blocks, head."""
    kinds = [layer.kind for layer in build_graph(get_model("t5-3b")).layers]
    assert kinds == (["embedding"] + ["transformer"] * 24 + ["norm", "embedding"]
                     + ["decoder"] * 24 + ["head"])


def test_moe_layers_alternate() -> None:
    """With moe_layer_interval 2 every second block is an MoE block."""
    kinds = [layer.kind for layer in build_graph(get_model("gpt-moe-350m-128e")).layers[1:-1]]
    assert kinds == ["transformer", "moe_transformer"] * 12


@pytest.mark.parametrize("name", list_models())
def test_every_zoo_model_builds(name: str) -> None:
    """Every zoo model builds with positive FLOPs, parameters and activations, and op names
    are unique within each layer."""
    graph = build_graph(get_model(name), micro_batch_size=2)
    assert graph.parameters > 0 and graph.fwd_flops > 0 and graph.activation_bytes() > 0
    assert graph.bwd_flops >= graph.fwd_flops
    for layer in graph.layers:
        names = [op.name for op in layer.ops]
        assert len(names) == len(set(names))


def test_selective_ops_are_attention_core() -> None:
    """Selective recompute flags exactly the attention core: the fused flash kernel (default),
    or QKᵀ, softmax, softmax dropout and attention·V with the eager kernel."""
    spec = get_model("gpt3-1.3b")
    block = build_graph(spec).layers[1]
    assert [op.name for op in block.ops if op.selective_recompute] == ["attn.flash"]
    eager = build_graph(dataclasses.replace(spec, attention="eager")).layers[1]
    assert [op.name for op in eager.ops if op.selective_recompute] == [
        "attn.score", "attn.softmax", "attn.attn_dropout", "attn.context"]


def test_tied_head_reports_shared_parameters() -> None:
    """A tied LM head owns no weight but reports the V·h embedding it shares."""
    spec = get_model("gpt3-1.3b")
    head = build_graph(spec).layers[-1]
    lm_head = next(op for op in head.ops if op.name == "lm_head")
    assert lm_head.params == 0
    assert head.shared_params == spec.vocab_size * spec.hidden


def test_op_rejects_negative_costs() -> None:
    """Ops refuse negative FLOPs and unknown kinds."""
    with pytest.raises(ValueError, match="fwd_flops"):
        Op(name="x", kind="matmul", fwd_flops=-1, bwd_flops=0, fwd_bytes=0, bwd_bytes=0,
           params=0, activation_bytes=0, output_bytes=0)
    with pytest.raises(ValueError, match="kind"):
        Op(name="x", kind="fft", fwd_flops=0, bwd_flops=0, fwd_bytes=0, bwd_bytes=0,
           params=0, activation_bytes=0, output_bytes=0)


def test_spec_checks_heads_divide() -> None:
    """A spec whose KV heads do not divide the heads is refused, naming the field."""
    with pytest.raises(ValueError, match="num_kv_heads"):
        ModelSpec(name="x", family="llama", num_layers=1, hidden=64, num_heads=8,
                  num_kv_heads=3, vocab_size=10, seq_len=8)


def test_seq_len_override() -> None:
    """build_graph's seq_len replaces the spec's; token count is b·s."""
    graph = build_graph(get_model("gpt3-125m"), micro_batch_size=3, seq_len=512)
    assert graph.seq_len == 512 and graph.tokens == 1536
    qkv = graph.layers[1].ops[1]
    assert qkv.shape == (1536, 3 * 768, 768)


def test_sharded_shape_splits_declared_dimension() -> None:
    """A column-parallel QKV at tp=4 has a quarter of the output columns per GPU."""
    qkv = build_graph(get_model("gpt3-125m")).layers[1].ops[1]
    assert qkv.sharded(4).shape == (2048, 3 * 768 // 4, 768)


def test_spec_helpers_for_plans() -> None:
    """num_blocks counts T5's decoder too; max_seq_len is the learned position table (0 when
    positions are rotary); op_names lists per-op recompute keys."""
    assert get_model("t5-3b").num_blocks == 48
    assert get_model("gpt3-1.3b").max_seq_len == 2048
    assert get_model("llama2-7b").max_seq_len == 0
    names = get_model("gpt3-1.3b").op_names()
    assert "attn.qkv" in names and "mlp.fc2" in names and len(names) == len(set(names))
