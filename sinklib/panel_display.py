"""Chapter 5's tables as the book shows them: shorter task names, intervals as text, split to fit the column.

The statistics (``sinklib.panel``) and the saved results keep the full frames; only the display changes.
"""
from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from .panel_schema import TASK_PREFIX, task_columns

# --------------------------------------------------------------------------- display tables of chapter 5
# (what the chapter shows; the statistics and saved results keep the full frames)

#: words shortened in displayed task names (explained in the legends)
TASK_ABBREVIATIONS = {"instructions": "instr.", "knowledge": "knowl.", "perplexity": "ppl", "diamond": "diam."}


def task_label(task: str) -> str:
    """A task column for display: 'delta_instructions_strict' -> 'instr. strict'."""
    from .plots import short_label

    name = task[len(TASK_PREFIX):] if task.startswith(TASK_PREFIX) else task
    return short_label(name, TASK_ABBREVIATIONS).replace("ppl ppl", "ppl")


def panel_tables(df: pd.DataFrame) -> list:
    """A panel for display: the numbers (index pair; QK-norm, S to 3 decimals, each task's change to 1
    decimal, split to fit the book's column), then the text columns (vlm, llm, note; a `source` shared by
    every row goes into the legend)."""
    from .plots import Table, tables

    d = df.set_index("pair")
    tasks = task_columns(df)
    nums = pd.DataFrame({"QK-norm": d["qk_norm"].str.replace("_", " "),
                         "S": ["" if pd.isna(v) else f"{v:.3f}" for v in d["S"]]}, index=d.index)
    for t in tasks:
        nums[task_label(t)] = ["" if pd.isna(v) else f"{v:+.1f}" for v in d[t]]
    ppl = " (ppl: change in perplexity, a rise is a loss)" if any("ppl" in t or "perplexity" in t for t in tasks) else ""
    out = tables(nums, "Task columns: change after VL adaptation in points" + ppl + "; empty: not reported or "
                       "not measured. instr. = instructions, knowl. = knowledge.")
    text_cols = [c for c in ("vlm", "llm", "note") if c in d and d[c].fillna("").astype(str).str.strip().any()]
    sources = list(dict.fromkeys(d["source"].astype(str))) if "source" in d else []
    if len(sources) > 1:
        text_cols.append("source")
    if text_cols:
        out.append(Table(d[text_cols].fillna(""), f"Source of every row: {sources[0]}." if len(sources) == 1 else ""))
    return out


def availability_table(av: pd.DataFrame):
    """`availability` for display: short task names and headers, explained in the legend."""
    from .plots import Table

    names = {"pairs_with_change": "n change", "pairs_with_S_and_change": "n with S", "spearman": "Spearman rho",
             "lopo": "LOPO", "architecture": "S beyond QK-norm"}
    d = av.set_index("task").rename(columns=names)
    d.index = [task_label(t) for t in d.index]
    d.index.name = "task"
    return Table(d, "n change: pairs with the task's change; n with S: of those, pairs that also have S; the last "
                    "three columns say whether Spearman rho, the leave-one-pair-out error (LOPO) and the test of "
                    "whether S adds to the QK-norm type can be computed, or why not.")


def summary_tables(summary: dict[str, pd.DataFrame], tasks: Sequence[str] | None = None) -> list[tuple[str, list]]:
    """`panel_summary`'s rho, LOPO and architecture tables for display (rows of `tasks`, default all):
    [(title, Tables)], intervals as 'lo to hi', numbers rounded, split to fit the book's column."""
    from .plots import tables

    def num(v, k=3):
        return "" if v is None or pd.isna(v) else f"{v:.{k}g}" if abs(v) < 1e-3 and v != 0 else f"{v:.{k}f}"

    def ci(lo, hi):
        return "" if pd.isna(lo) else f"{lo:.2f} to {hi:.2f}"

    def rows(key):
        d = summary[key]
        d = d[d["task"].isin(tasks)] if tasks is not None else d
        return d.assign(task=[task_label(t) for t in d["task"]]).set_index("task")

    r = rows("rho")
    rho = pd.DataFrame({"n": r["n"], "rho": [num(v) for v in r["rho"]], "p": [num(v) for v in r["p_value"]],
                        "p method": r["p_method"], "Fisher CI": [ci(a, b) for a, b in zip(r.ci_fisher_lo, r.ci_fisher_hi)],
                        "bootstrap CI": [ci(a, b) for a, b in zip(r.ci_boot_lo, r.ci_boot_hi)], "note": r["note"]})
    lo = rows("lopo")
    lopo = pd.DataFrame({"n": lo["n"], "MAE, S": [num(v, 2) for v in lo.mae_model],
                         "MAE, constant": [num(v, 2) for v in lo.mae_constant], "note": lo["note"]})
    a = rows("architecture")
    arch = pd.DataFrame({"n": a["n"], "groups": a["groups"].fillna(""),
                         "R2 arch": [num(v) for v in a.r2_arch], "R2 arch + S": [num(v) for v in a.r2_arch_plus_S],
                         "R2 S on arch": [num(v) for v in a.r2_S_on_arch], "df": a["df_resid"].fillna(""),
                         "F p": [num(v) for v in a.F_p], "LR p": [num(v) for v in a.LR_p],
                         "partial rho": [num(v) for v in a.partial_rho], "partial p": [num(v) for v in a.partial_p],
                         "min p": [num(v) for v in a.min_attainable_p], "note": a["note"].fillna("")})
    return [("Spearman rho, permutation p-value and intervals", tables(rho, "p: permutation p-value; p method: how it was computed; CI: intervals for rho")),
            ("Leave-one-pair-out mean absolute error (points)",
             tables(lopo, "MAE, S: predicting each pair's change from S fitted on the others; constant: the mean of the others")),
            ("Does S add to the QK-norm type?",
             tables(arch, "R2: of the change on the QK-norm type (arch), on type + S, and of S on the type; df: residual "
                          "degrees of freedom; F p, LR p: nested F and likelihood-ratio tests of adding S; partial rho: "
                          "S against the change within types; min p: the smallest p the within-type permutation can reach"))]
