"""Benchmarks reported as ratios measured in one run (never timed in tests)."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def interleaved_timings(fns: dict[str, Callable[[], object]], repeats: int = 3, warmup: int = 1) -> dict[str, list[float]]:
    """Run each function `repeats` times, interleaved (a, b, c, a, b, c, ...), after `warmup` rounds.

    Interleaving spreads machine noise over all contenders, so their ratios are fair.
    """
    for _ in range(warmup):
        for f in fns.values():
            f()
    out: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            out[k].append(time.perf_counter() - t0)
    return out


def ratio_table(times: dict[str, list[float]], baseline: str) -> list[dict]:
    """Median seconds and the ratio to the baseline's median, one row per contender."""
    base = statistics.median(times[baseline])
    return [{"method": k, "median s": statistics.median(v), "min s": min(v), "ratio to " + baseline: statistics.median(v) / base}
            for k, v in times.items()]


def long_input(tokenizer, texts: list[str], n_tokens: int) -> torch.Tensor:
    """One sequence of exactly n_tokens ids [1, T], made by concatenating texts (cycled) after the default prefix."""
    ids = list(tokenizer(texts[0])["input_ids"])
    i = 1
    while len(ids) < n_tokens:
        ids += tokenizer(" " + texts[i % len(texts)], add_special_tokens=False)["input_ids"]
        i += 1
    return torch.tensor([ids[:n_tokens]])
