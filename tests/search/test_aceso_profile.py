"""Aceso's V100 op-profile CSVs: every file in ../shared/data/aceso parses, the cost model returns
the measured µs for a profiled op, interpolates between micro-batch sizes, and leaves the
tensor-parallel collectives out of the program (Aceso's op times include them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainsim.errors import DataFileError
from trainsim.search.aceso.profile import (
    AcesoCostModel,
    aceso_lowering_options,
    load_aceso_profile,
    parse_op_file,
)


@pytest.fixture(scope="module")
def data(shared_subdir) -> Path:
    """Aceso's profiles (tests/conftest.py: skip if absent, fail under CI)."""
    return shared_subdir("aceso")


@pytest.mark.slow
def test_every_profile_file_parses(data: Path) -> None:
    """Both folders parse completely: every CSV is an op, collective or p2p file (540 files in
    the eurosys set, 114 in the miniset per SOURCES.md's listing)."""
    for folder in ("profiled-time-eurosys", "profiled-time-miniset"):
        root = data / folder
        prof = load_aceso_profile(root)
        n_csv = len(list(root.glob("*.csv")))
        assert len(prof.op_files) + len(prof.collectives) + len(prof.p2p) == n_csv
        assert all(f.ops for f in prof.op_files)


def test_op_file_values_in_seconds_and_bytes(data: Path) -> None:
    """gpt_1_3B mbs1 tp1: enc-attention-qkv forward 659.752 µs, backward 1307.446 µs (first
    rows of the miniset file), weights 24 MB."""
    f = parse_op_file(data / "profiled-time-miniset" / "gpt_1_3B_mbs1_tp1_algo0.csv")
    op = f.ops["enc-attention-qkv"]
    assert (f.mbs, f.tp, f.algo) == (1, 1, 0)
    assert op.fwd_s == pytest.approx(659.752e-6)
    assert op.bwd_s == pytest.approx(1307.446e-6)
    assert op.weight_bytes == pytest.approx(24 * 2**20)


def test_cost_model_returns_measured_and_interpolated_times(data: Path) -> None:
    """The QKV GEMM's forward query returns a third of Aceso's forward + backward µs at a
    measured batch (the lowering asks three equal-FLOP GEMM calls: F, and B's two halves) and
    the linear interpolation between batches 2 and 4 at batch 3."""
    from trainsim.hwmodels.gpus import get_gpu
    from trainsim.workloads.model import build_graph
    from trainsim.workloads.zoo import get_model

    model = get_model("aceso-gpt-1.3b")
    prof = load_aceso_profile(data / "profiled-time-miniset")
    cost = AcesoCostModel(prof, model)
    gpu = get_gpu("V100-PCIe-32GB")
    times = {}
    for b in (2, 3, 4):
        op = next(o for o in build_graph(model, b).layers[1].ops if o.name == "attn.qkv")
        times[b] = cost.estimate(op.kind, op.fwd_flops, op.fwd_bytes, gpu, shape=op.shape).time_s
    f2 = parse_op_file(data / "profiled-time-miniset" / "gpt_1_3B_mbs2_tp1_algo0.csv")
    f4 = parse_op_file(data / "profiled-time-miniset" / "gpt_1_3B_mbs4_tp1_algo0.csv")
    q2, q4 = f2.ops["enc-attention-qkv"], f4.ops["enc-attention-qkv"]
    t2, t4 = (q2.fwd_s + q2.bwd_s) / 3, (q4.fwd_s + q4.bwd_s) / 3
    assert times[2] == pytest.approx(t2) and times[4] == pytest.approx(t4)
    assert times[3] == pytest.approx((t2 + t4) / 2)


def test_profiled_lowering_has_no_tensor_parallel_tasks(data: Path) -> None:
    """With the Aceso options a tp=2 plan lowers without 'tp' stream tasks (the all-reduce is in
    the op times); the roofline lowering of the same plan has them."""
    from trainsim.hwmodels.cluster import parse_cluster
    from trainsim.search.oracle import Oracle
    from trainsim.workloads.lowering import lower
    from trainsim.workloads.zoo import get_model

    oracle = Oracle(get_model("aceso-gpt-1.3b"), parse_cluster("4xV100-PCIe-32GB"))
    opts = aceso_lowering_options(data / "profiled-time-miniset", oracle.model)
    plan = oracle.plan({"tp": 2, "pp": 2, "micro_batch_size": 1, "global_batch": 4,
                        "recompute": "full"})
    measured = lower(oracle.model, oracle.cluster, plan, opts)
    roofline = lower(oracle.model, oracle.cluster, plan)
    assert not any(t.name.startswith("tp.") for t in measured.tasks)
    assert any(t.name.startswith("tp.") for t in roofline.tasks)
    assert opts.cost_model.sources["measured"] > 0


def test_missing_or_foreign_folders_are_data_errors(tmp_path: Path) -> None:
    """A missing folder, an empty one and a stray CSV each raise DataFileError naming it."""
    with pytest.raises(DataFileError, match="does not exist"):
        load_aceso_profile(tmp_path / "nope")
    with pytest.raises(DataFileError, match="no Aceso op files"):
        load_aceso_profile(tmp_path)
    (tmp_path / "stray.csv").write_text("a,b\n1,2\n")
    with pytest.raises(DataFileError, match="stray.csv"):
        load_aceso_profile(tmp_path)
