"""The one training loop of sinklib: VL stages, the text-only control and the recovery fine-tune.

    for step i in 0..steps-1:
        batch = batches(i)                       # drawn before the step is timed
        loss = loss_fn(batch)                    # a scalar (or (scalar, aux)); non-finite -> error
        zero grads; loss.backward(); clip the gradient norm at max_grad_norm
        AdamW step (betas (0.9, 0.999), eps 1e-8); learning-rate schedule step
        after_step(StepInfo)                     # history, budgets, callbacks

The schedule is a linear warm-up over `warmup_frac` of the steps, then constant or cosine to 0.
"""
from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from sinklib.core import progress as _progress
from sinklib.errors import SinkbookError

SCHEDULES = ("constant", "cosine")
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
        on_nonfinite: Callable[[int, float], Exception] | None = None) -> float:
    """`steps` AdamW steps on `param_groups` (dicts with 'params' and 'lr'); returns seconds.

    `on_nonfinite(i, loss)` builds the error raised when a loss is NaN/inf (default: SinkbookError).
    """
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
