"""Chapter 4's score changes as chapters 5, 6 and 8 read them: the main metrics (`MAIN_METRICS`), the score table
of evaluated conditions (`score_table`), the changes from the base model (`score_deltas`, and paired on the same
items: `paired_table`, over training seeds: `seed_summary`), the strict-format mean (`strict_mean`,
`STRICT_METRICS`), one evaluated condition as a row (`condition_row`) and the measured panel rows chapter 5 reads
(`panel_row`, `panel_rows`). Re-exported by `sinklib.adapt.pairs`, where the evaluations come from."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from sinklib.core.models import Loaded
from sinklib.errors import ParameterError

#: the (suite, metric) pairs chapter 4 compares between conditions, in table order
MAIN_METRICS: tuple[tuple[str, str], ...] = (("instructions", "strict"), ("instructions", "lenient"),
                                             ("math", "strict"), ("math", "lenient"), ("knowledge", "acc"),
                                             ("perplexity", "ppl"))
#: the format-sensitive scores whose mean is "the strict-format score" of a condition
STRICT_METRICS: tuple[str, ...] = ("instructions strict", "math strict")


def score_table(evaluations: Mapping[tuple[str, str], dict]) -> pd.DataFrame:
    """{(model, condition): evaluate_condition(...)} -> one row per (model, condition, suite, metric)."""
    return pd.DataFrame([{"model": name, "condition": cond, **r}
                         for (name, cond), ev in evaluations.items() for r in ev["scores"]])


def score_deltas(scores: pd.DataFrame, conditions: Sequence[str] = ("vl", "text_only", "random")) -> pd.DataFrame:
    """Change of every main metric from the base model: columns model, condition, metric ('suite metric'), change."""
    rows = []
    for name in dict.fromkeys(scores.model):
        base = scores[(scores.model == name) & (scores.condition == "base")].set_index(["suite", "metric"]).score
        for cond in conditions:
            cur = scores[(scores.model == name) & (scores.condition == cond)].set_index(["suite", "metric"]).score
            for s, m in MAIN_METRICS:
                if (s, m) in base.index:
                    rows.append({"model": name, "condition": cond, "metric": f"{s} {m}",
                                 "change": cur[(s, m)] - base[(s, m)]})
    return pd.DataFrame(rows)


def paired_table(evaluations: Mapping[tuple[str, str], dict], conditions: Sequence[str] = ("vl", "text_only", "random"),
                 ref: str = "base", *, seed: int = 0) -> pd.DataFrame:
    """Paired changes of every condition from `ref` on the same items: one row per (model, condition, metric)
    with the scores, the change, its paired bootstrap 95 % interval, the exact McNemar p-value and the items
    lost / gained (`sinklib.evals.paired.paired_changes`), plus a row 'strict-format mean' (`STRICT_METRICS`)
    whose interval and p-value come from the paired bootstrap of the mean. evaluations: {(model, condition):
    evaluate_condition(...)} (each with 'outcomes')."""
    from sinklib.evals import paired

    rows = []
    for name in dict.fromkeys(m for m, _ in evaluations):
        b = evaluations[(name, ref)]
        for cond in conditions:
            if (name, cond) not in evaluations:
                continue
            o = evaluations[(name, cond)]
            for r in paired.paired_changes(b, o, seed=seed):
                if tuple(r["metric"].split(" ", 1)) in MAIN_METRICS:
                    rows.append({"model": name, "condition": cond, "test": "McNemar" if r["metric"] != "perplexity ppl"
                                 else "bootstrap", **r})
            held = [m for m in STRICT_METRICS if m in b["outcomes"] and m in o["outcomes"]]
            if held:
                point, draws = paired.change(b["outcomes"], o["outcomes"], held, seed=seed)
                e = paired.estimate(point, draws)
                rows.append({"model": name, "condition": cond, "test": "bootstrap", "metric": "strict-format mean",
                             "base": strict_mean({m: paired.score(b["outcomes"], m) for m in held}),
                             "other": strict_mean({m: paired.score(o["outcomes"], m) for m in held}),
                             "change": e.v, "lo": e.lo, "hi": e.hi, "p": paired.p_two_sided(draws),
                             "lost": np.nan, "gained": np.nan})
    return pd.DataFrame(rows)


def seed_summary(tables: Mapping[int, pd.DataFrame]) -> pd.DataFrame:
    """`paired_table`s of several training seeds -> one row per (model, condition, metric): the mean change over
    seeds, its spread (smallest and largest change, standard deviation), the number of seeds whose paired
    interval excludes zero below and above, and 'seed spread exceeds effect' (the range of the seeds' changes is
    wider than the absolute mean change: the training noise is as large as the effect, whatever one run's
    item-level interval says)."""
    if not tables:
        raise ParameterError("seed_summary needs the paired table of at least one seed")
    long = pd.concat([t.assign(seed=seed) for seed, t in tables.items()], ignore_index=True)
    rows = []
    for (model, cond, metric), g in long.groupby(["model", "condition", "metric"], sort=False):
        ch = g.change.to_numpy(float)
        rows.append({"model": model, "condition": cond, "metric": metric, "seeds": len(g),
                     "mean change": float(ch.mean()), "min": float(ch.min()), "max": float(ch.max()),
                     "sd": float(ch.std(ddof=1)) if len(ch) > 1 else float("nan"),
                     "seeds below zero": int((g.hi < 0).sum()), "seeds above zero": int((g.lo > 0).sum()),
                     "seed spread exceeds effect": bool(len(ch) > 1 and ch.max() - ch.min() > abs(ch.mean()))})
    return pd.DataFrame(rows)


def strict_mean(scores: Mapping[str, float] | pd.DataFrame) -> float | pd.Series:
    """Mean of the strict-format scores (`STRICT_METRICS`): of a mapping 'suite metric' -> score (the
    metrics it holds), or per row of a frame with those columns."""
    if isinstance(scores, pd.DataFrame):
        return scores[list(STRICT_METRICS)].mean(axis=1)
    return float(np.mean([scores[k] for k in STRICT_METRICS if k in scores]))


def condition_row(name: str, condition: str, evaluation: dict) -> dict:
    """One evaluated condition as a flat row: model, condition, S, VQA (%), and 'suite metric' -> score."""
    vqa = evaluation["vqa"]
    row = {"model": name, "condition": condition, "S": evaluation["S"], "VQA (%)": 100 * vqa[0] if vqa else np.nan}
    row.update({f"{r['suite']} {r['metric']}": r["score"] for r in evaluation["scores"]})
    return row


def panel_row(name: str, S: float, qk_norm: str, changes: Mapping[str, float]) -> dict:
    """The measured panel row of one adapted pair: `changes` maps 'suite metric' -> change under VL (points)."""
    from sinklib.stats.schema import task_column

    row = {"pair": f"{name}+VL (this book)", "vlm": f"{name} adapted by sinklib.vl", "llm": name, "S": float(S),
           "qk_norm": qk_norm, "source": "measured: notebook 04"}
    row.update({task_column(metric): float(v) for metric, v in changes.items()})
    return row


def panel_rows(lms: Mapping[str, Loaded], S_wide: pd.DataFrame, deltas: pd.DataFrame) -> list[dict]:
    """The measured panel that chapter 5 reads: one `panel_row` per model (its base S, QK-norm type and VL
    changes from `score_deltas`)."""
    return [panel_row(name, S_wide.loc[name, "base"], lm.qk_norm,
                      deltas[(deltas.model == name) & (deltas.condition == "vl")].set_index("metric").change)
            for name, lm in lms.items()]
