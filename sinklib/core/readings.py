"""Reading chapter 1's and 2's tables in words (the chapters' prose comes from these): rankings that flip under a
choice of S (`ordering_flips`), the direction of the aggregation choice (`aggregate_direction`), whether S keeps
its sign over calibration sets (`sign_note`), the first-token experiment (`first_token_reading`) and per-layer
sink mass as text (`layer_means_text`). Re-exported by `sinklib.core.sink`."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def ordering_flips(table, main: dict) -> list[tuple[str, str]]:
    """Rows (choice, value) of a sensitivity table [rows x 2 models of S] under which the two models rank
    the other way round than their default S (``main[name].S``). Empty for other than two models."""
    if table.shape[1] != 2:
        return []
    a, b = table.columns
    default = main[a].S > main[b].S
    return [idx for idx, row in table.iterrows() if (row[a] > row[b]) != default]


def aggregate_direction(table) -> str:
    """Whether ``logodds_then_mean`` gives a higher or lower S than ``mass_then_logodds``, per model, in
    words, from the "aggregate" rows of a sensitivity table."""
    agg = table.xs("aggregate", level=0)
    diff = agg.loc["logodds_then_mean"] - agg.loc["mass_then_logodds"]
    higher, lower = [m for m, d in diff.items() if d > 0], [m for m, d in diff.items() if d < 0]
    if not lower:
        return "higher for every model" if higher else "equal for every model"
    if not higher:
        return "lower for every model"
    return f"higher for {', '.join(higher)} and lower for {', '.join(lower)}"


def sign_note(values) -> str:
    """One sentence on whether each model's S (columns of `values`, one row per calibration set) keeps its sign."""
    changes = [c for c in values.columns if (values[c] > 0).any() and (values[c] < 0).any()]
    if not changes:
        return "Each model's S keeps its sign over every calibration set."
    return f"The S of {', '.join(changes)} changes sign from one calibration set to another."


def first_token_reading(masses: dict[str, dict[str, float]], ratio: float = 0.5) -> str:
    """Chapter 1's first-token experiment in words: for each model, is the sink positional (an ordinary word
    first keeps at least `ratio` of the default sink mass) or tied to the default first token (it keeps less)?

    masses: model -> {variant of FIRST_TOKEN_VARIANTS: mean sink mass}.
    """
    parts = []
    for model, m in masses.items():
        kept = m["word"] / m["default"] if m["default"] > 0 else float("nan")
        kind = "positional" if kept >= ratio else "tied to its default first token"
        parts.append(f"{model}'s mean sink mass is {m['default']:.3f} with its default first token, "
                     f"{m['none']:.3f} with no special token and {m['word']:.3f} with an ordinary word first "
                     f"({kept:.0%} kept): its sink is {kind}.")
    return " ".join(parts)


def layer_means_text(mass: np.ndarray, layers: Sequence[int], per_line: int = 10) -> str:
    """Per-layer mean sink mass of a [L, H] map as short text lines ("L0 0.01  L1 0.70 ...")."""
    cells = [f"L{l} {m:.2f}" for l, m in zip(layers, np.asarray(mass).mean(axis=1))]
    return "\n".join("  ".join(cells[i:i + per_line]) for i in range(0, len(cells), per_line))
