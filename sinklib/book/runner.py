"""The book pipeline: parameter profiles, the papermill runner, results with provenance.

    python -m sinklib.book run --profile quick|full|colab [--only 01 02] [--out book/chapters]
    python -m sinklib.book list
    python -m sinklib.book sync-text
    python -m sinklib.book set-repo https://github.com/<you>/sinkbook

Each notebook ``notebooks/NN_name.ipynb`` is executed with the parameters of
``data/profiles/NN_name.yml[profile]`` into ``book/chapters/NN_name.ipynb``; the values it ran with are
folded into the executed copy's parameters cell (papermill's separate injected cell is removed), so
the page shows them and a reader who opens the copy (Colab button) edits the cell that takes effect.
Notebooks write their key numbers with ``save_results`` into ``data/results/NN_name.json``
(``sinklib.core.resources.results_dir``); results with provenance live in `sinklib.book.results` (re-exported here).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from sinklib.errors import ParameterError
from sinklib.core.resources import checkout_root, data_path, display_path, results_dir  # noqa: F401 (callers use them here)
from sinklib.book import contracts, deps, record
from sinklib.book.contracts import READS_RESULTS_OF, run_order  # noqa: F401 (the contract, re-exported)
from sinklib.book.results import device_info, load_results, save_results  # noqa: F401 (results with provenance)

REPO = checkout_root() or Path.cwd()       # the runner and set-repo need a checkout; see _need_checkout
NOTEBOOKS = REPO / "notebooks"
CHAPTERS = REPO / "book" / "chapters"
PROFILES = data_path("profiles")
PROFILE_NAMES = ("quick", "full", "colab")


# ---------------------------------------------------------------------------------------
# profiles


def notebook_names() -> list[str]:
    """Stems of the source notebooks, in chapter order."""
    return sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def load_profile(notebook: str, profile: str) -> dict:
    """Parameters of one notebook under a profile (missing file or key = notebook defaults)."""
    import yaml

    if profile not in PROFILE_NAMES:
        raise ParameterError(f"parameter 'profile' got {profile!r}; allowed: {', '.join(PROFILE_NAMES)}")
    f = PROFILES / f"{notebook}.yml"
    if not f.exists():
        return {"profile": profile}
    data = yaml.safe_load(f.read_text()) or {}
    unknown = set(data) - set(PROFILE_NAMES)
    if unknown:
        raise ParameterError(f"{f} has unknown profile(s) {sorted(unknown)}; allowed: {', '.join(PROFILE_NAMES)}")
    return {**(data.get(profile) or {}), "profile": profile}


# ---------------------------------------------------------------------------------------
# runner


def _literal(value: Any) -> str:
    """A parameter value as Python source, strings in double quotes as the notebooks write them."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_literal(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_literal(k)}: {_literal(v)}" for k, v in value.items()) + "}"
    return repr(value)


def fold_parameters(source: str, values: dict[str, Any]) -> str:
    """The parameters cell `source` with the value of each `name = ...` in `values` replaced, comments kept.

    Values equal to the cell's own literal keep their text. A name the cell does not assign is an error
    (papermill would have injected it silently).
    """
    import ast

    tree = ast.parse(source)
    spans: dict[str, ast.expr] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            spans[node.targets[0].id] = node.value
    unknown = sorted(set(values) - set(spans))
    if unknown:
        raise ParameterError(f"parameters {unknown} are not assigned in the notebook's parameters cell; "
                             f"allowed: {', '.join(spans)}")
    lines = source.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    edits = []
    for name, value in values.items():
        node = spans[name]
        try:
            if ast.literal_eval(node) == value and type(ast.literal_eval(node)) is type(value):
                continue
        except ValueError:
            pass
        start = offsets[node.lineno - 1] + len(lines[node.lineno - 1].encode()[:node.col_offset].decode())
        end = offsets[node.end_lineno - 1] + len(lines[node.end_lineno - 1].encode()[:node.end_col_offset].decode())
        edits.append((start, end, _literal(value)))
    for start, end, text in sorted(edits, reverse=True):
        source = source[:start] + text + source[end:]
    return source


def parameters_cell(nb):
    """The cell tagged `parameters` (exactly one in every notebook of the book)."""
    cells = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(cells) != 1:
        raise ParameterError(f"a notebook of the book has exactly one cell tagged 'parameters'; found {len(cells)}")
    return cells[0]


README_FIGURE_TAG = "readme-figure"


def export_tagged_figures(path: Path, static: Path | None = None) -> list[Path]:
    """Write the first PNG output of each cell tagged ``readme-figure`` in the executed copy at `path` to
    ``book/_static/<notebook>.png`` (the README shows it); returns the files written."""
    import base64

    import nbformat

    static = static or (checkout_root() or Path.cwd()) / "book" / "_static"
    nb = nbformat.read(path, as_version=4)
    out = []
    for c in nb.cells:
        if README_FIGURE_TAG in c.get("metadata", {}).get("tags", []):
            png = next((o["data"]["image/png"] for o in c.get("outputs", []) if "image/png" in o.get("data", {})), None)
            if png is None:
                raise ParameterError(f"{Path(path).name}: the cell tagged {README_FIGURE_TAG!r} drew no PNG figure")
            static.mkdir(parents=True, exist_ok=True)
            f = static / f"{Path(path).stem}.png"
            f.write_bytes(base64.b64decode(png))
            out.append(f)
    return out


def fold_injected_cell(path: Path) -> dict:
    """Fold papermill's injected values into the parameters cell of the executed copy at `path`.

    The separate `injected-parameters` cell is removed, so the visible parameters cell is the one that
    takes effect when a reader reruns the copy (Colab button); the cell is tagged `hide-input`, so the page
    shows the parameters folded instead of hiding them. Returns the injected values.
    """
    import nbformat

    nb = nbformat.read(path, as_version=4)
    values = dict(nb.metadata.get("papermill", {}).get("parameters", {}))
    cell = parameters_cell(nb)
    cell.source = fold_parameters(cell.source, values)
    cell.metadata["tags"] = [t for t in cell.metadata.get("tags", []) if t != "remove-cell"] + ["hide-input"]
    nb.cells = [c for c in nb.cells if "injected-parameters" not in c.get("metadata", {}).get("tags", [])]
    nbformat.write(nb, path)
    return values


# ---------------------------------------------------------------------------------------
# prose from outputs

GLUE_PREFIX = "application/papermill.record/"   # myst-nb's glue format, without importing myst-nb


def glue(name: str, value: Any, display: bool = False) -> None:
    """Store `value` under `name` in the cell's output, for prose that states a result: the page writes it
    with ``{glue:text}`name` `` (myst-nb's glue, same format; myst-nb is not needed to run a notebook).
    Strings are glued as they are, so prose reads ``higher`` rather than ``'higher'``."""
    from IPython.core.formatters import format_display_data
    from IPython.display import display as ipy_display

    if isinstance(value, str):
        bundle, metadata = {"text/plain": value}, {}
    else:
        bundle, metadata = format_display_data(value)
    metadata = dict(metadata)
    prefix = "" if display else GLUE_PREFIX
    metadata["scrapbook"] = {"name": name, "mime_prefix": prefix}
    ipy_display({prefix + k: v for k, v in bundle.items()}, raw=True, metadata=metadata)


# ---------------------------------------------------------------------------------------
# the repository URL: written once, in _config.yml


def _need_checkout(what: str) -> Path:
    root = checkout_root()
    if root is None:
        raise ParameterError(f"{what} needs a checkout of the sinkbook repository (git clone it and run from there); "
                             "an installed sinkbook has no notebooks/ or _config.yml")
    return root


def repository_url() -> str:
    """``repository.url`` of the book's ``_config.yml``: the launch buttons, the Colab cell and the README use it."""
    import yaml

    cfg = yaml.safe_load((_need_checkout("repository_url") / "_config.yml").read_text())
    return str(cfg["repository"]["url"]).rstrip("/")


def pages_url(url: str | None = None) -> str:
    """The GitHub Pages address of the published book for a repository URL (default `repository_url`):
    ``https://github.com/<owner>/<name>`` -> ``https://<owner>.github.io/<name>/`` (the README links to it)."""
    owner, name = (url or repository_url()).rstrip("/").split("/")[-2:]
    return f"https://{owner.lower()}.github.io/{name}/"


BOOTSTRAP_FIRST_LINE = "# On Colab: install sinkbook, the embedded models and the graders. Elsewhere: nothing."


def bootstrap_source(url: str) -> str:
    """The first code cell of every notebook: installs sinkbook from `url` when run on Colab, else nothing."""
    return f"""{BOOTSTRAP_FIRST_LINE}
import sys

REPOSITORY = "{url}"  # from _config.yml
if "google.colab" in sys.modules:
    get_ipython().run_line_magic("pip", f"install -q 'sinkbook @ git+{{REPOSITORY}}'")
    import importlib

    importlib.invalidate_caches()
    from sinklib.install import install_extras

    install_extras("models", "graders")  # with pip --no-deps (see sinklib.install)"""


def set_repo(url: str) -> list[str]:
    """Point the book at another repository (a fork): ``_config.yml``, the README and every notebook's
    Colab cell (sources and executed copies; the cell does nothing off Colab, so no re-execution is needed).
    Returns the files changed."""
    import re

    import nbformat

    url = url.strip().rstrip("/")
    if not re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", url):
        raise ParameterError(f"repository URL {url!r} is not of the form https://github.com/<owner>/<name>")
    root = _need_checkout("set-repo")
    old = repository_url()
    changed = []
    for f in (root / "_config.yml", root / "README.md"):
        text = f.read_text()
        if old in text and old != url:
            f.write_text(text.replace(pages_url(old), pages_url(url)).replace(old, url))
            changed.append(f.name)
    for f in sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb")) + sorted((root / "book").rglob("[0-9][0-9]_*.ipynb")):
        nb = nbformat.read(f, as_version=4)
        cell = next(c for c in nb.cells if c.cell_type == "code")
        if cell.source != bootstrap_source(url):
            cell.source = bootstrap_source(url)
            nbformat.write(nb, f)
            changed.append(str(f.relative_to(root)))
    return changed


def select(only: list[str] | None) -> list[str]:
    """The notebooks named by `--only` prefixes (all when empty), in `run_order`."""
    names = notebook_names()
    if only:
        missing = [o for o in only if not any(n.startswith(o) for n in names)]
        if missing:
            raise ParameterError(f"--only {missing} matches no notebook; available: {', '.join(names)}")
        names = [n for n in names if any(n.startswith(o) or n == o for o in only)]
    return run_order(names)


def code_fingerprint(nb, fold: dict[str, Any] | None = None) -> str:
    """sha256 of a notebook's code cells (`code_sources`), the Colab bootstrap cell left out."""
    return record.code_sha256(code_sources(nb, fold=fold), skip_prefix=BOOTSTRAP_FIRST_LINE)


def reads_fingerprint(name: str) -> dict[str, str | None]:
    """sha256 of each results file `name` reads (`contracts.READS_RESULTS_OF`), as it is now."""
    return {dep: record.file_sha256(results_dir() / f"{dep}.json") for dep in contracts.reads(name)}


def sinklib_dependencies(nb, root: Path | None = None) -> dict[str, str | None]:
    """The files a notebook's code depends on (`sinklib.book.deps`, the Colab cell left out), with their hashes."""
    root = Path(root or REPO)
    return deps.hashes(deps.dependencies(code_sources(nb), root, skip_prefix=BOOTSTRAP_FIRST_LINE), root)


def execute(name: str, profile: str, out: Path = CHAPTERS, kernel: str = "python3", log_output: bool = False,
            params: dict | None = None) -> float:
    """Execute one notebook into `out` with the profile's parameters (updated by `params`), fold them into
    the parameters cell and write the run record (`sinklib.book.record`); returns seconds."""
    import papermill as pm

    from sinklib.book.results import _git_commit

    params = {**load_profile(name, profile), **(params or {})}
    reads, commit = reads_fingerprint(name), _git_commit()
    import nbformat

    sinklib_files = sinklib_dependencies(nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4))
    os.environ["SINKBOOK_PROFILE"] = profile
    t0 = time.perf_counter()
    pm.execute_notebook(str(NOTEBOOKS / f"{name}.ipynb"), str(out / f"{name}.ipynb"), parameters=params,
                        kernel_name=kernel, language="python", cwd=str(REPO), progress_bar=sys.stderr.isatty(),
                        log_output=log_output)
    fold_injected_cell(out / f"{name}.ipynb")
    if Path(out).resolve() == CHAPTERS.resolve():
        export_tagged_figures(out / f"{name}.ipynb")
    seconds = time.perf_counter() - t0
    code = code_fingerprint(nbformat.read(out / f"{name}.ipynb", as_version=4))
    record.write(out / f"{name}.ipynb", record.make(code, params, reads, sinklib_files, commit, seconds))
    return round(seconds, 1)


def run(profile: str, only: list[str] | None = None, out: Path = CHAPTERS, kernel: str = "python3",
        log_output: bool = False) -> dict[str, float]:
    """Execute notebooks with a profile into `out`; returns seconds per notebook."""
    _need_checkout("python -m sinklib.book run")
    names = select(only)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    times: dict[str, float] = {}
    for i, name in enumerate(names, 1):
        print(f"[{i}/{len(names)}] {name}  profile={profile}  params={load_profile(name, profile)}", flush=True)
        times[name] = execute(name, profile, out, kernel, log_output)
        print(f"    done in {times[name]:.1f} s", flush=True)
    print(f"total {sum(times.values()):.1f} s for {len(times)} notebook(s)", flush=True)
    return times


def code_sources(nb, fold: dict[str, Any] | None = None) -> list[str]:
    """The code of a notebook's cells (freshness checks); papermill's injected-parameters cell left out.

    `fold`: parameter values to fold into the parameters cell first (a source notebook compared with an
    executed copy, whose values are in ``nb.metadata.papermill.parameters``).
    """
    out = []
    for c in nb.cells:
        if c.cell_type != "code" or "injected-parameters" in c.metadata.get("tags", []):
            continue
        src = c.source
        if fold is not None and "parameters" in c.metadata.get("tags", []):
            src = fold_parameters(src, fold)
        out.append(src.strip())
    return out


def executed_parameters(nb) -> dict[str, Any]:
    """The parameter values an executed copy ran with (papermill's record in its metadata)."""
    return dict(nb.metadata.get("papermill", {}).get("parameters", {}))


def _cell_kinds(nb) -> list[str]:
    return [c.cell_type for c in nb.cells if "injected-parameters" not in c.metadata.get("tags", [])]


def sync_text(names: list[str] | None = None, out: Path = CHAPTERS) -> list[str]:
    """Copy edited markdown cells from notebooks/ into the executed copies without re-running them.

    Only prose changes this way: if any code cell differs, or the markdown cells changed in number or
    position, it refuses and names the notebook to re-execute. Returns the notebooks it updated.
    """
    import nbformat

    updated = []
    for name in names or notebook_names():
        src_nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
        ex_path = Path(out) / f"{name}.ipynb"
        ex_nb = nbformat.read(ex_path, as_version=4)
        if code_sources(src_nb, fold=executed_parameters(ex_nb)) != code_sources(ex_nb):
            raise ParameterError(f"{ex_path}: code cells differ from notebooks/{name}.ipynb; re-execute it with "
                                 f"`python -m sinklib.book run --only {name[:2]}`")
        if _cell_kinds(src_nb) != _cell_kinds(ex_nb):
            raise ParameterError(f"{ex_path}: cells were added, removed or moved in notebooks/{name}.ipynb; "
                                 f"re-execute it with `python -m sinklib.book run --only {name[:2]}`")
        src_md = [c for c in src_nb.cells if c.cell_type == "markdown"]
        ex_md = [c for c in ex_nb.cells if c.cell_type == "markdown"]
        changed = False
        for a, b in zip(src_md, ex_md):
            if a.source != b.source:
                b.source = a.source
                changed = True
        if changed:
            nbformat.write(ex_nb, ex_path)
            updated.append(name)
    return updated


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sinklib.book", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="execute notebooks with a parameter profile")
    r.add_argument("--profile", default="full", choices=PROFILE_NAMES)
    r.add_argument("--only", nargs="*", help="notebook prefixes, e.g. 01 02")
    r.add_argument("--out", default=str(CHAPTERS), help="folder of the executed copies (default book/chapters)")
    r.add_argument("--log-output", action="store_true", help="stream cell outputs to the terminal")
    sub.add_parser("list", help="list notebooks and their profiles")
    t = sub.add_parser("sync-text", help="copy edited markdown from notebooks/ into the executed copies")
    t.add_argument("--only", nargs="*", help="notebook names (default: all)")
    s = sub.add_parser("set-repo", help="point _config.yml, the README and the Colab cells at a fork")
    s.add_argument("url", help="https://github.com/<owner>/<name>")
    a = ap.parse_args(argv)
    if a.cmd == "set-repo":
        print("changed:", ", ".join(set_repo(a.url)) or "nothing")
        return 0
    if a.cmd == "sync-text":
        names = [n for n in notebook_names() if not a.only or any(n.startswith(o) for o in a.only)]
        print("updated:", ", ".join(sync_text(names)) or "nothing")
        return 0
    if a.cmd == "list":
        for n in notebook_names():
            print(n, {p: load_profile(n, p) for p in PROFILE_NAMES})
        return 0
    run(a.profile, a.only, Path(a.out), log_output=a.log_output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
