"""`--device cpu|cuda` for `sim profile` and `sim trace`: backend choice and the refusals.

No GPU is needed: CUDA's presence is faked (torch.cuda.is_available / device_count patched)
and the worker spawn is intercepted, so these check the plumbing — which backend and device
reach the workers — and the one-line errors, not a CUDA run.
"""

from __future__ import annotations

import pytest

from trainsim.cli import main
from trainsim.errors import TraceError
from trainsim.validate.devices import backend_for, check_device


class _Spawned(Exception):
    """Raised by the fake spawn, carrying the workers' config."""


@pytest.fixture
def fake_gpus(monkeypatch):
    """Pretend torch sees CUDA with 2 GPUs and capture what would be spawned."""
    import torch
    import torch.multiprocessing as mp

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)

    def spawn(fn, args, nprocs, join):
        raise _Spawned(args[0], nprocs)

    monkeypatch.setattr(mp, "spawn", spawn)


def test_backend_per_device() -> None:
    """gloo on cpu, NCCL on cuda; anything else is a TraceError naming --device."""
    assert backend_for("cpu") == "gloo"
    assert backend_for("cuda") == "nccl"
    with pytest.raises(TraceError, match="--device 'tpu'"):
        backend_for("tpu")


def test_cuda_without_a_gpu_or_with_too_few_is_refused() -> None:
    """No CUDA: refused naming torch.cuda.is_available(); 1 GPU for 2 processes: refused
    naming both counts; 2 GPUs for 2 processes: NCCL."""
    with pytest.raises(TraceError, match=r"is_available\(\) is False"):
        check_device("sim trace", "cuda", 2, cuda_available=False, gpu_count=0)
    with pytest.raises(TraceError, match="2 GPUs .* 1 visible"):
        check_device("sim trace", "cuda", 2, cuda_available=True, gpu_count=1)
    assert check_device("sim trace", "cuda", 2, cuda_available=True, gpu_count=2) == "nccl"
    assert check_device("sim trace", "cpu", 2, cuda_available=False, gpu_count=0) == "gloo"


@pytest.mark.slow  # imports torch (about 1.5 s on first use)
@pytest.mark.parametrize("command", ["trace", "profile"])
def test_cli_cuda_without_gpu_is_one_line_exit_2(tmp_path, capsys, monkeypatch, command) -> None:
    """`sim trace|profile --device cuda` where torch sees no GPU: exit 2, one error line."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exc:
        main([command, "--model", "micro-gpt", "--device", "cuda", "--out",
              str(tmp_path / "out")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--device cuda" in err[0] and "is_available" in err[0]


def test_cli_unknown_device_is_one_line_exit_2(tmp_path, capsys) -> None:
    """`--device tpu` is refused before anything runs."""
    with pytest.raises(SystemExit) as exc:
        main(["trace", "--model", "micro-gpt", "--device", "tpu", "--out",
              str(tmp_path / "t.json")])
    assert exc.value.code == 2
    assert "--device 'tpu'" in capsys.readouterr().err


@pytest.mark.slow  # imports torch (about 1.5 s on first use)
def test_trace_workers_get_nccl_and_cuda(fake_gpus, tmp_path) -> None:
    """With (faked) GPUs, `sim trace --device cuda` spawns one worker per rank configured for
    NCCL on cuda."""
    from trainsim.validate.torch_parallel import run_parallel

    with pytest.raises(_Spawned) as got:
        run_parallel("micro-gpt", dp=2, tp=1, pp=1, micro_batch_size=1, num_micro_batches=1,
                     iterations=1, warmup=0, out_dir=tmp_path, device="cuda")
    cfg, nprocs = got.value.args
    assert nprocs == 2 and cfg["backend"] == "nccl" and cfg["device"] == "cuda"


@pytest.mark.slow  # imports torch (about 1.5 s on first use)
def test_profile_workers_get_nccl_and_no_solo_timings(fake_gpus) -> None:
    """`sim profile --device cuda` spawns NCCL workers on cuda and skips solo timings (each
    process has its own GPU); on cpu with 2 processes the workers use gloo and time solo."""
    from trainsim.validate.profiler import run_profile

    with pytest.raises(_Spawned) as got:
        run_profile("micro-gpt", device="cuda", processes=2)
    cfg, _ = got.value.args
    assert cfg["backend"] == "nccl" and cfg["device"] == "cuda" and cfg["solo"] is False
    with pytest.raises(_Spawned) as got:
        run_profile("micro-gpt", device="cpu", processes=2)
    cfg, _ = got.value.args
    assert cfg["backend"] == "gloo" and cfg["solo"] is True


def test_cpu_workers_get_the_caching_malloc_settings(monkeypatch) -> None:
    """On cpu the spawned workers inherit glibc's mmap and trim thresholds at 1 GiB (freed
    tensors stay in the heap, as under a caching allocator) and gloo on loopback; a value the
    user set is kept; cuda workers get neither."""
    import os

    from trainsim.validate.devices import prepare_workers

    for key in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLOO_SOCKET_IFNAME"):
        monkeypatch.delenv(key, raising=False)
    prepare_workers("cuda")
    assert "MALLOC_MMAP_THRESHOLD_" not in os.environ
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "12345")
    prepare_workers("cpu")
    assert os.environ["MALLOC_MMAP_THRESHOLD_"] == str(2**30)
    assert os.environ["MALLOC_TRIM_THRESHOLD_"] == "12345"
    assert os.environ["GLOO_SOCKET_IFNAME"] == "lo"


def test_cpu_workers_get_a_core_each_where_there_are_enough(monkeypatch) -> None:
    """One-thread cpu workers are bound rank r to the r-th allowed CPU; cuda, several threads
    a worker or more workers than CPUs leave them to the OS; the metadata says which."""
    import os

    from trainsim.validate import devices

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {5, 2, 9}, raising=False)
    assert devices.worker_cores("cpu", 2) == [2, 5]
    assert devices.worker_cores("cpu", 3) == [2, 5, 9]
    assert devices.worker_cores("cpu", 4) is None
    assert devices.worker_cores("cpu", 2, threads=2) is None
    assert devices.worker_cores("cuda", 2) is None
    assert devices.cpu_binding([2, 5]) == "one core per worker (rank r on CPU 2, 5 in order)"
    assert devices.cpu_binding(None).startswith("none")
    bound: list[set[int]] = []
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cpus: bound.append(set(cpus)),
                        raising=False)
    devices.pin_worker([2, 5], 1)
    devices.pin_worker(None, 0)
    assert bound == [{5}]


@pytest.mark.slow  # imports torch (about 1.5 s on first use)
def test_trace_and_profile_workers_are_given_their_cores(fake_gpus, tmp_path) -> None:
    """`sim trace` and `sim profile` on cpu hand their workers `worker_cores`' answer."""
    from trainsim.validate.devices import worker_cores
    from trainsim.validate.profiler import run_profile
    from trainsim.validate.torch_parallel import run_parallel

    with pytest.raises(_Spawned) as got:
        run_parallel("micro-gpt", dp=2, tp=1, pp=1, micro_batch_size=1, num_micro_batches=1,
                     iterations=1, warmup=0, out_dir=tmp_path, device="cpu")
    assert got.value.args[0]["cores"] == worker_cores("cpu", 2)
    with pytest.raises(_Spawned) as got:
        run_profile("micro-gpt", device="cpu", processes=2)
    assert got.value.args[0]["cores"] == worker_cores("cpu", 2)
