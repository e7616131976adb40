"""Signed numbers and intervals as prose and table cells show them: '+1.3 [0.0, +3.0]', never '-0.0'."""
from __future__ import annotations


def signed(value: float, digits: int = 1, minus: str = "-") -> str:
    """`value` with `digits` decimals and its sign ('+' on positives, `minus` on negatives: the claims page writes
    the typographic minus); a value that rounds to zero reads '0.0' (no '-0.0' from a tiny negative, no '+0.0')."""
    text = f"{value:+.{digits}f}"
    return f"{0:.{digits}f}" if float(text) == 0 else text.replace("-", minus)


def interval(value: float, lo: float, hi: float, digits: int = 1, minus: str = "-") -> str:
    """A change and its interval, 'v [lo, hi]', each `signed`."""
    return f"{signed(value, digits, minus)} [{signed(lo, digits, minus)}, {signed(hi, digits, minus)}]"
