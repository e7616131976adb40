"""The token sequences the text suites feed a model, without running it.

`suite_inputs` resolves a suite exactly as `sinklib.evals.run_suite` does (the seeded item sample, the prompt
style, the worked examples) and returns the sequences its forward passes start from: the prompt of each
generation item (instructions, math), every context + choice of a multiple-choice item (knowledge) and every
document with its first token (perplexity). Chapter 8 matches its mass-matched control on these, the inputs of
the evaluation it is compared on, instead of on the calibration prompts. The tokens a generation suite then
decodes are not included: they exist only once the (intervened) model has run.

`tests/test_evals_inputs.py` checks that these are, token for token, what the suites' runners pass to the model.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sinklib.core.params import check_choice, check_int
from sinklib.errors import ParameterError
from sinklib.evals import SUITES, _shots, instruction_prompt, items, knowledge_context, lm, math_prompt
from sinklib.evals.lm import PROMPT_STYLES, resolve_prompt_style


def _knowledge(tok: Any, rows: Sequence[dict], style: str) -> list[list[int]]:
    seqs = []
    for r in rows:
        ctx = knowledge_context(r)
        for c in r["choices"]:
            if style == "chat":
                pre, cont = (lm.encode(tok, lm.chat_text(tok, [{"role": "user", "content": ctx}]), False),
                             lm.encode(tok, c, False))
            else:
                pre, cont = lm.split_continuation(tok, ctx, " " + c, special=True)
            seqs.append(list(pre) + list(cont))
    return seqs


def _perplexity(tok: Any, rows: Sequence[str]) -> list[list[int]]:
    pre = tok.bos_token_id if getattr(tok, "bos_token_id", None) is not None else tok.eos_token_id
    if pre is None:
        raise ParameterError("perplexity needs a BOS or EOS token to condition the first word on; "
                             "this tokenizer has neither")
    return [[pre] + lm.encode(tok, p, False) for p in rows]


def suite_inputs(tokenizer: Any, suite: str, n_items: int | None = None, *, seed: int = 0,
                 prompt_style: str = "auto", n_shots: int | None = None) -> list[list[int]]:
    """Token id lists that `run_suite(model, tokenizer, suite, n_items, seed=seed, prompt_style=...,
    n_shots=...)` starts its forward passes from (see the module's docstring), in the suite's item order."""
    check_choice("suite", suite, list(SUITES))
    check_choice("prompt_style", prompt_style, PROMPT_STYLES)
    seed = check_int("seed", seed)
    if n_items is not None:
        n_items = check_int("n_items", n_items, 1)
    spec = SUITES[suite]
    style = resolve_prompt_style(tokenizer, prompt_style,
                                 default_auto="plain" if spec["kind"] == "likelihood" else None)
    all_rows = spec["load"](n_items) if spec.get("sized") else spec["load"]()
    rows = items.sample(all_rows, n_items, seed)
    if suite in ("instructions", "math"):
        n = spec["n_shots"][style] if n_shots is None else check_int("n_shots", n_shots, 0, 8)
        shots = _shots(items.load_instruction_fewshot() if suite == "instructions" else items.load_math_fewshot(), n)
        if suite == "instructions":
            return [instruction_prompt(tokenizer, r["prompt"], style, shots)[0] for r in rows]
        return [math_prompt(tokenizer, r["question"], style, shots)[0] for r in rows]
    if suite == "knowledge":
        return _knowledge(tokenizer, rows, style)
    return _perplexity(tokenizer, rows)


def inputs_of(tokenizer: Any, eval_n: Mapping[str, int], *, seed: int = 0, per_suite: int | None = None) -> list[list[int]]:
    """The inputs of every suite of `eval_n` ({suite: items}, 0 skips one, as chapter 8's evaluation is called),
    concatenated in `eval_n`'s order; per_suite: at most this many sequences from each suite, evenly spaced
    through its list (None: all)."""
    out: list[list[int]] = []
    for suite, n in eval_n.items():
        if not n:
            continue
        seqs = suite_inputs(tokenizer, suite, int(n), seed=seed)
        if per_suite is not None and len(seqs) > check_int("per_suite", per_suite, 1):
            step = len(seqs) / per_suite
            seqs = [seqs[int(i * step)] for i in range(per_suite)]
        out += seqs
    return out


__all__ = ["suite_inputs", "inputs_of"]
