"""The panel CSV: one row per VLM-LLM pair, its schema and its validation.

=========  ========  ===========================================================
column     type      meaning
=========  ========  ===========================================================
pair       str       unique short id of the pair, e.g. ``qwen2.5-vl``
vlm        str       the vision-language model (may be empty when unnamed)
llm        str       the reference LLM whose S is measured (may be empty)
S          float     Sink Strength of the reference LLM (empty = not measured)
qk_norm    str       QK-norm type of the backbone: ``none``, ``per_head``, ``layerwise``
delta_*    float     one column per task: post-VL score minus pre-VL score, in points
                     (empty = not reported / not measured); `task_column(metric)` names it
source     str       where the row's numbers come from (non-empty)
=========  ========  ===========================================================

Other columns (``note``, ``results_file``) are carried along and ignored by the statistics.
Measured rows come from the results files (`collect_panel_rows`): ``results.panel_rows`` (chapter 4's
pairs of embedded models, written with `sinklib.adapt.pairs.panel_row`) and ``results.tiny_panel_rows``
(chapter 7's controlled panel of tiny models, `sinklib.tiny.panel`), two panels never mixed.
"""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sinklib.core.anatomy import QK_NORM_TYPES
from sinklib.errors import PanelError
from sinklib.core.resources import data_path, results_dir as _default_results_dir

REQUIRED_COLUMNS: tuple[str, ...] = ("pair", "vlm", "llm", "S", "qk_norm", "source")
TASK_PREFIX = "delta_"
PAPER_CSV: Path = data_path("paper_reported.csv")


def task_column(metric: str) -> str:
    """The panel column of a task metric: 'instructions strict' -> 'delta_instructions_strict'."""
    return TASK_PREFIX + metric.replace(" ", "_")


def task_name(task: str) -> str:
    """A task column in words, for messages a reader sees: 'delta_instructions_strict' -> 'instructions strict'."""
    return (task[len(TASK_PREFIX):] if task.startswith(TASK_PREFIX) else task).replace("_", " ")


#: the measured panel's strict instruction-following change: written by chapter 4
#: (`sinklib.adapt.pairs.panel_row`), the headline task of chapter 5's measured panel
STRICT_TASK = task_column("instructions strict")


#: the controlled panel's strict-format change (chapter 7's tiny models, `sinklib.tiny.adapt.PANEL_METRICS`),
#: the headline task of chapter 5's second measured panel
TINY_STRICT_TASK = task_column("format strict")


def task_columns(df: pd.DataFrame) -> list[str]:
    """The task-change columns of a panel (names starting with ``delta_``), in column order."""
    return [c for c in df.columns if str(c).startswith(TASK_PREFIX)]


def _is_blank(v: Any) -> bool:
    if v is None:
        return True
    if isinstance(v, float) and math.isnan(v):
        return True
    return isinstance(v, str) and not v.strip()


def _label(df: pd.DataFrame, i: int) -> str:
    pair = df["pair"].iloc[i] if "pair" in df.columns else None
    return f"row {i + 1}" + ("" if _is_blank(pair) else f" (pair {str(pair).strip()!r})")


def _check_columns(df: pd.DataFrame, where: str) -> list[str]:
    """The checks on a panel's columns (`validate_panel`): a DataFrame, no duplicate column, every required
    column, at least one task column; returns the task columns."""
    if not isinstance(df, pd.DataFrame):
        raise PanelError(f"{where}: expected a pandas DataFrame, got {type(df).__name__}")
    dup_cols = sorted({str(c) for c in df.columns if list(df.columns).count(c) > 1})
    if dup_cols:
        raise PanelError(f"{where}: duplicate column name(s) {dup_cols}; each column may appear once")
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise PanelError(
            f"{where}: missing column(s) {missing}; a panel needs {list(REQUIRED_COLUMNS)} "
            f"plus at least one '{TASK_PREFIX}<task>' column; found {list(map(str, df.columns))}"
        )
    tasks = task_columns(df)
    if not tasks:
        raise PanelError(
            f"{where}: no task-change column; add at least one column named "
            f"'{TASK_PREFIX}<task>' (e.g. {TASK_PREFIX}ifeval) holding the change in points"
        )
    return tasks


def _check_pairs(out: pd.DataFrame, where: str) -> None:
    """Every pair id present and unique (`validate_panel`); turns the column into strings, in place."""
    blank_pairs = [_label(out, i) for i, v in enumerate(out["pair"]) if _is_blank(v)]
    if blank_pairs:
        raise PanelError(f"{where}: empty pair id in {', '.join(blank_pairs)}; every row needs one")
    out["pair"] = out["pair"].astype(str)
    dup = out["pair"][out["pair"].duplicated(keep=False)]
    if len(dup):
        rows = {p: [i + 1 for i in dup.index[dup == p]] for p in dict.fromkeys(dup)}
        desc = "; ".join(f"{p!r} in rows {r}" for p, r in rows.items())
        raise PanelError(f"{where}: duplicate pair id(s): {desc}; each pair may appear once")


def _numeric_column(out: pd.DataFrame, c: str, where: str) -> np.ndarray:
    """Column `c` of a panel as floats (blank -> NaN); PanelError lists every non-numeric or infinite cell."""
    values: list[float] = []
    bad: list[str] = []
    for i, v in enumerate(out[c]):
        if _is_blank(v):
            values.append(float("nan"))
            continue
        try:
            if isinstance(v, bool):
                raise ValueError
            f = float(v.strip()) if isinstance(v, str) else float(v)
        except (TypeError, ValueError):
            bad.append(f"{_label(out, i)}: {v!r}")
            continue
        if not math.isfinite(f):
            bad.append(f"{_label(out, i)}: {v!r} (not finite)")
            continue
        values.append(f)
    if bad:
        raise PanelError(
            f"{where}: column {c!r} must hold numbers (leave a cell empty when the value "
            f"is unknown); non-numeric value(s): {'; '.join(bad)}"
        )
    return np.asarray(values, dtype=float)


def validate_panel(df: pd.DataFrame, *, min_rows: int = 0, where: str = "panel") -> pd.DataFrame:
    """Check a panel against the schema and return a cleaned copy.

    Cleaned: strings stripped, ``S`` and ``delta_*`` as float (blank -> NaN), index 0..n-1.
    Raises PanelError naming the problem: a missing column, no task column, an empty or
    duplicate pair id, an unknown qk_norm value, a non-numeric or infinite number, an
    empty source, or fewer than ``min_rows`` rows. ``where`` names the panel in messages.
    """
    tasks = _check_columns(df, where)
    out = df.copy().reset_index(drop=True)
    for c in out.columns:
        if c not in ("S", *tasks):
            out[c] = [v.strip() if isinstance(v, str) else v for v in out[c]]
    _check_pairs(out, where)

    bad_qk = [
        f"{_label(out, i)}: {v!r}" for i, v in enumerate(out["qk_norm"]) if _is_blank(v) or v not in QK_NORM_TYPES
    ]
    if bad_qk:
        raise PanelError(f"{where}: qk_norm must be one of {list(QK_NORM_TYPES)}; got {'; '.join(bad_qk)}")
    for c in ("S", *tasks):
        out[c] = _numeric_column(out, c, where)

    blank_src = [_label(out, i) for i, v in enumerate(out["source"]) if _is_blank(v)]
    if blank_src:
        raise PanelError(f"{where}: empty source in {', '.join(blank_src)}; say where each row's numbers come from")
    for c in ("vlm", "llm"):
        out[c] = ["" if _is_blank(v) else str(v) for v in out[c]]

    if len(out) < min_rows:
        raise PanelError(
            f"{where}: {len(out)} pair(s) ({', '.join(out['pair']) or 'none'}); "
            f"at least {min_rows} are needed"
        )
    return out


def read_panel(path: str | Path | None = None, *, min_rows: int = 0) -> pd.DataFrame:
    """Read and validate a panel CSV (``None`` or ``""``: ``data/paper_reported.csv``)."""
    p = PAPER_CSV if path is None or (isinstance(path, str) and not path.strip()) else Path(path)
    if not p.is_file():
        raise PanelError(f"panel CSV {str(p)!r} does not exist; pass an existing file or '' for {PAPER_CSV.name}")
    try:
        with open(p, newline="", encoding="utf-8") as fh:
            lines = [r for r in csv.reader(fh) if any(c.strip() for c in r)]
    except (csv.Error, UnicodeDecodeError) as e:
        raise PanelError(f"panel CSV {str(p)!r} cannot be parsed as CSV: {e}") from None
    if not lines:
        raise PanelError(f"panel CSV {str(p)!r} is empty; it needs a header row {list(REQUIRED_COLUMNS)} + delta_* columns")
    header = [h.strip() for h in lines[0]]
    ragged = [f"line {i + 2} has {len(r)} fields" for i, r in enumerate(lines[1:]) if len(r) != len(header)]
    if ragged:
        raise PanelError(f"panel CSV {p.name}: the header has {len(header)} columns but {'; '.join(ragged)} "
                         "(quote values that contain commas)")
    raw = pd.DataFrame(lines[1:], columns=header, dtype=object)
    return validate_panel(raw, min_rows=min_rows, where=f"panel CSV {p.name}")


#: the results keys of the measured panels (the contract between the chapters that write rows and chapter 5):
#: 'pairs' = chapter 4's VL pairs of embedded models (full fine-tunes), 'tiny' = chapter 7's controlled panel of
#: tiny models, 'lora' = chapter 11's four-model panel (LoRA at chapter 10's frozen recipe): kept apart from 'pairs',
#: because pooling the two would confound the training method with the model
PANEL_KEYS: dict[str, str] = {"pairs": "panel_rows", "tiny": "tiny_panel_rows", "lora": "lora_panel_rows"}


def _results_dir(results_dir: str | Path | None) -> Path:
    if results_dir is not None:
        return Path(results_dir)
    return _default_results_dir(create=False)


def collect_panel_rows(results_dir: str | Path | None = None, panel: str = "pairs") -> pd.DataFrame:
    """All measured rows of one panel (`PANEL_KEYS`: 'pairs' reads ``results.panel_rows``, 'tiny'
    ``results.tiny_panel_rows``) of every ``*.json`` in the results folder.

    The folder is ``results_dir``, else ``sinklib.core.resources.results_dir()``. Files
    without ``panel_rows`` are skipped; a ``results_file`` column names each row's file.
    Returns an empty frame with the schema columns when there are no rows; the rows found
    are validated (PanelError names the file on a malformed JSON or a bad row).
    """
    if panel not in PANEL_KEYS:
        raise PanelError(f"parameter 'panel' got {panel!r}; allowed: {', '.join(PANEL_KEYS)}")
    key = PANEL_KEYS[panel]
    d = _results_dir(results_dir)
    rows: list[dict] = []
    for f in sorted(d.glob("*.json")) if d.is_dir() else []:
        try:
            doc = json.loads(f.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise PanelError(f"results file {str(f)!r} is not valid JSON: {e}") from None
        res = doc.get("results") if isinstance(doc, dict) else None
        pr = res.get(key) if isinstance(res, dict) else None
        if pr is None:
            continue
        if not isinstance(pr, list) or not all(isinstance(r, dict) for r in pr):
            raise PanelError(f"results file {f.name}: results.{key} must be a list of objects (one per pair)")
        rows.extend({**r, "results_file": f.name} for r in pr)
    if not rows:
        return pd.DataFrame(columns=[*REQUIRED_COLUMNS, "results_file"])
    return validate_panel(pd.DataFrame(rows), where=f"measured panel '{panel}' in {d}")


def usable(df: pd.DataFrame, task: str, predictor: str = "S") -> pd.DataFrame:
    """The rows of a validated panel where both ``predictor`` and ``task`` are present."""
    for c in (predictor, task):
        if c not in df.columns:
            raise PanelError(f"panel has no column {c!r}; task columns are {task_columns(df)}")
    return df[df[predictor].notna() & df[task].notna()].reset_index(drop=True)
