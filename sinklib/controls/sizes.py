"""What chapter 6's suites can detect: the smallest fall of each pass/fail score that the paired test finds with
80 % power (`sinklib.evals.power`, exact McNemar at the 5 % level), computed for the items the chapter actually
evaluates and each model's base accuracy on them, before any verdict is read (issue #31: the chapter used to point
at chapter 4's power table, computed for other suite sizes)."""
from __future__ import annotations

from collections.abc import Mapping

#: the scores whose falls chapter 6's verdicts are about (the strict-format pair) and the knowledge score
POWER_METRICS: tuple[str, ...] = ("instructions strict", "math strict", "knowledge acc")
#: background churn of the paired test: items that flip both ways without a net change (0: the best case)
FLIPS: tuple[float, ...] = (0.0, 0.05)
BEST, CHURN = (f"paired, flip {f:g}" for f in FLIPS)


def detectable_table(base_outcomes: Mapping[str, Mapping], metrics: tuple[str, ...] = POWER_METRICS):
    """{model: per-item outcomes of its base evaluation} -> one row per (model, metric): items, the base accuracy
    (%) and the smallest detectable fall in points (80 % power, paired test; NaN where none is), with no
    background flips (`BEST`) and with 5 % of items flipping both ways (`CHURN`, the claims page's figure)."""
    from sinklib.evals.power import base_power_table

    t = base_power_table(base_outcomes, metrics, flips=FLIPS).drop(columns="unpaired")
    t.insert(0, "model", [s.split(": ", 1)[0] for s in t.suite])
    t["suite"] = [s.split(": ", 1)[1] for s in t.suite]
    return t.rename(columns={"suite": "metric"})


def points(v: float) -> str:
    """A detectable fall as the pages print it, to one decimal ('14.5'); 'none' for NaN (no fall is detectable).
    The one formatter of chapter 6's sizes, chapter 8's and the claims page's power notes."""
    return "none" if v != v else f"{v:.1f}"


def detectable_display(table):
    """`detectable_table` for display: model and metric as the index, 'none' where no fall is detectable."""
    from sinklib.plots import Table

    d = table.set_index(["model", "metric"])
    out = d[["items"]].copy()
    out["base (%)"] = [f"{v:.1f}" for v in d["base (%)"]]
    out["smallest fall, no churn (pt)"] = [points(v) for v in d[BEST]]
    out["with 5 % churn (pt)"] = [points(v) for v in d[CHURN]]
    return Table(out, "Smallest fall of each score (points) that the paired exact McNemar test detects with 80 % power "
                      "at the 5 % level, on this chapter's items at the base model's accuracy; 'no churn': every item "
                      "that changes goes one way, '5 % churn': besides the fall, 5 % of items fail and 5 % recover "
                      "(the figure the claims page quotes). 'none': even losing every passed item is not detected "
                      "that often.")


def undetectable(table, model: str, metrics: tuple[str, ...] = ("instructions strict", "math strict")) -> list[str]:
    """The `metrics` of `model` on which no fall of any size is detected with 80 % power, even without churn."""
    d = table[(table.model == model) & table.metric.isin(metrics)]
    return [m for m, v in zip(d.metric, d[BEST]) if v != v]


def _fall(best: float, churn: float) -> str:
    if best != best:
        return "no fall of any size"
    return f"{points(best)} points at best, " + ("none" if churn != churn else f"{points(churn)} points") + " with 5 % churn"


def detectable_sentence(table) -> str:
    """`detectable_table` in words, per model: each score's items, base accuracy and smallest detectable fall."""
    parts = []
    for model in dict.fromkeys(table.model):
        d = table[table.model == model]
        each = [f"{r.metric} ({r['items']} items, base {r['base (%)']:.0f} %): {_fall(r[BEST], r[CHURN])}"
                for _, r in d.iterrows()]
        parts.append(f"{model}: " + "; ".join(each))
    return ". ".join(parts)
