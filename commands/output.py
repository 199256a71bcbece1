"""What every command shares: output paths checked before the work starts, JSON and tables.

Nothing a user wrote is overwritten without `--force`, and a command refuses before it spends
minutes computing, not after.
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from trainsim.errors import SpecError, TrainsimError
from trainsim.simulator.own_files import written_by_trainsim

EXIT_BAD_INPUT = 2
"""Exit code for input a user can fix (one line on stderr names it)."""

_F = TypeVar("_F", bound=Callable[..., Any])


def one_line(message: str) -> str:
    """`message` on one line: user text inside it (a path or name with a newline, carriage
    return or other control character) is shown escaped, as repr() would."""
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in message)


def fail(message: str) -> None:
    """Print one error line to stderr and exit with EXIT_BAD_INPUT."""
    typer.echo(f"error: {one_line(message)}", err=True)
    raise typer.Exit(EXIT_BAD_INPUT)


def error_line(exc: Exception) -> str | None:
    """The one line a user error deserves, or None when `exc` is not a user error."""
    if isinstance(exc, TrainsimError):
        return str(exc)
    if isinstance(exc, (FileNotFoundError, IsADirectoryError, PermissionError)):
        return f"{exc.strerror}: {exc.filename}"
    if isinstance(exc, OSError) and exc.filename is not None:
        # e.g. a name too long for the file system, a path through a file (ENOTDIR)
        name = str(exc.filename)
        return f"{exc.strerror}: {name if len(name) <= 80 else name[:77] + '...'}"
    if isinstance(exc, UnicodeDecodeError):
        # A binary or wrongly encoded input file: readers open text as UTF-8.
        return f"an input file is not UTF-8 text ({exc.reason} at byte {exc.start})"
    return None


def user_errors(command: _F) -> _F:
    """Every command wears this: a user error becomes one line and exit code 2, however the
    command is invoked (the `sim` entry point, a sub-app, typer's test runner)."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except (TrainsimError, OSError, UnicodeDecodeError) as exc:
            line = error_line(exc)
            if line is None:
                raise
            fail(line)
            return None

    return run  # type: ignore[return-value]


def _check_writable_dir(folder: Path, what: str, *, create: bool) -> None:
    """`folder` is (or, with `create`, can be made as) a folder this process may write in."""
    probe = folder
    while not probe.exists() and create and probe != probe.parent:
        probe = probe.parent
    if not probe.exists():
        raise SpecError(f"{what}: folder {str(folder)!r} does not exist")
    if not probe.is_dir():
        raise SpecError(f"{what}: {str(probe)!r} is not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise SpecError(f"{what}: folder {str(probe)!r} is not writable")
    # os.access answers from permission bits, which root passes: a file made and removed
    # there is the real test (/proc, a read-only mount, a full quota refuse it)
    try:
        with tempfile.NamedTemporaryFile(dir=probe, prefix=".sim-write-check-"):
            pass
    except OSError as exc:
        raise SpecError(f"{what}: folder {str(probe)!r} is not writable "
                        f"({exc.strerror or exc})") from None


def check_new_file(path: Path | None, force: bool, what: str | None = None, *,
                   create_parents: bool = True) -> None:
    """Before any work: refuse to overwrite an existing `path` (a `what`: "timeline",
    "trace", ...) unless `force`, a folder in its place, and a path that cannot be written
    (read-only, or its folder missing and, with `create_parents`, not makeable).

    Every command's file outputs make their missing folders, as `--out` folders are made:
    `--timeline runs/a/t.html` works the same for every command. Here the folder is only
    checked to be makeable; the writer makes it (`own_files.make_parent`), so a run refused
    after this check leaves no empty folder."""
    if path is None:
        return
    name = str(path) if what is None else f"{what} {str(path)!r}"
    if path.is_dir():
        raise SpecError(f"{name} is a folder; give a file path")
    if path.exists() and not force and not written_by_trainsim(path):
        raise SpecError(f"{name} exists; pass --force to overwrite it")
    if path.exists() and not os.access(path, os.W_OK):
        raise SpecError(f"{name} is not writable")
    _check_writable_dir(path.parent, name, create=create_parents)


def check_out_dir(out: Path | None, names: Iterable[str], force: bool) -> None:
    """Refuse an `--out` folder that is a file, or that holds any of `names` that trainsim did
    not write itself, unless `force`."""
    if out is None:
        return
    names = tuple(names)
    if out.exists() and not out.is_dir():
        raise SpecError(f"--out {str(out)!r} is an existing file; give a folder for "
                        f"{', '.join(names)}")
    _check_writable_dir(out, f"--out {str(out)!r}", create=True)
    if force:
        return
    for name in names:
        if (out / name).exists() and not written_by_trainsim(out / name):
            raise SpecError(f"{out / name} exists; pass --force to overwrite it")


def _finite(doc: Any) -> Any:
    """`doc` with non-finite floats as None: strict JSON has no NaN/Infinity."""
    if isinstance(doc, float) and not math.isfinite(doc):
        return None
    if isinstance(doc, dict):
        return {k: _finite(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [_finite(v) for v in doc]
    return doc


def dumps(doc: Any, *, indent: int | None = 2, sort_keys: bool = False) -> str:
    """Strict JSON text of `doc` (non-finite numbers become null)."""
    return json.dumps(_finite(doc), indent=indent, sort_keys=sort_keys, allow_nan=False)


def echo_json(doc: Any, *, indent: int | None = 2, sort_keys: bool = False) -> None:
    """Print `doc` as one strict JSON object on stdout."""
    typer.echo(dumps(doc, indent=indent, sort_keys=sort_keys))


def print_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]], *,
                right: Sequence[str] = ()) -> None:
    """A rich table on stdout; None cells print empty, columns named in `right` align right."""
    table = Table(title=title)
    for col in columns:
        table.add_column(col, justify="right" if col in right else "left")
    for row in rows:
        table.add_row(*("" if v is None else str(v) for v in row))
    Console().print(table)


@contextmanager
def counting_bar(label: str, *, total: int | None = None, quiet: bool = False
                 ) -> Iterator[Callable[[int, int | None, str], None]]:
    """A rich progress bar on stderr for work counted in items (rows, scenarios,
    compositions), silent when piped or `quiet`; yields `tick(done, total, note)`, `total`
    None keeping the one given (or unknown), `note` shown after the count."""
    console = Console(stderr=True)
    with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[note]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                  console=console, transient=True,
                  disable=quiet or not console.is_terminal) as bar:
        job = bar.add_task(label, total=total, note="")

        def tick(done: int, count: int | None = None, note: str = "") -> None:
            if count is None:
                bar.update(job, completed=done, note=note)
            else:
                bar.update(job, completed=done, total=count, note=note)

        yield tick


def stderr_console(quiet: bool = False) -> Console:
    """The console progress bars and status lines draw on: stderr, silent when piped."""
    return Console(stderr=True, quiet=quiet or not sys.stderr.isatty())
