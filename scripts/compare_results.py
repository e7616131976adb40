#!/usr/bin/env python
"""Compare two folders of results JSON: every number beyond a tolerance (default 1e-9), ignoring
provenance, timings and paths (sinklib.book.compare.IGNORED_KEYS).

    python scripts/compare_results.py BEFORE_DIR AFTER_DIR [--tol 1e-9] [--ignore REGEX]

Prints "0 differences ..." and exits 0, or lists each difference and exits 1.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sinklib.book.compare import IGNORED_KEYS, compare_results, report  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--tol", type=float, default=1e-9)
    ap.add_argument("--ignore", default=None, help="regex of keys to skip (default: sinklib.book.compare.IGNORED_KEYS)")
    a = ap.parse_args(argv)
    for d in (a.before, a.after):
        if not d.is_dir():
            ap.error(f"{d} is not a folder")
    ignore = IGNORED_KEYS if a.ignore is None else re.compile(a.ignore)
    diffs = compare_results(a.before, a.after, a.tol, ignore)
    n = len({p.name for p in a.before.glob("*.json")} | {p.name for p in a.after.glob("*.json")})
    print(report(diffs, n))
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
