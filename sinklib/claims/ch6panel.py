"""Chapter 6's Part 3 judged: the merges of chapter 11's pairs (`sinklib.controls.panelmerge.run`) by chapter 6's
rule (`claims.ch6.merge_verdict`) on the strict instruction pass rate, every change pooled over the training seeds
(`evals.pooling.pooled`); its table, its sentence and its records for the results file."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from sinklib.controls.panelmerge import METRICS


def verdicts(doc: Mapping[str, Any], names: Sequence[str], methods: Sequence[str],
             rows: Sequence[Mapping[str, Any]] = (), not_tested: Mapping[str, str] | None = None,
             same: Mapping[str, Mapping[str, str]] | None = None) -> pd.DataFrame:
    """One row per (model, merge): chapter 6's rule (`claims.ch6.merge_verdict`) on the strict instruction pass
    rate, every change pooled over the training seeds of `doc` (the layout of `run`'s outcomes, under
    results.outcomes): the merge minus VL, the merge minus the base, and VL minus the base (the loss to recover),
    with the seeds the merge was pooled over; with `run`'s `rows`, the merge's VQA accuracy as % of the VL model's
    (mean over seeds of each seed's ratio). `not_tested`: {model: why} for a pair whose precondition failed
    (`panelpairs.precondition_failed`); `same`: `run`'s 'same_as_vl', merges that leave the VL model unchanged
    (not tested)."""
    import numpy as np

    from sinklib.claims.ch6 import merge_recovers, merge_verdict, merge_worse
    from sinklib.evals.pooling import pooled

    out = []
    for name in names:
        vl_loss, _ = pooled(doc, name, "vl", "base", METRICS)
        for m in methods:
            c = f"merge:{m}"
            (to_vl, n), (to_base, _) = (pooled(doc, name, c, ref, METRICS) for ref in ("vl", "base"))
            why = (not_tested or {}).get(name, "") or (f"precondition failed: {(same or {}).get(name, {})[m]}"
                                                       if m in (same or {}).get(name, {}) else "")
            v = merge_verdict(to_base, to_vl, vl_loss, not_tested=why)
            out.append({"model": name, "method": m, "seeds": n, "outcome": v.outcome, "why": v.why,
                        "VL minus base (pt)": vl_loss, "merge minus VL (pt)": to_vl, "merge minus base (pt)": to_base,
                        "worse than VL": merge_worse(to_vl), "recovers to base level": merge_recovers(to_base, to_vl),
                        "VQA kept (% of VL)": _vqa_kept(rows, name, m) if rows else np.nan})
    return pd.DataFrame(out)


def _vqa_kept(rows: Sequence[Mapping[str, Any]], name: str, method: str) -> float:
    """The merge's VQA accuracy as % of its VL model's, per seed, averaged over the seeds."""
    import numpy as np

    by = {(r["seed"], r["condition"].split(" seed ")[0]): r["VQA (%)"] for r in rows if r["model"] == name}
    ratios = [100 * by[(s, f"merge:{method}")] / by[(s, "vl")] for (s, c) in by
              if c == "vl" and (s, f"merge:{method}") in by and by[(s, "vl")] > 0]
    return float(np.mean(ratios)) if ratios else float("nan")


def verdict_table(v: pd.DataFrame):
    """`verdicts` for display: one row per pair and merge, the pooled changes with their intervals in one cell."""
    from sinklib.core.numbers import interval
    from sinklib.plots import Table

    cell = lambda e: interval(e.v, e.lo, e.hi)  # noqa: E731
    d = pd.DataFrame({"model": v.model, "method": v.method,
                      "merge - VL (pt)": [cell(e) for e in v["merge minus VL (pt)"]],
                      "merge - base (pt)": [cell(e) for e in v["merge minus base (pt)"]],
                      "VQA kept (%)": [f"{x:.0f}" for x in v["VQA kept (% of VL)"]],
                      "verdict: no recovery": v.outcome}).set_index(["model", "method"])
    loss = "; ".join(f"{m} {cell(e)} pt over {n} seed(s)" for m, e, n in
                     v.drop_duplicates("model")[["model", "VL minus base (pt)", "seeds"]].itertuples(index=False))
    why = "; ".join(f"{o} ({k} of {len(v)}): {w}" for (o, w), k in v.groupby(["outcome", "why"], sort=False)
                    .size().items())
    return Table(d, "Strict instruction pass rate (chapter 11's instruction suite), changes pooled over the training "
                    "seeds with paired 95 % intervals (items and seeds resampled). The loss to recover, VL minus base: "
                    f"{loss}. VQA kept: the merge's held-out VQA accuracy as % of its VL model's. Verdicts by Part 2's "
                    f"rule: {why}.")


def sentence(v: pd.DataFrame) -> str:
    """What the merges did to each pair's loss, in words, from `verdicts`."""
    from sinklib.claims.ch6 import outcome_counts
    from sinklib.core.numbers import interval

    if v.empty:
        return "no pair of chapter 11 was merged"
    parts = []
    for name, g in v.groupby("model", sort=False):
        e = g["VL minus base (pt)"].iloc[0]
        back = g[g["recovers to base level"]]
        worse = g[g["worse than VL"]]
        parts.append(
            f"{name} (VL minus base {interval(e.v, e.lo, e.hi)} pt over {g.seeds.iloc[0]} seed(s)): "
            + (f"{len(back)} of {len(g)} merges recover the loss ("
               + ", ".join(f"{r.method} keeping {r['VQA kept (% of VL)']:.0f} % of VL's VQA" for _, r in back.iterrows())
               + ")" if len(back) else f"none of the {len(g)} merges recovers the loss")
            + (f", {len(worse)} {'is' if len(worse) == 1 else 'are'} worse than VL outside the noise "
               f"({', '.join(worse.method)})" if len(worse) else "")
            + f"; verdicts: {outcome_counts(g.outcome)}")
    return "; ".join(parts)


def records(v: pd.DataFrame) -> list[dict]:
    """`verdicts` as JSON records (each pooled change as [point, lo, hi]), as the chapter saves them and the claims
    page reads them."""
    import numpy as np

    est = ("VL minus base (pt)", "merge minus VL (pt)", "merge minus base (pt)")
    return [{k: [x.v, x.lo, x.hi] if k in est else bool(x) if isinstance(x, (bool, np.bool_)) else x
             for k, x in r.items()} for r in v.to_dict("records")]
