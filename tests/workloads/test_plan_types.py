"""ParallelPlan fields of the wrong type: one PlanError naming plan.<field> and the value.

Plans are hand-written JSON (`sim simulate --plan bad.json`) or dicts given to
`trainsim.simulate`, so a string where an integer belongs is a user error like an impossible
degree: it must read "plan.tp='two' must be a positive integer", never a TypeError traceback.
"""

from __future__ import annotations

import dataclasses
import json
import re
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainsim.errors import PlanError
from trainsim.workloads.plan import ParallelPlan

BAD_FIELDS: list[tuple[dict[str, Any], str]] = [
    ({"schedule": 5}, r"plan\.schedule=5 must be a schedule name"),
    ({"recompute": 5}, r"plan\.recompute=5 must be none, selective, full or a list of op names"),
    ({"stage_layers": [[0, 1]]}, r"plan\.stage_layers\[0\]=\[0, 1\] must be an integer"),
    ({"stage_layers": "x"}, r"plan\.stage_layers='x' must be a list of integers"),
    ({"micro_batches": "x"}, r"plan\.micro_batches='x' must be a list of"),
    ({"micro_batches": [{"batch_size": "a", "seq_len": 2}]},
     r"plan\.micro_batches\[0\]\.batch_size='a' must be a positive integer"),
    ({"micro_batches": [5]}, r"plan\.micro_batches\[0\]=5 must be \{\"batch_size\""),
    ({"op_tp": {"attn.qkv": "x"}}, r"plan\.op_tp\['attn\.qkv'\]='x' must be a positive integer"),
    ({"placement": 3}, r"plan\.placement=3 must be a list of integers"),
    ({"stage_tp": [2, "x"]}, r"plan\.stage_tp\[1\]='x' must be a positive integer"),
    ({"stage_recompute": [1, 2]}, r"plan\.stage_recompute\[0\]=1 must be none, selective"),
    ({"freq_mhz": "fast"}, r"plan\.freq_mhz='fast' must be a positive frequency in MHz"),
    ({"freq_mhz": float("nan")}, r"plan\.freq_mhz=nan must be a positive frequency"),
    ({"tp": "two"}, r"plan\.tp='two' must be a positive integer"),
    ({"tp": 2.5}, r"plan\.tp=2\.5 must be a positive integer"),
    ({"sp": "yes"}, r"plan\.sp='yes' must be true or false"),
    ({"dtype": 3}, r"plan\.dtype=3 must be fp16, bf16 or fp32"),
    ({"global_batch": True}, r"plan\.global_batch=True must be a positive integer"),
    ({"zero": "1"}, r"plan\.zero='1' must be 0, 1, 2 or 3"),
    ({"order": 5}, r"plan\.order=5 must be a list of per-rank action lists"),
    ({"order": {"a": []}}, r"plan\.order=\{'a': \[\]\}: .*rank numbers as keys"),
    ({"instruction_freq_mhz": [1, 2]}, r"plan\.instruction_freq_mhz=\[1, 2\] must be a map"),
    ({"instruction_freq_mhz": {"zz": 900}},
     r"plan\.instruction_freq_mhz key 'zz' is not an action like '2F3'"),
    ({"stage_freq_mhz": [True]}, r"plan\.stage_freq_mhz\[0\]=True must be a positive frequency"),
]


@pytest.mark.parametrize(("fields", "message"), BAD_FIELDS, ids=lambda v: json.dumps(v)[:40]
                         if isinstance(v, dict) else "")
def test_wrong_type_names_field_and_value(fields: dict[str, Any], message: str) -> None:
    """Each wrongly typed field, from a plan JSON file or a dict, is one PlanError that names
    plan.<field>, the bad value and what is expected."""
    with pytest.raises(PlanError, match=message):
        ParallelPlan.from_dict(fields)
    with pytest.raises(PlanError, match=message):  # Python's json reads and writes NaN
        ParallelPlan.from_json(json.dumps(fields))


def test_wrong_type_through_simulate() -> None:
    """`trainsim.simulate(model, cluster, {...})` reports a wrong type the same way."""
    import trainsim

    with pytest.raises(PlanError, match=r"plan\.tp='two' must be a positive integer"):
        trainsim.simulate("gpt3-125m", "1xA100-SXM4-80GB", {"tp": "two"})


def test_lists_become_tuples_and_numpy_like_ints_are_accepted() -> None:
    """JSON lists are stored as tuples (plans are hashable, frozen records); ints of other
    integral types (numpy) are stored as int, so the plan still serialises to JSON."""
    np = pytest.importorskip("numpy")
    plan = ParallelPlan(pp=np.int64(2), stage_layers=[np.int64(3), 5], stage_freq_mhz=[1000, 1100],
                        op_tp={"mlp.fc1": np.int32(1)}, order=[["0F0"], ["1F0"]],
                        schedule="explicit")
    assert plan.stage_layers == (3, 5) and type(plan.pp) is int
    assert plan.stage_freq_mhz == (1000.0, 1100.0)
    assert plan.order == (("0F0",), ("1F0",))
    assert json.loads(plan.to_json())["op_tp"] == {"mlp.fc1": 1}


_FIELDS = sorted(f.name for f in dataclasses.fields(ParallelPlan))
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 64) | st.integers() | st.floats()
    | st.sampled_from(["", "x", "1f1b", "interleaved", "selective", "fp16", "0F0", "1B1", "3"]),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.sampled_from(["batch_size", "seq_len", "0", "1", "0F0", "attn.qkv",
                                       "x"]), inner, max_size=3),
    max_leaves=8)


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(_FIELDS), _JSON, max_size=4))
def test_random_json_gives_a_plan_or_a_plan_error(fields: dict[str, Any]) -> None:
    """from_dict on random JSON-like values for random known fields either returns a plan
    (which round-trips through JSON unchanged) or raises PlanError naming a plan field; never
    another exception."""
    try:
        plan = ParallelPlan.from_dict(fields)
    except PlanError as exc:
        assert re.search(r"plan[. ]", str(exc))
        return
    assert ParallelPlan.from_json(plan.to_json()) == plan


def test_check_never_crashes_on_a_typed_plan() -> None:
    """A plan that passed its own checks is compared with the model and cluster without a
    TypeError (stage_tp entries are ints by then, so `t < 1` and `% t` are safe)."""
    cluster = SimpleNamespace(num_gpus=4, node_groups=[SimpleNamespace(num_gpus=4)],
                              gpu=lambda rank: SimpleNamespace(name="g", sm_clock_min_mhz=100,
                                                               sm_clock_max_mhz=2000))
    model = SimpleNamespace(name="m", num_layers=4, num_heads=4, num_kv_heads=4, ffn_hidden=16,
                            num_experts=0, max_seq_len=0, op_names=list)
    plan = ParallelPlan.from_json('{"dp": 2, "pp": 2, "stage_tp": [1, 3]}')
    with pytest.raises(PlanError, match=r"plan\.stage_tp\[1\]=3 must divide"):
        plan.check(model, cluster)
