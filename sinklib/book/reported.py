"""The numbers the paper reports, from the book's page of reported numbers (``data/paper_reported_values.csv``).

Every value here is **reported by the paper** (with the table or section it comes from); none was
measured in this repository. Chapters read them with ``reported(key)`` instead of typing them.
"""
from __future__ import annotations

import csv
from functools import lru_cache

from sinklib.errors import ParameterError
from sinklib.core.resources import data_path

VALUES_FILE = "paper_reported_values.csv"


@lru_cache(maxsize=1)
def reported_values() -> dict[str, dict]:
    """key -> {"claim", "value" (float), "unit", "where"} for every reported number."""
    rows = list(csv.DictReader(data_path(VALUES_FILE).open(encoding="utf-8")))
    out = {}
    for r in rows:
        if r["key"] in out:
            raise ParameterError(f"{VALUES_FILE}: key {r['key']!r} appears twice")
        out[r["key"]] = {**r, "value": float(r["value"])}
    return out


def reported(key: str) -> float:
    """One number reported by the paper, by key (see the book's page of reported numbers)."""
    vals = reported_values()
    if key not in vals:
        raise ParameterError(f"no reported value {key!r}; known keys: {', '.join(vals)}")
    return vals[key]["value"]


__all__ = ["reported", "reported_values", "VALUES_FILE"]
