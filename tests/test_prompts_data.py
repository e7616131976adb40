"""Checks on data/calibration_prompts.jsonl and on sinklib.core.data.load_prompts."""
from __future__ import annotations

import json
import re
from collections import Counter, defaultdict

import pytest

from sinklib.core.data import PROMPTS_FILE, all_prompts, load_prompts
from sinklib.errors import ParameterError

KINDS = {"instruction", "question", "prose", "dialogue", "code", "list"}
KEYS = {"id", "domain", "kind", "text"}


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    """Every record, parsed line by line straight from the file (not via sinklib)."""
    out = []
    for lineno, line in enumerate(PROMPTS_FILE.read_text(encoding="utf-8").splitlines(), 1):
        assert line.strip(), f"blank line {lineno} in {PROMPTS_FILE}"
        rec = json.loads(line)
        assert isinstance(rec, dict), f"line {lineno} is not a JSON object"
        out.append(rec)
    return out


def test_schema(rows):
    for r in rows:
        assert set(r) == KEYS, f"{r.get('id')}: keys {sorted(r)} != {sorted(KEYS)}"
        assert all(isinstance(r[k], str) for k in KEYS), r["id"]
        assert re.fullmatch(r"p\d{3}", r["id"]), r["id"]
        assert r["domain"].strip(), r["id"]


def test_count_and_unique_ids(rows):
    assert len(rows) >= 120
    ids = [r["id"] for r in rows]
    assert len(set(ids)) == len(ids), [i for i, c in Counter(ids).items() if c > 1]


def test_texts_nonempty_unique_ascii(rows):
    texts = [r["text"] for r in rows]
    assert all(t.strip() for t in texts)
    assert all(t == t.strip() for t in texts), "leading/trailing whitespace"
    norm = [" ".join(t.lower().split()) for t in texts]
    dupes = [t[:40] for t, c in Counter(norm).items() if c > 1]
    assert not dupes, dupes
    bad = [r["id"] for r in rows if not r["text"].isascii()]
    assert not bad, f"non-ASCII text in {bad}"


def test_kinds_and_mix(rows):
    kinds = Counter(r["kind"] for r in rows)
    assert set(kinds) <= KINDS, set(kinds) - KINDS
    assert set(kinds) == KINDS, f"kinds never used: {KINDS - set(kinds)}"
    assert kinds["instruction"] >= 0.25 * len(rows)
    assert kinds["prose"] >= 0.25 * len(rows)
    kinds_per_domain = defaultdict(set)
    for r in rows:
        kinds_per_domain[r["domain"]].add(r["kind"])
    rich = [d for d, ks in kinds_per_domain.items() if len(ks) >= 3]
    assert len(rich) >= 6, f"only {rich} cover >= 3 kinds"


def test_length_spread(rows):
    words = sorted(len(r["text"].split()) for r in rows)
    assert words[0] < 15, words[0]
    assert words[-1] > 100, words[-1]
    medium = sum(30 <= w <= 80 for w in words)
    assert medium >= 0.3 * len(words), f"only {medium} prompts of 30-80 words"


def test_all_prompts_matches_file(rows):
    assert all_prompts() == rows
    assert load_prompts() == [r["text"] for r in rows]


def test_load_prompts_deterministic_per_seed(rows):
    a = load_prompts(15, seed=0)
    assert a == load_prompts(15, seed=0)
    assert len(a) == 15 and len(set(a)) == 15
    assert set(a) <= {r["text"] for r in rows}


def test_load_prompts_differs_across_seeds():
    samples = {tuple(load_prompts(15, seed=s)) for s in range(5)}
    assert len(samples) == 5


def test_load_prompts_full_size(rows):
    everything = load_prompts(len(rows), seed=3)
    assert sorted(everything) == sorted(r["text"] for r in rows)


@pytest.mark.parametrize("n", [0, -1, "too_many"])
def test_load_prompts_rejects_bad_n(rows, n):
    if n == "too_many":
        n = len(rows) + 1
    with pytest.raises(ParameterError, match="n_prompts"):
        load_prompts(n, seed=0)
