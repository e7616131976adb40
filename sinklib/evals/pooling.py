"""Changes between two conditions of a model, from a chapter's results (chapter 4's layout: per-item outcomes under
``results.outcomes[model][condition]``, scores under ``results.scores``): paired on the shared items
(`sinklib.evals.paired`) and pooled over training seeds, with MOVER intervals where no outcomes were stored. The
claims page (`sinklib.claims.core` re-exports them) and chapter 11's pair rows (`sinklib.adapt.panelrows`) read
them."""
from __future__ import annotations

from sinklib.stats.verdicts import Est, diff, mean


def score(doc: dict, model: str, cond: str, metric: str) -> Est:
    """The stored score (chapter 4's layout) of `model` under `cond` for a metric 'suite metric', with its stored interval."""
    suite, m = metric.split(" ", 1)
    for r in doc["results"]["scores"]:
        if (r["model"], r["condition"], r["suite"], r["metric"]) == (model, cond, suite, m):
            return Est(r["score"], r["lo"], r["hi"])
    raise KeyError(f"no score for {model} / {cond} / {metric} in the results' scores")


def outcomes_of(doc: dict, model: str, cond: str) -> dict | None:
    """The per-item outcomes a chapter stored for (model, condition), or None when it stored none."""
    return doc["results"].get("outcomes", {}).get(model, {}).get(cond)


def paired_change(a_out: dict | None, b_out: dict | None, metrics) -> tuple[float, object] | None:
    """(point, bootstrap draws) of a - b of the mean of `metrics` on the shared items, from two per-item outcome
    records (`sinklib.evals.paired`); None when either record is missing (the caller falls back to MOVER)."""
    from sinklib.evals import paired

    return None if a_out is None or b_out is None else paired.change(b_out, a_out, list(metrics))


def paired_delta(a_out: dict | None, b_out: dict | None, metrics) -> Est | None:
    """`paired_change` as a point value with its interval, or None."""
    from sinklib.evals import paired

    d = paired_change(a_out, b_out, metrics)
    return None if d is None else paired.estimate(*d)


def _draws(doc: dict, model: str, cond: str, ref: str, metrics) -> tuple[float, object] | None:
    return paired_change(outcomes_of(doc, model, cond), outcomes_of(doc, model, ref), metrics)


def delta(doc: dict, model: str, cond: str, ref: str, metrics) -> Est:
    """cond minus ref of the mean of `metrics` ('suite metric'), in points: a paired bootstrap interval over
    the shared items when the doc holds per-item outcomes of both, else the MOVER interval of the scores."""
    e = paired_delta(outcomes_of(doc, model, cond), outcomes_of(doc, model, ref), metrics)
    if e is not None:
        return e
    return diff(mean(*(score(doc, model, cond, m) for m in metrics)), mean(*(score(doc, model, ref, m) for m in metrics)))


def seed_conditions(doc: dict, model: str, cond: str) -> list[str]:
    """`cond` and its extra training seeds ('vl', 'vl seed 1', ...) that hold per-item outcomes."""
    outs = doc["results"].get("outcomes", {}).get(model, {})
    return [c for c in outs if c == cond or c.startswith(f"{cond} seed ")]


def seed_pairs(doc: dict, model: str, cond: str, ref: str) -> list[tuple[dict, dict]]:
    """(outcomes of cond, outcomes of ref) per training seed of `cond` that holds per-item outcomes: a seed of
    `ref` pairs with the same seed of `cond` ('vl seed 1' with 'text seed 1'); 'base' is one model and pairs with
    every seed. Seeds whose reference has no outcomes are left out; [] when `ref` has none at all. Every pooled
    change (`pooled`, `pooled_gap`, `sinklib.evals.clustered`) pairs its seeds through this."""
    conds = seed_conditions(doc, model, cond)
    refs = [ref if ref == "base" else c.replace(cond, ref, 1) for c in conds]
    return [(outcomes_of(doc, model, c), outcomes_of(doc, model, r)) for c, r in zip(conds, refs)
            if outcomes_of(doc, model, r) is not None]


def _seed_draws(doc: dict, model: str, cond: str, ref: str, metrics):
    """(points [seeds], bootstrap draws [seeds, n_boot]) of cond minus ref per training seed, each paired on its
    items (`seed_pairs`); None without outcomes."""
    import numpy as np

    got = [paired_change(c, r, metrics) for c, r in seed_pairs(doc, model, cond, ref)]
    if not got:
        return None
    return np.asarray([g[0] for g in got]), np.asarray([g[1] for g in got])


def pool_seeds(pts, draws, n_boot_seed: int = 0) -> Est:
    """The mean over seeds of per-seed changes `pts`, its interval from their bootstrap draws ([seeds, n_boot],
    the same resampled items or groups for every seed) with the seeds resampled (with replacement) too."""
    import numpy as np

    from sinklib.evals import paired

    pick = np.random.default_rng(n_boot_seed).integers(0, len(draws), size=(draws.shape[1], len(draws)))
    return paired.estimate(float(np.mean(pts)), draws[pick, np.arange(draws.shape[1])[:, None]].mean(1))


def pooled(doc: dict, model: str, cond: str, ref: str, metrics) -> tuple[Est, int]:
    """(cond minus ref of the mean of `metrics`, pooled over the training seeds, and the number of seeds). Each
    seed's change is paired on the shared items; the pooled point is their mean, and its interval resamples the
    items (the same indices for every seed, `sinklib.evals.paired`) and the seeds (with replacement), so it holds
    the seed spread too. Without per-item outcomes: `delta` (seed 0, MOVER)."""
    sd = _seed_draws(doc, model, cond, ref, metrics)
    return (delta(doc, model, cond, ref, metrics), 1) if sd is None else (pool_seeds(*sd), len(sd[0]))


def pooled_gap(doc: dict, model: str, cond: str, ref: str, metrics_a, metrics_b) -> Est:
    """The change of `metrics_a` minus the change of `metrics_b` (same conditions), pooled over training seeds as
    in `pooled`; `gap` (seed 0) without per-item outcomes."""
    a, b = _seed_draws(doc, model, cond, ref, metrics_a), _seed_draws(doc, model, cond, ref, metrics_b)
    if a is None or b is None:
        return gap(doc, model, (cond, ref, metrics_a), (cond, ref, metrics_b))
    return pool_seeds(a[0] - b[0], a[1] - b[1])


def gap(doc: dict, model: str, a: tuple, b: tuple) -> Est:
    """delta(*a) minus delta(*b) (each (cond, ref, metrics)): paired draws where per-item outcomes exist (the
    two changes' suites resampled as in `sinklib.evals.paired`), MOVER otherwise."""
    from sinklib.evals import paired

    da, db = _draws(doc, model, *a), _draws(doc, model, *b)
    if da is not None and db is not None:
        return paired.estimate(da[0] - db[0], da[1] - db[1])
    return diff(delta(doc, model, *a), delta(doc, model, *b))
