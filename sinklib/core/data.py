"""The calibration prompts (shipped with sinklib: ``data/calibration_prompts.jsonl``)."""
from __future__ import annotations

import json
import random

from sinklib.errors import ParameterError
from sinklib.core.params import check_int
from sinklib.core.resources import data_path

PROMPTS_FILE = data_path("calibration_prompts.jsonl")


def all_prompts() -> list[dict]:
    """Every calibration prompt record: {"id", "domain", "kind", "text"}."""
    rows = [json.loads(line) for line in PROMPTS_FILE.read_text(encoding="utf-8").splitlines() if line.strip()]
    for r in rows:
        if not str(r.get("text", "")).strip():
            raise ParameterError(f"calibration prompt {r.get('id')!r} in {PROMPTS_FILE.name} is empty")
    return rows


def load_prompts(n: int | None = None, seed: int = 0) -> list[str]:
    """A seeded sample of n calibration prompts (all of them, in file order, when n is None)."""
    rows = all_prompts()
    if n is None:
        return [r["text"] for r in rows]
    n = check_int("n_prompts", n, 1, len(rows))
    seed = check_int("seed", seed)
    idx = random.Random(seed).sample(range(len(rows)), n)
    return [rows[i]["text"] for i in idx]
