"""The search for the worst case of Theorem 1: random layers checked in bulk (`random_draws`, which keeps the
tightest), a projected gradient ascent over the directions of the weight change (`worst_direction`), and the
adversary of chapter 3 (`adversary_search`), which starts from the tightest random layers and reports the better
of its start and its ascent, so it is at least as strong as the random draws by construction; `adversary_note`
says what it found in words.
"""
from __future__ import annotations

import heapq
from collections.abc import Sequence

import pandas as pd
import torch
from torch import Tensor

from sinklib.bound.instances import Instance, _logu, check_instance, random_instance
from sinklib.bound.theorem import COMPETITORS, gap_change_bound, gap_changes
from sinklib.errors import ParameterError


def random_draws(generator: torch.Generator, norm: str, n: int, scale_range: tuple[float, float],
                 rel_range: tuple[float, float], keep: int = 0) -> tuple[list[dict], list[Instance]]:
    """`n` random layers of QK-norm variant `norm`, each with an input scale and a relative weight change drawn
    log-uniformly from `scale_range` and `rel_range` (in that order, then `random_instance`, all from
    `generator`) and checked with `check_instance`.

    -> (rows {tightness, **instance info}, the `keep` tightest instances, tightest first; ties: earliest first).
    """
    rows, top = [], []
    for i in range(n):
        inst = random_instance(generator, norm, _logu(generator, *scale_range), _logu(generator, *rel_range))
        ratio = check_instance(inst)["ratio"]
        rows.append(dict(tightness=ratio, **inst.info))
        if keep > 0:
            item = (ratio, -i, inst)
            if len(top) < keep:
                heapq.heappush(top, item)
            elif item[:2] > top[0][:2]:
                heapq.heapreplace(top, item)
    return rows, [inst for _, _, inst in sorted(top, key=lambda t: t[:2], reverse=True)]


def _ratio(inst: Instance, dq: Tensor, dk: Tensor, competitors: tuple[str, ...], sink: int, query_start: int) -> Tensor:
    """max over heads, queries and `competitors` of |actual change| / bound (the bound clamped away from 0)."""
    kw = {**inst.kwargs(), "dwq": dq, "dwk": dk}
    ch = gap_changes(**kw, sink=sink, query_start=query_start, competitors=competitors)
    act = torch.stack([ch[c].abs() for c in competitors]).amax(0)
    return (act / gap_change_bound(**kw, sink=sink, query_start=query_start).clamp_min(1e-300)).max()


def _unit(p: Tensor) -> Tensor:
    return p / torch.linalg.matrix_norm(p, ord=2)


def worst_direction(inst: Instance, steps: int = 100, lr: float = 0.05, sink: int = 0, query_start: int = 1,
                    competitor: str = "both") -> tuple[float, Instance]:
    """Projected gradient ascent on actual / bound over the directions of dW_Q, dW_K, their spectral norms held
    fixed (a matrix that does not move stays zero): an adversary looking for a violation.

    Each step moves the directions along the normalised gradient by `lr` times their Frobenius norm and projects
    them back to their spectral norms; a step that raises the ratio is kept and the next one is 1.5 times longer,
    a step that does not is undone and the next one half as long. Gradient entries below 1e-10 of the largest are
    dropped, so a block that does not move (a single-head change) stays exactly zero instead of collecting
    rounding-level changes whose ratio to a rounding-level bound means nothing. The ratio is that of `check_instance` (both
    competitors) unless `competitor` names one. -> (best ratio found, the instance attaining it); with
    ``steps=0`` the ratio of `inst` itself."""
    comps = COMPETITORS if competitor == "both" else (competitor,)
    if not set(comps) <= set(COMPETITORS):
        raise ParameterError(f"competitor got {competitor!r}; allowed: 'both', {', '.join(COMPETITORS)}")
    rq, rk = (float(torch.linalg.matrix_norm(d, ord=2)) for d in (inst.dwq, inst.dwk))
    if rq == 0 and rk == 0:
        return 0.0, inst
    cur = [_unit(inst.dwq) if rq > 0 else inst.dwq, _unit(inst.dwk) if rk > 0 else inst.dwk]
    moving = [i for i, r in enumerate((rq, rk)) if r > 0]

    def evaluate(ps: list[Tensor]) -> tuple[float, list[Tensor | None], tuple[Tensor, Tensor]]:
        ps = [p.detach().clone().requires_grad_(i in moving) for i, p in enumerate(ps)]
        dq, dk = (rq * _unit(ps[0]) if rq > 0 else ps[0]), (rk * _unit(ps[1]) if rk > 0 else ps[1])
        r = _ratio(inst, dq, dk, comps, sink, query_start)
        grads = torch.autograd.grad(r, [ps[i] for i in moving], allow_unused=True)
        full: list[Tensor | None] = [None, None]
        for i, g in zip(moving, grads):
            if g is not None:   # rounding-level entries (e.g. in a block that does not move) stay out of the step
                g = torch.nan_to_num(g, nan=0.0, posinf=0.0, neginf=0.0)
                g = torch.where(g.abs() > 1e-10 * g.abs().max(), g, torch.zeros_like(g))
            full[i] = g
        return float(r.detach()), full, (dq.detach().clone(), dk.detach().clone())

    best, grads, dirs = evaluate(cur)
    best_inst = Instance(**{**inst.__dict__, "dwq": dirs[0], "dwk": dirs[1]})
    step = lr
    for _ in range(steps):
        cand = list(cur)
        for i in moving:
            g = grads[i]
            gn = float(torch.linalg.norm(g)) if g is not None else 0.0
            if gn > 0:   # a zero or undefined gradient leaves this matrix where it is
                cand[i] = _unit(cur[i] + step * float(torch.linalg.norm(cur[i])) * g / gn)
        r, g_new, d_new = evaluate(cand)
        if r > best:
            best, cur, grads, step = r, cand, g_new, step * 1.5
            best_inst = Instance(**{**inst.__dict__, "dwq": d_new[0], "dwk": d_new[1]})
        else:
            step *= 0.5
        if step < 1e-8:
            break
    return best, best_inst


def adversary_search(starts: Sequence[Instance], steps: int, lr: float = 0.05) -> list[dict]:
    """`worst_direction` from each start (e.g. the tightest random layers of `random_draws`). -> rows {start (its
    `check_instance` ratio), ascent (`check_instance` of the ascent's best instance), adversary (the larger of the
    two: never below the start), improved (the ascent beat its start)}."""
    rows = []
    for inst in starts:
        start = check_instance(inst)["ratio"]
        _, worst = worst_direction(inst, steps=steps, lr=lr)
        ascent = check_instance(worst)["ratio"]
        rows.append(dict(start=start, ascent=ascent, adversary=max(start, ascent), improved=bool(ascent > start)))
    return rows


def adversary_note(draws: pd.DataFrame, adv: pd.DataFrame, within: float = 0.1) -> str:
    """Chapter 3's adversary in words, per variant: its largest tightness against the random draws' largest, how
    many random layers came within `within` (relative) of it, and in how many searches the ascent beat its start.

    draws: rows {variant, tightness} (every random layer); adv: rows {variant, adversary, improved}."""
    if adv.empty:
        return "The adversary did not run (no layers were handed to it)."
    parts, near = [], []
    for v, a in adv.groupby("variant", sort=False):
        t = draws.tightness[draws.variant == v]
        top = float(a.adversary.max())
        parts.append(f"{v} {top:.3f} (random draws {t.max():.3f})")
        near.append(f"{int((t >= (1 - within) * top).sum()):,} of {len(t):,} ({v})")
    return (f"Largest tightness found by the adversary: {', '.join(parts)}. Random layers within {within:.0%} of the "
            f"adversary's value: {', '.join(near)}. The ascent raised the tightness above its starting layer's in "
            f"{int(adv.improved.sum())} of {len(adv)} searches.")
