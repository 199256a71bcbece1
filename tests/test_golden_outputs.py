"""The JSON that `sim simulate`, `sim search`, `sim energy frontier` and `sim validate` print on
small cases is byte-identical to the recorded outputs (tests/golden_cases.py). Refactors must
not move a figure; a deliberate model change re-records them with
`python tests/golden_cases.py --write` and says why in its commit."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location("golden_cases",
                                               Path(__file__).with_name("golden_cases.py"))
assert _SPEC is not None and _SPEC.loader is not None
golden = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(golden)


@pytest.mark.parametrize("case", sorted(golden.CASES))
def test_output_is_byte_identical_to_the_recorded_one(case: str, tmp_path: Path) -> None:
    expected = (golden.GOLDEN / f"{case}.json").read_text()
    assert golden.run_case(case, tmp_path) == expected
