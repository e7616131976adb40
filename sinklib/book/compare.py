"""Compare two folders of results JSON (the `data/results/*.json` layout): every number, beyond a
tolerance, ignoring provenance, timings and paths. Used to prove that a refactor changed no result
(`scripts/compare_results.py BEFORE_DIR AFTER_DIR`).
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: keys whose subtree is skipped: provenance, timings (wall-clock seconds and ratios of timings), paths; "utc"
#: only as a word of its own (a timestamp), never inside another word ("outcomes" are results)
IGNORED_KEYS = re.compile(
    r"(^provenance$|seconds|runtime|timing|^loads$| s$| s/step|(?<![a-z])utc|git_commit|path|checkpoint|_dir$|"
    r"^long_context$)", re.IGNORECASE)


@dataclass(frozen=True)
class Difference:
    """One difference: the file, the JSON path, the two values (MISSING when absent) and why."""

    file: str
    path: str
    before: Any
    after: Any
    kind: str  # "number", "text", "type", "missing", "file"

    def __str__(self) -> str:
        return f"{self.file}: {self.path}: {self.kind}: {self.before!r} -> {self.after!r}"


MISSING = "<missing>"


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _numbers_equal(a: float, b: float, tol: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= tol * max(1.0, abs(a), abs(b))


def diff_values(a: Any, b: Any, tol: float = 1e-9, path: str = "", file: str = "",
                ignore: re.Pattern = IGNORED_KEYS) -> Iterator[Difference]:
    """Differences between two JSON values (recursively); numbers beyond `tol` (relative above 1,
    absolute below), texts, types and keys present on one side only."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(a) + [k for k in b if k not in a]:
            if ignore.search(str(k)):
                continue
            p = f"{path}/{k}"
            if k not in b:
                yield Difference(file, p, a[k], MISSING, "missing")
            elif k not in a:
                yield Difference(file, p, MISSING, b[k], "missing")
            else:
                yield from diff_values(a[k], b[k], tol, p, file, ignore)
    elif isinstance(a, list) and isinstance(b, list):
        for i in range(max(len(a), len(b))):
            p = f"{path}[{i}]"
            if i >= len(b):
                yield Difference(file, p, a[i], MISSING, "missing")
            elif i >= len(a):
                yield Difference(file, p, MISSING, b[i], "missing")
            else:
                yield from diff_values(a[i], b[i], tol, p, file, ignore)
    elif _is_number(a) and _is_number(b):
        if not _numbers_equal(float(a), float(b), tol):
            yield Difference(file, path, a, b, "number")
    elif type(a) is not type(b) and not (a is None or b is None):
        yield Difference(file, path, a, b, "type")
    elif a != b:
        yield Difference(file, path, a, b, "text" if isinstance(a, str) else "type")


def compare_results(before: str | Path, after: str | Path, tol: float = 1e-9,
                    ignore: re.Pattern = IGNORED_KEYS) -> list[Difference]:
    """Every difference between the `*.json` files of two results folders (a file on one side only is one)."""
    before, after = Path(before), Path(after)
    names = sorted({p.name for p in before.glob("*.json")} | {p.name for p in after.glob("*.json")})
    out: list[Difference] = []
    for name in names:
        fa, fb = before / name, after / name
        if not fa.exists() or not fb.exists():
            out.append(Difference(name, "", "present" if fa.exists() else MISSING,
                                  "present" if fb.exists() else MISSING, "file"))
            continue
        out.extend(diff_values(json.loads(fa.read_text()), json.loads(fb.read_text()), tol, "", name, ignore))
    return out


def report(differences: list[Difference], n_files: int) -> str:
    """The text `scripts/compare_results.py` prints."""
    if not differences:
        return f"0 differences beyond tolerance in {n_files} file(s)"
    lines = [f"{len(differences)} difference(s):"] + [f"  {d}" for d in differences]
    return "\n".join(lines)
