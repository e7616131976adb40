"""Which files of the checkout a chapter's results depend on, read statically (``ast``; nothing is imported, so
no torch): the sinklib modules its code cells import, transitively, with the ``__init__`` of every package on
the way, and the package data those modules (or the cells) open with ``data_path`` and constant arguments.

A cell's ``from sinklib import X`` resolves X through `sinklib.NOTEBOOK_NAMES` (else the submodule
``sinklib.X``), an old module path through `sinklib.LEGACY_PATHS`; both tables are read from the checkout's
``sinklib/__init__.py`` as literals. Every ``import`` of a module counts, lazy ones inside functions included.
The Colab bootstrap cell is left out (it does nothing off Colab), and so are the rerun tooling modules
(`record.TOOLING`, no result depends on them). Not covered: imports by computed name (``importlib``), files
opened by a path built at run time rather than by ``data_path`` with constant arguments, the ``profiles`` and
``results`` folders (the parameters and ``READS_RESULTS_OF`` are judged on their own), and anything outside
sinklib and ``data/`` (installed packages, the cache).

Files are named by their path in the checkout (``sinklib/core/params.py``, ``data/evals/math.jsonl``), the way
git names them. The run record keeps a short sha256 of each (`hashes`) and one sha256 over them all
(`record.set_sha256`)."""
from __future__ import annotations

import ast
import hashlib
from pathlib import Path

from sinklib.book.record import TOOLING

PACKAGE = "sinklib"
DATA = "data"   # what sinklib/_data links to: data_path(*parts) is data/<parts> in a checkout
SKIP_DATA = ("profiles", "results")   # judged by the parameters and READS_RESULTS_OF
SHORT = 16   # hex digits of each file's sha256 kept in a record


def module_files(root: Path) -> dict[str, str]:
    """Module name -> its path in the checkout, for every ``.py`` under ``root/sinklib`` but the tooling."""
    base = Path(root) / PACKAGE
    out = {}
    for p in sorted(base.rglob("*.py")):
        rel = p.relative_to(base).as_posix()
        if "__pycache__" in p.parts or rel in TOOLING:
            continue
        parts = (PACKAGE, *p.relative_to(base).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f"{PACKAGE}/{rel}"
    return out


def name_tables(root: Path) -> tuple[dict[str, str], dict[str, str]]:
    """(`NOTEBOOK_NAMES`, `LEGACY_PATHS`) as literals in the checkout's ``sinklib/__init__.py`` (empty if absent)."""
    init = Path(root) / PACKAGE / "__init__.py"
    found: dict[str, dict] = {"NOTEBOOK_NAMES": {}, "LEGACY_PATHS": {}}
    if init.exists():
        for node in ast.parse(init.read_text()).body:
            target = node.target if isinstance(node, ast.AnnAssign) else (
                node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
            if isinstance(target, ast.Name) and target.id in found and node.value is not None:
                found[target.id] = ast.literal_eval(node.value)
    return found["NOTEBOOK_NAMES"], found["LEGACY_PATHS"]


class _Resolver:
    """Turns the import statements of one parsed file into sinklib module names."""

    def __init__(self, mods: dict[str, str], names: dict[str, str], legacy: dict[str, str]):
        self.mods, self.names, self.legacy = mods, names, legacy

    def module(self, name: str) -> str | None:
        name = self.legacy.get(name, name)
        return name if name in self.mods else None

    def from_import(self, base: str, alias: str) -> str | None:
        if base == PACKAGE and alias in self.names:
            return self.module(self.names[alias].partition(":")[0])
        return self.module(f"{base}.{alias}") or self.module(base)

    def attribute(self, chain: list[str]) -> str | None:
        """``sinklib.a.b.f`` used after ``import sinklib``: the short name, else the longest module prefix."""
        if len(chain) > 1 and chain[1] in self.names:
            return self.module(self.names[chain[1]].partition(":")[0])
        for n in range(len(chain), 0, -1):
            if (m := self.module(".".join(chain[:n]))) is not None:
                return m
        return None

    def imports(self, tree: ast.AST, package: str = "") -> set[str]:
        """The sinklib modules `tree` imports (relative imports resolved against `package`)."""
        out, plain = set(), False
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                if base == PACKAGE or base.startswith(PACKAGE + "."):
                    out |= {self.from_import(base, a.name) for a in node.names}
            elif isinstance(node, ast.Import):
                out |= {self.module(a.name) for a in node.names if a.name.split(".")[0] == PACKAGE}
                plain |= any(a.name == PACKAGE and a.asname is None for a in node.names)
        if plain:
            out |= {self.attribute(c) for c in _chains(tree) if c[0] == PACKAGE}
        return out - {None}


def _chains(tree: ast.AST) -> list[list[str]]:
    """Dotted names ``a.b.c`` used in `tree`, outermost attribute only, as lists."""
    chains, inner = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inner:
            parts, cur = [], node
            while isinstance(cur, ast.Attribute):
                parts.append(cur.attr)
                inner.add(id(cur.value))
                cur = cur.value
            if isinstance(cur, ast.Name):
                chains.append([cur.id, *reversed(parts)])
    return chains


def data_files(tree: ast.AST, root: Path) -> set[str]:
    """Package data opened by ``data_path(...)`` calls in `tree` whose arguments are string literals or names
    bound to one at the top of the file (a folder counts as every file in it)."""
    consts = {t.id: n.value.value for n in getattr(tree, "body", []) if isinstance(n, ast.Assign)
              and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
              for t in n.targets if isinstance(t, ast.Name)}
    out = set()
    for node in ast.walk(tree):
        func = getattr(node, "func", None)
        if not isinstance(node, ast.Call) or getattr(func, "id", getattr(func, "attr", None)) != "data_path":
            continue
        parts = [a.value if isinstance(a, ast.Constant) else consts.get(getattr(a, "id", None)) for a in node.args]
        if not parts or not all(isinstance(p, str) for p in parts) or parts[0].split("/")[0] in SKIP_DATA:
            continue
        path = Path(root) / DATA / Path(*parts)
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        out |= {p.relative_to(root).as_posix() for p in files if "__pycache__" not in p.parts}
    return out


def _parse_cells(sources: list[str]) -> ast.Module | None:
    """The code cells as one module (IPython ``%``/``!`` lines commented out); None when one does not parse."""
    body = []
    for src in sources:
        lines = ["#" + ln if ln.lstrip().startswith(("%", "!")) else ln for ln in src.splitlines()]
        try:
            body += ast.parse("\n".join(lines)).body
        except SyntaxError:
            return None
    return ast.Module(body=body, type_ignores=[])


def _with_packages(module: str, mods: dict[str, str]) -> set[str]:
    """`module` and every package above it (importing ``a.b.c`` runs ``a`` and ``a.b`` first)."""
    parts = module.split(".")
    return {".".join(parts[:n]) for n in range(1, len(parts) + 1)} & set(mods)


def closure(roots: set[str], root: Path, mods: dict[str, str], resolver: _Resolver) -> tuple[set[str], set[str]]:
    """(the modules `roots` import, transitively, packages included; the package data they open)."""
    seen: set[str] = set()
    todo = set().union(*[_with_packages(m, mods) for m in roots]) if roots else set()
    data: set[str] = set()
    while todo:
        name = todo.pop()
        seen.add(name)
        path = Path(root) / mods[name]
        tree = ast.parse(path.read_text())
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        data |= data_files(tree, root)
        for m in resolver.imports(tree, package):
            todo |= _with_packages(m, mods) - seen
    return seen, data


def dependencies(sources: list[str], root: Path, skip_prefix: str | None = None) -> list[str]:
    """The files (paths in the checkout, sorted) that code cells `sources` depend on; cells starting with
    `skip_prefix` (the Colab bootstrap) left out. A cell that does not parse makes every module a dependency."""
    root = Path(root)
    mods = module_files(root)
    resolver = _Resolver(mods, *name_tables(root))
    tree = _parse_cells([s for s in sources if not (skip_prefix and s.startswith(skip_prefix))])
    if tree is None:
        return sorted(mods.values())
    modules, data = closure(resolver.imports(tree), root, mods, resolver)
    return sorted({mods[m] for m in modules} | data | data_files(tree, root))


def hashes(files: list[str], root: Path) -> dict[str, str | None]:
    """Short sha256 of each file (None when it is missing)."""
    out = {}
    for f in files:
        p = Path(root) / f
        out[f] = hashlib.sha256(p.read_bytes()).hexdigest()[:SHORT] if p.is_file() else None
    return out


def changed(recorded: dict[str, str | None], now: dict[str, str | None]) -> list[str]:
    """Files whose hash differs, appeared in or left the set, sorted."""
    return sorted(f for f in set(recorded) | set(now) if recorded.get(f, "") != now.get(f, ""))


def display(path: str) -> str:
    """``sinklib/core/params.py`` -> ``sinklib.core.params``; a data file keeps its path."""
    if path.startswith(PACKAGE + "/") and path.endswith(".py"):
        return path[: -len(".py")].replace("/", ".")
    return path


def summary(paths: list[str], few: int = 3) -> str:
    """A few names (sinklib modules first, then data files), then ``and N more``."""
    names = [display(p) for p in sorted(paths, key=lambda p: (not p.startswith(PACKAGE + "/"), p))]
    head = ", ".join(names[:few])
    return head if len(names) <= few else f"{head} and {len(names) - few} more"
