"""Where sinklib finds its data and where results go, inside a checkout or installed from a wheel.

The calibration prompts, evaluation items, parameter profiles and the paper's reported values live in
the repository's top-level ``data/`` folder. ``sinklib/_data`` is a link to that folder, and the wheel
ships its files (``pyproject.toml``, package-data) under the same name, so every file is read through
``importlib.resources`` and works from any working directory, with or without a checkout.

Results (``<notebook>.json``) go to ``$SINKBOOK_RESULTS`` when set, else to ``data/results/`` of the
checkout sinklib runs from, else (an installed wheel, for example on Colab) to ``./sinkbook_results``
in the current working directory.
"""
from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from sinklib.errors import ParameterError

PACKAGE = Path(__file__).resolve().parent.parent  # sinklib/


def data_path(*parts: str) -> Path:
    """A file shipped with sinklib, e.g. ``data_path("evals", "math.jsonl")``.

    Raises ParameterError naming the file when it is missing (a broken install or checkout).
    """
    root = resources.files("sinklib").joinpath("_data")
    p = Path(str(root.joinpath(*parts)))
    if not p.exists():
        raise ParameterError(f"sinklib's data file {'/'.join(parts)!r} is missing from {root}: reinstall sinkbook "
                             "(pip install --force-reinstall 'sinkbook @ git+<repository>') or restore data/ in "
                             "your checkout")
    return p


def checkout_root() -> Path | None:
    """The repository root when sinklib runs from a checkout of sinkbook (editable install), else None."""
    root = PACKAGE.parent
    if (root / "_toc.yml").is_file() and (root / "notebooks").is_dir() and (root / "data").is_dir():
        return root
    return None


def results_dir(create: bool = True) -> Path:
    """$SINKBOOK_RESULTS, else data/results of the checkout, else ./sinkbook_results (installed wheel)."""
    env = os.environ.get("SINKBOOK_RESULTS", "").strip()
    root = checkout_root()
    if env:
        d = Path(env)
    elif root is not None:
        d = root / "data" / "results"
    else:
        d = Path.cwd() / "sinkbook_results"
    if create:
        d.mkdir(parents=True, exist_ok=True)
    return d


def display_path(path: str | Path) -> str:
    """A path as a page may print it: relative to the checkout, or to $SINKBOOK_RESULTS / the working
    directory, never an absolute path of the machine that ran the notebook."""
    p = Path(path).resolve()
    env = os.environ.get("SINKBOOK_RESULTS", "").strip()
    for base, label in ((checkout_root(), ""), (Path(env).resolve() if env else None, "$SINKBOOK_RESULTS/"),
                        (Path.cwd().resolve(), "")):
        if base is not None and p.is_relative_to(base):
            return label + p.relative_to(base).as_posix()
    return p.name


__all__ = ["data_path", "checkout_root", "results_dir", "display_path"]
