#!/usr/bin/env python
"""Where a chapter's hours go (#30): from a results file of chapter 4 (or any chapter that stores `runtime` rows and
per-suite `seconds` in its `scores`), the seconds of training (per stage) and of evaluation (per suite: generation
for instructions and math, likelihood scoring for knowledge and perplexity), summed over the conditions stored;
with a second file (for example the committed results of an earlier run, `git show REV:data/results/04_vl_adaptation.json`),
the same table side by side with the ratio. Only what the results store is counted: evaluations of conditions
that the results file does not list (extra seeds, doses, sizes) are not in its `scores`.

    python scripts/chapter_profile.py data/results/04_vl_adaptation.json [BEFORE.json]
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

KIND = {"instructions": "generation", "math": "generation", "knowledge": "likelihood", "perplexity": "likelihood"}


def profile(doc: dict) -> dict[str, float]:
    """{'training: <stage>': seconds, 'evaluation: <suite> (<kind>)': seconds} of one results document."""
    r = doc.get("results", doc)
    out: dict[str, float] = defaultdict(float)
    for row in r.get("runtime") or []:
        out[f"training: {row['stage']}"] += float(row["seconds"])
    seen = set()
    for row in r.get("scores") or []:
        key = (row.get("model"), row.get("condition"), row["suite"])
        if key in seen or row.get("seconds") is None:  # one time per suite and condition, not per metric
            continue
        seen.add(key)
        out[f"evaluation: {row['suite']} ({KIND.get(row['suite'], 'other')})"] += float(row["seconds"])
    return dict(out)


def table(after: dict[str, float], before: dict[str, float] | None = None) -> str:
    keys = sorted(set(after) | set(before or {}), key=lambda k: -after.get(k, 0.0))
    lines = [f"{'part':42s} {'after (s)':>10s}" + (f" {'before (s)':>11s} {'before/after':>12s}" if before else "")]
    for k in keys + ["total"]:
        a = sum(after.values()) if k == "total" else after.get(k, 0.0)
        line = f"{k:42s} {a:10.0f}"
        if before is not None:
            b = sum(before.values()) if k == "total" else before.get(k, 0.0)
            line += f" {b:11.0f} {b / a if a else float('nan'):12.2f}"
        lines.append(line)
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv or len(argv) > 2:
        print(__doc__)
        return 2
    after = profile(json.loads(Path(argv[0]).read_text()))
    before = profile(json.loads(Path(argv[1]).read_text())) if len(argv) == 2 else None
    print(table(after, before))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
