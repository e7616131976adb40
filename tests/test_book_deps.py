"""The files a chapter depends on (`sinklib.book.deps`): imports read statically from the code cells, short
names and moved paths resolved, the closure over sinklib's own imports, package data, and how a change is named.
Nothing is executed; the real chapter is only read."""
from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from sinklib.book import deps, record, runner

ROOT = Path(__file__).resolve().parent.parent


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.fixture
def lib(tmp_path):
    """A small sinklib: short names and a moved path in its __init__, a package with a relative and a lazy
    import, package data opened through a constant, and modules nothing imports."""
    return _tree(tmp_path, {
        "sinklib/__init__.py": 'NOTEBOOK_NAMES: dict[str, str] = {"short": "sinklib.pkg.mod:f", "m": "sinklib.top"}\n'
                               'LEGACY_PATHS: dict[str, str] = {"sinklib.old": "sinklib.pkg.new"}\n',
        "sinklib/pkg/__init__.py": "from sinklib.pkg.base import BASE\n",
        "sinklib/pkg/base.py": "BASE = 1\n",
        "sinklib/pkg/mod.py": "from . import helper\n\n\ndef f():\n    return helper.g()\n",
        "sinklib/pkg/helper.py": 'ITEMS = "items"\n\n\ndef g():\n    from sinklib.leaf import z\n'
                                 '    from sinklib.core.resources import data_path\n'
                                 '    return z, data_path(ITEMS), data_path("profiles")\n',
        "sinklib/pkg/new.py": "NEW = 1\n",
        "sinklib/leaf.py": "z = 1\n",
        "sinklib/top.py": "T = 1\n",
        "sinklib/core/__init__.py": "", "sinklib/core/resources.py": "def data_path(*parts): ...\n",
        "sinklib/unused.py": "U = 1\n", "sinklib/install.py": "def install_extras(*a): ...\n",
        "sinklib/book/stale.py": "from sinklib.unused import U\n",   # tooling: never a dependency
        "data/items/a.jsonl": "{}\n", "data/items/b.jsonl": "{}\n", "data/profiles/01.yml": "full: {}\n",
    })


def test_short_names_moved_paths_relative_and_lazy_imports_are_followed(lib):
    cells = [runner.bootstrap_source("https://github.com/a/b"),     # imports sinklib.install, only on Colab
             "%matplotlib inline\nfrom sinklib import short, m as mm\nfrom sinklib.old import NEW\nx = short()"]
    found = deps.dependencies(cells, lib, skip_prefix=runner.BOOTSTRAP_FIRST_LINE)
    assert found == ["data/items/a.jsonl", "data/items/b.jsonl", "sinklib/__init__.py", "sinklib/core/__init__.py",
                     "sinklib/core/resources.py", "sinklib/leaf.py", "sinklib/pkg/__init__.py", "sinklib/pkg/base.py",
                     "sinklib/pkg/helper.py", "sinklib/pkg/mod.py", "sinklib/pkg/new.py", "sinklib/top.py"]


def test_plain_import_and_attribute_use(lib):
    assert deps.dependencies(["import sinklib.leaf"], lib) == ["sinklib/__init__.py", "sinklib/leaf.py"]
    assert deps.dependencies(["import sinklib\nsinklib.m.T"], lib) == ["sinklib/__init__.py", "sinklib/top.py"]
    assert deps.dependencies(["import numpy\nx = 1"], lib) == []
    assert "sinklib/unused.py" in deps.dependencies(["from sinklib import (\n"], lib)   # unreadable: everything


def test_a_real_chapter_depends_on_what_it_imports_and_not_on_the_rest():
    nb = nbformat.read(ROOT / "notebooks" / "05_panel_correlations.ipynb", as_version=4)
    found = set(runner.sinklib_dependencies(nb, ROOT))
    for needed in ("sinklib/__init__.py", "sinklib/stats/__init__.py", "sinklib/stats/panel.py",
                   "sinklib/stats/rank.py", "sinklib/stats/schema.py", "sinklib/core/params.py", "sinklib/plots/__init__.py",
                   "sinklib/book/results.py", "sinklib/book/runner.py", "sinklib/book/reported.py",
                   "data/paper_reported_values.csv"):
        assert needed in found, needed
    for unrelated in ("sinklib/tiny/backcopy.py", "sinklib/adapt/pairs.py", "sinklib/core/train.py",
                      "sinklib/vl/__init__.py", "sinklib/install.py", "data/evals/math.jsonl"):
        assert unrelated not in found, unrelated
    assert not {f"sinklib/{t}" for t in record.TOOLING} & found


def test_hashes_and_what_changed(lib):
    files = deps.dependencies(["from sinklib.old import NEW"], lib)
    before = deps.hashes(files, lib)
    assert all(len(h) == deps.SHORT for h in before.values())
    (lib / "sinklib/pkg/base.py").write_text("BASE = 2\n")
    after = deps.hashes(files, lib)
    assert deps.changed(before, after) == ["sinklib/pkg/base.py"]
    assert record.set_sha256(before) != record.set_sha256(after)
    assert deps.changed({**before, "sinklib/gone.py": "x"}, before) == ["sinklib/gone.py"]


def test_a_few_names_then_how_many_more():
    paths = ["data/x.csv", "sinklib/a.py", "sinklib/b/__init__.py", "sinklib/c.py", "sinklib/d.py"]
    assert deps.summary(paths) == "sinklib.a, sinklib.b.__init__, sinklib.c and 2 more"
    assert deps.summary(["data/x.csv", "sinklib/a.py"]) == "sinklib.a, data/x.csv"
