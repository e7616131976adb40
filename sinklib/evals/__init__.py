"""Offline text-capability suites: format-sensitive (strict vs lenient graders), knowledge
(multiple choice by log-likelihood, no parsing) and perplexity on held-out text.

| suite | in the manner of | metrics (in %, except perplexity) |
| --- | --- | --- |
| ``instructions`` | IFEval (graded by lm-eval's own checkers) | strict, lenient (prompt level), inst_strict, inst_lenient |
| ``math`` | GSM8K-CoT | strict ("The answer is N."), lenient (last number anywhere) |
| ``knowledge`` | MMLU / ARC / BoolQ, cloze style | acc, acc_norm (per-byte normalised) |
| ``perplexity`` | held-out text | ppl (per token), bits_per_byte |

The gap between the strict and the lenient score of a format-sensitive suite is the part of the
loss that is format, not content. Items live in ``data/evals/``; every score comes with a 95 %
interval (Wilson for proportions, a bootstrap over paragraphs for perplexity), because items are few.

    res = run_suite(lm.model, lm.tokenizer, "math", n_items=20)
    res.scores["strict"], res.ci["strict"], res.per_item[0]["response"]
"""
from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from sinklib.errors import ParameterError
from sinklib.core import progress
from sinklib.core.params import check_choice, check_int, integer
from sinklib.evals import grading, items, lm
from sinklib.evals.grading import (bootstrap_ppl_interval, grade_instructions, grade_math, parse_answer_lenient,
    parse_answer_strict, wilson_interval)
from sinklib.evals.items import generate_math_items
from sinklib.evals.decode import GENERATION_BATCH_SIZE
from sinklib.evals.lm import PROMPT_STYLES, continuation_logprobs, document_nll, generate, resolve_prompt_style

SOURCES = ("local", "ifeval")


@dataclass
class SuiteResult:
    """One suite's result: scores in % (perplexity suite: ppl and bits per byte), 95 % intervals,
    and every item's prompt, response and per-metric outcome."""

    suite: str
    n: int
    scores: dict[str, float]
    ci: dict[str, tuple[float, float]]
    per_item: list[dict]
    seconds: float
    settings: dict = field(default_factory=dict)

    def to_dict(self, with_items: bool = True) -> dict:
        d = asdict(self)
        d["ci"] = {k: [float(v[0]), float(v[1])] for k, v in self.ci.items()}
        if not with_items:
            d.pop("per_item")
        return d

    def row(self) -> dict:
        """One flat row: suite, n, seconds, and ``metric`` / ``metric_lo`` / ``metric_hi`` per metric."""
        r: dict[str, Any] = {"suite": self.suite, "n": self.n, "seconds": round(self.seconds, 1)}
        for k, v in self.scores.items():
            r[k], r[f"{k}_lo"], r[f"{k}_hi"] = v, self.ci[k][0], self.ci[k][1]
        return r


# ---------------------------------------------------------------------------------------------
# prompts

PLAIN_INSTRUCTION_HEADER = "Below are instructions, each followed by a response that follows it exactly.\n\n"
PLAIN_INSTRUCTION_STOP = ("### Instruction", "### Response")
PLAIN_MATH_STOP = ("\nQ:", "Q:", "\n\n")


def instruction_prompt(tokenizer: Any, prompt: str, style: str, shots: Sequence[dict] = ()) -> tuple[list[int], tuple[str, ...]]:
    """Token ids of one instruction prompt and the stop strings. chat: zero-shot in the chat template
    (as IFEval is run); plain: a few-shot '### Instruction / ### Response' document for base models."""
    if style == "chat":
        msgs = []
        for s in shots:
            msgs += [{"role": "user", "content": s["prompt"]}, {"role": "assistant", "content": s["response"]}]
        msgs.append({"role": "user", "content": prompt})
        return lm.encode(tokenizer, lm.chat_text(tokenizer, msgs), False), ()
    text = PLAIN_INSTRUCTION_HEADER
    for s in shots:
        text += f"### Instruction:\n{s['prompt']}\n\n### Response:\n{s['response']}\n\n"
    text += f"### Instruction:\n{prompt}\n\n### Response:\n"
    return lm.encode(tokenizer, text, True), PLAIN_INSTRUCTION_STOP


def math_prompt(tokenizer: Any, question: str, style: str, shots: Sequence[dict]) -> tuple[list[int], tuple[str, ...]]:
    """Token ids of one word problem with worked examples and the stop strings. chat: the examples as
    earlier turns; plain: a 'Q: ... A: ...' document (GSM8K-CoT's format)."""
    if style == "chat":
        msgs = []
        for s in shots:
            msgs += [{"role": "user", "content": s["question"]}, {"role": "assistant", "content": s["solution"]}]
        msgs.append({"role": "user", "content": question})
        return lm.encode(tokenizer, lm.chat_text(tokenizer, msgs), False), ()
    text = "".join(f"Q: {s['question']}\nA: {s['solution']}\n\n" for s in shots) + f"Q: {question}\nA:"
    return lm.encode(tokenizer, text, True), PLAIN_MATH_STOP


def knowledge_context(item: dict) -> str:
    """The cloze context of a multiple-choice item (the choice follows after a space)."""
    if item.get("passage"):
        return f"{item['passage']}\nQuestion: {item['question']}\nAnswer:"
    return f"Question: {item['question']}\nAnswer:"


# ---------------------------------------------------------------------------------------------
# suites

def _pct(flags: list[bool]) -> tuple[float, tuple[float, float]]:
    return grading.proportion_ci_pct(flags)


def _shots(rows: list[dict], n_shots: int | None) -> list[dict]:
    if not n_shots:
        return []
    if n_shots > len(rows):
        raise ParameterError(f"parameter 'n_shots' got {n_shots}; allowed: an integer in [0, {len(rows)}] "
                             "(the worked examples in data/evals)")
    return rows[:n_shots]


def _run_instructions(model, tok, rows, *, style, gen_batch_size, max_new_tokens, n_shots, **_):
    shots = _shots(items.load_instruction_fewshot(), n_shots)
    enc = [instruction_prompt(tok, r["prompt"], style, shots) for r in rows]
    stop = enc[0][1] if enc else ()
    responses = generate(model, tok, [e[0] for e in enc], max_new_tokens, gen_batch_size, stop)
    per, strict, lenient, inst_s, inst_l = [], [], [], [], []
    for r, resp in zip(rows, responses):
        resp = resp.strip()
        g = grade_instructions(r, resp)
        strict.append(g["strict"]), lenient.append(g["lenient"])
        inst_s += g["strict_list"]
        inst_l += g["lenient_list"]
        per.append({"key": r.get("key"), "prompt": r["prompt"], "instruction_id_list": r["instruction_id_list"],
                    "response": resp, **g})
    out = {"strict": _pct(strict), "lenient": _pct(lenient), "inst_strict": _pct(inst_s), "inst_lenient": _pct(inst_l)}
    return per, out


def _run_math(model, tok, rows, *, style, gen_batch_size, max_new_tokens, n_shots, **_):
    shots = _shots(items.load_math_fewshot(), n_shots)
    enc = [math_prompt(tok, r["question"], style, shots) for r in rows]
    stop = enc[0][1] if enc else ()
    responses = generate(model, tok, [e[0] for e in enc], max_new_tokens, gen_batch_size, stop)
    per = []
    for r, resp in zip(rows, responses):
        resp = resp.strip()
        per.append({"key": r.get("key"), "prompt": r["question"], "answer": r["answer"], "response": resp,
                    **grade_math(resp, r["answer"])})
    return per, {"strict": _pct([p["strict"] for p in per]), "lenient": _pct([p["lenient"] for p in per])}


def _run_knowledge(model, tok, rows, *, style, batch_size, **_):
    pairs, owner = [], []
    for i, r in enumerate(rows):
        ctx = knowledge_context(r)
        for c in r["choices"]:
            if style == "chat":
                cpre = lm.encode(tok, lm.chat_text(tok, [{"role": "user", "content": ctx}]), False)
                pairs.append((cpre, lm.encode(tok, c, False)))
            else:
                pairs.append(lm.split_continuation(tok, ctx, " " + c, special=True))
            owner.append(i)
    lps = continuation_logprobs(model, pairs, lm.pad_id(tok, model), batch_size=batch_size)
    per, k = [], 0
    for r in rows:
        ll = [lps[k + j][0] for j in range(len(r["choices"]))]
        k += len(r["choices"])
        norm = [v / max(1, len(c.encode("utf-8"))) for v, c in zip(ll, r["choices"])]
        pred = max(range(len(ll)), key=lambda j: ll[j])
        pred_n = max(range(len(norm)), key=lambda j: norm[j])
        per.append({"key": r.get("key"), "category": r["category"], "prompt": knowledge_context(r),
                    "choices": r["choices"], "answer": r["answer"], "loglik": ll, "pred": pred, "pred_norm": pred_n,
                    "acc": pred == r["answer"], "acc_norm": pred_n == r["answer"]})
    return per, {"acc": _pct([p["acc"] for p in per]), "acc_norm": _pct([p["acc_norm"] for p in per])}


def _run_perplexity(model, tok, rows, *, batch_size, seed, **_):
    pre = tok.bos_token_id if getattr(tok, "bos_token_id", None) is not None else tok.eos_token_id
    if pre is None:
        raise ParameterError("perplexity needs a BOS or EOS token to condition the first word on; "
                             "this tokenizer has neither")
    docs = [[pre] + lm.encode(tok, p, False) for p in rows]
    res = document_nll(model, docs, lm.pad_id(tok, model), batch_size=max(1, batch_size // 2))
    nll = [a for a, _ in res]
    nt = [n for _, n in res]
    nb = [len(p.encode("utf-8")) for p in rows]
    per = [{"key": i, "prompt": p[:80] + ("..." if len(p) > 80 else ""), "nll": a, "n_tokens": n, "n_bytes": b,
            "ppl": math.exp(a / n)} for i, (p, a, n, b) in enumerate(zip(rows, nll, nt, nb))]
    ppl = math.exp(sum(nll) / sum(nt))
    bpb = sum(nll) / math.log(2) / sum(nb)
    return per, {"ppl": (ppl, bootstrap_ppl_interval(nll, nt, seed=seed)),
                 "bits_per_byte": (bpb, grading.bootstrap_ratio_interval(
                     [a / math.log(2) for a in nll], nb, seed=seed))}


SUITES: dict[str, dict] = {
    "instructions": {"kind": "generation", "metrics": ("strict", "lenient", "inst_strict", "inst_lenient"),
                     "max_new_tokens": 192, "n_shots": {"chat": 0, "plain": 4},
                     "load": items.load_instruction_suite, "sized": True, "run": _run_instructions,
                     "description": "verifiable instructions, graded by IFEval's strict and loose checkers"},
    "math": {"kind": "generation", "metrics": ("strict", "lenient"), "max_new_tokens": 128,
             "n_shots": {"chat": 4, "plain": 4},
             "load": items.load_math_items, "run": _run_math,
             "description": "arithmetic word problems; strict 'The answer is N.' vs the last number anywhere"},
    "knowledge": {"kind": "likelihood", "metrics": ("acc", "acc_norm"), "max_new_tokens": 0, "n_shots": None,
                  "load": items.load_knowledge_items, "run": _run_knowledge,
                  "description": "multiple choice by log-likelihood (capitals, science, common sense, yes/no)"},
    "perplexity": {"kind": "likelihood", "metrics": ("ppl", "bits_per_byte"), "max_new_tokens": 0, "n_shots": None,
                   "load": items.load_heldout, "run": _run_perplexity,
                   "description": "perplexity on held-out paragraphs written for this book"},
}


def _unpack(model: Any, tokenizer: Any) -> tuple[Any, Any]:
    if hasattr(model, "model") and hasattr(model, "tokenizer") and hasattr(model, "source"):  # sinklib Loaded
        tokenizer = tokenizer if tokenizer is not None else model.tokenizer
        model = model.model
    if tokenizer is None:
        raise ParameterError("parameter 'tokenizer' is None: the suites need a Hugging Face tokenizer "
                             "(sinklib.core.models.tiny_model has none; pass one explicitly)")
    return model, tokenizer


def run_suite(model: Any, tokenizer: Any = None, suite: str = "instructions", n_items: int | None = None,
              seed: int = 0, batch_size: int = 8, max_new_tokens: int | None = None, prompt_style: str = "auto",
              source: str = "local", n_shots: int | None = None, gen_batch_size: int = GENERATION_BATCH_SIZE) -> SuiteResult:
    """Run one suite on a causal LM and grade it.

    model: a transformers causal LM (or a ``sinklib.core.models.Loaded``; then tokenizer may be None).
    suite: one of ``SUITES``. n_items: a seeded sample of that many items (all when None; capped at
    the number available; for 'instructions', more than the 72 hand-written items samples the powered suite,
    ``items.load_instruction_suite``). prompt_style: 'chat' (the tokenizer's chat template), 'plain' (a few-shot
    document, for base models) or 'auto' (chat when a template exists, for the generation suites;
    the likelihood suites use plain text under 'auto', as lm-eval does). source: 'local' (items in
    data/evals) or 'ifeval' (instructions suite only: the real google/IFEval prompts, needs network;
    the same lm-eval checkers grade them). n_shots: worked examples in the prompt (default per suite
    and style, see ``SUITES``). batch_size: sequences per pass of the likelihood suites; gen_batch_size: rows
    decoded together by the generation suites (`sinklib.evals.decode`).
    """
    check_choice("suite", suite, list(SUITES))
    check_choice("prompt_style", prompt_style, PROMPT_STYLES)
    check_choice("source", source, SOURCES)
    if source == "ifeval" and suite != "instructions":
        raise ParameterError(f"parameter 'source' is 'ifeval', which only the 'instructions' suite has; "
                             f"suite {suite!r} allows source='local'")
    seed = check_int("seed", seed)
    batch_size = check_int("batch_size", batch_size, 1)
    gen_batch_size = check_int("gen_batch_size", gen_batch_size, 1)
    if n_items is not None:
        n_items = check_int("n_items", n_items, 1)
    spec = SUITES[suite]
    model, tok = _unpack(model, tokenizer)
    style = resolve_prompt_style(tok, prompt_style, default_auto="plain" if spec["kind"] == "likelihood" else None)
    if max_new_tokens is None:
        max_new_tokens = spec["max_new_tokens"]
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, 0 if spec["kind"] == "likelihood" else 1)
    if n_shots is None and spec["n_shots"] is not None:
        n_shots = spec["n_shots"][style]
    if n_shots is not None:
        n_shots = check_int("n_shots", n_shots, 0, 8)
    t0 = time.perf_counter()
    if source == "ifeval":
        all_rows = items.load_ifeval_items()  # fails first and fast when offline
        grading.ensure_punkt()  # two IFEval ids need nltk's punkt_tab data
    else:
        all_rows = spec["load"](n_items) if spec.get("sized") else spec["load"]()
    rows = items.sample(all_rows, n_items, seed)
    was_training = getattr(model, "training", False)
    model.eval()
    progress.report(f"evaluating {suite}", 0, len(rows))  # side channel ($SINKBOOK_PROGRESS), not the page
    try:
        per, out = spec["run"](model, tok, rows, style=style, batch_size=batch_size, gen_batch_size=gen_batch_size,
                               max_new_tokens=max_new_tokens, n_shots=n_shots, seed=seed)
    finally:
        if was_training:
            model.train()
    settings = {"prompt_style": style, "source": source, "seed": seed, "n_items_requested": n_items,
                "n_available": len(all_rows), "batch_size": batch_size}
    if spec["kind"] == "generation":
        settings.update(max_new_tokens=max_new_tokens, n_shots=n_shots, decoding="greedy", gen_batch_size=gen_batch_size)
    return SuiteResult(suite=suite, n=len(rows), scores={k: float(v[0]) for k, v in out.items()},
                       ci={k: (float(v[1][0]), float(v[1][1])) for k, v in out.items()}, per_item=per,
                       seconds=time.perf_counter() - t0, settings=settings)


def run_suites(model: Any, tokenizer: Any = None,
               suites: Sequence[str] = ("instructions", "math", "knowledge", "perplexity"),
               n_items: int | dict[str, int | None] | None = None, **kwargs) -> dict[str, SuiteResult]:
    """Run several suites; ``n_items`` is one number for all or a dict suite -> number (missing = all).
    Other keyword arguments go to ``run_suite``."""
    if isinstance(suites, str):
        suites = [s.strip() for s in suites.split(",") if s.strip()]
    for s in suites:
        check_choice("suites[]", s, list(SUITES))
    if isinstance(n_items, dict):
        unknown = [k for k in n_items if k not in SUITES]
        if unknown:
            raise ParameterError(f"parameter 'n_items' has unknown suite(s) {unknown}; allowed: {', '.join(SUITES)}")
    out = {}
    for s in suites:
        n = n_items.get(s) if isinstance(n_items, dict) else n_items
        out[s] = run_suite(model, tokenizer, s, n_items=n, **kwargs)
    return out


def results_table(results: dict[str, SuiteResult]) -> list[dict]:
    """Long-format rows (suite, metric, score, lo, hi, n, seconds) for a table or a DataFrame."""
    rows = []
    for name, r in results.items():
        for k, v in r.scores.items():
            rows.append({"suite": name, "metric": k, "score": v, "lo": r.ci[k][0], "hi": r.ci[k][1], "n": r.n,
                         "seconds": r.seconds})
    return rows


__all__ = ["SUITES", "SOURCES", "SuiteResult", "run_suite", "run_suites", "results_table", "grade_instructions",
           "grade_math", "parse_answer_strict", "parse_answer_lenient", "wilson_interval", "bootstrap_ppl_interval",
           "generate_math_items", "generate", "continuation_logprobs", "document_nll", "instruction_prompt",
           "math_prompt", "knowledge_context"]


#: notebook parameters: items per suite (0 skips the suite); `counts` turns them into run_suites' n_items
COUNT_PARAMS = {"eval_instructions": integer(0, 10_000), "eval_math": integer(0, 10_000),
                "eval_knowledge": integer(0, 10_000), "eval_perplexity": integer(0, 10_000)}


def counts(params: dict) -> dict[str, int]:
    """{suite: items} from the validated `COUNT_PARAMS` of a notebook (the suites' order)."""
    return {k[len("eval_"):]: params[k] for k in COUNT_PARAMS}
