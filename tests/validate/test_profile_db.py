"""Profile database round trip, the profiled cost model's lookups and the cpu hardware fit."""

from __future__ import annotations

import json
import math

import pytest

from trainsim.errors import DataFileError
from trainsim.simulator.collectives import collective_time_s, link_bandwidths, plan_collective
from trainsim.validate.cpu_hardware import cpu_cluster, cpu_gpu_spec, fit_alpha_beta
from trainsim.validate.profile_db import ProfileDB, ProfileRow
from trainsim.validate.profiled_cost import ProfiledCostModel

ALPHA_S = 1e-4
BETA = 1e9


def _db() -> ProfileDB:
    """A synthetic database: two GEMMs, a layernorm, an optimizer step, exact α-β collectives."""
    rows = [
        ProfileRow(kind="matmul", shape=(256, 256, 256), pass_="fwd", flops=2 * 256**3,
                   bytes_moved=3.0 * 4 * 256**2, time_s=1e-3),
        ProfileRow(kind="matmul", shape=(256, 256, 256), pass_="bwd", flops=4 * 256**3,
                   bytes_moved=6 * 4 * 256**2, time_s=2e-3),
        ProfileRow(kind="matmul", shape=(256, 1024, 256), pass_="fwd", flops=8 * 256**3,
                   bytes_moved=4.0 * (2 * 256 * 1024 + 256**2), time_s=3e-3),
        ProfileRow(kind="matmul", shape=(256, 1024, 256), pass_="bwd", flops=16 * 256**3,
                   bytes_moved=8.0 * (2 * 256 * 1024 + 256**2), time_s=6e-3),
        ProfileRow(kind="layernorm", shape=(65536,), pass_="fwd", flops=5 * 65536,
                   bytes_moved=8 * 65536, time_s=5e-5),
        ProfileRow(kind="layernorm", shape=(65536,), pass_="bwd", flops=10 * 65536,
                   bytes_moved=12 * 65536, time_s=8e-5),
        ProfileRow(kind="optimizer", shape=(1000,), pass_="step", flops=12000,
                   bytes_moved=28000, time_s=1e-4),
        ProfileRow(kind="optimizer", shape=(4000,), pass_="step", flops=48000,
                   bytes_moved=112000, time_s=4e-4),
    ]
    for size in (4096.0, 2**20, 2**24):
        # ring all-reduce on 2 ranks: 2 steps of α, S bytes per link
        rows.append(ProfileRow(kind="all_reduce", pass_="comm", group_size=2, size_bytes=size,
                               time_s=2 * ALPHA_S + size / BETA))
    return ProfileDB(meta={"device": "cpu", "cpu_model": "test", "cpu_mhz": 2000.0},
                     rows=tuple(rows))


def test_round_trip_is_exact(tmp_path):
    """Saving and loading a database gives back the same metadata and rows."""
    db = _db()
    path = tmp_path / "p.csv"
    db.save(path)
    back = ProfileDB.load(path)
    assert back.meta == db.meta
    assert set(back.rows) == set(db.rows) and len(back.rows) == len(db.rows)


def test_save_refuses_to_overwrite(tmp_path):
    """An existing file is only overwritten with force."""
    path = tmp_path / "p.csv"
    _db().save(path)
    with pytest.raises(DataFileError, match="--force"):
        _db().save(path)
    _db().save(path, force=True)


def test_bad_files_raise_data_file_error(tmp_path):
    """A file without the header line, or a truncated header, is a DataFileError."""
    bad = tmp_path / "bad.csv"
    bad.write_text("kind,shape\nmatmul,1x2x3\n")
    with pytest.raises(DataFileError, match="not a trainsim profile"):
        ProfileDB.load(bad)
    bad.write_text('# trainsim-profile v1 {"device": "cp')
    with pytest.raises(DataFileError, match="not JSON"):
        ProfileDB.load(bad)


def test_exact_shapes_are_used_as_measured():
    """A measured forward and backward come back as measured; each of a GEMM's three calls
    (forward, two backward halves, same FLOPs) gets a third of forward + backward."""
    cost = ProfiledCostModel(_db())
    assert cost.time_s("layernorm", 5 * 65536, 8 * 65536, (65536,)) == pytest.approx(5e-5)
    assert cost.time_s("layernorm", 10 * 65536, 12 * 65536, (65536,)) == pytest.approx(8e-5)
    assert cost.time_s("matmul", 2 * 256**3, 0, (256, 256, 256)) == pytest.approx(1e-3)


def test_interpolation_is_a_power_law_between_shapes():
    """Halfway in log(FLOPs) between two GEMMs the time is halfway in log(time): the
    geometric means (forward 1 ms and 3 ms → √3 ms; backward 2 and 6 → 2√3)."""
    cost = ProfiledCostModel(_db())
    flops = 4 * 256**3  # geometric mean of 2·256³ and 8·256³
    t = cost.time_s("matmul", flops, 0, (256, 512, 256))
    assert t == pytest.approx((math.sqrt(3) * 1e-3 + 2 * math.sqrt(3) * 1e-3) / 3)
    assert cost.sources["interpolated"] == 2


def test_extrapolation_keeps_the_nearest_throughput():
    """Beyond the largest measured GEMM time grows in proportion to FLOPs."""
    cost = ProfiledCostModel(_db())
    t = cost.time_s("matmul", 16 * 256**3, 0, (256, 2048, 256))
    assert t == pytest.approx((6e-3 + 12e-3) / 3)


def test_backward_pass_recognised_at_an_unmeasured_shape():
    """At an unmeasured shape a layernorm query with 10 FLOPs/element is a backward."""
    cost = ProfiledCostModel(_db())
    t = cost.time_s("layernorm", 10 * 131072, 12 * 131072, (131072,))
    assert t == pytest.approx(2 * 8e-5)


def test_optimizer_step_by_parameter_count():
    """The Adam step (elementwise, no shape, 12 FLOPs per parameter) is looked up by
    parameter count: 2000 parameters lie between 1000 (0.1 ms) and 4000 (0.4 ms)."""
    cost = ProfiledCostModel(_db())
    assert cost.time_s("elementwise", 12 * 1000, 28 * 1000, None) == pytest.approx(1e-4)
    assert cost.time_s("elementwise", 12 * 2000, 28 * 2000, None) == pytest.approx(2e-4)


def test_unprofiled_kind_falls_back_to_roofline():
    """A kind the profile lacks costs max(FLOPs/peak, bytes/bandwidth) + the op overhead,
    with the peak and bandwidth the profile implies."""
    cost = ProfiledCostModel(_db())
    fig = cost.figures
    t = cost.time_s("gelu", 8e6, 8e6, (1_000_000,))
    expected = max(8e6 / fig.peak_flops, 8e6 / fig.memory_bandwidth_bytes_per_s) \
        + fig.op_overhead_s
    assert t == pytest.approx(expected)
    assert cost.sources["roofline"] == 1
    # peak = the fastest GEMM: 8·256³ FLOPs in 3 ms
    assert fig.peak_flops == pytest.approx(8 * 256**3 / 3e-3)


def test_alpha_beta_fit_recovers_the_formula():
    """All-reduces timed exactly as 2α + S/β give back α and β."""
    alpha, beta = fit_alpha_beta(_db())
    assert alpha == pytest.approx(ALPHA_S, rel=1e-6)
    assert beta == pytest.approx(BETA, rel=1e-6)


def test_cpu_cluster_prices_a_ring_all_reduce_by_the_fit():
    """On the cpu cluster a planned all-reduce of S takes 2α + S/β (ring, 2 ranks)."""
    cluster = cpu_cluster(_db(), 2)
    assert cluster.num_gpus == 2 and cluster.gpu(0).name == "cpu"
    size = 8e6
    phases = plan_collective("all_reduce", (0, 1), size, cluster, "ring")
    t = collective_time_s(phases, link_bandwidths(cluster, (0, 1)))
    assert t == pytest.approx(2 * ALPHA_S + size / BETA, rel=1e-6)


def test_cpu_spec_peak_is_the_measured_gemm_rate():
    """The cpu GpuSpec's fp32 peak equals the fastest measured GEMM's FLOP/s."""
    spec = cpu_gpu_spec(_db())
    assert spec.peak_flops("fp32") == pytest.approx(8 * 256**3 / 3e-3)


def test_solo_column_round_trips_and_old_files_read_it_as_zero(tmp_path):
    """solo_s survives save/load; a file written before the column existed loads with
    solo_s = 0 (not measured); a negative solo_s is a DataFileError naming the field."""
    row = ProfileRow(kind="matmul", shape=(8, 8, 8), pass_="fwd", flops=1024.0, time_s=2e-3,
                     solo_s=1e-3)
    db = ProfileDB(meta={"device": "cpu"}, rows=(row,))
    path = tmp_path / "p.csv"
    db.save(path)
    assert ProfileDB.load(path).rows[0].solo_s == 1e-3
    head, *lines = path.read_text().splitlines()
    old = [",".join(line.split(",")[:-1]) for line in lines]  # drop the last column
    prefix, meta = head.split("{", 1)
    meta_dict = json.loads("{" + meta)
    del meta_dict["sha256"]  # files of that time had no content hash either
    head = prefix + json.dumps(meta_dict)
    path.write_text("\n".join([head, *old]) + "\n")
    assert ProfileDB.load(path).rows[0].solo_s == 0.0
    with pytest.raises(DataFileError, match="solo_s"):
        ProfileRow(kind="matmul", pass_="fwd", time_s=1e-3, solo_s=-1.0)


def test_solo_cost_model_reads_solo_timings_where_measured():
    """ProfiledCostModel(solo=True) answers with solo_s where a row has it (the layernorm
    forward, 2e-5 s) and with time_s where it does not (the GEMM, 1e-3 s); the default model
    ignores solo_s."""
    import dataclasses

    base = _db()
    rows = tuple(dataclasses.replace(r, solo_s=2e-5)
                 if (r.kind, r.pass_) == ("layernorm", "fwd") else r for r in base.rows)
    db = ProfileDB(meta=base.meta, rows=rows)
    assert db.has_solo() and not base.has_solo()
    solo = ProfiledCostModel(db, solo=True)
    assert solo.time_s("layernorm", 5 * 65536, 0.0, (65536,)) == pytest.approx(2e-5)
    assert 3 * solo.time_s("matmul", 2 * 256**3, 0.0, (256, 256, 256)) == pytest.approx(3e-3)
    assert ProfiledCostModel(db).time_s("layernorm", 5 * 65536, 0.0, (65536,)) \
        == pytest.approx(5e-5)


def test_alpha_beta_fit_prefers_all_reduces_timed_after_compute():
    """With all-reduces timed after a GEMM (2α' + S/β, α' = 3α: the wake-up of a sleeping
    peer) beside the back-to-back ones, the fit takes the former: α' and β come back."""
    base = _db()
    extra = tuple(ProfileRow(kind="all_reduce_after_compute", pass_="comm", group_size=2,
                             size_bytes=size, time_s=2 * 3 * ALPHA_S + size / BETA)
                  for size in (4096.0, 2**20, 2**24))
    alpha, beta = fit_alpha_beta(ProfileDB(meta=base.meta, rows=base.rows + extra))
    assert alpha == pytest.approx(3 * ALPHA_S, rel=1e-6)
    assert beta == pytest.approx(BETA, rel=1e-6)
