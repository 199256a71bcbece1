"""A task-table builder that also takes whole runs of rows as numpy columns.

Runs stamped out from tapes (stamp.py) are built as numpy columns; appended to the builder's
Python lists they were turned into lists (`tolist`) only for `build()` to turn them back into
arrays, a third of a many-micro-batch lowering's time. `ChunkedBuilder` keeps them as arrays
(`append_chunk`) between the rows added one by one, and `build()` lays both out in id order.
Ids stay global: `add` and `len()` count the chunks' rows, and code that reads the lists back
(replay.py's `record`) subtracts `stamped_rows` for positions in them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trainsim.simulator.task_table import TaskTable, TaskTableBuilder

ROW_COLUMNS = {
    "name_code": np.int32, "name_arg": np.int64, "kind_code": np.int32,
    "stream_code": np.int32, "member_count": np.int64, "link_count": np.int64,
    "dep_count": np.int64, "duration_s": np.float64, "comm_bytes": np.float64,
    "mem_alloc_bytes": np.float64, "mem_free_bytes": np.float64, "power_w": np.float64,
    "freq_mhz": np.float64, "micro_batch": np.int64, "stage": np.int64,
    "first_layer": np.int64, "last_layer": np.int64,
}
"""The builder's per-row columns and their dtypes (the `TaskTable`'s, so `build` converts
each once)."""
FLAT_COLUMNS = {"member_rank": 1, "link_idx": 2, "dep_idx": 3}
"""The builder's flat columns and their place in a chunk's list positions."""
_FLAT_DTYPES = {"member_rank": np.int32, "link_idx": np.int32, "dep_idx": np.int64}


class ChunkedBuilder(TaskTableBuilder):
    """`TaskTableBuilder` plus chunks: runs of rows given as numpy columns."""

    def __init__(self) -> None:
        super().__init__()
        self.stamped = 0
        """Rows held in chunks (not in the lists)."""
        self._chunks: list[tuple[tuple[int, int, int, int], dict[str, np.ndarray]]] = []
        self._late: list[tuple[int, np.ndarray, np.ndarray]] = []
        """Late deps given as arrays: (place in the late lists, owners, deps)."""

    def __len__(self) -> int:
        return len(self.kind_code) + self.stamped

    def add(self, *args: Any, **kwargs: Any) -> int:
        """`TaskTableBuilder.add`; the id counts the chunks' rows."""
        return super().add(*args, **kwargs) + self.stamped

    def append_chunk(self, columns: dict[str, np.ndarray]) -> None:
        """Append rows given as every column of `ROW_COLUMNS` and `FLAT_COLUMNS` (ids in
        `dep_idx` global). Every list must be as long as the rows added so far."""
        at = (len(self.kind_code), len(self.member_rank), len(self.link_idx),
              len(self.dep_idx))
        self._chunks.append((at, columns))
        self.stamped += len(columns["kind_code"])

    def append_late(self, owners: np.ndarray, deps: np.ndarray) -> None:
        """`add_dep(owner, dep)` for each pair, in order, given as arrays."""
        self._late.append((len(self.late_owner), owners, deps))

    def build(self) -> TaskTable:
        """The table of every row, the lists' and the chunks' in id order."""
        if self._late:
            for name, place in (("late_owner", 1), ("late_dep", 2)):
                listed = np.asarray(getattr(self, name), np.int64)
                pieces, prev = [], 0
                for at, owners, deps in self._late:
                    given = owners if place == 1 else deps
                    pieces += [listed[prev:at], given.astype(np.int64, copy=False)]
                    prev = at
                pieces.append(listed[prev:])
                setattr(self, name, np.concatenate(pieces))
            self._late = []
        if self._chunks:
            for name, dtype in ROW_COLUMNS.items():
                setattr(self, name, self._merged(name, 0, dtype))
            for name, place in FLAT_COLUMNS.items():
                setattr(self, name, self._merged(name, place, _FLAT_DTYPES[name]))
            self._chunks = []
            self.stamped = 0
        return super().build()

    def _merged(self, name: str, place: int, dtype: Any) -> Any:
        listed = np.asarray(getattr(self, name), dtype)
        pieces, prev = [], 0
        for at, columns in self._chunks:
            pieces.append(listed[prev:at[place]])
            pieces.append(columns[name].astype(dtype, copy=False))
            prev = at[place]
        pieces.append(listed[prev:])
        return np.concatenate(pieces)


def stamped_rows(b: TaskTableBuilder) -> int:
    """Rows of `b` held in chunks: a row's place in the lists is its id less those before
    it (all of them, for rows added since the last chunk)."""
    return b.stamped if isinstance(b, ChunkedBuilder) else 0


__all__ = ["FLAT_COLUMNS", "ROW_COLUMNS", "ChunkedBuilder", "stamped_rows"]
