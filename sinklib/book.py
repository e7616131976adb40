"""The book pipeline: parameter profiles, the papermill runner, results with provenance.

    python -m sinklib.book run --profile quick|full|colab [--only 01 02] [--out book/chapters]
    python -m sinklib.book list

Each notebook ``notebooks/NN_name.ipynb`` is executed with the parameters of
``data/profiles/NN_name.yml[profile]`` into ``book/chapters/NN_name.ipynb``. Notebooks write
their key numbers with ``save_results`` into ``data/results/NN_name.json`` ($SINKBOOK_RESULTS).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .data import REPO
from .errors import ParameterError, ResultsMissing

NOTEBOOKS = REPO / "notebooks"
CHAPTERS = REPO / "book" / "chapters"
PROFILES = REPO / "data" / "profiles"
PROFILE_NAMES = ("quick", "full", "colab")
_T0 = time.perf_counter()


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
# results and provenance


def results_dir() -> Path:
    """$SINKBOOK_RESULTS, else data/results."""
    d = Path(os.environ.get("SINKBOOK_RESULTS", REPO / "data" / "results"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def _git_commit() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return (sha or "unknown") + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("torch", "transformers", "numpy", "scipy", "statsmodels", "mergekit", "sinkbook"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


def device_info() -> str:
    """'cpu (N cores)' or the CUDA device name."""
    try:
        import torch

        if torch.cuda.is_available():
            return f"cuda: {torch.cuda.get_device_name(0)}"
        return f"cpu ({os.cpu_count()} cores, {torch.get_num_threads()} torch threads)"
    except ImportError:
        return f"cpu ({os.cpu_count()} cores)"


def _jsonable(x: Any) -> Any:
    import numpy as np

    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    if isinstance(x, (np.floating,)):
        return float(x)
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.bool_,)):
        return bool(x)
    if isinstance(x, float) and (x != x or x in (float("inf"), float("-inf"))):
        return None
    if hasattr(x, "item") and callable(x.item) and getattr(x, "ndim", 1) == 0:
        return x.item()
    if isinstance(x, Path):
        return str(x)
    return x


def save_results(notebook: str, results: dict, params: dict | None = None, models: list | None = None,
                 seconds: float | None = None) -> Path:
    """Write data/results/<notebook>.json: results + parameters + provenance. Returns the path.

    models: Loaded objects (sinklib.models) or dicts; seconds defaults to the time since this
    kernel imported sinklib.book (about the notebook's run time).
    """
    prov = {
        "profile": (params or {}).get("profile", os.environ.get("SINKBOOK_PROFILE", "interactive")),
        "git_commit": _git_commit(),
        "versions": _versions(),
        "device": device_info(),
        "seconds": round(seconds if seconds is not None else time.perf_counter() - _T0, 2),
        "utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "models": [m.provenance() if hasattr(m, "provenance") else m for m in (models or [])],
    }
    doc = {"notebook": notebook, "results": _jsonable(results), "parameters": _jsonable(params or {}),
           "provenance": _jsonable(prov)}
    path = results_dir() / f"{notebook}.json"
    path.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
    return path


def load_results(notebook: str, key: str | None = None) -> dict:
    """Results an earlier notebook wrote (the whole document, or doc['results'][key])."""
    path = results_dir() / f"{notebook}.json"
    if not path.exists():
        raise ResultsMissing(f"{path} does not exist: run notebooks/{notebook}.ipynb first, for example "
                             f"`python -m sinklib.book run --profile full --only {notebook[:2]}`")
    doc = json.loads(path.read_text())
    return doc if key is None else doc["results"][key]


# ---------------------------------------------------------------------------------------
# runner


def _tag_injected_cell(path: Path) -> None:
    """Hide papermill's injected-parameters cell on the rendered page (tag it remove-cell)."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    for c in nb.cells:
        tags = c.get("metadata", {}).get("tags", [])
        if "injected-parameters" in tags and "remove-cell" not in tags:
            c["metadata"]["tags"] = tags + ["remove-cell"]
    nbformat.write(nb, path)


def run(profile: str, only: list[str] | None = None, out: Path = CHAPTERS, kernel: str = "python3",
        log_output: bool = False) -> dict[str, float]:
    """Execute notebooks with a profile into `out`; returns seconds per notebook."""
    import papermill as pm

    names = notebook_names()
    if only:
        sel = [n for n in names if any(n.startswith(o) or n == o for o in only)]
        missing = [o for o in only if not any(n.startswith(o) for n in names)]
        if missing:
            raise ParameterError(f"--only {missing} matches no notebook; available: {', '.join(names)}")
        names = sel
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ["SINKBOOK_PROFILE"] = profile
    times: dict[str, float] = {}
    for i, name in enumerate(names, 1):
        params = load_profile(name, profile)
        print(f"[{i}/{len(names)}] {name}  profile={profile}  params={params}", flush=True)
        t0 = time.perf_counter()
        pm.execute_notebook(str(NOTEBOOKS / f"{name}.ipynb"), str(out / f"{name}.ipynb"), parameters=params,
                            kernel_name=kernel, language="python", cwd=str(REPO), progress_bar=sys.stderr.isatty(),
                            log_output=log_output)
        _tag_injected_cell(out / f"{name}.ipynb")
        times[name] = round(time.perf_counter() - t0, 1)
        print(f"    done in {times[name]:.1f} s", flush=True)
    print(f"total {sum(times.values()):.1f} s for {len(times)} notebook(s)", flush=True)
    return times


def code_sources(nb) -> list[str]:
    """The code of a notebook's cells, papermill's injected-parameters cell left out (freshness checks)."""
    return [c.source.strip() for c in nb.cells if c.cell_type == "code"
            and "injected-parameters" not in c.metadata.get("tags", [])]


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
        if code_sources(src_nb) != code_sources(ex_nb):
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
    a = ap.parse_args(argv)
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
