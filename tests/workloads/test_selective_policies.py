"""Framework memory behaviour (issue 13, item 5): torchtitan's op-level selective activation
checkpointing and the cross entropy's backward buffers.

torchtitan `_custom_policy` keeps the outputs of the matmuls (but every second one, counted
per block in call order: wq, wk, wv, wo, w1, w3, w2) and of the attention kernel; the block
input is kept by the checkpoint itself; every other op runs again before the backward.
Its loss, ``F.cross_entropy(pred.float(), labels)``, holds two fp32 gradient buffers (8 bytes
per logit) in its backward beyond the saved fp32 log-probabilities.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import yaml

from trainsim import api
from trainsim.errors import DataFileError
from trainsim.hwmodels.gpus import get_gpu
from trainsim.hwmodels.opcost import RooflineCostModel
from trainsim.workloads.framework import apply_framework, get_framework, parse_profiles
from trainsim.workloads.model import ModelSpec, build_graph
from trainsim.workloads.stage_costs import instruction_costs
from trainsim.workloads.transformer_block import LSE_BYTES
from trainsim.workloads.zoo import get_model

SMALL = ModelSpec(name="small-llama", family="llama", num_layers=4, hidden=512, num_heads=8,
                  num_kv_heads=2, ffn_hidden=1536, vocab_size=32000, seq_len=2048,
                  norm="rmsnorm", activation="swiglu", bias=False, dropout=False,
                  position_embedding="rotary", tied_embeddings=False, dtype="bf16",
                  source="a small GQA Llama for memory tests")


def _op_spec(spec: ModelSpec) -> ModelSpec:
    return dataclasses.replace(spec, selective_policy="op")


@pytest.mark.parametrize("name", ["llama2-7b", "llama2-70b"])
def test_op_sac_keeps_the_odd_matmuls_the_attention_output_and_the_input(name: str) -> None:
    """Per token: input h, wq h_q, wv h_kv, attention output h_q and its logsumexp, w1 f,
    w2 h (bf16), hand-counted from torchtitan's call order."""
    spec = _op_spec(get_model(name))
    b, s = 2, 1024
    block = build_graph(spec, b, s).layers[1]
    h, a, d = spec.hidden, spec.num_heads, int(spec.head_dim or 0)
    h_q, h_kv, f = a * d, int(spec.num_kv_heads or 0) * d, int(spec.ffn_hidden or 0)
    per_token = 2 * (h + h_q + h_kv + h_q + f + h) + LSE_BYTES * a
    assert block.activation_bytes(recompute="selective") == pytest.approx(per_token * b * s)
    # less than keeping everything, more than full recompute
    assert block.activation_bytes(recompute="full") < per_token * b * s \
        < block.activation_bytes(recompute="none")


def test_op_sac_recomputes_the_even_matmuls_and_every_cheap_op() -> None:
    spec = _op_spec(SMALL)
    block = build_graph(spec, 1, 2048).layers[1]
    shares = block.selective_shares()
    h_q, h_kv = spec.num_heads * 64, 2 * 64
    assert shares["attn.qkv"] == pytest.approx(h_kv / (h_q + 2 * h_kv))  # wk
    assert shares["attn.proj"] == 1.0  # wo
    assert shares["mlp.fc1"] == pytest.approx(0.5)  # w3
    assert "mlp.fc2" not in shares and "attn.flash" not in shares  # w2, attention: kept
    cheap = {op.name for op in block.ops if op.kind not in ("matmul", "flash_attention")}
    assert all(shares[name] == 1.0 for name in cheap)
    ops = {op.name: op for op in block.ops}
    expected = sum(share * ops[name].fwd_flops for name, share in shares.items())
    assert block.recompute_fwd_flops("selective") == pytest.approx(expected)


def test_op_sac_shards_with_tensor_and_sequence_parallelism() -> None:
    """Column-parallel outputs and the attention output split over tp; with SP the block
    input and the row-parallel (reduce-scattered) output w2 split too."""
    spec = _op_spec(SMALL)
    block = build_graph(spec, 1, 2048).layers[1]
    whole = block.activation_bytes(recompute="selective")
    assert block.activation_bytes(tp=4, sp=True, recompute="selective") == \
        pytest.approx(whole / 4)
    tp_only = block.activation_bytes(tp=4, sp=False, recompute="selective")
    assert whole / 4 < tp_only < whole


def test_megatron_selective_is_unchanged_by_default() -> None:
    """Without a profile saying otherwise, selective is Megatron's attention-core policy."""
    block = build_graph(SMALL, 1, 2048).layers[1]
    assert block.selective_policy == "megatron"
    assert block.activation_bytes(recompute="selective") == pytest.approx(
        sum(op.saved_bytes("selective") for op in block.ops))
    assert set(block.selective_shares()) == {"attn.flash"}


def test_profiles_carry_the_policies_with_sources() -> None:
    titan = get_framework("torchtitan")
    assert titan.selective_recompute.value == "op" and "_custom_policy" in \
        titan.selective_recompute.source
    assert titan.loss_workspace.value == 8.0 and "cross_entropy" in titan.loss_workspace.source
    assert get_framework("megatron").selective_recompute.value == "megatron"
    spec = apply_framework(SMALL, "torchtitan")
    assert (spec.selective_policy, spec.loss_workspace_bytes) == ("op", 8.0)
    assert apply_framework(spec, "megatron").selective_policy == "megatron"


@pytest.mark.parametrize(("entry", "message"), [
    ({"selective_recompute": {"value": "some", "source": "x"}},
     "selective_recompute.value='some' is not one of megatron, op"),
    ({"loss_workspace": {"value": -1, "source": "x"}},
     "loss_workspace.value=-1 must be a number of bytes in"),
    ({"loss_workspace": {"value": "8", "source": "x"}},
     "loss_workspace.value='8' must be a number of bytes in"),
])
def test_bad_profile_values_are_one_line_naming_the_field(entry: dict[str, Any],
                                                         message: str) -> None:
    data = {"profiles": {"default": {"attention": {"value": "flash", "source": "x"}, **entry}}}
    with pytest.raises(DataFileError, match=message) as info:
        parse_profiles(yaml.safe_load(yaml.safe_dump(data)), where="frameworks.yaml")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_loss_workspace_raises_the_simulated_peak_by_its_bytes(recompute: str) -> None:
    """One GPU, one micro-batch: the peak is reached in the head's backward, so the loss
    buffers add exactly 8 bytes per logit where they exceed the recomputed activations."""
    b, s = 1, 2048
    kwargs: dict[str, Any] = {"dp": 1, "tp": 1, "pp": 1, "micro_batch_size": b,
                              "global_batch": b, "seq_len": s, "recompute": recompute,
                              "dtype": "bf16"}
    base = api.simulate(SMALL, "1xA100-SXM4-80GB", **kwargs)
    spec = dataclasses.replace(SMALL, loss_workspace_bytes=8.0)
    more = api.simulate(spec, "1xA100-SXM4-80GB", **kwargs)
    workspace = 8.0 * b * s * SMALL.vocab_size
    graph = build_graph(SMALL, b, s)
    redo = max(layer.activation_bytes(recompute="none") - layer.activation_bytes(
        recompute=recompute) for layer in graph.layers)
    assert more.peak_memory_bytes - base.peak_memory_bytes == pytest.approx(
        workspace - redo, rel=1e-6)
    # time is unchanged: buffers, not work
    assert more.iteration_time_s == pytest.approx(base.iteration_time_s)


def test_memory_never_goes_negative_with_a_workspace_and_no_recompute() -> None:
    """The backward allocates the workspace itself when nothing is recomputed (and frees it
    with the activations), so every rank ends at its static memory."""
    spec = dataclasses.replace(SMALL, loss_workspace_bytes=8.0)
    result = api.simulate(spec, "1x4xA100-SXM4-80GB", dp=1, tp=1, pp=4, micro_batch_size=1,
                          global_batch=8, seq_len=1024, recompute="none", dtype="bf16",
                          schedule="zb-h1")
    timeline = result.memory_timeline
    assert (timeline["bytes"] >= -1e-6).all()
    first = timeline.groupby("rank")["bytes"].first()
    last = timeline.groupby("rank")["bytes"].last()
    assert (last - first).abs().max() < 1.0


def test_eager_torchtitan_moves_more_bytes_in_its_unfused_element_wise_ops() -> None:
    """torchtitan eager runs RMSNorm as six kernels (9x the fused traffic), rotary as three
    (6x), SwiGLU as two (5/3); torch.compile fuses them back. FLOPs and saved activations do
    not change, and the simulated step is slower eager than compiled."""
    eager = apply_framework(SMALL, "torchtitan")
    compiled = apply_framework(SMALL, "torchtitan-compile")
    # the loss stays eager under compile (outside the compiled blocks)
    assert compiled.unfused_traffic == (("cross_entropy", 4.6),)
    assert compiled.selective_policy == "op"
    fused_ops = {op.name: op for op in build_graph(compiled, 1, 1024).layers[1].ops}
    eager_ops = {op.name: op for op in build_graph(eager, 1, 1024).layers[1].ops}
    for name, factor in (("attn.norm", 9.0), ("attn.rotary", 6.0), ("mlp.swiglu", 1.6667),
                         ("attn.residual", 1.0), ("attn.qkv", 1.0)):
        assert eager_ops[name].fwd_bytes == pytest.approx(factor * fused_ops[name].fwd_bytes)
        assert eager_ops[name].bwd_bytes == pytest.approx(factor * fused_ops[name].bwd_bytes)
        assert eager_ops[name].fwd_flops == fused_ops[name].fwd_flops
        assert eager_ops[name].activation_bytes == fused_ops[name].activation_bytes
    kwargs: dict[str, Any] = {"dp": 1, "tp": 1, "pp": 1, "micro_batch_size": 1,
                              "global_batch": 1, "seq_len": 1024, "dtype": "bf16"}
    slow = api.simulate(SMALL, "1xA100-SXM4-80GB", framework="torchtitan", **kwargs)
    fast = api.simulate(SMALL, "1xA100-SXM4-80GB", framework="torchtitan-compile", **kwargs)
    assert slow.iteration_time_s > fast.iteration_time_s
    assert slow.peak_memory_bytes == pytest.approx(fast.peak_memory_bytes)


def test_bad_unfused_traffic_is_one_line() -> None:
    data = {"profiles": {"default": {"attention": {"value": "flash", "source": "x"},
                                     "unfused_traffic": {"value": {"rmsnorm": 0.5},
                                                         "source": "x"}}}}
    with pytest.raises(DataFileError, match="unfused_traffic.value must map op kinds to "
                                            "factors in"):
        parse_profiles(data, where="frameworks.yaml")


def test_delayed_fp8_casts_follow_transformer_engine() -> None:
    """Transformer Engine (delayed scaling): a GEMM after a norm gets its FP8 input from the
    norm, the others cast their input once (cast_transpose, 4 B/element); every backward casts
    the output gradient; weights are cached over a step's micro-batches. torchao (dynamic)
    casts input and weight in the forward, gradient and weight again, input again."""
    from trainsim.workloads.op_work import fp8_cast_bytes, fp8_cast_elements

    spec = dataclasses.replace(SMALL, dtype="fp8")
    te = {op.name: op for op in build_graph(dataclasses.replace(spec, fp8_recipe="delayed"),
                                            1, 1024).layers[1].ops}
    ao = {op.name: op for op in build_graph(spec, 1, 1024).layers[1].ops}
    assert te["attn.qkv"].fp8_input_fused and te["mlp.fc1"].fp8_input_fused
    assert not te["attn.proj"].fp8_input_fused and not te["mlp.fc2"].fp8_input_fused
    for name in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2"):
        m, n, k = te[name].shape
        fused = te[name].fp8_input_fused
        assert fp8_cast_elements(te[name]) == ((0.0 if fused else m * k), m * n, 0.0)
        assert fp8_cast_elements(ao[name]) == (m * k + k * n, m * n + k * n, m * k)
        assert (fp8_cast_bytes(te[name]), fp8_cast_bytes(ao[name])) == (4.0, 5.0)
    kwargs: dict[str, Any] = {"dp": 1, "tp": 1, "pp": 1, "micro_batch_size": 1,
                              "global_batch": 1, "seq_len": 1024}
    engine = api.simulate(SMALL, "1xH100-SXM5-80GB", framework="megatron", dtype="fp8", **kwargs)
    torchao = api.simulate(SMALL, "1xH100-SXM5-80GB", framework="torchtitan-compile",
                           dtype="fp8", **kwargs)
    assert engine.iteration_time_s < torchao.iteration_time_s
    bf16 = [api.simulate(SMALL, "1xH100-SXM5-80GB", dtype="bf16",
                         attention="flash", **kwargs).iteration_time_s,
            api.simulate(dataclasses.replace(SMALL, fp8_recipe="delayed"), "1xH100-SXM5-80GB",
                         dtype="bf16", **kwargs).iteration_time_s]
    assert bf16[0] == pytest.approx(bf16[1])  # the recipe only matters in FP8


def test_nemo_shards_optimizer_state_by_default() -> None:
    nemo = get_framework("nemo")
    assert nemo.distributed_optimizer.value is True and nemo.fp8_recipe.value == "delayed"
    assert "use_distributed_optimizer=True" in nemo.distributed_optimizer.source
    assert get_framework("megatron").distributed_optimizer.value is False


def test_a_vocab_parallel_loss_holds_its_own_workspace() -> None:
    """torchtitan's loss parallel (tp > 1) holds 12 bytes a logit beyond the saved ones in its
    backward, against 8 for the fused single-GPU loss: the head's working set follows tp."""
    titan = get_framework("torchtitan")
    assert titan.loss_workspace_tp.value == 12.0 and "loss.py" in titan.loss_workspace_tp.source
    spec = apply_framework(SMALL, "torchtitan")
    b, s = 1, 1024
    head = build_graph(spec, b, s).layers[-1]
    assert head.kind == "head"
    logits = b * s * spec.vocab_size
    kw: dict[str, Any] = {"sp": False, "ep": 1, "recompute": "none", "freq_mhz": None,
                          "dtype": "bf16", "cost_model": RooflineCostModel(),
                          "gpu": get_gpu("A100-SXM4-80GB")}
    one = instruction_costs([head], tp=1, **kw)
    two = instruction_costs([head], tp=2, **kw)
    assert one.recompute_activation_bytes == pytest.approx(8.0 * logits)
    assert two.recompute_activation_bytes == pytest.approx(12.0 * logits / 2)


def test_a_compiled_block_does_not_keep_what_its_backward_never_reads() -> None:
    """Under op-level checkpointing eager PyTorch keeps the down projection's output (a saved
    matmul's), which only the residual add reads; torchtitan-compile does not."""
    eager = apply_framework(get_model("llama2-7b"), "torchtitan")
    compiled = apply_framework(get_model("llama2-7b"), "torchtitan-compile")
    assert eager.sac_keeps_unread and not compiled.sac_keeps_unread
    b, s = 1, 1024
    block_e = next(la for la in build_graph(eager, b, s).layers if la.recomputable)
    block_c = next(la for la in build_graph(compiled, b, s).layers if la.recomputable)
    fc2 = next(op for op in block_e.ops if op.name.endswith("mlp.fc2"))
    kept_e, shares_e = block_e.op_sac()
    kept_c, shares_c = block_c.op_sac()
    assert kept_e - kept_c == pytest.approx(fc2.output_bytes)
    assert shares_e == shares_c  # nothing more is recomputed: it is just not kept


def test_torchtitans_eager_loss_moves_its_measured_bytes() -> None:
    """torchtitan's loss (an fp32 cast of the logits, log-softmax forward and backward, a zero
    fill and the cast back) moved 46.4 bytes per logit on our H100 recording where one fused
    kernel moves 10: both torchtitan profiles scale the cross entropy's traffic 4.6x, compiled
    or not (the loss is outside the compiled blocks); Megatron's is left as modelled."""
    spec = get_model("llama2-7b")
    plain = {op.name: op for op in build_graph(spec, 1, 1024).layers[-1].ops}
    for framework in ("torchtitan", "torchtitan-compile"):
        ops = {op.name: op for op in build_graph(apply_framework(spec, framework), 1,
                                                 1024).layers[-1].ops}
        ce = next(n for n, op in ops.items() if op.kind == "cross_entropy")
        assert ops[ce].fwd_bytes + ops[ce].bwd_bytes == pytest.approx(
            4.6 * (plain[ce].fwd_bytes + plain[ce].bwd_bytes))
        assert ops[ce].fwd_flops == plain[ce].fwd_flops
    megatron = {op.name: op for op in build_graph(apply_framework(spec, "megatron"), 1,
                                                  1024).layers[-1].ops}
    ce = next(n for n, op in megatron.items() if op.kind == "cross_entropy")
    assert megatron[ce].fwd_bytes == plain[ce].fwd_bytes
