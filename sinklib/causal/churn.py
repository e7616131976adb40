"""What chapter 8's suites can detect at the churn its ablations actually cause. The power table of
`sinklib.controls.sizes` assumes 5 % of items flip each way besides a fall; under head ablation many more items flip
(a referee's reading of the session-48 run: 10-15 % each way). Here the churn is measured: for every condition below
dose 1, the share of items that pass under the ablation but failed unablated ('gained': the flips against a fall,
which a symmetric background churn makes as often in the other direction), its median over the conditions, and the
smallest fall the exact McNemar test detects with 80 % power at that churn (`sinklib.evals.power`)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from sinklib.controls.sizes import points

PASS_FAIL = ("instructions strict", "math strict", "knowledge acc")


def observed(table, eval_n: Mapping[str, int], metrics: Sequence[str] = PASS_FAIL):
    """`dose_response`'s rows -> one row per (model, metric): items, base accuracy (%), the median share of items
    gained under the conditions below dose 1 (%, the churn each way), how many conditions, and the smallest fall
    detected with 80 % power at that churn (points; NaN: none)."""
    import numpy as np
    import pandas as pd

    from sinklib.evals.power import min_detectable_drop

    rows = []
    t = table[(table.dose < 1) & table.metric.isin(list(metrics))]
    for (model, metric), g in t.groupby(["model", "metric"], sort=False):
        n = int(eval_n[metric.split()[0]])
        if n < 1:
            continue
        share = float(np.median(g.gained / n))
        base = float(g.base.iloc[0])
        rows.append({"model": model, "metric": metric, "items": n, "base (%)": round(base, 1),
                     "churn each way (%)": round(100 * share, 1), "conditions": len(g),
                     "smallest fall at that churn (pt)": min_detectable_drop(n, base / 100, flip=share)})
    return pd.DataFrame(rows, columns=["model", "metric", "items", "base (%)", "churn each way (%)", "conditions",
                                       "smallest fall at that churn (pt)"])


def sentence(rows) -> str:
    """`observed` in words, per model and metric."""
    if not len(rows):
        return "no condition below dose 1 in this run, so no churn was measured"
    fall = "smallest fall at that churn (pt)"
    return "; ".join(f"{r['model']} {r['metric']}: {r['churn each way (%)']:.1f} % of items flip each way (median of "
                     f"{r['conditions']} conditions), so the smallest fall detected is "
                     + (f"{points(r[fall])} points" if r[fall] == r[fall] else "none of any size")
                     for _, r in rows.iterrows())


def display(rows):
    """`observed` as a page shows it: model and metric as the index, 'none' where no fall is detectable."""
    fall = "smallest fall at that churn (pt)"
    shown = rows.set_index(["model", "metric"])
    return shown.assign(**{fall: [points(v) for v in shown[fall]]})


def from_document(doc: Mapping):
    """`observed` for a stored chapter-8 results document ({'results': {'dose_response': rows}, 'parameters':
    {'eval_instructions', 'eval_math', 'eval_knowledge', ...}}); None where the rows or the suite sizes are missing."""
    import pandas as pd

    rows = pd.DataFrame([r for r in (doc.get("results") or {}).get("dose_response") or [] if "gained" in r])
    p = doc.get("parameters") or {}
    n = {s: int(p[f"eval_{s}"]) for s in ("instructions", "math", "knowledge") if f"eval_{s}" in p}
    return observed(rows, n) if len(rows) and len(n) == 3 else None
