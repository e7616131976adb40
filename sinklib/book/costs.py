"""Where a chapter's compute goes, from its results file (#30): the trainings (seconds per stage) and evaluations
(seconds per suite) it records, summed over the conditions stored. `compute_seconds` is the estimate of a rerun from
an empty cache that `sinklib.book.reproduce` shows beside the saved run time (which is what the last run took with
what it found cached). Only what the results store is counted: evaluations of conditions that a results file does
not list (extra seeds, doses, sizes) are not in its `scores`, so it is a lower bound. `scripts/chapter_profile.py`
prints the table, against an older results file when given one.
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

KIND = {"instructions": "generation", "math": "generation", "knowledge": "likelihood", "perplexity": "likelihood"}


def profile(doc: dict) -> dict[str, float]:
    """{'training: <stage>': seconds, 'evaluation: <suite> (<kind>)': seconds, 'jobs': seconds} of one results
    document (`runtime` rows, per-suite `seconds` of the `scores` rows once per model, condition and suite, and the
    seconds of chapter 11's jobs, which include their trainings and evaluations)."""
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
    for v in (r.get("job_seconds") or {}).values():
        out["jobs (training and evaluation)"] += float(v)
    return dict(out)


def compute_seconds(name: str, results: Path) -> float | None:
    """At least how long chapter `name` computes from an empty cache: the sum of `profile` of its results file in
    the folder `results` (None: no file, or nothing recorded)."""
    f = Path(results) / f"{name}.json"
    if not f.exists():
        return None
    total = sum(profile(json.loads(f.read_text())).values())
    return total or None


def table(after: dict[str, float], before: dict[str, float] | None = None) -> str:
    """`profile` as text, largest first, with a second profile and the ratio before / after when given."""
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
