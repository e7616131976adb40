"""Names the pages say in words, kept in one place: the QK-norm kinds (`lm.qk_norm`, a tiny model's variant)."""
from __future__ import annotations

#: QK-norm kinds in words
QK_NORM_WORDS = {"none": "no QK-norm", "per_head": "per-head QK-norm", "layerwise": "layerwise QK-norm"}


def qk_norm_words(kind: str, with_: bool = False) -> str:
    """'none' -> 'no QK-norm', 'per_head' -> 'per-head QK-norm' (other kinds with '-' for '_'); with `with_`:
    'without QK-norm', 'with per-head QK-norm' (to follow a noun: "models with per-head QK-norm")."""
    words = QK_NORM_WORDS.get(str(kind), f"{str(kind).replace('_', '-')} QK-norm")
    if not with_:
        return words
    return "without QK-norm" if str(kind) == "none" else f"with {words}"
