"""Reading chapter 1's and 2's tables in words (the chapters' prose comes from these): rankings that change under a
choice of S (`ordering_flips`, `flips_text`), the direction of the aggregation choice (`aggregate_direction`), whether
S keeps its sign over calibration sets (`sign_note`) and whether each pairwise margin does (`pair_margins`,
`margin_note`), the first-token experiment (`first_token_reading`) and per-layer sink mass as text
(`layer_means_text`). Any number of models. Re-exported by `sinklib.core.sink`."""
from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

import numpy as np


def swapped_pairs(row, default: dict[str, float]) -> list[tuple[str, str]]:
    """Pairs (a, b) of models, a ranked above b by their `default` S, that rank the other way round (or tie) in
    `row` (a mapping model -> S, e.g. one row of a sensitivity table)."""
    order = sorted((m for m in default if m in row), key=lambda m: -default[m])
    return [(a, b) for a, b in combinations(order, 2) if default[a] != default[b] and row[a] <= row[b]]


def ordering_flips(table, main: dict) -> list[tuple[str, str]]:
    """Rows (choice, value) of a sensitivity table [rows x models of S] under which at least one pair of models
    ranks the other way round than by their default S (``main[name].S``). Empty for fewer than two models."""
    default = {m: main[m].S for m in table.columns}
    return [idx for idx, row in table.iterrows() if swapped_pairs(row, default)]


def flips_text(table, main: dict) -> str:
    """`ordering_flips` in words, each row with the pairs that swap: "K (last layers) = all layers (a and b swap);
    ...", or "none of them"."""
    default = {m: main[m].S for m in table.columns}
    parts = []
    for (choice, value), row in table.iterrows():
        pairs = swapped_pairs(row, default)
        if pairs:
            parts.append(f"{choice} = {value} (" + ", ".join(f"{a} and {b}" for a, b in pairs) + " swap)")
    return "; ".join(parts) if parts else "none of them"


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


def pair_margins(values, order: dict[str, float] | None = None):
    """Every pairwise margin of S over calibration sets: `values` has one column of S per model and one row per
    (N, seed) cell. Each pair (a, b) is oriented so that a ranks above b by `order` (e.g. the default S; by the
    mean over the cells when None). -> DataFrame, one row per pair: pair ("S(a) − S(b)"), a, b, min, max,
    cells, sign flips (cells where the margin is not positive)."""
    import pandas as pd

    ref = dict(order) if order is not None else {c: float(values[c].mean()) for c in values.columns}
    models = sorted((c for c in values.columns if c in ref), key=lambda m: -ref[m])
    rows = []
    for a, b in combinations(models, 2):
        d = values[a] - values[b]
        rows.append({"pair": f"S({a}) − S({b})", "a": a, "b": b, "min": float(d.min()), "max": float(d.max()),
                     "cells": int(len(d)), "sign flips": int((d <= 0).sum())})
    return pd.DataFrame(rows, columns=["pair", "a", "b", "min", "max", "cells", "sign flips"])


def margin_note(margins) -> str:
    """One sentence on whether each pairwise margin of `pair_margins` keeps its sign over the (N, seed) cells."""
    if not len(margins):
        return "With one model there is no margin between models."
    n = int(margins["cells"].max())
    flipped = margins[margins["sign flips"] > 0]
    if not len(flipped):
        low = margins.loc[margins["min"].idxmin()]
        if len(margins) == 1:
            return f"The margin {low['pair']} keeps its sign in all {n} (N, seed) cells (smallest {low['min']:+.3f})."
        return (f"Every one of the {len(margins)} pairwise margins keeps its sign in all {n} (N, seed) cells; the "
                f"smallest is {low['pair']} = {low['min']:+.3f}.")
    each = ", ".join(f"{r['pair']} is not positive in {r['sign flips']} of {r['cells']}" for _, r in flipped.iterrows())
    if len(margins) == 1:
        return f"The margin changes sign over the (N, seed) cells: {each}."
    return (f"{len(margins) - len(flipped)} of the {len(margins)} pairwise margins keep their sign in all {n} (N, seed) "
            f"cells; {each}.")


def first_token_reading(masses: dict[str, dict[str, float]], ratio: float = 0.5,
                        first_tokens: dict[str, dict[str, str]] | None = None) -> str:
    """Chapter 1's first-token experiment in words: for each model, is the sink positional (an ordinary word
    first keeps at least `ratio` of the default sink mass) or tied to the default first token (it keeps less)?
    A forced BOS token that keeps less than `ratio` of it is said too.

    masses: model -> {variant of FIRST_TOKEN_VARIANTS: mean sink mass}; first_tokens (optional): model ->
    {variant: the first token as text}, to name the tokens and to say when the tokenizer adds no special token
    (the default and the 'none' variant start with the same token).
    """
    parts = []
    for model, m in masses.items():
        tok = (first_tokens or {}).get(model, {})
        kept = m["word"] / m["default"] if m["default"] > 0 else float("nan")
        if tok.get("default") and tok.get("default") == tok.get("none"):
            head = f"{model} (its tokenizer adds no special token: the prompt's own first word, {tok['default']}, comes first)"
        else:
            head = model + (f" (default first token {tok['default']})" if tok.get("default") else "")
        bos = ""
        if "bos" in m:
            bos = f"{m['bos']:.3f} with its BOS token" + (f" ({tok['bos']})" if tok.get("bos") else "") + " forced first, "
        positional = kept >= ratio
        kind = ("positional: it stays at position 0 whatever ordinary word is there" if positional else
                "tied to its default first token (measured at position 0: without that token the attention may "
                "sit elsewhere)")
        if "bos" in m and m["default"] > 0 and m["bos"] < ratio * m["default"]:
            share = f"{m['bos'] / m['default']:.0%}"
            kind += (f", except its own BOS token, which, put first, keeps only {share} of it" if positional else
                     f"; its BOS token put first keeps {share} of it")
        parts.append(f"{head}: mean sink mass {m['default']:.3f} with the default first token, {bos}"
                     f"{m['none']:.3f} with no special token and {m['word']:.3f} with an ordinary word first "
                     f"({kept:.0%} kept); its sink is {kind}.")
    return " ".join(parts)


def layer_means_text(mass: np.ndarray, layers: Sequence[int], per_line: int = 10) -> str:
    """Per-layer mean sink mass of a [L, H] map as short text lines ("L0 0.01  L1 0.70 ...")."""
    cells = [f"L{l} {m:.2f}" for l, m in zip(layers, np.asarray(mass).mean(axis=1))]
    return "\n".join("  ".join(cells[i:i + per_line]) for i in range(0, len(cells), per_line))
