"""Chapter 5's tables as shown (the statistics and the saved results keep the full frames): the panel, what can be
computed per task, and the summary statistics, with plain-word headers and each fact said once."""
from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from sinklib.plots.table import Table, number_text, short_label, tables
from sinklib.stats.schema import TASK_PREFIX, task_columns


#: words shortened in displayed task names (explained in the legends)
TASK_ABBREVIATIONS = {"instructions": "instr.", "knowledge": "knowl.", "perplexity": "ppl", "diamond": "diam."}


def task_label(task: str) -> str:
    """A task column for display: 'delta_instructions_strict' -> 'instr. strict'."""
    name = task[len(TASK_PREFIX):] if task.startswith(TASK_PREFIX) else task
    return short_label(name, TASK_ABBREVIATIONS).replace("ppl ppl", "ppl")


def panel_tables(df: pd.DataFrame) -> list:
    """A panel for display: the numbers (index pair; QK-norm, S to 3 decimals, each task's change to 1
    decimal, split to fit the book's column), then the text columns (vlm, llm, note; a `source` shared by
    every row goes into the legend)."""
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


#: the statistics of chapter 5 that need at least this many pairs with both S and the change
MIN_PAIRS = 3


def availability_table(av: pd.DataFrame):
    """`availability` for display: short task names and headers, explained in the legend. The tasks with fewer
    than MIN_PAIRS pairs with S are named once in the legend (their three cells are left empty), and when no task
    has them the three columns are left out."""
    names = {"pairs_with_change": "n change", "pairs_with_S_and_change": "n with S", "spearman": "Spearman rho",
             "lopo": "LOPO", "architecture": "S beyond QK-norm"}
    d = av.set_index("task").rename(columns=names)
    d.index = [task_label(t) for t in d.index]
    d.index.name = "task"
    stats = ["Spearman rho", "LOPO", "S beyond QK-norm"]
    short = d["n with S"] < MIN_PAIRS
    legend = "n change: pairs with the task's change; n with S: of those, pairs that also have S."
    need = (f"Spearman rho, the leave-one-pair-out error (LOPO) and the test of whether S adds to the QK-norm type "
            f"each need at least {MIN_PAIRS} pairs with both S and the change")
    if short.all():
        return Table(d.drop(columns=stats), f"{legend} {need}: no task here has them, so none of the three can be "
                                            "computed on this panel.")
    d.loc[short, stats] = ""
    legend += (" The last three columns say whether Spearman rho, the leave-one-pair-out error (LOPO) and the test of "
               "whether S adds to the QK-norm type can be computed, or why not.")
    if short.any():
        legend += f" {need}; empty: too few for {', '.join(d.index[short])}."
    return Table(d, legend)


def _drop_empty(frame: pd.DataFrame, column: str = "note") -> pd.DataFrame:
    return frame.drop(columns=[column]) if not frame[column].fillna("").astype(str).str.strip().any() else frame


def summary_tables(summary: dict[str, pd.DataFrame], tasks: Sequence[str] | None = None) -> list[tuple[str, list]]:
    """`panel_summary`'s rho, LOPO and architecture tables for display (rows of `tasks`, default all):
    [(title, Tables)], intervals as 'lo to hi', numbers rounded without turning a small value into zero
    (`number_text`), a note column only where some row has a note, split to fit the book's column."""
    def ci(lo, hi):
        return "" if pd.isna(lo) else f"{lo:.2f} to {hi:.2f}"

    def rows(key):
        d = summary[key]
        d = d[d["task"].isin(tasks)] if tasks is not None else d
        return d.assign(task=[task_label(t) for t in d["task"]]).set_index("task")

    def nums(values, k=3):
        return [number_text(v, k) for v in values]

    r = rows("rho")
    rho = pd.DataFrame({"n": r["n"], "rho": nums(r["rho"]), "p": nums(r["p_value"]), "p method": r["p_method"],
                        "Fisher CI": [ci(a, b) for a, b in zip(r.ci_fisher_lo, r.ci_fisher_hi)],
                        "bootstrap CI": [ci(a, b) for a, b in zip(r.ci_boot_lo, r.ci_boot_hi)], "note": r["note"]})
    lo = rows("lopo")
    lopo = pd.DataFrame({"n": lo["n"], "MAE, S": nums(lo.mae_model, 2), "MAE, constant": nums(lo.mae_constant, 2),
                         "note": lo["note"]})
    a = rows("architecture")
    arch = pd.DataFrame({"n": a["n"], "groups": a["groups"].fillna(""), "R2 arch": nums(a.r2_arch),
                         "R2 arch + S": nums(a.r2_arch_plus_S), "R2 S on arch": nums(a.r2_S_on_arch),
                         "df": a["df_resid"].fillna(""), "F p": nums(a.F_p), "LR p": nums(a.LR_p),
                         "partial rho": nums(a.partial_rho), "partial p": nums(a.partial_p),
                         "smallest possible p": nums(a.min_attainable_p), "note": a["note"].fillna("")})
    return [("Spearman rho, permutation p-value and intervals",
             tables(_drop_empty(rho), "p: two-sided permutation p-value; p method: how it was computed; CI: intervals for rho")),
            ("Leave-one-out mean absolute error (points)",
             tables(_drop_empty(lopo), "each row of the panel (a pair, or a model) left out in turn; MAE, S: "
                                       "predicting its change from S fitted on the others; constant: the mean of "
                                       "the others")),
            ("Does S add to the QK-norm type?",
             tables(_drop_empty(arch), "R2: of the change on the QK-norm type (arch), on type + S, and of S on the "
                                       "type; df: residual degrees of freedom; F p, LR p: nested F and likelihood-ratio "
                                       "tests of adding S; partial rho: S against the change within types; smallest "
                                       "possible p: the smallest p the within-type permutation can reach"))]


def _grouped(tasks: Sequence[str], texts: Sequence[str]) -> list[tuple[str, list[str]]]:
    """(text, [task labels]) for each distinct text, in first-seen order: a fact shared by tasks is said once."""
    out: dict[str, list[str]] = {}
    for t, text in zip(tasks, texts):
        out.setdefault(str(text), []).append(task_label(t))
    return list(out.items())


def not_computed_lines(summary: dict[str, pd.DataFrame]) -> list[str]:
    """One line per reason why a task has no statistics (its Spearman rho could not be computed), naming every
    task that shares the reason."""
    r = summary["rho"][summary["rho"]["rho"].isna()]
    return [f"No statistic computed for {', '.join(ts)}: {note}." for note, ts in _grouped(r["task"], r["note"])]


def caveat_lines(summary: dict[str, pd.DataFrame]) -> list[str]:
    """The small-n caveats of a `panel_summary` as Markdown list items, a caveat shared by tasks said once (those
    shared by the most tasks first)."""
    c = summary["caveats"]
    groups = sorted(_grouped(c["task"], c["caveat"]), key=lambda g: -len(g[1]))  # stable: ties keep their order
    return [f"- {', '.join(ts)}: {text}" for text, ts in groups]


def show_panel_summary(summary: dict[str, pd.DataFrame]) -> None:
    """Display a `panel_summary` in a notebook: one line per reason a task has no statistics, then the tables of
    the tasks that have them (`summary_tables`) and the computed small-n caveats."""
    from IPython.display import Markdown, display

    for line in not_computed_lines(summary):
        print(line)
    ok = summary["rho"]["rho"].notna()
    if not ok.any():
        return
    for title, shown in summary_tables(summary, set(summary["rho"]["task"][ok])):
        display(Markdown(f"**{title}**"))
        for t in shown:
            display(t)
    if len(summary["caveats"]):
        display(Markdown("**Small-n caveats, computed**\n\n" + "\n".join(caveat_lines(summary))))
