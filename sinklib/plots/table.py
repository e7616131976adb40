"""Tables as the book shows them: formatted frames with a legend line, their estimated rendered width, and frames
split into parts that fit the output column."""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: the width of a chapter's output column in the rendered book at a 1280 px window (px); wider figures
#: and tables are scaled down or overflow
COLUMN_PX = 688


#: estimated px of one character of a table cell, and the padding of one column (both generous: the
#: estimate is an upper bound of the rendered width measured in Chromium)
CHAR_PX = 9.3
CELL_PAD_PX = 16


@dataclass
class Table:
    """A table for display: `frame` (already formatted) and a `legend` line shown under it."""

    frame: Any
    legend: str = ""

    def _repr_html_(self) -> str:
        import html

        import pandas as pd

        with pd.option_context("display.max_colwidth", None):  # a cell is never cut short with '...'
            out = self.frame.to_html(border=0, na_rep="", escape=True)
        if self.legend:
            out += f'\n<p class="table-legend">{html.escape(self.legend)}</p>'
        return f"<div>{out}</div>"

    def __repr__(self) -> str:
        import pandas as pd

        with pd.option_context("display.max_colwidth", None):
            return self.frame.to_string(na_rep="") + (f"\n{self.legend}" if self.legend else "")

    def width_px(self) -> float:
        return table_width_px(self.frame)


def _cells(values: Sequence[Any]) -> list[str]:
    return ["" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v) for v in values]


def table_width_px(frame) -> float:
    """Upper estimate of the rendered width (px) of `frame` as a book table: per column (index levels
    included) its longest unbreakable word, in header or cells, at CHAR_PX per character plus padding."""
    import pandas as pd

    columns = []
    idx = frame.index
    for level in range(idx.nlevels):
        vals = idx.get_level_values(level) if isinstance(idx, pd.MultiIndex) else idx
        name = idx.names[level] if idx.names[level] is not None else ""
        columns.append(_cells([name, *vals]))
    for j in range(frame.shape[1]):
        head = frame.columns[j] if isinstance(frame.columns[j], tuple) else (frame.columns[j],)
        columns.append(_cells([*head, *frame.iloc[:, j]]))
    return sum(max((len(w) for v in col for w in v.split()), default=0) * CHAR_PX + CELL_PAD_PX for col in columns)


def fmt(values, digits: int = 1, *, signed: bool = False) -> list[str]:
    """Numbers as text with `digits` decimals ('' for a missing value; '+' on positives if `signed`)."""
    spec = f"{'+' if signed else ''}.{digits}f"
    return ["" if v is None or (isinstance(v, float) and math.isnan(v)) else format(float(v), spec) for v in values]


#: below this size a number in a table is floating-point noise around zero (a mean of an exactly symmetric null)
ZERO_BELOW = 1e-12


def number_text(value, digits: int = 3) -> str:
    """A number for a table cell with `digits` decimals, except that a value that is not zero never reads as zero
    (it gets `digits` significant digits instead: 0.000145, 2.5e-07) and no zero reads '-0.000'; '' when missing.
    A value smaller than ZERO_BELOW is zero."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    v = float(value)
    v = 0.0 if abs(v) < ZERO_BELOW else v
    text = f"{v:.{digits}f}"
    if float(text) == 0:
        text = f"{v:.{digits}g}" if v != 0 else f"{0.0:.{digits}f}"
    return text


def short_label(name: str, abbreviations: dict[str, str] | None = None) -> str:
    """A column or task name for display: `abbreviations` applied word by word, underscores as spaces (so
    the browser can wrap it)."""
    words = str(name).replace("_", " ").split()
    ab = abbreviations or {}
    return " ".join(ab.get(w, w) for w in words)


def split_to_fit(frame, max_px: float = COLUMN_PX) -> list:
    """`frame` as one or more frames of consecutive columns (each with the full index), each estimated
    (`table_width_px`) to fit `max_px`; a single column wider than that stays alone."""
    parts, start = [], 0
    while start < frame.shape[1]:
        stop = start + 1
        while stop < frame.shape[1] and table_width_px(frame.iloc[:, start:stop + 1]) <= max_px:
            stop += 1
        parts.append(frame.iloc[:, start:stop])
        start = stop
    return parts or [frame]


def tables(frame, legend: str = "", max_px: float = COLUMN_PX) -> list[Table]:
    """`split_to_fit` as Tables; the legend goes under the last one."""
    parts = split_to_fit(frame, max_px)
    return [Table(p, legend if i == len(parts) - 1 else "") for i, p in enumerate(parts)]


def show(*items) -> None:
    """Display Tables (or lists of them) one after another in a notebook."""
    from IPython.display import display

    for it in items:
        for t in (it if isinstance(it, (list, tuple)) else [it]):
            display(t)
