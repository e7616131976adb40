"""The three suites of the tiny corpus, on any causal LM with the tiny tokenizer; batched, greedy.

| suite | items | metrics |
| --- | --- | --- |
| ``format`` | held-out format tasks (``corpus.eval_items('format')``) | strict, lenient (and per task) in % |
| ``knowledge`` | held-out questions about the invented countries, 4 options | acc, acc_norm in % |
| ``perplexity`` | held-out prose paragraphs | ppl, bits_per_byte |

Results are `sinklib.evals.SuiteResult`s (the record chapters 4-5 use), with Wilson intervals for
proportions and a bootstrap over paragraphs for perplexity. The generation and likelihood code is
`sinklib.evals.lm`'s (left-padded batches, KV cache; the LM head only at scored positions).
"""
from __future__ import annotations

import math
import time
from collections.abc import Sequence

from sinklib.evals import SuiteResult
from sinklib.evals import lm as evlm
from sinklib.evals.grading import bootstrap_ppl_interval, bootstrap_ratio_interval, proportion_ci_pct
from sinklib.core.params import check_choice, check_int
from sinklib.tiny.corpus import FORMAT_TASKS, N_COUNTRIES, eval_items
from sinklib.tiny.grading import grade

TINY_SUITES = ("format", "knowledge", "perplexity")
EVAL_DEFAULTS = {"n_format": 100, "n_knowledge": 3 * N_COUNTRIES, "n_prose": 40, "seed": 0, "batch_size": 32,
                 "max_new_tokens": 16}


def _prefix(tokenizer) -> list[int]:
    """The tokens a document starts with: BOS when the tokenizer prepends one, else <eos> (the separator
    that precedes every document inside a packed training row)."""
    with_sp = tokenizer("a")["input_ids"]
    return [] if len(with_sp) > len(tokenizer("a", add_special_tokens=False)["input_ids"]) else [tokenizer.eos_token_id]


def format_suite(model, tokenizer, n: int = EVAL_DEFAULTS["n_format"], seed: int = 0, batch_size: int = 32,
                 max_new_tokens: int = 16, tasks: Sequence[str] | None = None) -> SuiteResult:
    """Greedy answers to held-out format tasks, graded strict and lenient (`corpus.grade`)."""
    t0 = time.perf_counter()
    items = eval_items("format", check_int("n", n, 1, 100_000), seed) if tasks is None else [
        it for t in tasks for it in eval_items(check_choice("task", t, FORMAT_TASKS), max(1, n // len(tasks)), seed)]
    pre = _prefix(tokenizer)
    prompts = [pre + tokenizer(it.context())["input_ids"] for it in items]
    answers = evlm.generate(model, tokenizer, prompts, max_new_tokens=max_new_tokens, batch_size=batch_size, stop=("\n",))
    per = []
    for it, a in zip(items, answers):
        g = grade(it, a)
        per.append({"task": it.task, "prompt": it.context(), "reference": it.answer, "response": a, **g})
    scores, ci = {}, {}
    for m in ("strict", "lenient"):
        scores[m], ci[m] = proportion_ci_pct([p[m] for p in per])
    for t in sorted({p["task"] for p in per}, key=FORMAT_TASKS.index):
        for m in ("strict", "lenient"):
            scores[f"{m}:{t}"], ci[f"{m}:{t}"] = proportion_ci_pct([p[m] for p in per if p["task"] == t])
    return SuiteResult("format", len(per), scores, ci, per, time.perf_counter() - t0,
                       {"seed": seed, "max_new_tokens": max_new_tokens})


#: options per knowledge question: chance accuracy is 100 / KNOWLEDGE_OPTIONS %
KNOWLEDGE_OPTIONS = 4


def knowledge_suite(model, tokenizer, n: int = EVAL_DEFAULTS["n_knowledge"], seed: int = 0,
                    batch_size: int = 32) -> SuiteResult:
    """Four-option questions about the invented countries, the option with the highest log-likelihood
    wins (acc; acc_norm divides by the option's length in bytes)."""
    t0 = time.perf_counter()
    items = eval_items("knowledge", n, seed)
    pre = _prefix(tokenizer)
    pairs, owner = [], []
    for i, it in enumerate(items):
        for c in it.choices:
            ctx, cont = evlm.split_continuation(tokenizer, it.context, " " + c, special=True)
            pairs.append((pre + ctx, cont))
            owner.append(i)
    lps = evlm.continuation_logprobs(model, pairs, tokenizer.pad_token_id, batch_size=batch_size)
    per, k = [], 0
    for it in items:
        ll = [lps[k + j][0] for j in range(len(it.choices))]
        k += len(it.choices)
        norm = [v / len(c.encode()) for v, c in zip(ll, it.choices)]
        pred, pred_n = max(range(len(ll)), key=ll.__getitem__), max(range(len(norm)), key=norm.__getitem__)
        per.append({"country": it.country, "attribute": it.attribute, "prompt": it.context, "choices": list(it.choices),
                    "answer": it.answer, "loglik": ll, "pred": pred, "acc": pred == it.answer,
                    "acc_norm": pred_n == it.answer})
    scores, ci = {}, {}
    for m in ("acc", "acc_norm"):
        scores[m], ci[m] = proportion_ci_pct([p[m] for p in per])
    return SuiteResult("knowledge", len(per), scores, ci, per, time.perf_counter() - t0, {"seed": seed, "options": KNOWLEDGE_OPTIONS})


def perplexity_suite(model, tokenizer, n: int = EVAL_DEFAULTS["n_prose"], seed: int = 0,
                     batch_size: int = 32) -> SuiteResult:
    """Per-token perplexity and bits per byte on held-out prose (the first token, BOS or <eos>, unscored)."""
    t0 = time.perf_counter()
    texts = eval_items("prose", n, seed)
    first = tokenizer.bos_token_id if _prefix(tokenizer) == [] else tokenizer.eos_token_id
    docs = [[first] + tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    res = evlm.document_nll(model, docs, tokenizer.pad_token_id, batch_size=batch_size)
    nll, nt = [a for a, _ in res], [b for _, b in res]
    nb = [len(t.encode()) for t in texts]
    per = [{"prompt": t[:80], "nll": a, "n_tokens": b, "n_bytes": c} for t, a, b, c in zip(texts, nll, nt, nb)]
    ppl = math.exp(sum(nll) / sum(nt))
    bpb = sum(nll) / math.log(2) / sum(nb)
    scores = {"ppl": ppl, "bits_per_byte": bpb}
    ci = {"ppl": bootstrap_ppl_interval(nll, nt, seed=seed),
          "bits_per_byte": bootstrap_ratio_interval([a / math.log(2) for a in nll], nb, seed=seed)}
    return SuiteResult("perplexity", len(per), scores, ci, per, time.perf_counter() - t0, {"seed": seed})


def evaluate(model, tokenizer, *, n_format: int = EVAL_DEFAULTS["n_format"],
             n_knowledge: int = EVAL_DEFAULTS["n_knowledge"], n_prose: int = EVAL_DEFAULTS["n_prose"], seed: int = 0,
             batch_size: int = 32, max_new_tokens: int = 16,
             suites: Sequence[str] = TINY_SUITES) -> dict[str, SuiteResult]:
    """The chosen suites on one model: {suite: SuiteResult}. The model is put in eval mode."""
    model.eval()
    out: dict[str, SuiteResult] = {}
    for s in suites:
        check_choice("suite", s, TINY_SUITES)
        if s == "format":
            out[s] = format_suite(model, tokenizer, n_format, seed, batch_size, max_new_tokens)
        elif s == "knowledge":
            out[s] = knowledge_suite(model, tokenizer, n_knowledge, seed, batch_size)
        else:
            out[s] = perplexity_suite(model, tokenizer, n_prose, seed, batch_size)
    return out


def summary(results: dict[str, SuiteResult]) -> dict:
    """The headline numbers: strict, lenient (format), acc (knowledge), ppl (perplexity), rounded."""
    out = {}
    if "format" in results:
        out["strict"] = round(results["format"].scores["strict"], 1)
        out["lenient"] = round(results["format"].scores["lenient"], 1)
    if "knowledge" in results:
        out["knowledge"] = round(results["knowledge"].scores["acc"], 1)
    if "perplexity" in results:
        out["ppl"] = round(results["perplexity"].scores["ppl"], 2)
    return out
