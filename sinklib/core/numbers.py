"""Signed numbers and intervals as prose and table cells show them: '+1.3 [0.0, +3.0]', never '-0.0'."""
from __future__ import annotations


def signed(value: float, digits: int = 1, minus: str = "-") -> str:
    """`value` with `digits` decimals and its sign ('+' on positives, `minus` on negatives: the claims page writes
    the typographic minus); a value that rounds to zero reads '0.0' (no '-0.0' from a tiny negative, no '+0.0')."""
    text = f"{value:+.{digits}f}"
    return f"{0:.{digits}f}" if float(text) == 0 else text.replace("-", minus)


def interval(value: float, lo: float, hi: float, digits: int = 1, minus: str = "-") -> str:
    """A change and its interval, 'v [lo, hi]', each `signed`; an endpoint that is not zero but rounds to zero at
    `digits` gets more decimals (`endpoint`: '[-27.8, +0.04]'), since its sign decides whether the interval excludes
    zero."""
    return f"{signed(value, digits, minus)} [{endpoint(lo, digits, minus)}, {endpoint(hi, digits, minus)}]"


def endpoint(value: float, digits: int = 1, minus: str = "-", most: int = 3) -> str:
    """An interval's endpoint: `signed`, with up to `most` more decimals where it is not zero but would read as zero
    (its sign decides whether the interval excludes zero); one that reads zero even then stays '0.0'."""
    for d in range(digits, digits + most + 1):
        if round(value, d) != 0:
            return signed(value, d, minus)
    return signed(value, digits, minus)


def direction(lo: float, hi: float, within: str = "did not move outside the noise", up: str = "rose",
              down: str = "fell") -> str:
    """The word for a change whose interval is [lo, hi]: `down` when it lies wholly below zero, `up` when wholly
    above, else `within` (the one rule every generated sentence of a direction uses)."""
    return down if hi < 0 else up if lo > 0 else within
