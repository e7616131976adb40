"""Collision check by construction (#29): does a control's training data teach an answer format to a kind of
question that an evaluation suite grades strictly in another format?

A training example and an evaluation item share a *template* when their questions open the same way: a yes/no
question by its first word ("Is there a red circle?" and "Is the sun a star?" are both ``is ...?``), any other
question by its first two words ("How many shapes are there?" and "... How many apples does Ana have now?" are
both ``how many ...?``); the question of a text is its last sentence ending in "?" (an instruction without one
has the template of its first word, ``write ...``). For each shared template the check asks the suite's own
strict grader whether it accepts the answers the training data teaches: when it rejects them, fine-tuning on
that data teaches the model to answer those evaluation questions in a format the suite scores as wrong, which
is a collision (a change of the strict score would then measure the training data, not the adaptation).
"""
from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sinklib.errors import ParameterError

#: first words of yes/no questions: their template is the first word alone
POLAR = ("is", "are", "am", "was", "were", "can", "could", "do", "does", "did", "should", "shall", "will", "would",
         "has", "have", "had", "may", "might", "must")

#: at most this many items and answers of one template are graded against each other
MAX_GRADED = 25


@dataclass(frozen=True)
class EvalItem:
    """An evaluation item for the check: its suite, text (the question or prompt), what its strict grader wants
    (words) and the grader itself (answer text -> accepted?), None when the suite is scored by likelihood."""

    suite: str
    text: str
    expects: str
    accepts: Callable[[str], bool] | None


def question_of(text: str) -> str:
    """The last sentence of `text` that ends in '?', else its first sentence (an instruction)."""
    sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+|\n+", text.strip()) if s.strip()]
    if not sentences:
        raise ParameterError("collision check: an empty question or prompt has no template")
    asked = [s for s in sentences if s.endswith("?")]
    return asked[-1] if asked else sentences[0]


def template(text: str) -> str:
    """'is ...?' for a yes/no question, 'how many ...?' for another question, 'write ...' for an instruction."""
    q = question_of(text)
    words = re.findall(r"[a-z']+", q.lower())
    if not words:
        return ""
    if not q.endswith("?"):
        return f"{words[0]} ..."
    return f"{words[0]} ...?" if words[0] in POLAR else " ".join(words[:2]) + " ...?"


def local_suite_items(instructions: str = "powered") -> list[EvalItem]:
    """The local math, instruction and knowledge items with their strict graders (`instructions`: 'powered' for
    the 360-item suite, 'core' for the 72 hand-written items)."""
    from sinklib.evals import grading, items

    if instructions not in ("powered", "core"):
        raise ParameterError(f"parameter 'instructions' got {instructions!r}; allowed: 'powered', 'core'")
    out = [EvalItem("math", r["question"], "'The answer is N.' (strict)",
                    lambda a: grading.parse_answer_strict(a) is not None) for r in items.load_math_items()]
    rows = items.load_powered_instruction_items() if instructions == "powered" else items.load_instruction_items()
    out += [EvalItem("instructions", r["prompt"], ", ".join(r["instruction_id_list"]),
                     lambda a, r=r: grading.grade_instructions(r, a)["strict"]) for r in rows]
    out += [EvalItem("knowledge", r["question"], "a choice, by likelihood (no format)", None)
            for r in items.load_knowledge_items()]
    return out


def _row(tpl: str, suite: str, train: list[tuple[str, str]], evals: list[EvalItem]) -> dict:
    """One shared template: how many training examples and evaluation items, and what the grader says."""
    answers = sorted({a for _, a in train})[:MAX_GRADED]
    graded = [e for e in evals if e.accepts is not None][:MAX_GRADED]
    verdicts = [e.accepts(a) for e in graded for a in answers]
    rejected = (1 - sum(verdicts) / len(verdicts)) if verdicts else None
    if rejected is None:
        verdict = "shared template, scored without a format"
    elif rejected > 0:
        verdict = "collision"
    else:
        verdict = "shared template, format kept"
    return {"template": tpl, "suite": suite, "verdict": verdict, "train examples": len(train),
            "eval items": len(evals), "rejected (%)": None if rejected is None else 100 * rejected,
            "train example": f"{train[0][0]} -> {train[0][1]}", "eval example": evals[0].text,
            "eval expects": evals[0].expects}


def find_collisions(train: Sequence[tuple[str, str]], eval_items: Sequence[EvalItem]) -> list[dict]:
    """Every (template, suite) that the training pairs (question, answer) share with evaluation items: one row each
    with the verdict 'collision' when the suite's strict grader rejects answers the training teaches (share of
    (answer, item) pairs rejected in 'rejected (%)'), else 'shared template, format kept' or '..., scored
    without a format'. Collisions first."""
    if not train:
        raise ParameterError("collision check: no training examples were given")
    by_tpl: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for q, a in train:
        by_tpl[template(q)].append((q, a))
    by_suite: dict[tuple[str, str], list[EvalItem]] = defaultdict(list)
    for e in eval_items:
        by_suite[(template(e.text), e.suite)].append(e)
    rows = [_row(t, s, by_tpl[t], es) for (t, s), es in by_suite.items() if t in by_tpl]
    return sorted(rows, key=lambda r: (r["verdict"] != "collision", r["suite"], r["template"]))


def sentence(rows: Sequence[dict]) -> str:
    """The collisions in words (or that there are none)."""
    hits = [r for r in rows if r["verdict"] == "collision"]
    if not hits:
        return "no training template collides with an evaluation item's strict format"
    return "; ".join(f"{r['template']} collides with {r['eval items']} {r['suite']} items (training teaches "
                     f"'{r['train example']}', the strict grader wants {r['eval expects']}, rejects "
                     f"{r['rejected (%)']:.0f} % of the taught answers)" for r in hits)
