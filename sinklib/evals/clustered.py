"""Intervals that resample instruction types instead of items: a check of the item-level paired bootstrap of
`sinklib.evals.paired`, which treats every item of a suite as an independent draw.

The 360-prompt instruction suite (`sinklib.evals.powered`) is built from 30 instruction types (one constraint,
or a pair of constraints, each graded by lm-eval's checker of that constraint), 9 to 17 items each. When a model
changes, the items of one type tend to change together (a model that stops ending with a fixed phrase loses most
items that ask for one), so the paired differences are not independent, and an interval that resamples the
items one by one is too narrow for the question "does the model follow instructions of these kinds less well?".
Here the types are resampled with replacement instead (a cluster bootstrap; base and the other condition share
the draws, so it stays paired) and the pass rate of each draw is its passed items over its items. The point value
is the item-level one; only the interval and the power change. The design effect is the cluster-robust (CR1)
variance of the mean paired difference over its variance for independent items (`design_effect`; per item, the
difference averaged over the training seeds), the factor by which the clustering shrinks the effective number
of items (n / design effect). The types are hand-built, not a random draw of instruction kinds, and the pair
types reuse the single ones' checkers, so even the type-level interval speaks for types like these.

The labels are read from the item file the chapter evaluates in the same run; a cached evaluation's key holds
that file's hash (`items.fingerprint`), so labels and outcomes cannot come from different versions of the file.

    labels = instruction_types(360)                 # one label per item, in the suite's item order
    rows = table(doc, models, labels)               # item-level and type-level intervals side by side
"""
from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sinklib.core.numbers import interval
from sinklib.errors import ParameterError
from sinklib.evals import paired
from sinklib.evals.pooling import outcomes_of, pool_seeds, pooled, seed_pairs
from sinklib.stats.verdicts import Est

#: the metric this check is for: the primary test's
METRIC = "instructions strict"


def instruction_types(n_items: int | None = None, seed: int = 0) -> list[tuple[str, ...]]:
    """The instruction ids of each item that `run_suite(..., 'instructions', n_items, seed=seed)` evaluates, in
    its item order (the same load and sample as the runner): the cluster labels of `change`."""
    from sinklib.evals import items

    return [tuple(r["instruction_id_list"]) for r in items.sample(items.load_instruction_suite(n_items), n_items, seed)]


def composition(labels: Sequence[Any]) -> str:
    """How the items fall into groups, as the text says it: '360 items in 30 instruction types of 9 to 17 items
    (10 of them combine two checkers)'."""
    sizes = np.bincount(groups(labels))
    size = f"{sizes.min()} to {sizes.max()}" if sizes.min() != sizes.max() else f"{sizes.min()}"
    multi = sum(len(t) > 1 for t in dict.fromkeys(labels) if isinstance(t, tuple))
    return (f"{len(labels)} items in {sizes.size} instruction types of {size} items"
            + (f" ({multi} of them combine two or more checkers)" if multi else ""))


def groups(labels: Sequence[Any]) -> np.ndarray:
    """Integer codes 0..K-1 of `labels` (K distinct labels, numbered in the order they first occur)."""
    codes: dict = {}
    return np.asarray([codes.setdefault(lab, len(codes)) for lab in labels], int)


def cluster_index(n_groups: int, *, n_boot: int = paired.N_BOOT, seed: int = 0) -> np.ndarray:
    """[n_boot, n_groups] group indices drawn with replacement; the same for every call with these arguments."""
    if n_groups < 2:
        raise ParameterError(f"a cluster bootstrap needs at least 2 groups; got {n_groups}")
    s = int.from_bytes(hashlib.sha256(f"{seed}:clusters:{n_groups}".encode()).digest()[:8], "little")
    return np.random.default_rng(s).integers(0, n_groups, size=(int(n_boot), int(n_groups)))


def change(base: Mapping[str, Any], other: Mapping[str, Any], labels: Sequence[Any], metric: str = METRIC, *,
           n_boot: int = paired.N_BOOT, seed: int = 0) -> tuple[float, np.ndarray]:
    """The paired change other - base of a pass/fail metric in points, as (point value, [n_boot] draws), the draws
    resampling the groups of `labels` (one label per item) instead of the items; NaN draws when all items
    belong to one group."""
    b, o = paired.unpack(base).get(metric), paired.unpack(other).get(metric)
    if b is None or o is None:
        raise ParameterError(f"no per-item outcomes for {metric!r} in both evaluations")
    if not len(b) == len(o) == len(labels):
        raise ParameterError(f"{metric}: {len(b)} and {len(o)} items in the two evaluations and {len(labels)} "
                             "labels; give one label per item, in the suite's item order (`instruction_types`)")
    g = groups(labels)
    k = int(g.max()) + 1
    d = np.bincount(g, np.asarray(o, float) - np.asarray(b, float), k)
    n = np.bincount(g, minlength=k).astype(float)
    if k < 2:  # one type (a few items of a quick run): no spread between types to resample
        return 100 * float(d.sum() / n.sum()), np.full(int(n_boot), np.nan)
    idx = cluster_index(k, n_boot=n_boot, seed=seed)
    return 100 * float(d.sum() / n.sum()), 100 * d[idx].sum(1) / n[idx].sum(1)


def cell(e: Est) -> str:
    """A change as a table or sentence shows it, 'v [lo, hi]'; 'v [no interval]' when it has none (one type)."""
    return interval(*e) if e.lo == e.lo else f"{interval(e.v, e.v, e.v).split(' ')[0]} [no interval]"


def pooled_change(doc: Mapping[str, Any], model: str, cond: str, ref: str, labels: Sequence[Any],
                  metric: str = METRIC) -> tuple[Est, int] | None:
    """`sinklib.evals.pooling.pooled` with the groups resampled instead of the items: each training seed's change
    paired on the shared groups (the same draws for every seed), the seeds resampled too. None without outcomes."""
    got = [change(r, c, labels, metric) for c, r in seed_pairs(doc, model, cond, ref)]
    if not got:
        return None
    return pool_seeds(np.asarray([g[0] for g in got]), np.asarray([g[1] for g in got])), len(got)


def design_effect(diffs: Sequence[float], labels: Sequence[Any]) -> float:
    """The cluster-robust (CR1) variance of the mean of the per-item paired differences `diffs` (groups of
    `labels`) over its variance for independent items; NaN with fewer than 2 groups or no spread at all."""
    d, g = np.asarray(diffs, float), groups(labels)
    k, n = int(g.max()) + 1, d.size
    if k < 2 or n < 2:
        return float("nan")
    r = d - d.mean()
    v_iid = float((r ** 2).sum()) / (n * (n - 1))
    v_cr = k / (k - 1) * float((np.bincount(g, r, k) ** 2).sum()) / n ** 2
    return v_cr / v_iid if v_iid > 0 else float("nan")


def item_differences(doc: Mapping[str, Any], model: str, cond: str, ref: str, metric: str = METRIC) -> np.ndarray | None:
    """Per item, cond minus ref of a pass/fail metric (0 or +-1), averaged over the training seeds of `cond`."""
    got = [np.asarray(paired.unpack(c)[metric], float) - np.asarray(paired.unpack(r)[metric], float)
           for c, r in seed_pairs(doc, model, cond, ref)]
    return np.mean(got, axis=0) if got else None


def _power(n: int, p: float, deff: float, power: float, flip: float) -> dict:
    """The effective number of items (None without a design effect; a design effect below 1 counts as 1) and the
    smallest fall detectable with `power` at n items and at the effective number (`sinklib.evals.power`)."""
    from sinklib.evals.power import min_detectable_drop

    n_eff = None if deff != deff else int(round(n / max(deff, 1.0)))
    return {"effective items": n_eff,
            "smallest detectable fall, items": min_detectable_drop(n, p, power=power, flip=flip),
            "smallest detectable fall, types": (float("nan") if n_eff is None else
                                                min_detectable_drop(n_eff, p, power=power, flip=flip))}


def points_table(base: Mapping[str, Any], others: Mapping[Any, Mapping[str, Any]], labels: Sequence[Any],
                 metric: str = METRIC, *, power: float = 0.8, flip: float = 0.05):
    """One row per evaluation in `others` ({name: per-item outcomes}, each on the items of `base`): its change
    from `base` with the items resampled (`sinklib.evals.paired`) and with the groups of `labels` resampled, the
    design effect and the detectable falls (`table`). For a chapter that keeps its evaluations rather than
    chapter 4's results layout."""
    import pandas as pd

    b = np.asarray(paired.unpack(base)[metric], float)
    rows = []
    for name, out in others.items():
        item = paired.estimate(*paired.change(base, out, metric))
        typed = paired.estimate(*change(base, out, labels, metric))
        deff = design_effect(np.asarray(paired.unpack(out)[metric], float) - b, labels)
        rows.append({"point": name, "change, items resampled": item, "change, types resampled": typed,
                     "design effect": deff, **_power(len(labels), float(b.mean()), deff, power, flip)})
    return pd.DataFrame(rows)


def table(doc: Mapping[str, Any], models: Sequence[str], labels: Sequence[Any], *, cond: str = "vl",
          ref: str = "base", metric: str = METRIC, power: float = 0.8, flip: float = 0.05):
    """One row per model with outcomes of both conditions: the change cond - ref of `metric` pooled over seeds,
    its interval resampling items and resampling instruction types, the design effect (`design_effect` of the
    per-item differences averaged over the seeds), the effective number of items and the smallest fall detectable
    with `power` (paired McNemar, background flip rate `flip`; `sinklib.evals.power`) at n items and at the
    effective number. `doc` is a chapter's results in chapter 4's layout (`results.outcomes[model][condition]`)."""
    import pandas as pd

    rows = []
    for m in models:
        typed = pooled_change(doc, m, cond, ref, labels, metric)
        if typed is None or outcomes_of(doc, m, ref) is None:
            continue
        diffs = item_differences(doc, m, cond, ref, metric)
        deff = design_effect(diffs, labels)
        p = paired.score(outcomes_of(doc, m, ref), metric) / 100
        rows.append({"model": m, "seeds": typed[1], "items": len(labels), "types": int(groups(labels).max()) + 1,
                     "base pass rate": p,
                     "change, items resampled": pooled(doc, m, cond, ref, [metric])[0],
                     "change, types resampled": typed[0], "design effect": deff,
                     "within-type correlation": intraclass(deff, labels),
                     "within-type correlation, 10-90 %": intraclass_span(diffs, labels),
                     **_power(len(labels), p, deff, power, flip)})
    return pd.DataFrame(rows)


def has_interval(e: Est | None) -> bool:
    """Whether `e` has an interval (a single-type run has none: NaN bounds)."""
    return e is not None and e.lo == e.lo and e.hi == e.hi


def outside(e: Est) -> bool:
    """The interval excludes zero (False for a change without an interval)."""
    return has_interval(e) and (e.hi < 0 or e.lo > 0)


def where(frame, mask):
    """The rows of `frame` where `mask` (one bool per row) holds; an empty frame stays a frame with its columns
    (plain `frame[[...]]` reads an empty list as a selection of no columns)."""
    return frame.loc[np.asarray(list(mask), dtype=bool)]


def _span(values) -> str:
    """'6.5' or '6.5-11.5' over the sizes given; 'none' when there are none (no fall of any size detected, or no
    design effect)."""
    v = [x for x in values if x == x]
    if not v:
        return "none"
    lo, hi = f"{min(v):.1f}", f"{max(v):.1f}"
    return lo if lo == hi else f"{lo}-{hi}"


def _num(v: float) -> str:
    return "-" if v != v else f"{v:.1f}"


def sentence(rows, names: Mapping[str, str] | None = None) -> str:
    """`table`'s rows in words: each change by item and by type, how many lie outside each noise (changes
    without a type-level interval counted apart), and the detectable falls."""
    if not len(rows):
        return "no model has outcomes of both conditions"
    names = names or {}
    r0 = rows.iloc[0]
    per = "; ".join(f"{names.get(r.model, r.model)} {cell(r['change, items resampled'])} by item, "
                    f"{cell(r['change, types resampled'])} by type (design effect {_num(r['design effect'])})"
                    for _, r in rows.iterrows())
    by_item = where(rows, [outside(e) for e in rows["change, items resampled"]])
    typed = where(by_item, [has_interval(e) for e in by_item["change, types resampled"]])
    kept = [names.get(m, m) for m, e in zip(typed.model, typed["change, types resampled"]) if outside(e)]
    untyped = len(by_item) - len(typed)
    fall = (f"the smallest fall the suite detects with 80 % power is {_span(rows['smallest detectable fall, items'])} "
            f"points with the items taken as independent and {_span(rows['smallest detectable fall, types'])} at "
            "the effective numbers of items (the same where the design effect is 1 or below)")
    lost = len(typed) - len(kept)
    meaning = (f". So {lost} of the changes that the item-level intervals put outside the noise "
               f"{'is' if lost == 1 else 'are'} inside it once the types are resampled: "
               f"{'a change' if lost == 1 else 'changes'} on these {r0['types']} instruction types, not yet "
               "evidence for instruction types like these in general" if lost else
               ". Every change outside the item-level noise stays outside it" if len(typed) else "")
    return (f"resampling the {r0['types']} instruction types instead of the {r0['items']} items: {per}. "
            f"{len(by_item)} of {len(rows)} changes lie outside the item-level interval's noise, and "
            f"{len(kept)} of them outside the type-level one{(' (' + ', '.join(kept) + ')') if kept else ''}"
            + (f" ({untyped} without a type-level interval: one type only)" if untyped else "")
            + f"; {fall}{meaning}")


def display(rows, title: str):
    """`table` as a page shows it: one column per model, each change 'v [lo, hi]' in points."""
    import pandas as pd

    from sinklib.plots import Table

    shown = pd.DataFrame({
        "model": rows.model, "training seeds": rows.seeds,
        "change, items resampled": [cell(e) for e in rows["change, items resampled"]],
        "change, instruction types resampled": [cell(e) for e in rows["change, types resampled"]],
        "design effect (CR1)": [_num(d) for d in rows["design effect"]],
        "effective items": ["-" if n is None or n != n else f"{int(n)} of {k}"
                            for n, k in zip(rows["effective items"], rows["items"])],
        "smallest detectable fall (80 % power), items": [_num(v) for v in rows["smallest detectable fall, items"]],
        "the same, effective items": [_num(v) for v in rows["smallest detectable fall, types"]]})
    return Table(shown.set_index("model").T, title)


def intraclass(deff: float, labels: Sequence[Any]) -> float:
    """The within-type correlation of the paired differences implied by a design effect on groups of `labels`:
    (deff - 1) / (m - 1), m the size-weighted mean group size (sum of m_g squared over n, Kish's formula for
    unequal groups); 0 where the design effect is at or below 1, NaN without one or with groups of one item."""
    sizes = np.bincount(groups(labels)).astype(float)
    m = float((sizes ** 2).sum() / sizes.sum())
    if deff != deff or m <= 1:
        return float("nan")
    return max(float(deff) - 1.0, 0.0) / (m - 1.0)


@functools.lru_cache(maxsize=256)  # a pure function of its arguments; plan_sentence asks it per model and bound
def items_needed(target: float, p: float | None = None, *, power: float = 0.8, flip: float = 0.05,
                 most: int = 4096) -> int | None:
    """The fewest independent items whose exact paired McNemar test (`sinklib.evals.power.mcnemar_power`, background
    flip rate `flip`) detects a fall of exactly `target` points with `power`: doubling from 8 items, then a
    bisection (the exact test's power is nearly, not strictly, monotone in n, so 'about'); None if even `most`
    items do not. The base pass rate `p`, where given, only bounds the fall (a fall above it is impossible)."""
    from sinklib.evals.power import mcnemar_power

    if p is not None and target / 100 > p:
        return None
    fits = lambda n: mcnemar_power(n, target / 100, flip) >= power  # noqa: E731
    lo, hi = 0, 8
    while not fits(hi):
        if hi >= most:
            return None
        lo, hi = hi, min(2 * hi, most)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    return hi


def intraclass_span(diffs: Sequence[float], labels: Sequence[Any], q: tuple[float, float] = (0.1, 0.9), *,
                    n_boot: int = 1000, seed: int = 0) -> tuple[float, float]:
    """Quantiles `q` of `intraclass` over the types resampled with replacement (`cluster_index`; a type drawn twice
    counts as two types): how firmly one suite measures the within-type correlation. NaN without 2 types."""
    d, g = np.asarray(diffs, float), groups(labels)
    k = int(g.max()) + 1 if g.size else 0
    if k < 2:
        return float("nan"), float("nan")
    members = [np.flatnonzero(g == j) for j in range(k)]
    rhos = []
    for draw in cluster_index(k, n_boot=n_boot, seed=seed):
        idx = [members[j] for j in draw]
        lab = np.repeat(np.arange(k), [len(i) for i in idx])
        rhos.append(intraclass(design_effect(d[np.concatenate(idx)], lab), lab))
    rhos = np.asarray(rhos)
    if np.isnan(rhos).all():
        return float("nan"), float("nan")
    lo, hi = np.nanquantile(rhos, q)
    return float(lo), float(hi)


def types_needed(target: float, p: float | None, rho: float, per_type: int, *, power: float = 0.8, flip: float = 0.05,
                 most: int = 1000) -> int | None:
    """The fewest instruction types of `per_type` items each whose suite detects a fall of `target` points with
    `power` at base pass rate `p`, when the items of a type correlate by `rho` (`intraclass`): the effective number
    of items, k m / (1 + (m - 1) rho), must reach `items_needed`. None if even `most` types do not; a planning
    figure for a next suite, which assumes new types cluster as the measured ones do."""
    if rho != rho or per_type < 1:
        raise ParameterError(f"types_needed needs a within-type correlation and per_type >= 1 (got {rho}, {per_type})")
    n = items_needed(target, p, power=power, flip=flip)
    k = None if n is None else int(np.ceil(n * (1.0 + (per_type - 1) * max(rho, 0.0)) / per_type - 1e-9))
    return k if k is not None and k <= most else None


def items_per_type(n_eff: int, k: int, rho: float) -> int | None:
    """The fewest items per type that give `k` types `n_eff` effective items at within-type correlation `rho`
    (k m / (1 + (m - 1) rho) >= n_eff); None where no number does (n_eff at or above k / rho)."""
    rho = max(rho, 0.0)
    if k - n_eff * rho <= 0:
        return None
    return max(1, int(np.ceil(n_eff * (1.0 - rho) / (k - n_eff * rho) - 1e-9)))


def _types_span(target: float, m: int, span) -> str:
    lo, hi = span if span is not None else (float("nan"), float("nan"))
    if lo != lo or hi != hi:
        return ""
    a, b = (types_needed(target, None, r, m) for r in (lo, hi))
    return f"; {a or 'over 1000'}-{b or 'over 1000'} over its 10-90 % bootstrap range {lo:.2f}-{hi:.2f}"


def plan_sentence(rows, labels: Sequence[Any], target: float, names: Mapping[str, str] | None = None) -> str:
    """What a suite would need to detect a fall of `target` points at `table`'s within-type correlations: per model,
    the number of types of this suite's mean size (`types_needed`, with the range over the correlation's type
    bootstrap), and whether more items in the suite's own types could do instead (`items_per_type`)."""
    names = names or {}
    k = int(groups(labels).max()) + 1
    m = int(round(len(labels) / k))
    n_need = items_needed(target)
    if n_need is None:
        return f"no suite of up to 4096 independent items detects a fall of {target:g} points with 80 % power"
    need, stuck, more = [], [], []
    for _, r in rows.iterrows():
        rho, name = r["within-type correlation"], names.get(r.model, r.model)
        if rho != rho:
            continue
        t = types_needed(target, None, rho, m)
        need.append(f"{name} {t or 'over 1000'} (within-type correlation {rho:.2f}"
                    + _types_span(target, m, r.get("within-type correlation, 10-90 %")) + ")")
        per = items_per_type(n_need, k, rho)
        (more.append(f"about {per} for {name}") if per else stuck.append(f"{name} ({k / rho:.0f})"))
    if not need:
        return "no model has a design effect to plan from"
    text = (f"to detect a fall of {target:g} points with 80 % power (exact paired McNemar test, background flip rate "
            f"0.05), about {n_need} independent items would do; at the within-type correlations measured here, a "
            f"suite of instruction types of {m} items would need about: " + "; ".join(need) + f", against the {k} "
            "types here")
    if stuck:
        text += (f". With {k} types the effective number of items cannot pass {k} over the correlation, which stays "
                 f"below {n_need} for " + ", ".join(stuck) + ": no number of items within these types would do there")
    if more:
        text += f". Items per type in the {k} types here (now {m} on average) would also do: " + ", ".join(more)
    return text
