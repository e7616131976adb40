"""Chapter 4's readings in words: sentences whose direction follows the data (a change outside the noise or not,
over the training seeds pooled or for one seed), so that the prose around them stays true on a rerun.

Every change here is a paired change from the base model on the same items; "pooled" is
`sinklib.evals.pooling.pooled` (items and training seeds resampled), "training seed s" is one run's paired
interval (`pairs.paired_table`)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from sinklib.adapt.display import CONDITION_LABELS as LABELS
from sinklib.adapt.scores import STRICT_METRICS as STRICT   # the strict-format mean's suites ('suite metric')
from sinklib.core.numbers import direction, interval, signed
from sinklib.core.words import QK_NORM_WORDS, qk_norm_words  # noqa: F401  (chapter 4 calls readings.qk_norm_words)
from sinklib.evals.pooling import pooled


def _names(xs: Sequence[str]) -> str:
    xs = list(xs)
    return ", ".join(xs[:-1]) + (" and " if len(xs) > 1 else "") + (xs[-1] if xs else "")


def _word(lo: float, hi: float, up: str = "rose", down: str = "fell") -> str:
    return direction(lo, hi, "stayed within the noise", f"{up} outside the noise", f"{down} outside the noise")


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


# ---------------------------------------------------------------------------------------
# the chapter's plain finding (atop its Summary) and its printed lines in words

#: a strict-format fall (points) from which the plain finding says the text-only control "cost a lot"
LARGE_FALL = 10.0
#: a KL ratio (text-only over VL) beyond which one control moves the model further than the other
KL_RATIO = 1.5
def _by_model(models: Sequence[str], words: Sequence[str], cells: Sequence[str], after: str = "") -> str:
    """'<word><after> (<cell>; <cell>)' where every model has the same word (the models named before, in this
    order), else '<word><after> in <model> (<cell>) and <word><after> in <model> (<cell>)'."""
    if len(set(words)) == 1:
        return f"{words[0]}{after} ({'; '.join(cells)})"
    return _names([f"{w}{after} in {m} ({c})" for m, w, c in zip(models, words, cells)])


def _strict_words(e: Any, large: float | None = None) -> str:
    if e.hi < 0:
        return "cost a lot of strict format" if large is not None and e.v <= -large else "cost strict format"
    return "raised the strict format" if e.lo > 0 else "cost no detectable strict format"


def vl_s_changes(sink_rows: pd.DataFrame, model: str, condition: str = "vl"):
    """One model's change of S under `condition` per training seed (from `isolate.sink_text_rows`) and their t
    interval (None with fewer than two seeds): the one computation behind this page's S sentence and the claims
    row 6c."""
    from sinklib.stats.verdicts import t_interval

    xs = [float(x) for x in sink_rows.loc[(sink_rows.model == model) & (sink_rows.condition.str.split(" seed ").str[0]
                                                                     == condition), "S change"]]
    return xs, t_interval(xs)


def _s_clause(sink_rows: pd.DataFrame, models: Sequence[str]) -> str:
    """S under VL over the training seeds (t interval; one seed: its point value), against the paper's fall."""
    words, cells = [], []
    for m in models:
        xs, e = vl_s_changes(sink_rows, m)
        if e is None:
            words.append(("rose" if xs[0] > 0 else "fell") if xs else "was not measured")
            cells.append(f"{signed(xs[0], 3)}, one training seed" if xs else "no rows")
        else:
            words.append(direction(e.lo, e.hi))
            cells.append(interval(e.v, e.lo, e.hi, 3))
    paper = (", where the paper's fell" if set(words) == {"rose"} else ", as the paper's did" if set(words) == {"fell"}
             else "; the paper's fell")
    return f"S {_by_model(models, words, cells, ' under VL over the training seeds')}{paper}"


def _kl_clause(kls_by: Mapping[str, Mapping[str, Mapping]], seed: int) -> str:
    """How far text-only moves the next-token distribution against VL, for the models that measured it."""
    ratios = {m: k["text_only"]["kl"] / k["vl"]["kl"] for m, k in kls_by.items()
              if k.get("vl", {}).get("kl", 0) > 0 and "text_only" in k}
    if not ratios:
        return ""
    r = list(ratios.values())
    how = ("also moved the model further than VL did" if min(r) > KL_RATIO else "moved the model less far than VL did"
           if max(r) < 1 / KL_RATIO else "moved the model about as far as VL did" if max(r) <= KL_RATIO and
           min(r) >= 1 / KL_RATIO else "moved the model by a different amount than VL did")
    return (f", and it {how} (its next-token KL from the base model " +
            _names([f"{v:.1f} times VL's in {m}" for m, v in ratios.items()]) + f", training seed {seed})")


def _random_clause(curve: pd.DataFrame | None, vl_strict: pd.DataFrame, kl_sizes: Mapping[str, float | None],
                   seed: int) -> str:
    """What the random control matched to VL on next-token KL did to the strict-format mean, against VL's own
    paired interval (one training seed)."""
    parts = []
    vl_by = {r.model: r for r in vl_strict.itertuples()}
    for m, k in kl_sizes.items():
        at = (curve[(curve.model == m) & (curve.metric == "strict-format mean") & np.isclose(curve.scale, k)]
              if curve is not None and k is not None else None)
        if at is None or at.empty or m not in vl_by:
            continue
        c, v = float(at.change.iloc[0]), vl_by[m]
        word = ("did what VL did" if v.lo <= c <= v.hi else "lost more strict format than VL" if c < v.lo
                else "lost less strict format than VL")
        where = "inside" if v.lo <= c <= v.hi else "outside"
        parts.append(f"{word} in {m} ({k:g}x VL's norm: {signed(c)} points, {where} VL's "
                     f"{interval(v.change, v.lo, v.hi)}, training seed {seed})")
    return ("The random control matched to VL on that KL " + _names(parts) + ".") if parts else ""


def _power_clause(power_rows: pd.DataFrame, vl_lost: bool, column: str = "paired, flip 0.05") -> str:
    """The smallest fall the instruction suite detects with 80 % power, and what that means for a null result."""
    rows = power_rows[power_rows.suite.astype(str).str.endswith("instructions strict")]
    vals = sorted({round(float(v), 1) for v in rows[column] if v == v})
    if rows.empty:
        return ""
    items = _names([str(int(n)) for n in dict.fromkeys(rows["items"])])
    sees = ("cannot see a fall of any size" if not vals else f"can see only falls of {vals[0]:.1f} points or more"
            if len(vals) == 1 else f"can see only falls of {vals[0]:.1f} to {vals[-1]:.1f} points or more")
    tail = ("so smaller losses would go unseen" if vl_lost else
            'so "no detectable loss" is not "no loss"')
    return f"The {items}-item instruction suite {sees} (80 % power), {tail}."


def plain_finding(doc: Mapping, models: Sequence[str], *, sink_rows: pd.DataFrame, power_rows: pd.DataFrame,
                  kls: Mapping[str, Mapping[str, Mapping]] | None = None, curve: pd.DataFrame | None = None,
                  vl_strict: pd.DataFrame | None = None, kl_sizes: Mapping[str, float | None] | None = None,
                  seed: int = 0) -> str:
    """Chapter 4's finding in four or five plain sentences, every direction from the data: VL's and text-only's
    strict-format change pooled over the training seeds (with text-only's KL against VL's), S under VL over the
    seeds, the KL-matched random control against VL, and what the instruction suite's power leaves open."""
    vl = [_pooled(doc, m, "vl", STRICT) for m in models]
    to = [_pooled(doc, m, "text_only", STRICT) for m in models]
    labels = list(dict.fromkeys(lab for _, lab in vl))
    head = (f"In {_names(models)} (values in that order; points of the strict-format mean, "
            f"{labels[0] if len(labels) == 1 else 'training seeds pooled where a model has them'}, 95 % intervals), ")
    vl_text = _by_model(models, [_strict_words(e) for e, _ in vl], [interval(e.v, e.lo, e.hi) for e, _ in vl])
    to_text = _by_model(models, [_strict_words(e, LARGE_FALL) for e, _ in to], [interval(e.v, e.lo, e.hi) for e, _ in to])
    out = [f"{head}VL adaptation {vl_text}.",
           f"Text-only fine-tuning on the same one-word answers {to_text}{_kl_clause(kls or {}, seed)}.",
           _s_clause(sink_rows, models) + ".",
           _random_clause(curve, vl_strict if vl_strict is not None else pd.DataFrame(columns=["model"]),
                          kl_sizes or {}, seed),
           _power_clause(power_rows, any(e.hi < 0 for e, _ in vl))]
    return " ".join(s for s in out if s)


def training_line(name: str, trained_now: Mapping[str, bool], logs: Mapping[str, Mapping]) -> str:
    """One model's training in words: which conditions were trained now and which loaded from the cache, with
    the seconds of each stage rounded (a cached condition keeps the times of the run that trained it)."""
    def cond(c: str) -> str:
        secs = ", ".join(f"{str(s).replace('stage', 'stage ')} {v:.0f} s" for s, v in logs[c].get("seconds", {}).items())
        return f"{LABELS.get(c, c)} ({secs})" if secs else LABELS.get(c, c)

    now = [cond(c) for c in logs if trained_now.get(c)]
    cached = [cond(c) for c in logs if not trained_now.get(c)]
    parts = (["trained now: " + "; ".join(now)] if now else []) + (
        ["loaded from the cache: " + "; ".join(cached) + " (training times of the run that trained them)"]
        if cached else [])
    return f"{name}: " + ". ".join(parts)


def gap_sentence(gaps: Mapping[str, float], empty: str = "no rerun in this run") -> str:
    """{what: largest absolute weight difference between a retrain and the cached model} in words: 'identical,
    weight for weight, for A and B; largest absolute weight difference 3.2e-05 for C'."""
    same = [k for k, v in gaps.items() if v == 0]
    parts = ([f"identical, weight for weight, for {_names(same)}"] if same else []) + [
        f"largest absolute weight difference {v:.1e} for {k}" for k, v in gaps.items() if v != 0]
    return "; ".join(parts) or empty


def rates_sentence(pair_params: Mapping[str, Mapping[str, Any]]) -> str:
    """The stage-2 learning rates of each model's pair ({model: pair parameters with 'lr_lm' and
    'lr_projector_stage2'}): '5e-05 for A and 1e-05 for B (the language model and the projector alike)'."""
    alike = all(float(p["lr_projector_stage2"]) == float(p["lr_lm"]) for p in pair_params.values())
    rates = {m: f"{float(p['lr_lm']):g}" + ("" if alike else f" (projector {float(p['lr_projector_stage2']):g})")
             for m, p in pair_params.items()}
    text = (f"{next(iter(rates.values()))} for {'every model' if len(rates) > 1 else next(iter(rates))}"
            if len(set(rates.values())) == 1 else _names([f"{r} for {m}" for m, r in rates.items()]))
    return text + (" (the language model and the projector alike)" if alike else "")


def sizes_who(random_names: Sequence[str], models: Sequence[str]) -> str:
    """Which models ran the random control at sizes other than 1x, in words."""
    rest = [m for m in models if m not in random_names]
    if not random_names:
        return "no model ran the random sizes in this run (every model has the 1x random control only)"
    if not rest:
        return f"{_names(random_names)} ran them"
    return (f"{_names(random_names)} alone ran them ({_names(rest)} {'has' if len(rest) == 1 else 'have'} the 1x "
            "random control only, in the tables above)")
