"""Chapter 4's readings in words: sentences whose direction follows the data (a change outside the noise or not,
over the training seeds pooled or for one seed), so that the prose around them stays true on a rerun.

Every change here is a paired change from the base model on the same items; "pooled" is
`sinklib.evals.pooling.pooled` (items and training seeds resampled), "training seed s" is one run's paired
interval (`pairs.paired_table`)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from sinklib.adapt.display import CONDITION_LABELS as LABELS
from sinklib.adapt.scores import STRICT_METRICS as STRICT   # the strict-format mean's suites ('suite metric')
from sinklib.core.numbers import interval
from sinklib.evals.pooling import pooled


def _names(xs: Sequence[str]) -> str:
    xs = list(xs)
    return ", ".join(xs[:-1]) + (" and " if len(xs) > 1 else "") + (xs[-1] if xs else "")


def _word(lo: float, hi: float, up: str = "rose", down: str = "fell") -> str:
    return f"{down} outside the noise" if hi < 0 else f"{up} outside the noise" if lo > 0 else "stayed within the noise"


def seeds_label(models: Sequence[str], seed_names: Sequence[str], extra_seeds: Sequence[int], seed: int) -> str:
    """'3 training seeds pooled', or per model where only some models have the extra seeds."""
    n = 1 + len(extra_seeds)
    with_seeds = [m for m in models if m in seed_names] if extra_seeds else []
    if len(with_seeds) == len(models) and models:
        return f"{n} training seeds pooled"
    if not with_seeds:
        return f"training seed {seed} alone"
    return (f"{n} training seeds pooled for {_names(with_seeds)}; training seed {seed} alone for "
            f"{_names([m for m in models if m not in with_seeds])}")


def _pooled(doc: Mapping, m: str, cond: str, metrics: Sequence[str]) -> tuple[Any, str]:
    e, k = pooled(doc, m, cond, "base", metrics)
    return e, f"{k} training seeds pooled" if k > 1 else "one training seed"


def format_outside(doc: Mapping, means: pd.DataFrame) -> dict[tuple[str, str], bool]:
    """{(model, condition): whether its strict-format change from base lies outside the noise}, pooled over the
    training seeds where the condition has them, for every row of `isolate.condition_means`."""
    out = {}
    for m, c in zip(means.model, means.condition):
        e, _ = pooled(doc, m, c, "base", STRICT)
        out[(m, c)] = bool(e.hi < 0 or e.lo > 0)
    return out


def change_sentence(doc: Mapping, seed_rows: pd.DataFrame, models: Sequence[str], cond: str,
                    metrics: Sequence[str] = ("math strict", "math lenient", "knowledge acc")) -> str:
    """Per model, each metric's change under `cond` pooled over the training seeds, its direction, and how many
    seeds' own paired intervals lie above or below zero (`seeds.summary`'s per-seed rows)."""
    parts = []
    for m in models:
        cells = []
        for metric in metrics:
            e, label = _pooled(doc, m, cond, (metric,))
            sub = seed_rows[(seed_rows.model == m) & (seed_rows.condition == cond) & (seed_rows.metric == metric)] \
                if len(seed_rows) else seed_rows
            count = (f"; seeds outside their own noise: {int((sub.lo > 0).sum())} of {len(sub)} above zero, "
                     f"{int((sub.hi < 0).sum())} below" if len(sub) > 1 else "")
            cells.append(f"{metric.replace(' acc', '')} {_word(e.lo, e.hi)} ({interval(e.v, e.lo, e.hi)}, "
                         f"{label}{count})")
        parts.append(f"{m}: " + "; ".join(cells))
    return ". ".join(parts)


def loss_source(doc: Mapping, models: Sequence[str]) -> str:
    """Whether VL lost strict format outside the noise (pooled) and, if not, whether the text-only control did:
    the loss, if any, that the controls can locate."""
    vl = {m: _pooled(doc, m, "vl", STRICT) for m in models}
    to = {m: _pooled(doc, m, "text_only", STRICT) for m in models}
    cell = lambda e, label: f"{interval(e.v, e.lo, e.hi)}, {label}"  # noqa: E731
    lost = [m for m, (e, _) in vl.items() if e.hi < 0]
    head = (f"VL lost strict format outside the noise in {_names(lost)}" if lost else
            "VL lost no strict format outside the noise in any model, so this run has no VL loss to locate")
    head += " (strict-format mean: " + "; ".join(f"{m} {cell(*vl[m])}" for m in models) + ")"
    t_lost = [m for m, (e, _) in to.items() if e.hi < 0]
    tail = (f"the loss it does show is the text-only control's, in {_names(t_lost)} (" +
            "; ".join(f"{m} {cell(*to[m])}" for m in t_lost) + ")") if t_lost else \
        "the text-only control lost no strict format outside the noise either"
    return f"{head}; {tail}"


def text_only_reading(doc: Mapping, models: Sequence[str]) -> str:
    """What the text-only control takes, per model: strict math alone (the format), or lenient math too, outside
    the noise (format and some arithmetic), pooled over the training seeds."""
    parts = []
    for m in models:
        (s, label), (le, _) = _pooled(doc, m, "text_only", ("math strict",)), _pooled(doc, m, "text_only", ("math lenient",))
        what = ("format and some arithmetic" if s.hi < 0 and le.hi < 0 else "the format, not the arithmetic"
                if s.hi < 0 else "arithmetic rather than the format" if le.hi < 0 else "neither outside the noise")
        parts.append(f"{m} ({label}): strict math {_word(s.lo, s.hi)} ({interval(s.v, s.lo, s.hi)}), lenient math "
                     f"{_word(le.lo, le.hi)} ({interval(le.v, le.lo, le.hi)}): it takes {what}")
    return "; ".join(parts)


def kl_ratio_sentence(kls_by: Mapping[str, Mapping[str, Mapping]], seed: int = 0) -> str:
    """How far the text-only control moves the next-token distribution against VL (KL from the base model,
    training seed `seed`), and what that means for the vision step (text-only -> VL) of the decomposition."""
    parts = []
    for m, kls in kls_by.items():
        if kls.get("vl", {}).get("kl", 0) <= 0 or "text_only" not in kls:
            continue
        t, v = kls["text_only"]["kl"], kls["vl"]["kl"]
        r = t / v
        what = ("so the vision step (text-only -> VL) also measures VL changing the model less, not vision alone"
                if r > 1.5 else "so the vision step also measures VL changing the model more, not vision alone"
                if r < 1 / 1.5 else "so the two change the model by about as much")
        parts.append(f"{m}: text-only moves the next-token distribution {r:.1f} times as far as VL ({t:.3f} "
                     f"against {v:.3f} nats per position, training seed {seed}), {what}")
    return "; ".join(parts) or "not measured in this run"


def runtime_note(rows: Sequence[Mapping[str, Any]], factor: float = 2.0) -> str:
    """The training stages that took more than `factor` times as long as the same model, condition and stage on
    another training seed: per step (median), or in all among the extra seeds (trained without the along-training
    measurements, so their totals compare). The recipe is the same, so the machine was busy with other work."""
    t = pd.DataFrame(list(rows))
    if t.empty or "median s/step" not in t:
        return "no training times in this run"
    t["kind"] = t.condition.astype(str).str.split(" seed ").str[0]
    t["seed"] = [c.split(" seed ")[1] if " seed " in c else "0" for c in t.condition.astype(str)]
    keys = ["model", "kind", "stage"]
    step_min = t.groupby(keys)["median s/step"].transform("min")
    extra = t[t.seed != "0"]
    total_min = extra.groupby(keys)["seconds"].transform("min").reindex(t.index)
    cells = []
    for i, r in t.iterrows():
        where = f"{r.model} {LABELS.get(r.kind, r.kind)} {str(r.stage).replace('stage', 'stage ')}, training seed {r.seed}"
        if r["median s/step"] > factor * step_min[i]:
            cells.append(f"{where}: {r['median s/step']:.1f} s per step against {step_min[i]:.1f} on another seed")
        elif total_min[i] == total_min[i] and r.seconds > factor * total_min[i]:
            cells.append(f"{where}: {r.seconds:.0f} s in all against {total_min[i]:.0f} on another seed")
    if not cells:
        return f"every stage took less than {factor:g} times as long as on the other training seeds"
    return ("; ".join(cells) + f". The recipe is the same, so the likeliest cause is a machine busy with other work "
            "during these stages, and their times overstate the recipe's cost")
