"""Controls that isolate one thing each (chapter 4): the text loss split into steps, and random changes of
several sizes.

The loss of a VL model splits, item by item, into three paired steps between conditions trained on the same
items for the same number of steps (`STEPS`):

    fine-tuning as such      base -> text_sentence  the task's content as text, answers as full sentences
    one-word answer format   text_sentence -> text_only   the same content, answers cut to one word
    vision                   text_only -> vl        the scene as an image instead of words

Every score is a mean over the same items, so the three steps add up to VL minus base exactly (a telescoping
sum; the test checks it). Each step has its own paired interval.

The random control at several sizes: `scaled_name(k)` is the condition holding base + k x (the norm-matched
random change), `evaluate_random_scaled` evaluates them one at a time, `random_curve` reads their paired
changes from the base, and `first_harm` says at which size, if any, a score falls outside the noise.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from sinklib.core.numbers import interval
from sinklib.errors import ParameterError
from sinklib.core.params import check_float

#: the steps of the decomposition: (label, from condition, to condition)
STEPS: tuple[tuple[str, str, str], ...] = (
    ("fine-tuning as such", "base", "text_sentence"),
    ("one-word answer format", "text_sentence", "text_only"),
    ("vision", "text_only", "vl"),
)
TOTAL = "all three (VL - base)"
#: the rows a decomposition or random curve reports, in order
METRICS: tuple[str, ...] = ("strict-format mean", "instructions strict", "math strict", "math lenient",
                            "knowledge acc", "perplexity ppl")


def _pair_rows(evaluations: Mapping[tuple[str, str], dict], model: str, ref: str, other: str, seed: int) -> pd.DataFrame:
    from sinklib.adapt.pairs import paired_table

    sub = {(model, ref): evaluations[(model, ref)], (model, other): evaluations[(model, other)]}
    t = paired_table(sub, conditions=(other,), ref=ref, seed=seed)
    return t[t.metric.isin(METRICS)]


def decomposition(evaluations: Mapping[tuple[str, str], dict], *, seed: int = 0) -> pd.DataFrame:
    """Each model's change from base to VL in the three `STEPS` and in total, paired on the same items.

    evaluations: {(model, condition): `pairs.evaluate_condition(...)`} holding base, text_sentence, text_only
    and vl of every model it is asked about (models without a text_sentence evaluation are skipped). Rows:
    model, step, from, to, metric, change, lo, hi, p (as `pairs.paired_table`)."""
    models = [m for m in dict.fromkeys(m for m, _ in evaluations) if (m, "text_sentence") in evaluations]
    if not models:
        raise ParameterError("decomposition needs a 'text_sentence' evaluation (the format-preserving control): "
                             "build the pair with `pairs.build_pair(..., extra=('text_sentence',))` and evaluate it")
    rows = []
    for m in models:
        missing = [c for c in ("base", "text_sentence", "text_only", "vl") if (m, c) not in evaluations]
        if missing:
            raise ParameterError(f"decomposition of {m} needs evaluations of {missing} as well")
        for label, a, b in STEPS + ((TOTAL, "base", "vl"),):
            t = _pair_rows(evaluations, m, a, b, seed).assign(step=label)
            t["from"], t["to"] = a, b
            rows.append(t)
    out = pd.concat(rows, ignore_index=True)
    return out[["model", "step", "from", "to", "metric", "change", "lo", "hi", "p"]]


def step_sentence(table: pd.DataFrame, metric: str = "strict-format mean") -> str:
    """One clause per model: each step's change of `metric` with its interval, and which steps lie outside the
    noise (interval excluding zero), from a `decomposition` table."""
    parts = []
    for m, g in table[table.metric == metric].groupby("model", sort=False):
        g = g.set_index("step")
        cells = [f"{s} {interval(g.loc[s, 'change'], g.loc[s, 'lo'], g.loc[s, 'hi'])}"
                 for s in [s for s, _, _ in STEPS] + [TOTAL]]
        out = [s for s, _, _ in STEPS if g.loc[s, "hi"] < 0 or g.loc[s, "lo"] > 0]
        parts.append(f"{m}: " + "; ".join(cells) + " (outside the noise: " + (", ".join(out) or "no step") + ")")
    return ". ".join(parts)


def display(table: pd.DataFrame, column: str = "step", order: Sequence[str] | None = None, caption: str = ""):
    """A `decomposition` or `random_curve` table for display: per model, one row per metric and one column per
    step (or size) holding 'change [lo, hi]' and the p-value."""
    from sinklib.adapt.pairs import SCORE_LEGEND, interval_cell, metric_grid
    from sinklib.plots import tables

    cells = [interval_cell(c, lo, hi, p) for c, lo, hi, p in zip(table.change, table.lo, table.hi, table.p)]
    return tables(metric_grid(table, cells, column, order), caption + " " + SCORE_LEGEND)


# ---------------------------------------------------------------------------------------
# the random control at several sizes

def scaled_name(scale: float) -> str:
    """The condition name of the random control at `scale` times the VL change's norm ('random' at 1)."""
    scale = check_float("scale", scale, 0.0, 1000.0)
    if scale <= 0:
        raise ParameterError(f"parameter 'scale' got {scale!r}; a random control needs a size above 0")
    return "random" if scale == 1 else f"random x{scale:g}"


def evaluate_random_scaled(lm: Any, pair: Any, scales: Sequence[float], **evaluate_kwargs: Any) -> dict[float, dict]:
    """The random control at each size in `scales`, evaluated by `pairs.evaluate_condition` (cached under the
    condition name `scaled_name(k)`): {k: evaluation}. Each scaled state, base + k x (random - base), exists only
    while it is evaluated (a model's weights per size would not fit a laptop's memory four times over); k = 1 is
    the pair's own random control."""
    from sinklib.adapt.pairs import evaluate_condition
    from sinklib.vl import scaled_change

    out = {}
    for k in scales:
        name = scaled_name(k)
        made = name not in pair.states
        if made and hasattr(pair.states, "defer"):  # made only if its evaluation is not cached
            pair.states.defer(name, lambda k=k: scaled_change(pair.states["base"], pair.states["random"], float(k)))
        elif made:
            pair.states[name] = scaled_change(pair.states["base"], pair.states["random"], float(k))
        try:
            out[float(k)] = evaluate_condition(lm, pair, name, **evaluate_kwargs)
        finally:
            if made:
                del pair.states[name]
    return out


def random_curve(evaluations: Mapping[tuple[str, str], dict], scales: Sequence[float], *, seed: int = 0,
                 vl_change: Mapping[str, float] | None = None) -> pd.DataFrame:
    """Paired changes from base of the random control at each size: rows model, scale, condition, metric,
    change, lo, hi, p, and 'relative change' (||dW||_F / ||W||_F of the whole model: k x the VL change's, from
    `vl_change` {model: VL's whole-model ratio} where given). Sizes not evaluated for a model are skipped."""
    rows = []
    for m in dict.fromkeys(m for m, _ in evaluations):
        for k in sorted(float(s) for s in scales):
            name = scaled_name(k)
            if (m, name) not in evaluations:
                continue
            t = _pair_rows(evaluations, m, "base", name, seed).assign(scale=k)
            t["relative change"] = k * vl_change[m] if vl_change and m in vl_change else np.nan
            rows.append(t)
    if not rows:
        raise ParameterError(f"random_curve found no evaluation of {[scaled_name(s) for s in scales]}: evaluate "
                             "them first (`add_scaled_random`, then `pairs.evaluate_condition`)")
    out = pd.concat(rows, ignore_index=True)
    return out[["model", "scale", "condition", "relative change", "metric", "change", "lo", "hi", "p"]]


def first_harm(curve: pd.DataFrame, metric: str = "strict-format mean") -> dict[str, float | None]:
    """{model: the smallest size whose paired interval of `metric` lies wholly below zero (None: no size)}; for
    perplexity, 'harm' is a rise (interval wholly above zero)."""
    out: dict[str, float | None] = {}
    for m, g in curve[curve.metric == metric].groupby("model", sort=False):
        g = g.sort_values("scale")
        hurt = g[g.lo > 0] if metric.startswith("perplexity") else g[g.hi < 0]
        out[m] = float(hurt.scale.iloc[0]) if len(hurt) else None
    return out


def harm_sentence(curve: pd.DataFrame, metrics: Sequence[str] = ("strict-format mean", "knowledge acc",
                                                                 "perplexity ppl")) -> str:
    """Per model: the sizes tried and, per metric, the smallest size that hurts outside the noise."""
    parts = []
    for m, g in curve.groupby("model", sort=False):
        sizes = ", ".join(f"{k:g}x" for k in sorted(set(g.scale)))
        found = []
        for metric in metrics:
            k = first_harm(g, metric).get(m)
            label = metric.replace(" acc", "").replace(" ppl", " (a rise)")
            found.append(f"{label}: {'from ' + format(k, 'g') + 'x' if k is not None else 'at no size'}")
        parts.append(f"{m} (sizes {sizes}): " + "; ".join(found))
    return ". ".join(parts)


def strict_lenient_sentence(curve: pd.DataFrame) -> str:
    """Per model of a `random_curve`: where strict and lenient math first fall outside the noise, and what that
    says: falling together (the change takes arithmetic, not only the answer format), strict first (format
    first), lenient first, or neither at any size."""
    parts = []
    for m, g in curve.groupby("model", sort=False):
        s, le = first_harm(g, "math strict").get(m), first_harm(g, "math lenient").get(m)
        if s is None and le is None:
            parts.append(f"{m}: neither strict nor lenient math falls outside the noise at any size")
        elif s is not None and le is not None and np.isclose(s, le):
            parts.append(f"{m}: strict and lenient math first fall outside the noise at the same size ({s:g}x), "
                         "so what the random change takes there is arithmetic, not only the answer format")
        elif le is None or (s is not None and s < le):
            parts.append(f"{m}: strict math falls first ({s:g}x; lenient "
                         f"{'at no size' if le is None else f'from {le:g}x'}), so the answer format goes first")
        else:
            parts.append(f"{m}: lenient math falls first ({le:g}x; strict "
                         f"{'at no size' if s is None else f'from {s:g}x'}), so arithmetic goes before the format")
    return "; ".join(parts)


# ---------------------------------------------------------------------------------------
# does the sink move with the format? (across every adapted condition of a model)

def sink_text_rows(evaluations: Mapping[tuple[str, str], dict], last_k: Mapping[str, int] | int,
                   metrics: Sequence[str] = ("strict-format mean", "knowledge acc")) -> pd.DataFrame:
    """One row per (model, adapted condition): the change from base of the sink mass of the last K layers (mean
    over their heads of the attention mass on the first token), of S, and of each metric (points, from the
    per-item outcomes; 'strict-format mean' as `pairs.STRICT_METRICS`). `last_k`: K, or {model: K}."""
    from sinklib.evals.paired import score
    from sinklib.adapt.pairs import STRICT_METRICS, strict_mean

    def value(out: Mapping[str, Any], metric: str) -> float:
        if metric == "strict-format mean":
            return strict_mean({m: score(out, m) for m in STRICT_METRICS if m in out})
        return score(out, metric)

    rows = []
    for (m, cond), ev in evaluations.items():
        if cond == "base" or (m, "base") not in evaluations:
            continue
        base = evaluations[(m, "base")]
        k = int(last_k[m] if isinstance(last_k, Mapping) else last_k)
        mass = float(np.mean(np.asarray(ev["mass"])[-k:])) - float(np.mean(np.asarray(base["mass"])[-k:]))
        row = {"model": m, "condition": cond, "sink mass change": mass, "S change": ev["S"] - base["S"]}
        row.update({f"{metric} change": value(ev["outcomes"], metric) - value(base["outcomes"], metric)
                    for metric in metrics})
        rows.append(row)
    if not rows:
        raise ParameterError("sink_text_rows found no adapted condition beside a base evaluation")
    return pd.DataFrame(rows)


# up to this many conditions the permutation tests enumerate every ordering; beyond it, seeded random orderings
EXACT_MAX_N = 8


def condition_means(rows: pd.DataFrame) -> pd.DataFrame:
    """`sink_text_rows` with the training-seed replicates of a condition ('vl seed 1', 'vl seed 2' next to 'vl')
    averaged into one row per (model, condition), so that a correlation across conditions counts each condition
    once: replicates are not independent conditions (with 3 seeds x 3 conditions + 1, a rho over 10 points
    overstates n; over the 4 condition means the smallest two-sided p is 2/24)."""
    base = rows["condition"].astype(str).str.split(" seed ").str[0]
    num = [c for c in rows.columns if c not in ("model", "condition") and pd.api.types.is_numeric_dtype(rows[c])]
    out = rows.assign(condition=base).groupby(["model", "condition"], sort=False)[num].mean().reset_index()
    out["replicates"] = rows.assign(condition=base).groupby(["model", "condition"], sort=False).size().to_numpy()
    return out


def sink_text_correlation(rows: pd.DataFrame, metrics: Sequence[str] = ("strict-format mean", "knowledge acc"),
                          x: str = "sink mass change") -> pd.DataFrame:
    """Spearman rho between `x` and each metric's change across the adapted conditions, per model and over all
    models together, with a two-sided permutation p-value (exact up to EXACT_MAX_N conditions, `panel.spearman_permutation`).
    Rows: model ('all models' for the pooled one), metric, n, rho, p."""
    from sinklib.stats.panel import spearman_permutation

    out = []
    groups = [(m, g) for m, g in rows.groupby("model", sort=False)]
    if len(groups) > 1:
        groups.append(("all models", rows))
    for m, g in groups:
        for metric in metrics:
            xs, ys = g[x].to_numpy(float), g[f"{metric} change"].to_numpy(float)
            if len(g) < 3 or np.ptp(xs) == 0 or np.ptp(ys) == 0:
                out.append({"model": m, "metric": metric, "n": len(g), "rho": np.nan, "p": np.nan})
                continue
            r = spearman_permutation(xs, ys, exact_max_n=EXACT_MAX_N)
            out.append({"model": m, "metric": metric, "n": len(g), "rho": r.rho, "p": r.p_value})
    return pd.DataFrame(out)


# the sign of rho (sink mass change vs score change) that "the format goes with the sink" predicts, per metric
PREDICTED_SIGN = {"strict-format mean": +1}


def correlation_sentence(corr: pd.DataFrame, level: float = 0.05) -> str:
    """'model: strict-format mean rho +0.50 (p 0.270, n 8; within chance), knowledge rho ... ' for each row group.
    Each rho is read against `level`: 'within chance', or outside it with its sign, and for a metric with a
    predicted sign (`PREDICTED_SIGN`: less sink mass, less strict format) whether that is the predicted sign."""
    def reading(r) -> str:
        if not r.p <= level:
            return "within chance"
        word, want = ("positive" if r.rho > 0 else "negative"), PREDICTED_SIGN.get(r.metric)
        if want is None:
            return f"{word}, outside chance"
        return f"{word}, {'the' if np.sign(r.rho) == want else 'the opposite of the'} sign the mechanism predicts"

    parts = []
    for m, g in corr.groupby("model", sort=False):
        cells = [f"{r.metric.replace(' acc', '')} rho {r.rho:+.2f} (p {r.p:.3f}, n {r.n}; {reading(r)})" if r.rho == r.rho
                 else f"{r.metric.replace(' acc', '')}: no rho (a side is constant or n < 3)" for r in g.itertuples()]
        parts.append(f"{m}: " + ", ".join(cells))
    return "; ".join(parts)


def _against(g: pd.DataFrame, outside: Mapping[tuple[str, str], bool], labels: Mapping[str, str]) -> list[str]:
    """Conditions of one model whose strict-format change lies outside the noise while the sink mass moved the
    other way (the opposite of the sign the mechanism predicts)."""
    out = []
    for _, r in g.iterrows():
        sink, fmt = r["sink mass change"], r["strict-format mean change"]
        if outside.get((r.model, r.condition)) and sink * fmt < 0:
            out.append(f"{labels.get(r.condition, r.condition)} (sink mass {sink:+.4f}, strict-format mean {fmt:+.1f})")
    return out


def sink_caveat(means: pd.DataFrame, outside: Mapping[tuple[str, str], bool] | None = None, seed: int = 0) -> str:
    """How to read `sink_text_correlation` over `condition_means`, per model: how many of its conditions are the
    random direction at other sizes (a change-size effect moves sink and format together, whatever the mechanism),
    the rho of the strict-format mean over the other conditions, the conditions whose strict-format change is
    outside the noise (`outside`: {(model, condition): bool}) while the sink mass moved the other way, and which
    condition means average several training seeds (the others are the chapter's `seed` alone)."""
    from sinklib.adapt.pairs import CONDITION_LABELS as labels

    outside = outside or {}
    parts = []
    for m, g in means.groupby("model", sort=False):
        sized = g.condition.astype(str).str.startswith("random x").to_numpy()
        rest, clauses = g[~sized], []
        if sized.any():
            clauses.append(f"{int(sized.sum())} of its {len(g)} conditions are the 1x random direction at other sizes"
                           + (", so its rho largely measures a change-size effect common to sink and format, which "
                              "is no evidence for the mechanism beyond that" if sized.sum() > len(g) / 2 else ""))
            if len(rest) >= 3:
                c = sink_text_correlation(rest, ("strict-format mean",))
                clauses.append(f"over its other {len(rest)} conditions, " + correlation_sentence(c).split(": ", 1)[1])
        against = _against(rest, outside, labels)
        if against:
            clauses.append("the sink mass moved against the predicted sign while the strict-format change lies "
                           "outside the noise: " + ", ".join(against))
        reps = rest[rest.replicates > 1]
        if len(reps):
            names = [labels.get(c, c) for c in reps.condition]
            clauses.append(f"{', '.join(names[:-1])}{' and ' if len(names) > 1 else ''}{names[-1]} are means over "
                           f"{int(reps.replicates.max())} training seeds, the other conditions training seed {seed} alone")
        text = f"{m}: " + "; ".join(clauses) if clauses else f"{m}: one training seed, no sizes"
        parts.append(text)
    return ". ".join(parts)


def critical_sentence(rows: pd.DataFrame, level: float = 0.05) -> str:
    """How large a rho must be to give p < `level` for each model's number of adapted conditions in `rows`
    (`sink_text_rows`): '14 conditions (smollm2-135m) a rho must reach 0.54 in size (random orderings), ...'."""
    parts = []
    for m, n in rows.groupby("model", sort=False).size().items():
        n = int(n)
        crit = critical_rho(n, level) if n >= 3 else float("nan")
        if crit == crit:
            parts.append(f"{n} conditions ({m}) a rho must reach {crit:.2f} in size to give p < {level:g}"
                         + (" (exact test)" if n <= EXACT_MAX_N else " (random orderings)"))
        else:
            parts.append(f"{n} conditions ({m}) no rho reaches p < {level:g} in the exact test")
    return ", and with ".join(parts)


def critical_rho(n: int, level: float = 0.05) -> float:
    """The smallest |rho| whose two-sided permutation p-value is at most `level` for n untied conditions (the bar
    a correlation across n conditions must clear): exact for n <= EXACT_MAX_N (every ordering, as `sink_text_correlation`), beyond that from 9999
    seeded random orderings with p = (k + 1) / (9999 + 1), as `panel.spearman_permutation` computes it."""
    from sinklib.stats.panel import rho_null
    from sinklib.core.params import check_int

    n = check_int("n", n, 3, 1000)
    null = np.abs(np.round(rho_null(n, exact_max_n=EXACT_MAX_N), 12))
    adj = 0 if n <= EXACT_MAX_N else 1
    for r in np.unique(null):
        if (np.count_nonzero(null >= r) + adj) / (len(null) + adj) <= level:
            return float(r)
    return float("nan")


def step_reading(table: pd.DataFrame) -> str:
    """Each step of a `decomposition` in words, per model: whether it lowers or raises the strict-format mean and
    the lenient math score outside the noise (paired interval excluding zero) or leaves them within it."""
    from sinklib.adapt.pairs import interval_cell

    def move(r: pd.Series, moves: tuple[str, str, str]) -> str:
        cell = interval_cell(r.change, r.lo, r.hi)
        return f"{moves[0] if r.hi < 0 else moves[1] if r.lo > 0 else moves[2]} ({cell})"

    parts = []
    for m, g in table.groupby("model", sort=False):
        g = g.set_index(["step", "metric"])
        steps = []
        for label, _, _ in STEPS:
            text = f"{label} " + move(g.loc[(label, "strict-format mean")],
                                      ("lowers the strict-format mean", "raises the strict-format mean",
                                       "leaves the strict-format mean within the noise"))
            if (label, "math lenient") in g.index:
                text += ", and the lenient math score " + move(g.loc[(label, "math lenient")],
                                                                ("falls", "rises", "stays within the noise"))
            steps.append(text)
        parts.append(f"{m}: " + "; ".join(steps))
    return ". ".join(parts)


def random_sizes(lm_by: Mapping[str, Any], built: Mapping[str, Any], evaluations: dict, scales: Sequence[float], *,
                 seed: int, **evaluate_kwargs: Any) -> pd.DataFrame:
    """Chapter 4's random-size section: evaluate the random control at each of `scales` for every model (largest
    first, cached), add the evaluations to `evaluations` under `scaled_name(k)`, and return `random_curve` over
    1x and `scales` with each size's whole-model relative change (k x the VL change's). `evaluate_kwargs` go to
    `pairs.evaluate_condition`, with `last_k_layers` and `max_tokens` in place of `sink_kwargs` (`pairs.per_model_kwargs`)."""
    from sinklib.adapt.pairs import per_model_kwargs, relative_change

    vl_size = {n: relative_change(b, "vl", whole=True)[0]["relative change"] for n, b in built.items()}
    for k in sorted(scales, reverse=True):
        for name, lm in lm_by.items():
            evaluations[(name, scaled_name(k))] = evaluate_random_scaled(
                lm, built[name], [k], seed=seed, **per_model_kwargs(lm, evaluate_kwargs))[float(k)]
    return random_curve(evaluations, [1.0, *scales], seed=seed, vl_change=vl_size)


def _multiples_axis(ax, one: float, scales) -> None:
    """A top axis on Figure 4.6's panel marking the multiples of VL's norm (the whole-model relative size of 1x is
    `one`): the sizes that are powers of two, labelled '1x', '8x', ..."""
    import math

    ticks = sorted({float(k) for k in scales if k > 0 and float(math.log2(k)).is_integer()})
    top = ax.secondary_xaxis("top", functions=(lambda x: x / one, lambda x: x * one))
    top.set_xticks(ticks, [f"{k:g}x" for k in ticks])
    top.minorticks_off()
    top.tick_params(labelsize=7)
    top.set_xlabel("multiple of VL's norm", fontsize=8)


def plot_random_curve(curve: pd.DataFrame, vl_change: Mapping[str, float]):
    """Figure 4.6: per model, the strict-format and knowledge changes of the random control against its
    whole-model relative size (log scale), with VL's own size (dotted) and VL's strict-format change (dashed).
    `vl_change`: {model: VL's strict-format mean change}."""
    from sinklib import plots
    from sinklib.adapt.pairs import SCORE_LABELS

    models = list(dict.fromkeys(curve.model))
    fig, axes = plots.subplots(1, len(models), height=3.4)
    for ax, name in zip(axes, models):
        for metric, color in (("strict-format mean", "C0"), ("knowledge acc", "C2")):
            c = curve[(curve.model == name) & (curve.metric == metric)]
            ax.errorbar(c["relative change"], c.change, yerr=[c.change - c.lo, c.hi - c.change], marker="o",
                        color=color, capsize=3, label=f"random: {SCORE_LABELS.get(metric, metric)}")
        one = curve[(curve.model == name) & (curve.scale == 1.0)]["relative change"]
        ax.axhline(vl_change[name], color="C3", ls="--", lw=1.5, zorder=3, label="VL: strict-format mean")
        ax.axhline(0, color="k", lw=0.6)
        ax.set_xscale("log"); ax.set_title(name)
        if len(one):
            ax.axvline(float(one.iloc[0]), color="grey", ls=":", lw=1)
            _multiples_axis(ax, float(one.iloc[0]), curve[curve.model == name].scale)
        ax.set_xlabel("||dW|| / ||W|| (whole model)"); ax.set_ylabel("change from base (points)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_sink_text(rows: pd.DataFrame):
    """Figure 4.7: per model, the change of the strict-format mean (circles) and of the knowledge score (squares)
    against the change of the last-K sink mass, one point per adapted condition of `sink_text_rows`. Trained
    conditions are labelled once per condition at the mean of its training seeds (`seeds.label`, with the number
    of seeds); the random controls (every size and seed), which crowd near the
    origin, are drawn hollow and unlabelled."""
    from sinklib import plots
    from sinklib.adapt.seeds import label, parse_name

    models = list(dict.fromkeys(rows.model))
    fig, axes = plots.subplots(1, len(models), height=3.6)
    for ax, name in zip(axes, models):
        r = rows[rows.model == name]
        rnd = r.condition.str.startswith("random")
        for sel, fill, tag in ((~rnd, True, ""), (rnd, False, "random (every size and seed): ")):
            if not sel.any():
                continue
            x = r[sel]["sink mass change"]
            ax.scatter(x, r[sel]["strict-format mean change"], marker="o", label=f"{tag}strict-format mean",
                       **({"color": "C0"} if fill else {"facecolors": "none", "edgecolors": "C0"}))
            ax.scatter(x, r[sel]["knowledge acc change"], marker="s", label=f"{tag}knowledge",
                       **({"color": "C2"} if fill else {"facecolors": "none", "edgecolors": "C2"}))
        trained = r[~rnd].assign(kind=[parse_name(c)[0] for c in r[~rnd].condition])
        for kind, g in trained.groupby("kind", sort=False):  # one label per condition, its seeds together
            ax.annotate(label(kind) + (f" ({len(g)} seeds)" if len(g) > 1 else ""),
                        (g["sink mass change"].mean(), g["strict-format mean change"].mean()),
                        fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.axhline(0, color="k", lw=0.6)
        ax.axvline(0, color="k", lw=0.6)
        ax.set_title(name)
        ax.set_xlabel("change of last-K sink mass")
        ax.set_ylabel("change from base (points)")
        ax.locator_params(axis="x", nbins=4)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=2, frameon=False)
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    return fig
