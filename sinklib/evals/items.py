"""Evaluation items: the files under ``data/evals/``, the seeded arithmetic generator that wrote
``math.jsonl``, and the real IFEval prompts from the hub (``source="ifeval"``, the Colab path)."""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from sinklib.core.resources import data_path
from sinklib.errors import ModelNotAvailable, ParameterError

EVALS = data_path("evals")
FILES = {
    "instructions": EVALS / "instructions.jsonl",
    "instructions_powered": EVALS / "instructions_powered.jsonl",
    "instructions_fewshot": EVALS / "instructions_fewshot.jsonl",
    "math": EVALS / "math.jsonl",
    "math_fewshot": EVALS / "math_fewshot.jsonl",
    "knowledge": EVALS / "knowledge.jsonl",
    "heldout": EVALS / "heldout.txt",
}


def read_jsonl(path: Path) -> list[dict]:
    rows = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ParameterError(f"{path}:{n}: not valid JSON ({e.msg})") from None
    return rows


def _require(path: Path, row: dict, keys: tuple[str, ...], n: int) -> None:
    missing = [k for k in keys if k not in row]
    if missing:
        raise ParameterError(f"{path} item {n}: missing field(s) {', '.join(missing)}; needs {', '.join(keys)}")


def validate_instruction_items(rows: list[dict], path: Path | str = "instructions", local: bool = True) -> list[dict]:
    """Check fields, known instruction ids, no falsy kwargs (lm-eval drops them and then draws a
    random value), and, for local items, none of the ids that need nltk's punkt_tab."""
    from sinklib.evals.grading import NEEDS_PUNKT, ifeval_modules

    known = ifeval_modules()["instructions_registry"].INSTRUCTION_DICT
    for n, r in enumerate(rows):
        _require(Path(path), r, ("prompt", "instruction_id_list", "kwargs"), n)
        if len(r["kwargs"]) != len(r["instruction_id_list"]):
            raise ParameterError(f"{path} item {n}: {len(r['kwargs'])} kwargs dicts for "
                                 f"{len(r['instruction_id_list'])} instruction ids")
        for iid, kw in zip(r["instruction_id_list"], r["kwargs"]):
            if iid not in known:
                raise ParameterError(f"{path} item {n}: unknown instruction id {iid!r}")
            if local and iid in NEEDS_PUNKT:
                raise ParameterError(f"{path} item {n}: {iid!r} needs nltk punkt_tab data; not usable offline")
            if local:
                falsy = [k for k, v in kw.items() if not v]
                if falsy:
                    raise ParameterError(f"{path} item {n}: kwargs {falsy} are falsy; lm-eval drops them and "
                                         "would draw random values instead")
    return rows


def load_instruction_items() -> list[dict]:
    """The local verifiable-instruction items (``data/evals/instructions.jsonl``)."""
    return validate_instruction_items(read_jsonl(FILES["instructions"]), FILES["instructions"])


def load_powered_instruction_items() -> list[dict]:
    """The powered suite (``data/evals/instructions_powered.jsonl``, written by
    ``sinklib.evals.powered.generate_instruction_items``): the 72 hand-written items first, then generated ones."""
    return validate_instruction_items(read_jsonl(FILES["instructions_powered"]), FILES["instructions_powered"])


def load_instruction_suite(n_items: int | None = None) -> list[dict]:
    """The items an instruction-suite run samples from: the hand-written items while `n_items` is None or at
    most their number (so every evaluation asked for that many keeps its items and its cache key), the powered
    suite when more are asked for (`instructions_uses_powered`)."""
    core = load_instruction_items()
    return load_powered_instruction_items() if instructions_uses_powered(n_items, len(core)) else core


def instructions_uses_powered(n_items: int | None, n_core: int | None = None) -> bool:
    """Whether `n_items` instruction items come from the powered suite (more than the hand-written file holds)."""
    if n_core is None:
        n_core = sum(1 for line in FILES["instructions"].read_text(encoding="utf-8").splitlines() if line.strip())
    return n_items is not None and n_items > n_core


def load_instruction_fewshot() -> list[dict]:
    """Worked examples (prompt, ids, kwargs, response) for the plain few-shot prompt of base models."""
    rows = read_jsonl(FILES["instructions_fewshot"])
    for n, r in enumerate(rows):
        _require(FILES["instructions_fewshot"], r, ("prompt", "instruction_id_list", "kwargs", "response"), n)
    return rows


def load_ifeval_items() -> list[dict]:
    """The real IFEval prompts (google/IFEval, 541 items) through ``datasets`` (needs network).

    Raises ModelNotAvailable with the pip command when ``datasets`` is missing, and with the cause
    when the hub cannot be reached.
    """
    try:
        import datasets
    except ImportError:
        raise ModelNotAvailable(
            "source='ifeval' loads google/IFEval with the `datasets` package, which is not installed; "
            "install it with: pip install datasets (and run with network access, e.g. on Colab), "
            "or use source='local' for the offline items") from None
    try:
        ds = datasets.load_dataset("google/IFEval", split="train")
    except Exception as e:  # the network boundary: connection, offline mode, hub errors
        raise ModelNotAvailable(
            f"could not load google/IFEval from the Hugging Face hub ({type(e).__name__}: "
            f"{str(e).strip().splitlines()[0][:200] if str(e).strip() else 'no message'}). source='ifeval' needs "
            "network access (and HF_HUB_OFFLINE / HF_DATASETS_OFFLINE unset); offline, use source='local'") from None
    rows = [{"key": int(r["key"]), "prompt": r["prompt"], "instruction_id_list": list(r["instruction_id_list"]),
             "kwargs": [dict(k) for k in r["kwargs"]]} for r in ds]
    return validate_instruction_items(rows, "google/IFEval", local=False)


def load_knowledge_items() -> list[dict]:
    """Multiple-choice items: question, choices, answer (index), category; ``passage`` for yes/no items.

    Scored cloze style (the choice text follows "Answer:"). Yes/no items (BoolQ-like: a passage and a
    question) offer the negated and the affirmative statement as choices 0 and 1: with bare " no" /
    " yes" both embedded models answer one word to every question (50 %, chance), so the bare format
    could not show a change.
    """
    rows = read_jsonl(FILES["knowledge"])
    for n, r in enumerate(rows):
        _require(FILES["knowledge"], r, ("question", "choices", "answer", "category"), n)
        if not (isinstance(r["answer"], int) and 0 <= r["answer"] < len(r["choices"]) and len(r["choices"]) >= 2):
            raise ParameterError(f"{FILES['knowledge']} item {n}: answer {r['answer']!r} is not an index "
                                 f"into {len(r['choices'])} choices (need >= 2)")
    return rows


def load_heldout() -> list[str]:
    """Held-out paragraphs for perplexity (``data/evals/heldout.txt``, separated by blank lines)."""
    text = FILES["heldout"].read_text(encoding="utf-8")
    paras = [" ".join(p.split()) for p in text.split("\n\n") if p.strip() and not p.lstrip().startswith("#")]
    if not paras:
        raise ParameterError(f"{FILES['heldout']} holds no paragraphs")
    return paras


def load_math_items() -> list[dict]:
    """Arithmetic word problems: question, answer (int), template (written by ``generate_math_items``)."""
    rows = read_jsonl(FILES["math"])
    for n, r in enumerate(rows):
        _require(FILES["math"], r, ("question", "answer"), n)
        if not isinstance(r["answer"], int):
            raise ParameterError(f"{FILES['math']} item {n}: answer must be an integer")
    return rows


def load_math_fewshot() -> list[dict]:
    """Worked examples (question, solution ending in 'The answer is N.', answer)."""
    rows = read_jsonl(FILES["math_fewshot"])
    for n, r in enumerate(rows):
        _require(FILES["math_fewshot"], r, ("question", "solution", "answer"), n)
    return rows


# ---------------------------------------------------------------------------------------------
# the seeded arithmetic generator

_NAMES = ["Ana", "Ben", "Chloe", "David", "Emma", "Farid", "Grace", "Hugo", "Ines", "Jack", "Kofi", "Lena",
          "Marco", "Nora", "Omar", "Priya", "Quinn", "Rosa", "Sam", "Tara"]
_ITEMS = ["apples", "pencils", "stickers", "marbles", "books", "cookies", "stamps", "shells", "cards", "eggs"]


def _t_add(r: random.Random) -> tuple[str, int]:
    n, it, a, b = r.choice(_NAMES), r.choice(_ITEMS), r.randint(2, 20), r.randint(2, 20)
    return f"{n} has {a} {it}. {n} gets {b} more {it}. How many {it} does {n} have now?", a + b


def _t_sub(r: random.Random) -> tuple[str, int]:
    n, it, b = r.choice(_NAMES), r.choice(_ITEMS), r.randint(2, 15)
    a = b + r.randint(2, 20)
    return f"{n} has {a} {it}. {n} gives {b} {it} to a friend. How many {it} does {n} have left?", a - b


def _t_mul(r: random.Random) -> tuple[str, int]:
    it, a, b = r.choice(_ITEMS), r.randint(2, 9), r.randint(2, 9)
    return f"A box holds {a} {it}. How many {it} are in {b} boxes?", a * b


def _t_div(r: random.Random) -> tuple[str, int]:
    it, a, b = r.choice(_ITEMS), r.randint(2, 9), r.randint(2, 6)
    return f"{a * b} {it} are shared equally among {b} children. How many {it} does each child get?", a


def _t_money(r: random.Random) -> tuple[str, int]:
    n, a, b = r.choice(_NAMES), r.randint(2, 9), r.randint(2, 6)
    return f"A notebook costs {a} dollars. {n} buys {b} notebooks. How many dollars does {n} spend?", a * b


def _t_two_step(r: random.Random) -> tuple[str, int]:
    n, it, a, b = r.choice(_NAMES), r.choice(_ITEMS), r.randint(5, 20), r.randint(2, 10)
    c = r.randint(1, a + b - 1)
    return (f"{n} has {a} {it}. {n} finds {b} more {it} and then gives away {c} {it}. "
            f"How many {it} does {n} have now?", a + b - c)


MATH_TEMPLATES = {"add": _t_add, "sub": _t_sub, "mul": _t_mul, "div": _t_div, "money": _t_money,
                  "two_step": _t_two_step}


def generate_math_items(n: int = 60, seed: int = 0, templates: tuple[str, ...] | None = None) -> list[dict]:
    """``n`` arithmetic word problems, cycling over the templates, drawn by a seeded generator.

    Deterministic: the same (n, seed, templates) always gives the same items (``math.jsonl`` is
    ``generate_math_items(300, seed=0)``; a test checks the file against the generator and every answer
    against an independent solver).
    """
    names = tuple(templates or MATH_TEMPLATES)
    for t in names:
        if t not in MATH_TEMPLATES:
            raise ParameterError(f"parameter 'templates' has {t!r}; allowed: {', '.join(MATH_TEMPLATES)}")
    r = random.Random(seed)
    rows, seen = [], set()
    while len(rows) < n:
        t = names[len(rows) % len(names)]
        q, a = MATH_TEMPLATES[t](r)
        if q in seen:
            continue
        seen.add(q)
        rows.append({"key": len(rows), "template": t, "question": q, "answer": int(a)})
    return rows


#: the files behind each suite (items and worked examples)
SUITE_FILES = {"instructions": ("instructions", "instructions_fewshot"), "math": ("math", "math_fewshot"),
               "knowledge": ("knowledge",), "perplexity": ("heldout",)}


def fingerprint(suites) -> str:
    """16 hex digits of the item files of `suites` (names, or an `eval_n` mapping suite -> items whose suites
    with items > 0 count; suites not in `SUITE_FILES`, such as chapter 7's generated ones, are skipped): part of
    every cached evaluation's key, so that editing an item file can never return scores of the old items. The
    powered instruction file counts only when the mapping asks for more instruction items than the hand-written
    file holds (`instructions_uses_powered`)."""
    import hashlib

    powered = False
    if isinstance(suites, dict):
        powered = instructions_uses_powered(suites.get("instructions"))
        suites = [k for k, v in suites.items() if v]
    h = hashlib.sha256()
    for s in sorted(suites):
        for f in SUITE_FILES.get(s, ()):
            h.update(f"{s}/{f}:".encode() + FILES[f].read_bytes())
        if s == "instructions" and powered:  # only then: the keys of every evaluation on <= 72 items stay as they were
            h.update(b"instructions/instructions_powered:" + FILES["instructions_powered"].read_bytes())
    return h.hexdigest()[:16]


def sample(rows: list[Any], n_items: int | None, seed: int) -> list[Any]:
    """A seeded sample of ``n_items`` rows kept in file order (all rows when n_items is None)."""
    if n_items is None or n_items >= len(rows):
        return list(rows)
    idx = sorted(random.Random(seed).sample(range(len(rows)), n_items))
    return [rows[i] for i in idx]
