"""The layers depend only downward, with no cycles, and imports sit at module level.

hwmodels ← workloads ← simulator ← search / validate ← api ← commands ← cli (DESIGN.md §1).
The simulator core runs Programs and knows nothing of models or GPUs; `workloads/lowering/` is
the one bridge from workloads to the simulator. An import inside a function is allowed only
for start-up time (a heavy library behind it), and its line says so.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LAYER = {"errors": 0, "hwmodels": 1, "workloads": 2, "simulator": 3, "search": 4,
         "validate": 4, "api": 5, "commands": 6, "cli": 7, "__init__": 8}
"""Each top-level module or package and its layer: a module imports only lower layers (and
its own package); equal layers (search, validate) do not import each other."""
BRIDGE = ("workloads", "lowering")
"""The one place in a lower layer allowed to import the simulator core."""
DEFERRED_MARK = "start-up time"
SKIP_DIRS = {"tests", "bench", "traces", "build", "dist", ".venv", "__pycache__"}


def _sources() -> list[Path]:
    out = []
    for path in sorted(REPO.rglob("*.py")):
        rel = path.relative_to(REPO)
        if not SKIP_DIRS.intersection(rel.parts) and not rel.parts[0].startswith("."):
            out.append(path)
    return out


def _unit(rel: Path) -> str:
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imports(path: Path) -> list[tuple[int, str, bool]]:
    """(line, imported trainsim module, inside a function) for every trainsim import, type-only
    ones included: a TYPE_CHECKING import is still a dependency of the design."""
    tree = ast.parse(path.read_text(), filename=str(path))
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inside.update(id(n) for n in ast.walk(node) if n is not node)
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
            if node.module == "trainsim":
                names = [f"trainsim.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            if name.startswith("trainsim."):
                found.append((node.lineno, name, id(node) in inside))
    return found


def _edges() -> dict[tuple[str, str], list[str]]:
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in _sources():
        rel = path.relative_to(REPO)
        src = _unit(rel)
        for line, module, _ in _imports(path):
            dst = module.split(".")[1]
            if dst != src:
                edges[(src, dst)].append(f"{rel}:{line} imports {module}")
    return edges


def test_every_unit_has_a_layer() -> None:
    units = {_unit(p.relative_to(REPO)) for p in _sources()}
    assert units <= set(LAYER), f"give these a layer in LAYER: {sorted(units - set(LAYER))}"


@pytest.mark.slow
def test_layers_only_depend_downward() -> None:
    upward = []
    for (src, dst), where in sorted(_edges().items()):
        if LAYER.get(dst, 99) < LAYER[src]:
            continue
        if src == BRIDGE[0] and dst == "simulator":
            upward += [w for w in where if not w.startswith(f"{BRIDGE[0]}/{BRIDGE[1]}/")]
            continue
        upward += where
    assert not upward, "upward or same-layer imports:\n" + "\n".join(upward)


@pytest.mark.slow
def test_simulator_core_knows_no_models_or_gpus() -> None:
    where = [w for (src, dst), ws in _edges().items() for w in ws
             if src == "simulator" and dst in ("workloads", "hwmodels")]
    assert not where, "\n".join(where)


@pytest.mark.slow
def test_no_import_cycles_between_packages() -> None:
    graph: dict[str, set[str]] = defaultdict(set)
    for src, dst in _edges():
        graph[src].add(dst)

    def reaches(a: str, b: str, seen: set[str]) -> bool:
        if a == b:
            return True
        seen.add(a)
        return any(reaches(n, b, seen) for n in graph.get(a, ()) if n not in seen)

    cycles = sorted(f"{a} <-> {b}" for a in list(graph) for b in graph[a]
                    if reaches(b, a, set()))
    assert not cycles, f"import cycles: {cycles}"


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(REPO)))
def test_trainsim_imports_sit_at_module_level(path: Path) -> None:
    """A function-local trainsim import needs a reason, on its line or the line above."""
    lines = path.read_text().splitlines()
    local = [(n, m) for n, m, inside in _imports(path) if inside]
    bad = [f"{path.relative_to(REPO)}:{n} {m}" for n, m in local
           if DEFERRED_MARK not in lines[n - 1] and DEFERRED_MARK not in lines[n - 2]]
    assert not bad, "move to module level, or say why it waits: " + ", ".join(bad)
