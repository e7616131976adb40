"""The evaluation and training rows of the benchmark (``python -m sinklib.bench eval``): chapter 4's costs as ratios.

Evaluation: the two generation suites (instructions, word problems) on the same items, decoded by the
`transformers` reference (`sinklib.evals.lm.hf_generate`, batches of 8 rows, the code before the decoder of
`sinklib.evals.decode`) and by `sinklib.evals.lm.generate` (`GENERATION_BATCH_SIZE` rows, shared prefix, ended
rows leave), interleaved round by round (the order alternates), with items and answer tokens per second and the
agreement of the two: identical answers, identical strict and lenient grades. Training: seconds per step,
examples and input positions per second of a few steps of both VL stages at the recipe's batch size.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

import torch

#: items per suite and rounds of the default run (a few minutes per model on a quiet 2-core machine)
EVAL_ITEMS = {"instructions": 16, "math": 24}
BEFORE_BATCH = 8  # the suites' batch before the decoder (chapter 4's eval_batch_size)
TRAIN_STEPS = 2


def suite_prompts(lm, suite: str, n: int, seed: int = 0) -> tuple[list[dict], list[list[int]], tuple[str, ...], int]:
    """(items, token-id prompts, stop strings, max new tokens) of a generation suite as `run_suite` builds them."""
    from sinklib import evals
    from sinklib.evals import items
    from sinklib.evals.lm import resolve_prompt_style

    spec = evals.SUITES[suite]
    style = resolve_prompt_style(lm.tokenizer, "auto")
    rows = items.sample(spec["load"](), n, seed)
    if suite == "instructions":
        shots = items.load_instruction_fewshot()[:spec["n_shots"][style]]
        enc = [evals.instruction_prompt(lm.tokenizer, r["prompt"], style, shots) for r in rows]
    else:
        shots = items.load_math_fewshot()[:spec["n_shots"][style]]
        enc = [evals.math_prompt(lm.tokenizer, r["question"], style, shots) for r in rows]
    return rows, [e[0] for e in enc], (enc[0][1] if enc else ()), spec["max_new_tokens"]


def grades(suite: str, rows: Sequence[dict], responses: Sequence[str]) -> list[tuple[bool, bool]]:
    """(strict, lenient) of every response, graded as the suite grades it."""
    from sinklib.evals.grading import grade_instructions, grade_math

    if suite == "instructions":
        gs = [grade_instructions(r, a.strip()) for r, a in zip(rows, responses)]
    else:
        gs = [grade_math(a.strip(), r["answer"]) for r, a in zip(rows, responses)]
    return [(bool(g["strict"]), bool(g["lenient"])) for g in gs]


def agreement(suite: str, rows: Sequence[dict], before: Sequence[str], after: Sequence[str]) -> dict:
    """Fractions of items with identical answers, identical strict grades and identical lenient grades."""
    gb, ga = grades(suite, rows, before), grades(suite, rows, after)
    n = max(1, len(rows))
    return {"n": len(rows), "same_answer": sum(a == b for a, b in zip(before, after)) / n,
            "same_strict": sum(x[0] == y[0] for x, y in zip(gb, ga)) / n,
            "same_lenient": sum(x[1] == y[1] for x, y in zip(gb, ga)) / n}


def alternating(fns: dict[str, Callable[[], object]], repeats: int) -> tuple[dict[str, list[float]], dict[str, object]]:
    """Seconds of each function per round, rounds alternating the order (a, b / b, a, ...), and each one's
    first return value (`timing.interleaved_timings` without warm-up)."""
    from sinklib.bench.timing import interleaved_timings

    first: dict[str, object] = {}
    return interleaved_timings(fns, repeats, warmup=0, alternate=True, first=first), first


def eval_rows(lm, suite: str, n: int, repeats: int, seed: int = 0) -> list[dict]:
    """Before/after rows of one generation suite on one model (items/s, answer tokens/s, ratio, agreement)."""
    from sinklib.evals.decode import GENERATION_BATCH_SIZE
    from sinklib.evals.lm import generate, hf_generate

    rows, prompts, stop, max_new = suite_prompts(lm, suite, n, seed)
    m, tok = lm.model, lm.tokenizer
    with torch.inference_mode():
        times, out = alternating({
            "before": lambda: hf_generate(m, tok, prompts, max_new, BEFORE_BATCH, stop),
            "after": lambda: generate(m, tok, prompts, max_new, GENERATION_BATCH_SIZE, stop)}, repeats)
    agree = agreement(suite, rows, out["before"], out["after"])
    ratios = [b / a for b, a in zip(times["before"], times["after"])]
    res = []
    for k in ("before", "after"):
        med = statistics.median(times[k])
        ans_tokens = sum(len(tok(a, add_special_tokens=False)["input_ids"]) for a in out[k])
        res.append({"part": "evaluation", "model": lm.name, "suite": suite, "code": k, "n_items": len(rows),
                    "batch": BEFORE_BATCH if k == "before" else GENERATION_BATCH_SIZE, "seconds": times[k],
                    "median_s": med, "items_per_s": len(rows) / med, "answer_tokens": ans_tokens,
                    "tokens_per_s": ans_tokens / med, "prompt_tokens": sum(map(len, prompts)),
                    "speedup": statistics.median(ratios) if k == "after" else 1.0,
                    "speedup_min": min(ratios) if k == "after" else 1.0,
                    "speedup_max": max(ratios) if k == "after" else 1.0, **({"agreement": agree} if k == "after" else {})})
    return res


MATMUL_N = 1024  # the product `matmul_rate` times


def matmul_rate(n: int = MATMUL_N, repeats: int = 10) -> float:
    """GFLOP/s of an n x n fp32 matrix product (2 n^3 operations) at the training thread count, the best of
    `repeats`: the machine's practical peak for the dense products that make up a training step."""
    import time

    from sinklib.core.train import fixed_threads

    a, b = torch.randn(n, n), torch.randn(n, n)
    best = float("inf")
    with fixed_threads():
        a @ b  # warm-up
        for _ in range(repeats):
            t = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def step_flops(lm, stage: str, batch_size: int) -> float:
    """Floating-point operations of one optimiser step of a VL `stage` ('stage1' or 'stage2') at the recipe's
    rates, counted by `torch.utils.flop_counter.FlopCounterMode` (matrix products and attention: what dominates);
    `lm.model` is trained by that step."""
    from torch.utils.flop_counter import FlopCounterMode

    from sinklib import vl

    rec = vl.recipe_for(lm.name)
    steps = {"stage1_steps": 1, "stage2_steps": 0} if stage == "stage1" else {"stage1_steps": 0, "stage2_steps": 1}
    with FlopCounterMode(display=False) as fc:
        vl.train_vl(lm.model, lm.tokenizer, batch_size=batch_size, seed=0, lr_lm=rec["lr_lm"],
                    lr_projector_stage2=rec["lr_projector_stage2"], progress=False, **steps)
    return float(fc.get_total_flops())


def train_row(lm, steps: int = TRAIN_STEPS, batch_size: int | None = None) -> list[dict]:
    """Seconds per step, examples and input positions per second of `steps` steps of each VL stage (the recipe's
    rates and batch size), and the step's arithmetic rate against the machine's matrix-product peak
    (`step_flops` / seconds per step, over `matmul_rate`: how far from the hardware's limit training runs).
    Changes `lm.model`'s weights: run it last."""
    from sinklib import vl
    from sinklib.core.train import train_threads

    rec = vl.recipe_for(lm.name)
    bs = batch_size or rec["batch_size"]
    r = vl.train_vl(lm.model, lm.tokenizer, stage1_steps=steps, stage2_steps=steps, batch_size=bs, seed=0,
                    lr_lm=rec["lr_lm"], lr_projector_stage2=rec["lr_projector_stage2"], progress=False)
    peak = matmul_rate()
    out = []
    for stage, budget in r.budget.items():
        hist = [h["seconds"] for h in r.history if h["stage"].startswith(f"VL stage {stage[-1]}")]
        sec = sum(hist) or float("nan")
        flops = step_flops(lm, stage, bs)
        fastest = min(hist) if hist else float("nan")
        out.append({"part": "training", "model": lm.name, "suite": stage, "code": "after", "steps": budget["steps"],
                    "batch": bs, "threads": train_threads(), "seconds_per_step": sec / max(1, len(hist)),
                    "items_per_s": budget["examples"] / sec, "tokens_per_s": budget["input_positions"] / sec,
                    "median_s": sec, "flops_per_step": flops, "gflops_per_s": flops / fastest / 1e9,
                    "matmul_gflops_per_s": peak, "share_of_matmul_peak": flops / fastest / 1e9 / peak})
    return out


def run_eval(models: Sequence[str], n_items: dict[str, int] | None = None, repeats: int = 2, train_steps: int = TRAIN_STEPS,
             log: Callable[[str], None] = print) -> tuple[dict, list]:
    """The evaluation rows (both generation suites) and the training rows of each model; (results, loaded models)."""
    from sinklib.core.models import load_model

    n_items = dict(n_items or EVAL_ITEMS)
    rows, loaded = [], []
    for name in models:
        lm = load_model(name, device="cpu")
        loaded.append(lm)
        for suite, n in n_items.items():
            log(f"{name} {suite}: {n} items, {repeats} rounds")
            rows += eval_rows(lm, suite, n, repeats)
            log(f"  speed-up {rows[-1]['speedup']:.2f} (rounds {rows[-1]['speedup_min']:.2f}-{rows[-1]['speedup_max']:.2f}), "
                f"agreement {rows[-1]['agreement']}")
        if train_steps:
            log(f"{name} training: {train_steps} steps per stage")
            rows += train_row(lm, train_steps)
    return {"rows": rows, "threads": torch.get_num_threads()}, loaded
