"""Chapter 8's hypothesis H2 tested directly: is the damage specific to the sink? At each dose below 1 (at dose 1
the sink and random heads are one condition), the sink heads' condition is compared with a control on the same
items: the paired change from the control to the sink condition (`sinklib.evals.paired.paired_changes`), that
is, the change under the sink ablation minus the change under the control. Below zero: the sink ablation costs
more than the control. A matched dose outside the mass tolerance (`matched_ok` False) is not tested. The
random heads usually remove less attention mass than the sink heads, so a random control that hurts less may
only have removed less: each row carries both masses."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sinklib.causal.suites import KNOWLEDGE, STRICT, random_draw
from sinklib.causal.cells import change_cells
from sinklib.evals.paired import paired_changes

AGAINST = ("random", "matched")
POOLED = "random, pooled"  # every random draw of a dose, pooled (`pooled_random`)


def contrasts(results: Mapping[tuple[float, str], Mapping], table, *, model: str, against: Sequence[str] = AGAINST,
              metrics: Sequence[str] = tuple(STRICT) + tuple(KNOWLEDGE), seed: int = 0):
    """One row per (dose below 1, control, metric) of one model: sink minus control, paired on the items, with its
    95 % interval and exact McNemar p, the mass each removed (`table`: `dose_response`'s rows of this model) and
    'tested' (False for a matched dose outside the tolerance)."""
    import pandas as pd

    mass = {(float(r.dose), r.control): (float(r.mass_removed), bool(getattr(r, "matched_ok", True)))
            for r in table.itertuples()}
    rows = []
    for (dose, control), res in sorted(results.items()):
        if control not in against or dose >= 1 or (dose, "sink") not in results:
            continue
        m_sink, _ = mass.get((dose, "sink"), (float("nan"), True))
        m_ctl, ok = mass.get((dose, control), (float("nan"), True))
        for ch in paired_changes(res, results[(dose, "sink")], seed=seed):
            if ch["metric"] in metrics:
                rows.append({"model": model, "dose": dose, "against": control, "metric": ch["metric"],
                             "sink minus control": ch["change"], "lo": ch["lo"], "hi": ch["hi"], "p": ch["p"],
                             "mass removed, sink": m_sink, "mass removed, control": m_ctl, "tested": ok})
    if "random" in against:
        rows += pooled_random(results, mass, model=model, metrics=metrics, seed=seed)
    return pd.DataFrame(rows)


def pooled_random(results: Mapping[tuple[float, str], Mapping], mass: Mapping[tuple[float, str], tuple], *,
                  model: str, metrics: Sequence[str], seed: int = 0) -> list[dict]:
    """Sink minus random, pooled over every random draw of a dose ('random', 'random 2', ...; only doses with two
    or more): the mean of the per-draw paired changes, its interval from their bootstrap draws with the items
    resampled alike for every draw and the draws resampled too (`sinklib.evals.pooling.pool_seeds`), so it holds
    part of the spread between random sets (resampling k sets understates their variance by (k - 1) / k); p: none (no exact test pools draws; the interval decides, as everywhere in
    chapter 8). 'mass removed, control': the draws' mean."""
    import numpy as np

    from sinklib.evals import paired
    from sinklib.evals.pooling import pool_seeds

    rows = []
    for dose in sorted({d for d, _ in results}):
        draws = sorted((c for d, c in results if d == dose and random_draw(c)), key=random_draw)
        if dose >= 1 or len(draws) < 2 or (dose, "sink") not in results:
            continue
        sink = results[(dose, "sink")]["outcomes"]
        for metric in [m for m in metrics if m in paired.unpack(sink)]:  # the metrics this run evaluated
            got = [paired.change(results[(dose, c)]["outcomes"], sink, metric, seed=seed) for c in draws]
            pts, boot = np.asarray([g[0] for g in got]), np.asarray([g[1] for g in got])
            e = pool_seeds(pts, boot, n_boot_seed=seed)
            rows.append({"model": model, "dose": dose, "against": POOLED, "metric": metric,
                         "sink minus control": e.v, "lo": e.lo, "hi": e.hi,
                         "p": float("nan"),
                         "mass removed, sink": mass.get((dose, "sink"), (float("nan"), True))[0],
                         "mass removed, control": float(np.mean([mass.get((dose, c), (float("nan"), True))[0]
                                                                 for c in draws])),
                         "tested": True, "draws": len(draws)})
    return rows


def outside(rows) -> tuple[Any, Any]:
    """Split contrasts (sink minus control) by the one rule: (the sink ablation cost more outside the noise: the
    interval wholly below zero, it cost less: wholly above)."""
    return rows[rows.hi < 0], rows[rows.lo > 0]


def display(rows) -> Any:
    """`contrasts` rows as a page shows them: one row per model, dose and metric, one column per control."""
    import pandas as pd

    shown = pd.DataFrame({"model": rows.model, "dose": rows.dose, "metric": rows.metric, "against": rows.against,
                          "sink minus control (points)": change_cells(rows, rows.tested, value="sink minus control")})
    return shown.pivot_table(index=["model", "metric", "dose"], columns="against",
                             values="sink minus control (points)", aggfunc="first")


def sentence(rows, metrics: Sequence[str] = tuple(STRICT), what: str = "strict format") -> str:
    """H2 in words over `metrics` (named `what`; default the strict-format metrics): per control, at how many tested
    (model, dose, metric) contrasts the sink ablation costs more than the control outside the noise (named), how
    many the other way (named too), and how many were run (95 % intervals, uncorrected for the number of
    contrasts: said so)."""
    if not len(rows):
        return "no dose below 1 has both the sink heads and a control, so H2 was not tested"
    parts, n_all, n_pooled = [], 0, 0
    for control in (*AGAINST, POOLED):
        r = rows[(rows.against == control) & rows.metric.isin(list(metrics))]
        if not len(r):
            continue
        t = r[r.tested]
        more, less = outside(t)
        n_all += len(t) if control != POOLED else 0
        n_pooled += len(t) if control == POOLED else 0
        where, other = (", ".join(f"{m} {mt} at {d:g}" for m, mt, d in zip(x.model, x.metric, x.dose))
                        for x in (more, less))
        whom = (f"{int(r.draws.max())} random head sets pooled" if control == POOLED else
                "the random heads (the first draw)" if control == "random" and (rows.against == POOLED).any() else
                "the matched control" if control == "matched" else f"the {control} heads")
        parts.append(f"against {whom} the sink ablation cost more {what} outside the noise in "
                     f"{len(more)} of {len(t)} tested contrasts{(' (' + where + ')') if where else ''} and less in "
                     f"{len(less)}{(' (' + other + ')') if other else ''}"
                     + (f"; {len(r) - len(t)} not tested (mass outside the tolerance)" if len(r) > len(t) else ""))
    count = ("This is 1 contrast" if n_all == 1 else f"These are {n_all} contrasts") + (
        f" (besides {n_pooled} pooled re-estimate{'s' if n_pooled > 1 else ''} of the random ones)" if n_pooled else "")
    return "; ".join(parts) + (f". {count}, each with its own 95 % interval and none corrected for the others: "
                               "one interval outside zero among many is weak evidence on its own")
