"""The package's architecture as tests: no import circles (between modules, or between the rooms of
sinklib), no module over 500 lines, no function over 60, and the notebooks' short names all resolve."""
from __future__ import annotations

import ast
import importlib
import json
from pathlib import Path

import pytest

import sinklib

ROOT = Path(sinklib.__file__).resolve().parent
REPO = ROOT.parent
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(ROOT.rglob("*.py")):
        parts = p.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the sinklib modules it imports (at any depth of the file, lazy imports included)."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            graph[name] |= {t for t in targets if t in mods and t != name}
    return graph


def room(module: str) -> str:
    """The top-level room of a module: sinklib.adapt.pairs -> adapt; sinklib.errors -> errors."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "sinklib"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def room_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    rooms: dict[str, set[str]] = {}
    for a, bs in graph.items():
        if a == "sinklib":
            continue  # the top package only names things lazily for the notebooks
        ra = room(a)
        rooms.setdefault(ra, set())
        rooms[ra] |= {room(b) for b in bs if room(b) not in (ra, "sinklib")}
    return rooms


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles_between_modules():
    found = cycles(import_graph())
    assert not found, "sinklib modules import each other in a circle: " + "; ".join(" <-> ".join(c) for c in found)


def test_no_import_circles_between_rooms():
    found = cycles(room_graph(import_graph()))
    assert not found, ("sinklib's subpackages import each other in a circle (move what both use to the lower "
                       "one): " + "; ".join(" <-> ".join(c) for c in found))


def test_no_module_over_500_lines():
    long = {str(p.relative_to(REPO)): n for p in ROOT.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by concept): {long}"


def test_no_function_over_60_lines():
    long = {}
    for p in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long[f"{p.relative_to(REPO)}:{node.name}"] = n
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_every_subpackage_is_packaged():
    import tomllib

    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(REPO).parts) for p in ROOT.rglob("__init__.py")}
    assert found == listed


@pytest.mark.parametrize("name", sorted(sinklib.NOTEBOOK_NAMES))
def test_notebook_names_resolve(name):
    assert getattr(sinklib, name) is not None


def test_unknown_short_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        sinklib.nope  # noqa: B018


def _notebook_code(path: Path) -> str:
    nb = json.loads(path.read_text())
    return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")


def test_legacy_paths_are_the_same_modules_and_still_needed():
    """A moved path stays importable only while a source notebook still uses it (its executed copy ran with
    it); once every chapter that used it has been re-executed with the new path, the entry must go."""
    notebooks = [_notebook_code(p) for p in sorted((REPO / "notebooks").glob("*.ipynb"))]
    for old, new in sinklib.LEGACY_PATHS.items():
        assert importlib.import_module(old) is importlib.import_module(new)
        assert any(f"from {old} import" in code or f"import {old}" in code for code in notebooks), (
            f"no notebook uses {old} any more: remove it from sinklib.LEGACY_PATHS")


def test_library_and_tests_use_no_legacy_path():
    users = []
    for p in list(ROOT.rglob("*.py")) + list((REPO / "tests").glob("*.py")) + list((REPO / "scripts").glob("*.py")):
        if p.name == "test_layout.py" or p == ROOT / "__init__.py":
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in sinklib.LEGACY_PATHS:
                users.append(f"{p.relative_to(REPO)}: {node.module}")
    assert not users, f"use the new module paths: {users}"
