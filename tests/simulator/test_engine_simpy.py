"""The SimPy reference engine on hand-checkable programs: streams, rendezvous, links, memory,
energy, throughput, folding and deadlock reports."""

from __future__ import annotations

import json
import math

import pytest

from trainsim.errors import SimulationError
from trainsim.simulator.engine_simpy import run_simpy
from trainsim.simulator.program import Program, ProgramInfo, Task


def _task(name: str, rank: int | tuple[int, ...] = 0, **kw) -> Task:
    ranks = (rank,) if isinstance(rank, int) else rank
    kw.setdefault("kind", "forward")
    kw.setdefault("stream", "compute")
    kw.setdefault("duration_s", 1.0)
    return Task(name=name, ranks=ranks, **kw)


def _times(program: Program) -> list[tuple[float, float]]:
    result = run_simpy(program)
    return [(float(s), float(e)) for s, e in zip(result.start_s, result.end_s, strict=True)]


def test_chain_on_one_stream_sums_durations() -> None:
    """Tasks on one stream run back to back: 0.5 + 1.25 + 2 = 3.75 s."""
    program = Program(
        num_ranks=1,
        tasks=[_task("a", duration_s=0.5), _task("b", duration_s=1.25), _task("c", duration_s=2.0)],
    )
    assert _times(program) == [(0.0, 0.5), (0.5, 1.75), (1.75, 3.75)]
    assert run_simpy(program).iteration_time_s == 3.75


def test_two_streams_of_one_rank_overlap() -> None:
    """Compute (1 s) and a dp transfer (2 s) on the same rank run concurrently: 2 s, not 3."""
    program = Program(
        num_ranks=1, tasks=[_task("f"), _task("ar", kind="all_reduce", stream="dp", duration_s=2.0)]
    )
    assert _times(program) == [(0.0, 1.0), (0.0, 2.0)]


def test_deps_delay_a_task_across_ranks() -> None:
    """A task on rank 1 that depends on rank 0's 1 s task starts at 1 s."""
    program = Program(num_ranks=2, tasks=[_task("a", 0), _task("b", 1, deps=(0,))])
    assert _times(program) == [(0.0, 1.0), (1.0, 2.0)]


def test_collective_waits_for_its_slowest_member_and_holds_all_streams() -> None:
    """An all-reduce on ranks 0 and 1 starts when rank 1's 3 s work ends, and the next dp task of
    rank 0 waits for it (rendezvous), although rank 0 was ready at 1 s."""
    program = Program(
        num_ranks=2,
        tasks=[
            _task("w0", 0, duration_s=1.0, stream="dp"),
            _task("w1", 1, duration_s=3.0, stream="dp"),
            _task("ar", (0, 1), kind="all_reduce", stream="dp", duration_s=0.5),
            _task("after", 0, kind="optimizer", stream="dp", duration_s=0.25),
        ],
    )
    assert _times(program) == [(0.0, 1.0), (0.0, 3.0), (3.0, 3.5), (3.5, 3.75)]


def test_lone_transfer_takes_latency_plus_bytes_over_the_bottleneck() -> None:
    """A p2p with α = 1 ms moving 1000 B over links of 1000 and 500 B/s ends at 0.001 + 2 s."""
    program = Program(
        num_ranks=2,
        tasks=[
            _task(
                "send",
                (0, 1),
                kind="p2p",
                stream="pp",
                duration_s=0.001,
                comm_bytes=1000.0,
                links=("nvl", "nic"),
            )
        ],
        link_bandwidth_bytes_per_s={"nvl": 1000.0, "nic": 500.0},
    )
    assert _times(program) == [(0.0, 2.001)]


def test_two_transfers_sharing_one_link_take_twice_as_long() -> None:
    """Two 100 B transfers started together on one 100 B/s link each get 50 B/s: both end at 2 s."""
    tasks = [
        _task(f"t{r}", r, kind="p2p", stream="pp", duration_s=0.0, comm_bytes=100.0, links=("l",))
        for r in (0, 1)
    ]
    program = Program(num_ranks=2, tasks=tasks, link_bandwidth_bytes_per_s={"l": 100.0})
    assert _times(program) == [(0.0, 2.0), (0.0, 2.0)]


def test_staggered_transfers_follow_the_piecewise_fluid_result() -> None:
    """A (100 B) starts at 0 on a 100 B/s link; B (100 B) joins at 0.5 s after its fixed part.
    0–0.5 s: A alone at 100 B/s (50 B left). Then both at 50 B/s: A ends at 1.5 s; B has 50 B
    left and finishes alone at 100 B/s at 2.0 s."""
    program = Program(
        num_ranks=2,
        tasks=[
            _task("A", 0, kind="p2p", stream="pp", duration_s=0.0, comm_bytes=100.0, links=("l",)),
            _task("B", 1, kind="p2p", stream="pp", duration_s=0.5, comm_bytes=100.0, links=("l",)),
        ],
        link_bandwidth_bytes_per_s={"l": 100.0},
    )
    assert _times(program) == [(0.0, 1.5), (0.0, 2.0)]


def test_rate_is_min_over_links_of_equal_shares() -> None:
    """A (100 B on l1) and B (30 B on l1+l2) with l1 = 100, l2 = 30 B/s: B gets min(50, 30) = 30 B/s
    and ends at 1 s; A gets 50 B/s, has 50 B left at 1 s, then 100 B/s: ends at 1.5 s."""
    program = Program(
        num_ranks=2,
        tasks=[
            _task("A", 0, kind="p2p", stream="pp", duration_s=0.0, comm_bytes=100.0, links=("l1",)),
            _task(
                "B", 1, kind="p2p", stream="pp", duration_s=0.0, comm_bytes=30.0, links=("l1", "l2")
            ),
        ],
        link_bandwidth_bytes_per_s={"l1": 100.0, "l2": 30.0},
    )
    assert _times(program) == [(0.0, 1.5), (0.0, 1.0)]


def test_memory_peak_and_timeline() -> None:
    """Static 100 B; a (0–1 s) holds 50 B, b (0–2 s, other stream) 30 B, c (1–2 s) 40 B once a
    freed its 50: peak 180 B at 0, then 130 and 170 at 1 s; at 2 s b then c free (task order)."""
    program = Program(
        num_ranks=1,
        tasks=[
            _task("a", mem_alloc_bytes=50.0, mem_free_bytes=50.0),
            _task("b", stream="tp", duration_s=2.0, mem_alloc_bytes=30.0, mem_free_bytes=30.0),
            _task("c", mem_alloc_bytes=40.0, mem_free_bytes=40.0),
        ],
        static_memory_bytes=[100.0],
    )
    result = run_simpy(program)
    timeline = list(
        zip(result.memory_timeline["time_s"], result.memory_timeline["bytes"], strict=True)
    )
    assert timeline == [
        (0.0, 100.0),
        (0.0, 150.0),
        (0.0, 180.0),
        (1.0, 130.0),
        (1.0, 170.0),
        (2.0, 140.0),
        (2.0, 100.0),
    ]
    assert result.ranks[0].peak_memory_bytes == 180.0
    assert not result.oom


def test_memory_freed_at_an_instant_is_reusable_by_a_task_starting_then() -> None:
    """A buffer freed at 1 s and a new 50 B one allocated at 1 s never coexist: peak = 10 + 50;
    a zero-length task's own 70 B allocation still counts: peak then 10 + 70."""
    program = Program(
        num_ranks=1,
        tasks=[
            _task("a", mem_alloc_bytes=50.0, mem_free_bytes=50.0),
            _task("b", stream="tp", deps=(0,), mem_alloc_bytes=50.0, mem_free_bytes=50.0),
        ],
        static_memory_bytes=[10.0],
    )
    assert run_simpy(program).peak_memory_bytes == 60.0
    zero = Program(
        num_ranks=1,
        tasks=[_task("z", duration_s=0.0, mem_alloc_bytes=70.0, mem_free_bytes=70.0)],
        static_memory_bytes=[10.0],
    )
    assert run_simpy(zero).peak_memory_bytes == 80.0


def test_oom_reports_moment_and_excess() -> None:
    """Capacity 150 B, static 100 B: an 80 B allocation at 2 s goes 30 B over, at 2 s."""
    program = Program(
        num_ranks=2,
        tasks=[
            _task("x", duration_s=2.0),
            _task("big", mem_alloc_bytes=80.0),
            _task("other", 1, mem_alloc_bytes=10.0),
        ],
        static_memory_bytes=[100.0, 100.0],
        memory_capacity_bytes=[150.0, 150.0],
    )
    result = run_simpy(program)
    rank0, rank1 = result.ranks
    assert (rank0.oom, rank0.oom_time_s, rank0.oom_excess_bytes) == (True, 2.0, 30.0)
    assert (rank1.oom, rank1.oom_time_s, rank1.oom_excess_bytes) == (False, None, 0.0)
    assert result.oom and result.peak_memory_bytes == 180.0


def test_energy_counts_powered_streams_and_idle_power() -> None:
    """Idle 50 W; compute 1 s at 300 W and a 2 s dp task at 200 W (unpowered stream):
    2 s iteration, energy = 300·1 + 50·(2 − 1) = 350 J, busy 1 s, idle 1 s."""
    program = Program(
        num_ranks=1,
        tasks=[
            _task("f", power_w=300.0),
            _task("ar", kind="all_reduce", stream="dp", duration_s=2.0, power_w=200.0),
        ],
        idle_power_w=[50.0],
    )
    result = run_simpy(program)
    rank = result.ranks[0]
    assert (rank.energy_j, rank.busy_s, rank.idle_s) == (350.0, 1.0, 1.0)
    assert result.tasks["energy_j"].tolist() == [300.0, 0.0]
    assert list(
        zip(result.power_timeline["time_s"], result.power_timeline["power_w"], strict=True)
    ) == [(0.0, 300.0), (1.0, 50.0)]


def test_overlapping_powered_streams_add_power_and_union_busy_time() -> None:
    """Both streams powered: 1 s at 300 W and 2 s at 100 W overlap; busy = 2 s (union), energy =
    300 + 200 + 40·(3 − 2) = 540 J in a 3 s iteration ending with a 1 s unpowered task."""
    program = Program(
        num_ranks=1,
        tasks=[
            _task("f", power_w=300.0),
            _task("g", stream="aux", duration_s=2.0, power_w=100.0),
            _task("h", stream="dp", deps=(1,), power_w=999.0),
        ],
        idle_power_w=[40.0],
        powered_streams=frozenset({"compute", "aux"}),
    )
    rank = run_simpy(program).ranks[0]
    assert (rank.busy_s, rank.energy_j) == (2.0, 540.0)


def test_bubble_fraction_is_idle_share_of_the_compute_stream() -> None:
    """Rank 1 computes 1 s of a 4 s iteration (bubble 0.75); rank 0 computes 4 s (bubble 0)."""
    program = Program(num_ranks=2, tasks=[_task("a", 0, duration_s=4.0), _task("b", 1)])
    result = run_simpy(program)
    assert [r.bubble_fraction for r in result.ranks] == [0.0, 0.75]
    assert result.bubble_fraction == 0.75


def test_throughput_and_mfu_from_program_info() -> None:
    """2 s iteration, batch 8 × 1024 tokens, 1.6e13 model FLOPs on 2 ranks of 1e13 FLOP/s peak:
    4 samples/s, 4096 tokens/s, MFU = 1.6e13 / (2 s · 2 · 1e13 FLOP/s) = 0.4."""
    program = Program(
        num_ranks=2,
        tasks=[_task("a", 0, duration_s=2.0), _task("b", 1, duration_s=2.0)],
        info=ProgramInfo(
            global_batch=8,
            seq_len=1024,
            model_flops_per_iteration=1.6e13,
            peak_flops_per_rank=1e13,
        ),
    )
    result = run_simpy(program)
    assert result.samples_per_s == 4.0
    assert result.tokens_per_s == 4096.0
    assert result.mfu == pytest.approx(0.4)
    bare = run_simpy(Program(num_ranks=1, tasks=[_task("a")]))
    assert (bare.samples_per_s, bare.tokens_per_s, bare.mfu) == (None, None, None)


def test_summary_dict_keys_and_json() -> None:
    """The summary has the CLI keys in a stable order and is valid JSON."""
    summary = run_simpy(Program(num_ranks=1, tasks=[_task("a")])).to_summary_dict()
    assert list(summary)[:9] == [
        "iteration_time_s",
        "samples_per_s",
        "tokens_per_s",
        "mfu",
        "bubble_fraction",
        "peak_memory_bytes",
        "oom",
        "energy_j",
        "cost_usd",
    ]
    assert summary["per_rank"][0]["rank"] == 0
    assert json.loads(json.dumps(summary)) == summary


def test_cost_is_price_per_hour_times_iteration_time() -> None:
    """A 2 s iteration on GPUs at $36/h costs 36 × 2 / 3600 = $0.02; no price, no cost."""
    priced = Program(num_ranks=1, tasks=[_task("a", duration_s=2.0)],
                     info=ProgramInfo(price_per_hour_usd=36.0))
    result = run_simpy(priced)
    assert result.cost_usd == pytest.approx(0.02)
    assert result.to_summary_dict()["cost_usd"] == result.cost_usd
    assert run_simpy(Program(num_ranks=1, tasks=[_task("a")])).cost_usd is None


def test_expand_unfolds_represented_ranks() -> None:
    """Two program ranks standing for physical ranks (0, 1) and (2, 3): expand() has 4 records and
    doubles the task rows; total energy counts each physical rank once: rank 0 draws 10 J (1 s
    at 10 W), rank 1 10 J idle, each for two physical ranks: 40 J."""
    program = Program(
        num_ranks=2,
        tasks=[_task("a", 0, power_w=10.0), _task("ar", (0, 1), kind="all_reduce", stream="dp")],
        represents=[(0, 1), (2, 3)],
        idle_power_w=[10.0, 10.0],
    )
    folded = run_simpy(program)
    expanded = folded.expand()
    assert [r.rank for r in expanded.ranks] == [0, 1, 2, 3]
    assert len(expanded.tasks) == 2 * len(folded.tasks)
    assert sorted(expanded.tasks[expanded.tasks["task_id"] == 1]["rank"]) == [0, 1, 2, 3]
    assert folded.energy_j == expanded.energy_j == 2 * 10.0 + 2 * 10.0
    assert expanded.to_summary_dict()["per_rank"][3]["represents"] == [3]


def test_empty_program_takes_no_time() -> None:
    """A program without tasks is valid: 0 s, static memory as peak, no energy."""
    result = run_simpy(Program(num_ranks=2, static_memory_bytes=[5.0, 7.0], idle_power_w=[1, 1]))
    assert result.iteration_time_s == 0.0
    assert result.peak_memory_bytes == 7.0
    assert result.energy_j == 0.0
    assert result.to_summary_dict()["bubble_fraction"] == 0.0


def test_deadlock_from_disagreeing_collective_order_names_ranks_and_heads() -> None:
    """Rank 1's dp stream must finish "pre" (which needs all-reduce Y) before all-reduce X, while
    rank 0's dp stream runs X before Y: the members disagree on the order of X and Y. The error
    names the three ranks, each stream's head task and the deps or peers it waits for."""
    program = Program(
        num_ranks=3,
        tasks=[
            _task("pre", 1, stream="dp", deps=(2,)),
            _task("X", (0, 1), kind="all_reduce", stream="dp"),
            _task("Y", (0, 2), kind="all_reduce", stream="dp"),
        ],
    )
    with pytest.raises(SimulationError) as info:
        run_simpy(program)
    text = str(info.value)
    assert "3 of 3 tasks can never run; stuck ranks: 0, 1, 2" in text
    assert (
        "rank 0 stream 'dp': head task 1 'X' (all_reduce) waits for peers not arrived: "
        "rank 1 (its 'dp' stream is at task 0 'pre')"
    ) in text
    assert "rank 1 stream 'dp': head task 0 'pre' (forward) waits for deps [2 'Y']" in text
    assert (
        "rank 2 stream 'dp': head task 2 'Y' (all_reduce) waits for peers not arrived: "
        "rank 0 (its 'dp' stream is at task 1 'X')"
    ) in text
    assert "wait cycle: 1 'X' -> 0 'pre' -> 2 'Y' -> 1 'X'" in text


def test_dep_on_a_later_task_of_the_same_stream_deadlocks() -> None:
    """Task 0 waits for task 1, which sits behind it on the same stream: both stuck."""
    program = Program(num_ranks=1, tasks=[_task("a", deps=(1,)), _task("b")])
    with pytest.raises(SimulationError, match=r"waits for deps \[1 'b'\]"):
        run_simpy(program)


def test_large_cyclic_program_reports_deadlock() -> None:
    """A 2000-task ring of deps over 8 ranks ends with an error naming all 8 ranks (no hang)."""
    n = 2000
    tasks = [_task(f"t{i}", i % 8, deps=((i - 1) % n,)) for i in range(n)]
    with pytest.raises(SimulationError) as info:
        run_simpy(Program(num_ranks=8, tasks=tasks))
    assert "2000 of 2000 tasks can never run; stuck ranks: 0, 1, 2, 3, 4, 5, 6, 7" in str(
        info.value
    )
    assert "wait cycle: 0 't0' -> 1999 't1999'" in str(info.value)


def test_structural_errors_are_reported_before_running() -> None:
    """A task on a rank the program does not have is a SimulationError, not a crash."""
    with pytest.raises(SimulationError, match="rank 4 out of range"):
        run_simpy(Program(num_ranks=2, tasks=[_task("a", 4)]))


def test_task_frame_has_one_row_per_member_and_the_documented_columns() -> None:
    """A 2-rank p2p gives two rows; columns include timing, metadata and energy."""
    program = Program(
        num_ranks=2,
        tasks=[
            _task(
                "p",
                (0, 1),
                kind="p2p",
                stream="pp",
                micro_batch=3,
                stage=1,
                first_layer=4,
                last_layer=7,
                freq_mhz=1410.0,
            )
        ],
    )
    frame = run_simpy(program).tasks
    assert frame["rank"].tolist() == [0, 1]
    for column in (
        "task_id",
        "name",
        "kind",
        "rank",
        "stream",
        "start_s",
        "end_s",
        "duration_s",
        "micro_batch",
        "stage",
        "first_layer",
        "last_layer",
        "comm_bytes",
        "freq_mhz",
        "power_w",
        "energy_j",
    ):
        assert column in frame.columns
    assert frame["micro_batch"].tolist() == [3, 3] and frame["freq_mhz"].tolist() == [1410.0] * 2
    assert not math.isnan(frame["end_s"].iloc[0])


def test_progress_callback_reaches_the_task_count() -> None:
    """on_progress sees a growing count of ended tasks ending at the total (for progress bars)."""
    seen: list[tuple[int, int]] = []
    program = Program(num_ranks=1, tasks=[_task(f"t{i}") for i in range(250)])
    run_simpy(program, on_progress=lambda done, total: seen.append((done, total)))
    assert seen[-1] == (250, 250)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
