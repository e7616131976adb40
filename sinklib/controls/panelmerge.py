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
    """Each merge of `methods` of each pair of `names` at each seed chapter 11 ran, evaluated (cached; `seed` draws
    DARE's masks and joins each merge's key). A seed whose evaluations are all cached loads no pair; otherwise the
    pair is loaded once and each merge is made only when its evaluation is missing, then dropped (one merged state
    in memory at a time). -> {'rows': condition rows (model, seed, condition with its seed suffix, scores),
    'outcomes': {model: {condition (`panelpairs.condition`): packed per-item outcomes}}, 'seconds': {model/seed/
    method: merge seconds}, 'same_as_vl': {model: {method: why}} (`same_as_vl`)}."""
    import time

    from sinklib.adapt import panelpairs
    from sinklib.adapt.scores import condition_row
    from sinklib.core.models import load_model
    from sinklib.evals.paired import pack

    rows, outcomes, seconds, same = [], {}, {}, {}
    for name in names:
        lm = load_model(name, device=device)
        first = panelpairs.params_of(doc11, name, doc11["parameters"]["seeds"][0], lm.weights_sha256)
        same[name] = {m: why for m in methods for why in [same_as_vl(m, lm.model, first)] if why}
        for s in panelpairs.seeds_run(doc11):
            conds = [c for c in ["base", "vl", *(f"merge:{m}" for m in methods)]
                     if not (c == "base" and "base" in outcomes.get(name, {}))]  # one base model for every seed
            extra = {c: _key_extra(c, seed) for c in conds}
            evs = {c: panelpairs.cached(lm, doc11, s, c, extra[c]) for c in conds}
            pair = None
            for c in conds:
                t0 = time.perf_counter()
                if evs[c] is None:
                    pair = pair or panelpairs.load(lm, doc11, s)
                    method = c[len("merge:"):] if c.startswith("merge:") else None
                    if method:
                        pair.states.defer(c, _merger(pair, method, seed, seconds, f"{name}/{s}/{method}"))
                    evs[c] = panelpairs.evaluate(lm, pair, doc11, c, key_extra=extra[c])
                    if method:
                        del pair.states[c]
                named = panelpairs.condition(c, s, doc11)
                outcomes.setdefault(name, {})[named] = pack(evs[c]["outcomes"])
                rows.append({**condition_row(name, named, evs[c]), "seed": s})
                if log:
                    log(f"{name} seed {s} {c}: {time.perf_counter() - t0:.0f} s")
            del pair
        del lm
    return {"rows": rows, "outcomes": outcomes, "seconds": seconds, "same_as_vl": same}


def _merger(pair: Any, method: str, seed: int, seconds: dict, label: str) -> Callable[[], dict]:
    """A maker of the merged state (read by the evaluation only when it is not cached), timed into `seconds`."""
    def make() -> dict:
        import time

        from sinklib.controls.merge import merge

        t0 = time.perf_counter()
        out = merge(pair.states["base"], pair.states["vl"], method, seed=seed)
        seconds[label] = time.perf_counter() - t0
        return out
    return make


def _key_extra(cond: str, seed: int) -> dict | None:
    """What joins a merge's evaluation key: its method's settings and the mask seed (base and VL: nothing)."""
    from sinklib.controls.merge import evaluation_extra

    if not cond.startswith("merge:"):
        return None
    return {**evaluation_extra(cond[len("merge:"):]), "merge_seed": seed}


def same_as_vl(method: str, model: Any, params: Mapping[str, Any]) -> str:
    """Why `method` leaves a LoRA pair's VL weights as they are ('' when it changes them): TSV keeps the top
    ceil(rank_fraction x min(m, n)) singular directions of each changed matrix, and a rank-r LoRA change has at
    most r, so where every adapted matrix keeps r or more the merge is the VL model up to rounding."""
    import math

    import torch

    from sinklib.controls.merge import METHODS

    if method != "tsv" or params.get("lm_method") != "lora":
        return ""
    rank, frac = int(params["lora_rank"]), float(METHODS["tsv"].defaults["rank_fraction"])
    targets = set(params["lora_targets"])
    kept = [max(1, math.ceil(frac * min(mod.weight.shape) - 1e-9)) for n, mod in model.named_modules()
            if isinstance(mod, torch.nn.Linear) and n.rsplit(".", 1)[-1] in targets]
    if not kept or min(kept) < rank:
        return ""
    return (f"TSV keeps at least {min(kept)} singular directions of each matrix LoRA changed, whose change has rank "
            f"{rank} at most, so this merge is the VL model up to rounding (nothing to test)")


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
