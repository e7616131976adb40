"""Training seeds: chapter 4's VL, text-only and random conditions retrained with other seeds and evaluated on
the same items as the first seed, so that every change from base has a spread across training runs beside its
item-level interval.

A seed changes everything a training run draws: the stage-1 and stage-2 batches, the frozen random vision
encoder, the projector's initial weights and the random control's direction; the evaluation items (text suites
and held-out VQA) stay those of the chapter's `seed`. The base model does not depend on the training seed, so every seed's changes are
paired against the one base evaluation. Seed s's conditions are stored in the chapter's evaluations under
`seed_name(condition, s)` ('vl seed 1'); the first seed's keep their plain names.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pandas as pd

from sinklib.core.numbers import signed
from sinklib.errors import ParameterError
from sinklib.core.params import check_int

#: the conditions every training seed repeats (the format-preserving control and the dose series do not)
CONDITIONS = ("vl", "text_only", "random")
_SEP = " seed "


def seed_name(condition: str, seed: int) -> str:
    """The condition name of one training seed's condition: '<condition> seed <s>'."""
    if condition not in CONDITIONS:
        raise ParameterError(f"parameter 'condition' got {condition!r}; allowed: {', '.join(map(repr, CONDITIONS))}")
    return f"{condition}{_SEP}{check_int('seed', seed, 0)}"


def parse_name(name: str) -> tuple[str, int | None]:
    """'vl seed 2' -> ('vl', 2); a name without a seed -> (name, None)."""
    cond, sep, s = name.partition(_SEP)
    return (cond, int(s)) if sep and s.isdigit() and cond in CONDITIONS else (name, None)


def label(name: str) -> str:
    """A short figure label of a condition name: 'VL s1' for 'vl seed 1', `pairs.CONDITION_LABELS` otherwise."""
    from sinklib.adapt.pairs import CONDITION_LABELS

    cond, s = parse_name(name)
    return f"{CONDITION_LABELS[cond]} s{s}" if s is not None else CONDITION_LABELS.get(name, name)


def check_seeds(extra_seeds: Sequence[int], seed: int) -> list[int]:
    """The extra training seeds, distinct and different from the chapter's `seed`; a clear error otherwise."""
    out = [check_int(f"extra_seeds[{i}]", s, 0) for i, s in enumerate(extra_seeds)]
    if seed in out:
        raise ParameterError(f"parameter 'extra_seeds' holds the chapter's own seed {seed}; list only the other "
                             f"training seeds, e.g. {[s for s in range(seed + 1, seed + 3)]}")
    if len(set(out)) != len(out):
        raise ParameterError(f"parameter 'extra_seeds' repeats a seed: {out}; list each seed once")
    return out


def run(lm_by: Mapping[str, Any], built: Mapping[str, Any], extra_seeds: Sequence[int], evaluations: dict, *,
        vqa_n: int = 0, progress: bool = False, **evaluate_kwargs: Any) -> dict[str, dict[int, dict]]:
    """Chapter 4's seeds for every model of `lm_by`: build (train, or load from the cache) the pair of each
    training seed in `extra_seeds` with the first pair's recipe, evaluate its VL, text-only and random conditions
    on the same items (`evaluate_kwargs['seed']`, the chapter's seed) into `evaluations` under `seed_name`, VQA for
    VL. One extra pair is held in memory at a time. Returns {model: {seed: {'trained now': {condition: bool},
    'runtime': `pairs.runtime_rows` of its training, conditions named '<condition> seed <s>'}}}. `evaluate_kwargs` go to `pairs.evaluate_condition`, with
    `last_k_layers` and `max_tokens` in place of `sink_kwargs` (`pairs.per_model_kwargs`)."""
    from sinklib.adapt.pairs import build_pair, evaluate_condition, per_model_kwargs, runtime_rows

    info: dict[str, dict[int, dict]] = {}
    for name, lm in lm_by.items():
        first = built[name].params
        for s in check_seeds(extra_seeds, first["seed"]):
            pair = build_pair(lm, {**first, "seed": s}, progress=progress)  # no along-training measurements
            kw = per_model_kwargs(lm, evaluate_kwargs)
            for cond in CONDITIONS:
                evaluations[(name, seed_name(cond, s))] = evaluate_condition(
                    lm, pair, cond, vqa_n=vqa_n if cond == "vl" else 0, **kw)
            info.setdefault(name, {})[s] = {"trained now": dict(pair.trained_now),
                                            "runtime": runtime_rows(name, pair.logs, suffix=f"{_SEP}{s}")}
            del pair
    return info


def by_seed(evaluations: Mapping[tuple[str, str], dict], seed: int) -> dict[int, dict[tuple[str, str], dict]]:
    """The chapter's evaluations regrouped per training seed: {s: {(model, 'base'): ..., (model, condition): ...}}
    with plain condition names, for the models that have at least one extra seed; `seed` is the chapter's own
    (its conditions carry plain names). Every seed shares the model's one base evaluation."""
    extra: dict[str, set[int]] = {}
    for (m, c) in evaluations:
        cond, s = parse_name(c)
        if s is not None:
            extra.setdefault(m, set()).add(s)
    out: dict[int, dict] = {}
    for m, seeds in extra.items():
        if (m, "base") not in evaluations:
            raise ParameterError(f"seed evaluations of {m} have no base evaluation beside them")
        for s in [seed, *sorted(seeds)]:
            ev = out.setdefault(s, {})
            ev[(m, "base")] = evaluations[(m, "base")]
            for cond in CONDITIONS:
                name = cond if s == seed else seed_name(cond, s)
                if (m, name) in evaluations:
                    ev[(m, cond)] = evaluations[(m, name)]
    return out


def summary(evaluations: Mapping[tuple[str, str], dict], seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-seed paired table with a 'training seed' column, `pairs.seed_summary` over the seeds) for the models
    with extra seeds; both empty when there are none. Paired intervals use the chapter's `seed` for the
    bootstrap, as chapter 4's own table does."""
    from sinklib.adapt.pairs import paired_table, seed_summary

    groups = by_seed(evaluations, seed)
    if not groups:
        return pd.DataFrame(), pd.DataFrame()
    tables = {s: paired_table(ev, CONDITIONS, seed=seed) for s, ev in groups.items()}
    per_seed = pd.concat([t.assign(**{"training seed": s}) for s, t in tables.items()], ignore_index=True)
    return per_seed, seed_summary(tables)


def summary_cell(row: Mapping[str, Any]) -> str:
    """'mean (min to max), k/n below zero' for one row of `pairs.seed_summary`; '!' marks a seed spread wider
    than the absolute mean change."""
    below, above, n = int(row["seeds below zero"]), int(row["seeds above zero"]), int(row["seeds"])
    sig = f"{below}/{n} below" if below or not above else f"{above}/{n} above"
    mark = " !" if row["seed spread exceeds effect"] else ""
    return f"{signed(row['mean change'])} ({signed(row['min'])} to {signed(row['max'])}), {sig}{mark}"


def display(summ: pd.DataFrame):
    """`summary`'s seed table for display: per model, one row per metric, one column per condition holding
    `summary_cell`."""
    from sinklib.adapt.pairs import CONDITION_LABELS, SCORE_LEGEND, metric_grid
    from sinklib.plots import tables

    t = summ.assign(condition=[CONDITION_LABELS.get(c, c) for c in summ.condition])
    wide = metric_grid(t, [summary_cell(r) for _, r in summ.iterrows()], "condition",
                       [CONDITION_LABELS[c] for c in CONDITIONS])
    n = int(summ.seeds.max())
    return tables(wide, f"change from the base model over {n} training seeds, points (ppl: perplexity units): the "
                        "mean change (smallest to largest seed), and how many seeds' paired 95 % intervals lie "
                        "below zero (or above it, where none lies below); ! marks a seed spread (largest minus "
                        "smallest) wider than the absolute mean change: training noise as large as the effect. "
                        + SCORE_LEGEND)


def verdict_note(summ: pd.DataFrame, model: str, condition: str, metric: str = "strict-format mean",
                 fmt: Callable[[float], str] = signed) -> str:
    """For a verdict table (and the claims page): the change of `condition` over the training seeds on `metric`
    and whether the seed spread exceeds it ('one training seed' where the model has no extra seeds); `fmt`
    writes each number (the claims page passes its own, with the true minus sign)."""
    sub = summ[(summ.model == model) & (summ.condition == condition) & (summ.metric == metric)] if len(summ) else summ
    if not len(sub):
        return "one training seed"
    r = sub.iloc[0]
    return (f"{int(r.seeds)} seeds: {fmt(r['mean change'])} ({fmt(r['min'])} to {fmt(r['max'])}), "
            f"{int(r['seeds below zero'])} of {int(r.seeds)} below zero outside the noise, {_spread(r)}")


def _spread(r: Mapping[str, Any]) -> str:
    if r["min"] == 0 and r["max"] == 0:
        return "no seed changed it"
    return f"the seed spread {'exceeds' if r['seed spread exceeds effect'] else 'is smaller than'} the effect"


def sentence(summ: pd.DataFrame, metric: str = "strict-format mean") -> str:
    """One clause per model and condition on `metric`: the mean change over seeds, the seeds' range, how many
    seeds' intervals exclude zero, and whether the seed spread exceeds the effect."""
    from sinklib.adapt.pairs import CONDITION_LABELS

    sub = summ[summ.metric == metric]
    if sub.empty:
        raise ParameterError(f"the seed summary has no rows for metric {metric!r}")
    parts = []
    for m, g in sub.groupby("model", sort=False):
        cl = []
        for _, r in g.iterrows():
            n, below, above = int(r.seeds), int(r["seeds below zero"]), int(r["seeds above zero"])
            outside = f"{below} of {n} below zero" + (f", {above} above" if above else "")
            spread = _spread(r)
            cl.append(f"{CONDITION_LABELS.get(r.condition, r.condition)} {signed(r['mean change'])} "
                      f"(seeds {signed(r['min'])} to {signed(r['max'])}; {outside}; {spread})")
        parts.append(f"{m} ({int(g.seeds.max())} training seeds): " + ", ".join(cl))
    return "; ".join(parts)


def vqa_rows(evaluations: Mapping[tuple[str, str], dict], seed: int, image_size: int) -> pd.DataFrame:
    """Held-out VQA of every training seed's VL model against the blind majority baseline
    (`vl.against_majority`), with the VL model's S beside the base model's: one row per model and training
    seed."""
    from sinklib.vl import against_majority

    rows = []
    for s, ev in by_seed(evaluations, seed).items():
        for (m, c), e in ev.items():
            if c == "vl" and e.get("vqa"):
                rows.append({"model": m, "training seed": s, **against_majority(*e["vqa"], seed, image_size),
                             "S base": ev[(m, "base")]["S"], "S VL": e["S"]})
    return pd.DataFrame(rows).sort_values(["model", "training seed"], kind="stable").reset_index(drop=True) \
        if rows else pd.DataFrame()
