"""Chapter 6's merges on chapter 11's pairs that lost strict instruction format (`sinklib.adapt.panelpairs`).

Chapter 4's pairs lost nothing outside the noise, so the paper's "no merging setting recovers the VL loss" could not
be tested on them. Here every merge method of chapter 6 is applied to each chosen pair of chapter 11 at every
training seed chapter 11 ran, evaluated with chapter 11's suites and settings (its base and VL evaluations are
chapter 11's own, read from the cache), and judged by chapter 6's rule (`claims.ch6.merge_verdict`) on the panel's
metric, the strict instruction pass rate, with every change pooled over the seeds (`evals.pooling.pooled`).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pandas as pd

from sinklib.adapt.primary import PRIMARY

#: the metric the verdicts read: chapter 11's primary one (the paper's IFEval counterpart)
METRICS = (PRIMARY,)


def run(doc11: Mapping[str, Any], names: Sequence[str], methods: Sequence[str], *, device: str = "auto",
        seed: int = 0, log: Callable[[str], None] | None = None) -> dict:
    """Each merge of `methods` of each pair of `names` at each seed chapter 11 ran, evaluated (cached). A merge is
    made only when its evaluation is not cached, and dropped after it (one merged state in memory at a time).
    -> {'rows': condition rows (model, seed, condition, scores), 'outcomes': {model: {condition (with its seed
    suffix, `panelpairs.condition`): packed per-item outcomes}}, 'seconds': {model/seed/method: merge seconds}}."""
    import time

    from sinklib.adapt import panelpairs
    from sinklib.adapt.scores import condition_row
    from sinklib.controls.merge import evaluation_extra
    from sinklib.core.models import load_model
    from sinklib.evals.paired import pack

    rows, outcomes, seconds = [], {}, {}
    for name in names:
        lm = load_model(name, device=device)
        for s in panelpairs.seeds_run(doc11):
            pair = panelpairs.load(lm, doc11, s)
            for cond in ["base", "vl", *(f"merge:{m}" for m in methods)]:
                if cond == "base" and "base" in outcomes.get(name, {}):
                    continue  # one base model for every seed
                method = cond[len("merge:"):] if cond.startswith("merge:") else None
                if method:
                    pair.states.defer(cond, _merger(pair, method, seed, seconds, f"{name}/{s}/{method}"))
                t0 = time.perf_counter()
                ev = panelpairs.evaluate(lm, pair, doc11, cond,
                                         key_extra=evaluation_extra(method) if method else None)
                if method:
                    del pair.states[cond]
                named = panelpairs.condition(cond, s, doc11)
                outcomes.setdefault(name, {})[named] = pack(ev["outcomes"])
                rows.append({**condition_row(name, named, ev), "seed": s})
                if log:
                    log(f"{name} seed {s} {cond}: {time.perf_counter() - t0:.0f} s")
        del lm
    return {"rows": rows, "outcomes": outcomes, "seconds": seconds}


def _merger(pair: Any, method: str, seed: int, seconds: dict, label: str) -> Callable[[], dict]:
    def make() -> dict:
        import time

        from sinklib.controls.merge import merge

        t0 = time.perf_counter()
        out = merge(pair.states["base"], pair.states["vl"], method, seed=seed)
        seconds[label] = time.perf_counter() - t0
        return out
    return make


def verdicts(doc: Mapping[str, Any], names: Sequence[str], methods: Sequence[str],
             rows: Sequence[Mapping[str, Any]] = ()) -> pd.DataFrame:
    """One row per (model, merge): chapter 6's rule (`claims.ch6.merge_verdict`) on the strict instruction pass
    rate, every change pooled over the training seeds of `doc` (the layout of `run`'s outcomes, under
    results.outcomes): the merge minus VL, the merge minus the base, and VL minus the base (the loss to recover),
    with the number of seeds; with `run`'s `rows`, the merge's VQA accuracy as % of the VL model's (mean over
    seeds of each seed's ratio)."""
    import numpy as np

    from sinklib.claims.ch6 import merge_recovers, merge_verdict, merge_worse
    from sinklib.evals.pooling import pooled

    out = []
    for name in names:
        vl_loss, n = pooled(doc, name, "vl", "base", METRICS)
        for m in methods:
            c = f"merge:{m}"
            to_vl, to_base = (pooled(doc, name, c, ref, METRICS)[0] for ref in ("vl", "base"))
            v = merge_verdict(to_base, to_vl, vl_loss)
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
    return Table(d, "Strict instruction pass rate (chapter 11's 360-prompt suite), changes pooled over the training "
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
