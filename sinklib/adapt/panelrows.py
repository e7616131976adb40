"""Chapter 11's pairs as numbers: each pair's changes from its base model pooled over the training seeds
(`sinklib.evals.pooling.pooled`, the interval method of chapter 4's rows) and the precondition of the primary test.
The rate walk (`sinklib.adapt.ratechoice`) reads them to choose a rate, the chapter and the claims page to show them
(`sinklib.claims.ch11` re-exports them)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from sinklib.adapt.primary import PRIMARY
from sinklib.evals.pooling import pooled


#: the metrics of the panel's table: the primary one, the strict and lenient math pair, knowledge
METRICS = (PRIMARY, "math strict", "math lenient", "knowledge acc")


def condition_name(kind: str, seed: int, first: int) -> str:
    """How a seed's condition is named in the outcomes (chapter 4's layout: 'vl', 'vl seed 1', ...)."""
    return kind if seed == first else f"{kind} seed {seed}"


def outcomes_doc(panel: Mapping[str, Any], first_seed: int) -> dict:
    """`run_panel`'s evaluations in the layout the claims page pools (`sinklib.evals.pooling.pooled`):
    {'results': {'outcomes': {model: {'base' | 'vl' | 'vl seed 1' | 'text_only' | ...: packed outcomes}}}}."""
    from sinklib.evals.paired import pack

    out: dict = {m: {"base": pack(ev["outcomes"])} for m, ev in panel["base"].items()}
    for (m, s, k), ev in panel["evals"].items():
        out[m][condition_name(k, s, first_seed)] = pack(ev["outcomes"])
    return {"results": {"outcomes": out}}


def pair_rows(panel: Mapping[str, Any], first_seed: int, image_size: int) -> pd.DataFrame:
    """One row per model: its base S, VQA (mean over seeds) and whether every VL seed learned the task
    (`vl.against_majority`), and each metric's VL change from base pooled over the training seeds
    (`sinklib.evals.pooling.pooled`: the items and the seeds resampled), the same for text-only and VL minus text-only
    (the controlled contrast, seed by seed), and the precondition of the primary test: the task learned and
    knowledge held (its pooled interval not below zero)."""
    from sinklib.vl import against_majority

    doc = outcomes_doc(panel, first_seed)
    rows = []
    for m, base in panel["base"].items():
        vls = [ev for (mm, _, k), ev in panel["evals"].items() if mm == m and k == "vl"]
        checks = [against_majority(*ev["vqa"], 0, image_size) for ev in vls if ev.get("vqa")]
        row: dict = {"model": m, "S": base["S"], "seeds": len(vls),
                     "VQA": float(np.mean([c["vqa"] for c in checks])) if checks else float("nan"),
                     "majority": checks[0]["majority"] if checks else float("nan"),
                     "learned": bool(checks) and all(c["learned"] for c in checks)}
        outs = doc["results"]["outcomes"][m]
        for metric in METRICS:
            row[f"VL: {metric}"] = pooled(doc, m, "vl", "base", [metric])[0] if "vl" in outs else None
            row[f"text-only: {metric}"] = (pooled(doc, m, "text_only", "base", [metric])[0]
                                           if "text_only" in outs else None)
        row["VL minus text-only: " + PRIMARY] = (pooled(doc, m, "vl", "text_only", [PRIMARY])[0]
                                                 if "vl" in outs and "text_only" in outs else None)
        k = row["VL: knowledge acc"]
        row["precondition"] = row["learned"] and k is not None and not k.hi < 0
        rows.append(row)
    return pd.DataFrame(rows)


def records(rows: pd.DataFrame) -> list[dict]:
    """`pair_rows` as the results file stores them: one dict a pair, each change `Est` as a [v, lo, hi] list."""
    return [{k: (list(v) if isinstance(v, tuple) else v) for k, v in r.items()} for r in rows.to_dict(orient="records")]
