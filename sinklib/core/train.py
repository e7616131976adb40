"""The one training loop of sinklib: VL stages, the text-only control and the recovery fine-tune.

    for step i in 0..steps-1:
        batch = batches(i)                       # drawn before the step is timed
        loss = loss_fn(batch)                    # a scalar (or (scalar, aux)); non-finite -> error
        zero grads; loss.backward(); clip the gradient norm at max_grad_norm
        AdamW step (betas (0.9, 0.999), eps 1e-8); learning-rate schedule step
        after_step(StepInfo)                     # history, budgets, callbacks

The schedule is a linear warm-up over `warmup_frac` of the steps, then constant or cosine to 0.

Threads: a CPU matmul splits its sums over torch's intra-op threads, so the same run with another thread count
gives weights that differ in the last bits, and the differences grow over the steps. The loop therefore runs
with a fixed thread count, `TRAIN_THREADS` (the count every cached training of the book was made with; the
environment variable `SINKBOOK_TRAIN_THREADS` overrides it on a machine with more cores, at the price of
weights that differ from those cached trainings), and restores the caller's count afterwards.
"""
from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from sinklib.core import progress as _progress
from sinklib.errors import SinkbookError

SCHEDULES = ("constant", "cosine")
#: torch intra-op threads of every training run (see the module docstring); not part of any cache key
TRAIN_THREADS = 2
THREADS_ENV = "SINKBOOK_TRAIN_THREADS"
OPTIMIZER = "AdamW(betas=(0.9, 0.999), eps=1e-8)"


def lr_lambda(steps: int, warmup_frac: float, schedule: str) -> Callable[[int], float]:
    """Multiplier of the base learning rate after i optimiser steps (LambdaLR)."""
    warm = max(1, int(round(warmup_frac * steps))) if warmup_frac > 0 else 0

    def f(i: int) -> float:  # i = number of optimiser steps taken so far
        if i < warm:
            return (i + 1) / warm
        if schedule == "constant":
            return 1.0
        span = max(1, steps - warm)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (i - warm) / span)))
    return f


@dataclass
class StepInfo:
    """What `after_step` receives: step index i (0-based), the loss, the gradient norm before
    clipping, the learning rates used (one per parameter group), seconds of the step, the batch, and
    `aux`, the second value when `loss_fn` returns (loss, aux)."""

    i: int
    loss: float
    grad_norm: float
    lrs: list[float]
    seconds: float
    batch: Any
    aux: Any = None


def run(param_groups: Sequence[dict], steps: int, batches: Callable[[int], Any],
        loss_fn: Callable[[Any], torch.Tensor | tuple[torch.Tensor, Any]], *, weight_decay: float = 0.0, warmup_frac: float = 0.0,
        schedule: str = "constant", max_grad_norm: float = 1.0, desc: str = "training", progress: bool = False,
        after_step: Callable[[StepInfo], None] | None = None,
        on_nonfinite: Callable[[int, float], Exception] | None = None, threads: int | None = None) -> float:
    """`steps` AdamW steps on `param_groups` (dicts with 'params' and 'lr'); returns seconds.

    `on_nonfinite(i, loss)` builds the error raised when a loss is NaN/inf (default: SinkbookError).
    `threads`: torch threads of the run (default `train_threads()`), whatever the caller's setting.
    """
    with fixed_threads(threads):
        return _loop(param_groups, steps, batches, loss_fn, weight_decay, warmup_frac, schedule, max_grad_norm, desc,
                     progress, after_step, on_nonfinite)


def _loop(param_groups, steps, batches, loss_fn, weight_decay, warmup_frac, schedule, max_grad_norm, desc, progress,
          after_step, on_nonfinite) -> float:
    from tqdm.auto import tqdm

    groups = [dict(g) for g in param_groups]
    trainable = [p for g in groups for p in g["params"]]
    opt = torch.optim.AdamW(groups, betas=(0.9, 0.999), eps=1e-8, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(steps, warmup_frac, schedule))
    t0 = time.perf_counter()
    bar = tqdm(range(steps), desc=desc, disable=not progress, leave=True)
    for i in bar:
        batch = batches(i)
        ts = time.perf_counter()
        out = loss_fn(batch)
        loss, aux = out if isinstance(out, tuple) else (out, None)
        if not torch.isfinite(loss):
            raise (on_nonfinite or _default_error(desc))(i, loss.item())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = float(torch.nn.utils.clip_grad_norm_(trainable, max_grad_norm))
        lrs = [g["lr"] for g in opt.param_groups]
        opt.step()
        sched.step()
        value = loss.item()
        bar.set_postfix(loss=f"{value:.3f}")
        _progress.report(desc, i + 1, steps)  # side channel ($SINKBOOK_PROGRESS), never the cell's output
        if after_step is not None:
            after_step(StepInfo(i, value, gnorm, lrs, time.perf_counter() - ts, batch, aux))
    bar.close()
    return time.perf_counter() - t0


def train_threads() -> int:
    """The thread count training runs with: `SINKBOOK_TRAIN_THREADS` when set, else `TRAIN_THREADS`."""
    raw = os.environ.get(THREADS_ENV, "").strip()
    if not raw:
        return TRAIN_THREADS
    if not raw.isdigit() or int(raw) < 1:
        raise SinkbookError(f"environment variable {THREADS_ENV} is {raw!r}; allowed: a positive integer")
    return int(raw)


@contextlib.contextmanager
def fixed_threads(n: int | None = None) -> Iterator[int]:
    """Inside: torch uses `n` intra-op threads (default `train_threads()`); the caller's count is restored."""
    n = train_threads() if n is None else int(n)
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield n
    finally:
        torch.set_num_threads(old)


def _default_error(desc: str) -> Callable[[int, float], Exception]:
    return lambda i, v: SinkbookError(f"{desc}: loss is {v} at step {i + 1}; lower the learning rate")


@contextlib.contextmanager
def only_training(model: torch.nn.Module, params: Sequence[torch.nn.Parameter]) -> Iterator[None]:
    """Inside: only `params` require gradients (every other parameter of `model` is frozen);
    every requires_grad flag of `model` is restored afterwards."""
    saved = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for p in model.parameters():
            p.requires_grad_(False)
        for p in params:
            p.requires_grad_(True)
        yield
    finally:
        for p, r in saved:
            p.requires_grad_(r)
