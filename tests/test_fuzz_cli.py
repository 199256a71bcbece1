"""Fuzz every `sim` command's options: 0 tracebacks, 0 hangs, bad input is one line, exit 2.

The commands and their options are read from the CLI itself (typer's click tree), so a new
command or option is fuzzed without editing this file. Each example picks a few options and
gives each a value drawn by its type from random, extreme and malformed values: numbers like
10^12, −1, 0, NaN and inf, unknown names, corrupt or truncated JSON / CSV / YAML files, a
binary file, an empty file, a folder, a path that cannot be written, a file that already
exists. Every call runs in-process under a timeout (SIGALRM). What must hold:

- the call ends within TIMEOUT_S (no hang), by SystemExit with code 0, 1, 2 or 3;
- nothing prints a Python traceback, and no other exception escapes;
- with code 2 (bad input), stderr is exactly one line.

`TRAINSIM_FUZZ_EXAMPLES` sets the examples per command (default 30, about a minute in all); a
deeper local run: ``TRAINSIM_FUZZ_EXAMPLES=200 pytest tests/test_fuzz_cli.py``. Commands whose
valid runs take minutes (real torch runs in `sim profile` / `sim trace`, fitting in `sim
calibrate`) always get at least one out-of-range number, so they are fuzzed on their checks.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainsim.cli import app, main

TIMEOUT_S = 60
EXAMPLES = int(os.environ.get("TRAINSIM_FUZZ_EXAMPLES", "30"))
SLOW_COMMANDS = {"profile", "trace", "calibrate dvfs"}
"""Valid runs of these take minutes: every example gets one out-of-range number (or, without
numeric options, a missing or corrupt input path)."""
NUMBERS = ["0", "-1", "1", "2", "3", "8", "1000000000000", "-1000000000000", "nan", "inf",
           "-inf", "1e309", "2.5", "abc", ""]
NAMES = ["gpt3-125m", "tiny-gpt", "nope", "", "A100", "4xV100-SXM2-32GB", "1x2xA40",
         "cpu:2", "cpu:0", "1000000x8xA100-SXM4-80GB", "2xA100-SXM4-80GB+1xA10", "x" * 300,
         "dp2", "dp=2,tp=2,pp=2", "selective", "1f1b", "numba", "cuda", "-1", "nan", "ÿ\x00"]


def _commands() -> list[tuple[tuple[str, ...], Any]]:
    out: list[tuple[tuple[str, ...], Any]] = []

    def walk(cmd: Any, path: tuple[str, ...]) -> None:
        if hasattr(cmd, "commands"):
            for name, sub in sorted(cmd.commands.items()):
                walk(sub, (*path, name))
        else:
            out.append((path, cmd))

    walk(typer.main.get_command(app), ())
    return out


COMMANDS = _commands()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Malformed and awkward paths, made once."""
    d = tmp_path_factory.mktemp("fuzz-files")
    made = {
        "corrupt.json": '{"format": "trainsim-trace", "version": 1, "model": ',
        "list.json": "[1, 2, 3]",
        "empty.json": "",
        "corrupt.csv": "stage,instruction,frequency\n0,forward,abc\n1,",
        "header.csv": "# trainsim-profile v1 {not json}\nkind,shape\n",
        "corrupt.yaml": "family: gpt\nnum_layers: [1, 2\n",
        "model.yaml": "family: gpt\nnum_layers: -3\nhidden: 0\n",
        "plan.json": '{"dp": "two", "tp": 2.5}',
        "existing.html": "<html>mine</html>",
    }
    paths = {}
    for name, text in made.items():
        (d / name).write_text(text, encoding="utf-8")
        paths[name] = str(d / name)
    (d / "binary.bin").write_bytes(bytes(range(256)) * 4)
    paths["binary.bin"] = str(d / "binary.bin")
    paths["folder"] = str(d)
    paths["missing"] = str(d / "no" / "such" / "file.json")
    paths["unwritable"] = "/proc/trainsim-fuzz/out.html"
    paths["new"] = str(d / "new-output")
    return paths


def _kind(param: Any) -> type:
    """The option's value type (typer gives a type, or its name where the command module
    uses postponed annotations)."""
    bare = param.bare_type()
    name = bare if isinstance(bare, str) else getattr(bare, "__name__", str(bare))
    for key, kind in (("float", float), ("int", int), ("Path", Path), ("bool", bool)):
        if key in name:
            return kind
    return str


def _value(param: Any, draw: Any, files: dict[str, str]) -> str:
    kind = _kind(param)
    if kind in (int, float):
        return draw(st.sampled_from(NUMBERS))
    if kind is Path:
        return draw(st.sampled_from(sorted(files.values())))
    return draw(st.one_of(st.sampled_from(NAMES), st.sampled_from(sorted(files.values())),
                          st.text(max_size=12)))


def _argv(path: tuple[str, ...], cmd: Any, draw: Any, files: dict[str, str]) -> list[str]:
    params = [p for p in cmd.params if p.name != "help"]
    args = [p for p in params if p.param_type_name == "argument"]
    options = [p for p in params if p.param_type_name == "option"]
    argv = list(path)
    for p in args:
        argv.append(_value(p, draw, files))
    chosen = draw(st.lists(st.sampled_from(options), max_size=4, unique_by=lambda p: p.name)
                  ) if options else []
    chosen += [p for p in options if p.required and p not in chosen]
    numeric = [p for p in options if _kind(p) in (int, float)]
    paths = [p for p in options if _kind(p) is Path and "out" not in p.name]
    if " ".join(path) in SLOW_COMMANDS and (numeric or paths):
        forced = draw(st.sampled_from(numeric or paths))
        chosen = [p for p in chosen if p is not forced]
        bad = (["-1", "nan", "1000000000000"] if numeric else
               [files["missing"], files["corrupt.csv"], files["binary.bin"]])
        argv += [forced.opts[0], draw(st.sampled_from(bad))]
    for p in chosen:
        if p.is_flag:
            argv.append(p.opts[0])
        else:
            argv += [p.opts[0], _value(p, draw, files)]
    return argv


@contextmanager
def _deadline(seconds: int, argv: list[str]) -> Iterator[None]:
    def hang(signum: int, frame: Any) -> None:
        raise TimeoutError(f"sim {' '.join(argv)} ran over {seconds} s")

    old = signal.signal(signal.SIGALRM, hang)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.slow
@pytest.mark.parametrize(("path", "cmd"), COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_fuzz_command(path: tuple[str, ...], cmd: Any, files: dict[str, str],
                      tmp_path_factory: pytest.TempPathFactory,
                      capsys: pytest.CaptureFixture[str],
                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path_factory.mktemp("fuzz-cwd"))  # default outputs land here

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def run(data: st.DataObject) -> None:
        argv = _argv(path, cmd, data.draw, files)
        with _deadline(TIMEOUT_S, argv), pytest.raises(SystemExit) as info:
            main(argv)
        out = capsys.readouterr()
        code = info.value.code or 0
        shown = f"sim {' '.join(argv)!r}: exit {code}\n{out.err[-2000:]}"
        assert code in (0, 1, 2, 3), shown
        assert "Traceback" not in out.err + out.out, shown
        if code == 2:
            assert len(out.err.strip().splitlines()) == 1, shown

    run()
