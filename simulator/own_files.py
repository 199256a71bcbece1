"""Files trainsim wrote itself carry a marker, so a rerun may replace them without --force.

Nothing a user wrote is overwritten: a file without the marker still needs `--force`. HTML
pages carry `<meta name="generator" content="trainsim">` in their head; Chrome traces carry
`"generator":"trainsim"` in `otherData`, which sorts before `traceEvents`, so both markers sit
in the first few kilobytes.
"""

from __future__ import annotations

from pathlib import Path

HTML_MARKER = '<meta name="generator" content="trainsim">'
TRACE_MARKER = '"generator":"trainsim"'
_HEAD_BYTES = 16_384
"""How much of a file's start is read to find the marker."""


def mark_html(html: str) -> str:
    """`html` with the generator marker as the first element of its head."""
    return html.replace("<head>", f"<head>{HTML_MARKER}", 1)


def make_parent(path: str | Path) -> Path:
    """`path`, with the folder it goes in made (and that folder's parents). Outputs are
    written into missing folders, but made only when written: a run refused before (a bad
    argument checked after the output path) leaves no empty folder behind."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    return out


def written_by_trainsim(path: Path) -> bool:
    """True when `path` is a regular file whose start carries one of trainsim's markers."""
    try:
        with path.open("rb") as handle:
            head = handle.read(_HEAD_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return False
    return HTML_MARKER in head or TRACE_MARKER in head
