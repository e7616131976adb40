"""Display tables of chapters 4 and 6 (what is shown; the saved results keep the full frames): short score and
condition labels (`SCORE_LABELS`, `SCORE_LEGEND`, `CONDITION_LABELS`), the token budget, one-column-per-model
frames, condition scores, merge verdicts and paired changes with their intervals (`interval_cell`,
`metric_grid`, `paired_display`). Re-exported by `sinklib.adapt.pairs`."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

#: short display names of the score columns ('suite metric'), explained by SCORE_LEGEND
SCORE_LABELS = {"instructions strict": "instr. strict", "instructions lenient": "instr. lenient",
                "math strict": "math strict", "math lenient": "math lenient", "knowledge acc": "knowl.",
                "perplexity ppl": "ppl", "VQA (%)": "VQA"}
SCORE_LEGEND = ("instr. = instruction following, strict or lenient format; math = arithmetic graded by the strict "
                "or lenient parser; knowl. = knowledge multiple-choice accuracy; scores in %; ppl = perplexity; "
                "VQA = held-out visual question accuracy (%)")
CONDITION_LABELS = {"vl": "VL", "text_only": "text-only", "base": "base", "random": "random",
                     "text_sentence": "text-only, sentences"}


def budget_table(budget_rows: Sequence[Mapping[str, Any]]):
    """Chapter 4's token budget for display: rows (model, quantity), one column per condition and stage."""
    from sinklib.plots import Table

    df = pd.DataFrame(budget_rows)
    quantities = [c for c in df.columns if c not in ("model", "condition", "stage")]
    df["run"] = [f"{CONDITION_LABELS.get(c, c)} {s.replace('stage', 'stage ')}" for c, s in zip(df.condition, df.stage)]
    long = df.melt(id_vars=["model", "run"], value_vars=quantities, var_name="quantity")
    long["quantity"] = long["quantity"].str.replace("_", " ")
    wide = long.pivot_table(index=["model", "quantity"], columns="run", values="value", aggfunc="first", sort=False)
    wide = wide.map(lambda v: "" if pd.isna(v) else f"{int(v):,}")
    wide.columns.name = None
    return Table(wide, "Summed over each stage: optimiser steps, training examples, answer tokens (the loss's "
                       "targets) and input positions (visual + text = input; padded: with padding). The text-only "
                       "control runs one stage, matched to VL stage 2.")


def by_model_table(rows: pd.DataFrame, legend: str = "", digits: int = 1):
    """A one-row-per-model frame transposed for display: one column per model, one row per column of `rows`
    (numbers with `digits` decimals, booleans as yes/no)."""
    from sinklib.plots import Table

    t = rows.set_index("model").T
    t = t.map(lambda v: ("yes" if v else "no") if isinstance(v, (bool, np.bool_)) else
              (f"{v:.{digits}f}" if isinstance(v, (float, np.floating)) else v))
    t.columns.name = None
    return Table(t, legend)


def condition_tables(rows: pd.DataFrame, legend: str = SCORE_LEGEND) -> list:
    """`condition_row` rows (model, condition, S, VQA (%), 'suite metric' scores) for display: index
    (model, condition without 'merge:'), short headers (`SCORE_LABELS`), S to 3 decimals and scores to 1;
    split into tables that fit the book's column."""
    from sinklib.plots import tables

    cols = ["S", "VQA (%)", "instructions strict", "math strict", "instructions lenient", "math lenient",
            "knowledge acc", "perplexity ppl"]
    d = rows.copy()
    d["condition"] = [str(c).replace("merge:", "") for c in d["condition"]]
    d = d.set_index(["model", "condition"])[[c for c in cols if c in rows]]
    for c in d.columns:
        d[c] = [f"{v:.3f}" if c == "S" else ("" if pd.isna(v) else f"{v:.1f}") for v in d[c]]
    d.columns = [SCORE_LABELS.get(c, c) for c in d.columns]
    return tables(d, legend)


def merge_verdict_table(verdicts: pd.DataFrame):
    """Chapter 6's merge verdicts for display: the change from VL with its paired interval in one cell (when
    the verdicts hold 'lo' and 'hi'), short headers, the repeated reported verdict as the legend."""
    from sinklib.plots import Table

    names = {"strict format change vs VL (pt)": "strict change vs VL (pt)", "worse than VL": "worse than VL",
             "recovers to base level": "back to base", "VQA kept (% of VL)": "VQA kept (%)", "S": "S"}
    v = verdicts.copy()
    if "outcome" in v.columns:  # the per-merge verdict of `claims.merge_verdict`, its reasons in the legend
        names["outcome"] = "verdict: no recovery"
    if {"lo", "hi"} <= set(v.columns):
        v["strict format change vs VL (pt)"] = [f"{x:+.1f} [{lo:+.1f}, {hi:+.1f}]" for x, lo, hi in
                                                zip(v["strict format change vs VL (pt)"], v.lo, v.hi)]
    d = v.set_index(["model", "method"])[list(names)].rename(columns=names)
    for c in d.columns:
        d[c] = [("yes" if x else "no") if isinstance(x, (bool, np.bool_)) else x if isinstance(x, str) else
                ("" if pd.isna(x) else (f"{x:.3f}" if c == "S" else f"{x:.1f}")) for x in d[c]]
    reported = "; ".join(f"{m}: {r}" for r, ms in verdicts.groupby("paper's verdict (reported)", sort=False).method
                         for m in [", ".join(dict.fromkeys(ms))])
    paired_note = (" [paired bootstrap 95 % interval over the shared items]; worse than VL: that interval lies below "
                   "zero" if {"lo", "hi"} <= set(v.columns) else "")
    why = "" if "why" not in v.columns else " Verdict of 'no merge recovers the VL loss' per merge, by the claims " \
        "page's rule: " + "; ".join(f"{o} ({n} of {len(v)}): {w}" for (o, w), n in v.groupby(["outcome", "why"],
                                                                                             sort=False).size().items()) + "."
    return Table(d, f"strict = mean of the strict-format scores{paired_note}; back to base: the merge recovers the "
                    "VL loss by the claims page's paired rule (above the base outside the noise, or not below it and "
                    "above VL outside the noise); VQA kept: the merge's VQA accuracy as % of the VL model's. The "
                    f"paper's verdict (reported): {reported}.{why}")


def interval_cell(change: float, lo: float, hi: float, p: float = float("nan")) -> str:
    """'change [lo, hi] p=...' for display, each number `signed` (no '-0.0'); p < 0.001 as 'p<0.001'; no p
    where it is NaN."""
    from sinklib.core.numbers import interval

    cell = interval(change, lo, hi)
    return cell if p != p else f"{cell} {'p<0.001' if p < 0.001 else f'p={p:.3f}'}"


def metric_grid(table: pd.DataFrame, cells: Sequence[str], column: str, order: Sequence[str] | None = None) -> pd.DataFrame:
    """Long rows (model, metric, `column`) with one display string each in `cells` -> the wide frame every
    chapter 4 table shows: per model one row per metric (`SCORE_LABELS`), one column per value of `column` in
    `order` (first appearance where None; values not present are dropped)."""
    t = table.assign(cell=list(cells), metric=[SCORE_LABELS.get(m, m) for m in table.metric])
    wide = t.pivot_table(index=["model", "metric"], columns=column, values="cell", aggfunc="first", sort=False)
    cols = list(order) if order is not None else list(dict.fromkeys(t[column]))
    wide = wide[[c for c in cols if c in wide.columns]]
    wide.columns.name = None
    return wide


def paired_display(table: pd.DataFrame, conditions: Sequence[str] = ("vl", "text_only", "random"), note: str = ""):
    """`paired_table` for display: per model, one row per metric and one column per condition holding
    'change [lo, hi]' and the p-value underneath (p < 0.001 as 'p<0.001'); split to fit the column. `note` opens
    the legend (e.g. which training seed the table is)."""
    from sinklib.plots import tables

    t = table.assign(condition=[CONDITION_LABELS.get(c, c) for c in table.condition])
    wide = metric_grid(t, [interval_cell(c, lo, hi, p) for c, lo, hi, p in zip(t.change, t.lo, t.hi, t.p)],
                       "condition", [CONDITION_LABELS.get(c, c) for c in conditions])
    legend = ("change from the base model on the same items, points (ppl: perplexity units) [paired bootstrap 95 % "
              "interval]; p: exact McNemar for pass/fail scores, paired bootstrap for the strict-format mean; "
              "perplexity without a p-value. " + SCORE_LEGEND)
    return tables(wide, (note + ": " if note else "") + legend)


# ---------------------------------------------------------------------------------------
# chapter 4's findings in words (the printed summary and the glued sentences of "What this run shows")

def findings(built: Mapping[str, Any], vqa_checks: Mapping[str, dict], S_wide: pd.DataFrame, deltas: pd.DataFrame,
             stage1_steps: int) -> dict[str, Any]:
    """Chapter 4's findings, computed from its tables: {'lines': printed lines per model, 'vqa', 'S', 'text':
    one sentence each over all models (VQA along training and held-out against the majority answer; S base ->
    VL; strict/lenient math and knowledge changes of VL and text-only)}."""
    lines, vqa_story, s_story, text_story = [], [], [], []
    for name, b in built.items():
        d = deltas[deltas.model == name].set_index(["condition", "metric"]).change
        v, S = vqa_checks[name], S_wide.loc[name]
        word = "rose" if S["vl"] > S["base"] else "fell"
        lines.append(f"- {name}: VQA {v['vqa']:.1f}% [{v['vqa_lo']:.1f}, {v['vqa_hi']:.1f}] after VL training vs "
                     f"{v['majority']:.1f}% for the blind majority answer ("
                     f"{'learned: the interval lies above it' if v['learned'] else 'NOT shown to be learned'}); "
                     f"S {S['base']:.3f} (base) -> {S['vl']:.3f} (VL), {S['text_only']:.3f} (text-only), "
                     f"{S['random']:.3f} (random): S {word} under VL (paper, reported: Tulu 3B +0.41 -> +0.20).")
        lines.append("  changes from base (points; VL / text-only / random): " + "; ".join(
            f"{m} {d[('vl', m)]:+.1f} / {d[('text_only', m)]:+.1f} / {d[('random', m)]:+.1f}"
            for m in ("instructions strict", "math strict", "math lenient", "knowledge acc") if ("vl", m) in d.index))
        cb = [(c["step"], 100 * c["value"]["vqa"]) for c in b.logs["vl"]["callbacks"] if "vqa" in c["value"]]
        end1 = max((c for c in cb if c[0] <= stage1_steps), default=None)
        track = (f"tracking items {cb[0][1]:.0f} % at step 0, {end1[1]:.0f} % at the end of stage 1, {cb[-1][1]:.0f} % "
                 f"at the end of stage 2; " if cb and end1 else "")
        vqa_story.append(f"{name}: {track}held-out {v['vqa']:.1f} % [{v['vqa_lo']:.1f}, {v['vqa_hi']:.1f}] against "
                         f"{v['majority']:.1f} % for the blind majority answer "
                         f"({'learned' if v['learned'] else 'not shown to be learned'})")
        s_story.append(f"{name} {S['base']:.3f} -> {S['vl']:.3f} ({word})")
        text_story.append(f"{name}: " + "; ".join(
            f"{label} " + ", ".join(f"{m} {d[(c, m)]:+.1f}" for m in ("math strict", "math lenient", "knowledge acc"))
            for c, label in (("vl", "VL"), ("text_only", "text-only"))))
    return {"lines": lines, "vqa": "; ".join(vqa_story), "S": "; ".join(s_story), "text": "; ".join(text_story)}
