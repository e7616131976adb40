"""Results with provenance: what a notebook saves of its run (``save_results``: its key numbers, the parameters it
ran with, and the git commit, package versions, device, run time and models that made them) into
``data/results/NN_name.json`` (``sinklib.core.resources.results_dir``), and what a later notebook reads back
(``load_results``). Re-exported by `sinklib.book.runner` and `sinklib.book`."""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

from sinklib.core.resources import checkout_root, display_path, results_dir
from sinklib.errors import ResultsMissing

_T0 = time.perf_counter()  # imported with sinklib.book (its __init__ imports the runner, which imports this)


#: what the runner itself writes (executed copies, results, generated pages, the exported README figures): a
#: change there does not make the code dirty, so chapters run one after another in one call stay clean
RUNNER_OUTPUTS = ("book/chapters", "data/results", "book/_generated", "book/_static/[0-9][0-9]_*.png")


def _git_commit() -> str:
    repo = checkout_root()
    if repo is None:
        return "installed sinkbook (no git checkout)"
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                *(f":!{p}" for p in RUNNER_OUTPUTS)], cwd=repo,
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
    if type(x).__name__ == "DataFrame" and hasattr(x, "to_dict"):  # a table: one record per row
        return _jsonable(x.to_dict(orient="records"))
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
                 seconds: float | None = None) -> str:
    """Write <results folder>/<notebook>.json: results + parameters + provenance.

    Returns the file's path as a page may print it (``data/results/NN.json``, relative; never a machine path).

    models: Loaded objects (sinklib.core.models) or dicts; seconds defaults to the time since this
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
    return display_path(path)


def load_results(notebook: str, key: str | None = None) -> dict:
    """Results an earlier notebook wrote (the whole document, or doc['results'][key])."""
    path = results_dir() / f"{notebook}.json"
    if not path.exists():
        raise ResultsMissing(f"{display_path(path)} does not exist: run notebooks/{notebook}.ipynb first, for example "
                             f"`python -m sinklib.book run --profile full --only {notebook[:2]}`")
    doc = json.loads(path.read_text())
    return doc if key is None else doc["results"][key]
