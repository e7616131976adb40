"""Instances for testing Theorem 1: random weight directions, random attention layers of each
QK-norm variant, a planted-sink layer (Remark 1) and its sign flips under weight changes, the
tightness of the bound on an instance (`sinklib.bound.adversary` searches for the direction closest to
breaking it), and the constructions that break the bound on purpose (dropping one assumption).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from sinklib.bound.theorem import (VARIANTS, QKSpec, first_order_gap_bound, gap_change_bound,
    gap_changes, qk_logits, rope_tables, sink_gap, spectral_norm)
from sinklib.errors import ParameterError

def random_direction(w: Tensor, rel: float, generator: torch.Generator | None = None, norm: str = "spectral") -> Tensor:
    """A Gaussian direction dW with ||dW|| = rel * ||W||, in the spectral ("spectral") or Frobenius
    ("fro") norm. w [m, d] -> [m, d]."""
    if not (rel >= 0 and math.isfinite(rel)):
        raise ParameterError(f"relative change got {rel!r}; allowed: a finite number >= 0")
    if norm not in ("spectral", "fro"):
        raise ParameterError(f"norm got {norm!r}; allowed: 'spectral', 'fro'")
    z = torch.randn(w.shape, generator=generator, dtype=w.dtype).to(w.device)
    f = spectral_norm if norm == "spectral" else torch.linalg.norm
    return z * (rel * f(w) / f(z))


def _logu(gen: torch.Generator, lo: float, hi: float) -> float:
    return float(math.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * torch.rand((), generator=gen).item()))


def _randint(gen: torch.Generator, lo: int, hi: int) -> int:
    return int(torch.randint(lo, hi + 1, (), generator=gen).item())


DIRECTION_KINDS: tuple[str, ...] = ("gaussian", "rank_one_top", "scaled_copy", "single_head")


@dataclass
class Instance:
    """One attention layer (weights, inputs, a weight change) for the bound checks."""

    x: Tensor                  # [T, d]
    wq: Tensor                 # [H*dh, d]
    wk: Tensor                 # [Hkv*dh, d]
    dwq: Tensor                # [H*dh, d]
    dwk: Tensor                # [Hkv*dh, d]
    spec: QKSpec
    gq: Tensor | None = None   # effective gains
    gk: Tensor | None = None
    rope: tuple[Tensor, Tensor] | None = None
    info: dict = field(default_factory=dict)

    def kwargs(self) -> dict:
        """The keyword arguments shared by gap_change and gap_change_bound."""
        return dict(x=self.x, wq=self.wq, wk=self.wk, dwq=self.dwq, dwk=self.dwk, spec=self.spec,
                    gq=self.gq, gk=self.gk, rope=self.rope)


def _direction(kind: str, w: Tensor, n_heads: int, dh: int, rel: float, gen: torch.Generator) -> Tensor:
    if kind == "gaussian":
        z = torch.randn(w.shape, generator=gen, dtype=w.dtype)
    elif kind == "rank_one_top":     # along the top singular pair: moves the largest logits most
        U, S, Vh = torch.linalg.svd(w, full_matrices=False)
        z = torch.outer(U[:, 0], Vh[0]) * (1 if torch.rand((), generator=gen) < 0.5 else -1)
    elif kind == "scaled_copy":      # dW = +-rel*W: a pure rescaling (invisible to per-head norm)
        z = w.clone() * (1 if torch.rand((), generator=gen) < 0.5 else -1)
    elif kind == "single_head":      # only one head's block moves
        z = torch.zeros_like(w)
        h = _randint(gen, 0, n_heads - 1)
        z[h * dh:(h + 1) * dh] = torch.randn(dh, w.shape[1], generator=gen, dtype=w.dtype)
    else:
        raise ParameterError(f"direction kind got {kind!r}; allowed: {', '.join(DIRECTION_KINDS)}")
    return z * (rel * spectral_norm(w) / spectral_norm(z))


def random_instance(generator: torch.Generator, norm: str, scale: float, rel_change: float,
                    direction: str | None = None, dtype: torch.dtype = torch.float64,
                    sizes: dict | None = None) -> Instance:
    """A random attention layer for stress tests. Everything is drawn from ``generator``.

    Sizes (unless given in ``sizes``): d in [4, 48], dh in {2, 4, 8, 16}, H in [1, 6], Hkv a divisor
    of H, T in [3, 20]. Inputs: Gaussian rows of norm ~``scale`` times per-token factors in
    [0.1, 10]; the sink row (0) carries a massive activation (a few coordinates multiplied by up to
    100). Weights: anisotropic (column scales in [0.1, 10]); for "layerwise" each head gets its own raw
    scale in [0.03, 1] (the situation of Remark 1). Gains ~ 1 + 0.5 N(0, 1) (some negative).
    eps in {0, 1e-6, 1e-3}; RoPE on in half the draws. The change has spectral norm
    ``rel_change`` times the weight's, along a direction of kind ``direction`` (random if None).
    """
    if norm not in VARIANTS:
        raise ParameterError(f"norm got {norm!r}; allowed: {', '.join(VARIANTS)}")
    g = generator
    s = dict(sizes or {})
    d = s.get("d", _randint(g, 4, 48))
    dh = s.get("dh", [2, 4, 8, 16][_randint(g, 0, 3)])
    H = s.get("H", _randint(g, 1, 6))
    divisors = [k for k in range(1, H + 1) if H % k == 0]
    Hkv = s.get("Hkv", divisors[_randint(g, 0, len(divisors) - 1)])
    T = s.get("T", _randint(g, 3, 20))
    eps = s.get("eps", [0.0, 1e-6, 1e-3][_randint(g, 0, 2)])
    use_rope = s.get("rope", bool(torch.rand((), generator=g) < 0.5))

    x = torch.randn(T, d, generator=g, dtype=dtype) / math.sqrt(d)
    x = x * torch.exp(torch.empty(T, 1, dtype=dtype).uniform_(math.log(0.1), math.log(10), generator=g))
    k = max(1, d // 8)
    idx = torch.randperm(d, generator=g)[:k]
    x[0, idx] = x[0, idx] * _logu(g, 1.0, 100.0)
    x = x * scale

    def weight(n_heads: int) -> Tensor:
        w = torch.randn(n_heads * dh, d, generator=g, dtype=dtype) / math.sqrt(d)
        w = w * torch.exp(torch.empty(1, d, dtype=dtype).uniform_(math.log(0.1), math.log(10), generator=g))
        if norm == "layerwise":
            hs = torch.exp(torch.empty(n_heads, dtype=dtype).uniform_(math.log(0.03), math.log(1.0), generator=g))
            w = w * hs.repeat_interleave(dh)[:, None]
        return w

    wq, wk = weight(H), weight(Hkv)
    kinds = DIRECTION_KINDS
    kq = direction or kinds[_randint(g, 0, len(kinds) - 1)]
    kk = direction or kinds[_randint(g, 0, len(kinds) - 1)]
    dwq = _direction(kq, wq, H, dh, rel_change, g)
    dwk = _direction(kk, wk, Hkv, dh, rel_change, g)
    if direction is None and torch.rand((), generator=g) < 0.2:  # sometimes only one matrix moves
        (dwq if torch.rand((), generator=g) < 0.5 else dwk).zero_()
    gq = gk = None
    if norm != "none":
        width_q = dh if norm == "per_head" else H * dh
        width_k = dh if norm == "per_head" else Hkv * dh
        gq = 1 + 0.5 * torch.randn(width_q, generator=g, dtype=dtype)
        gk = 1 + 0.5 * torch.randn(width_k, generator=g, dtype=dtype)
    spec = QKSpec(norm, H, Hkv, dh, scaling=1 / math.sqrt(dh), eps=eps)
    rope = rope_tables(T, dh, base=_logu(g, 10.0, 1e4), dtype=dtype) if use_rope else None
    return Instance(x, wq, wk, dwq, dwk, spec, gq, gk, rope,
                    info=dict(d=d, dh=dh, H=H, Hkv=Hkv, T=T, eps=eps, rope=use_rope, scale=scale,
                              rel_change=rel_change, direction_q=kq, direction_k=kk))


def planted_sink_layer(generator: torch.Generator, head_scales: Tensor, d: int = 64, head_dim: int = 16,
                       T: int = 48, sink_strength: float = 3.0, planted: float = 2.0,
                       dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor, Tensor]:
    """A layer whose heads share one sink but differ in raw norm (the setting of Remark 1).

    Tokens x_j = z_j / sqrt(d) + mu (a shared mean direction mu); the sink token adds
    ``sink_strength`` * m (m orthogonal to mu). Every head's key map sends m towards its mean query
    direction W_Q,h mu (weight ``planted``), so all heads attend to the sink. Head h's blocks of W_Q
    and W_K are multiplied by head_scales[h]. head_scales [H] -> x [T, d], wq [H*dh, d], wk [H*dh, d]
    (no GQA: Hkv = H).
    """
    g, H, dh = generator, head_scales.numel(), head_dim
    mu = torch.randn(d, generator=g, dtype=dtype)
    mu = mu / mu.norm()
    m = torch.randn(d, generator=g, dtype=dtype)
    m = m - (m @ mu) * mu
    m = m / m.norm()
    x = torch.randn(T, d, generator=g, dtype=dtype) / math.sqrt(d) + mu
    x[0] = x[0] + sink_strength * m
    wq = torch.randn(H, dh, d, generator=g, dtype=dtype) / math.sqrt(d)
    wk = torch.randn(H, dh, d, generator=g, dtype=dtype) / math.sqrt(d)
    qbar = wq @ mu                                            # [H, dh]
    wk = wk + planted * (qbar / qbar.norm(dim=-1, keepdim=True))[:, :, None] * m[None, None, :]
    s = head_scales.to(dtype)[:, None, None]
    return x, (s * wq).reshape(H * dh, d), (s * wk).reshape(H * dh, d)


def logit_range(logits: Tensor) -> Tensor:
    """Largest minus smallest causally visible logit of each head. [..., T, T] -> [...]."""
    T = logits.shape[-1]
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool, device=logits.device))
    hi = logits.masked_fill(~causal, float("-inf")).amax((-1, -2))
    lo = logits.masked_fill(~causal, float("inf")).amin((-1, -2))
    return hi - lo


def check_instance(inst: Instance, sink: int = 0, query_start: int = 1) -> dict:
    """Actual |gap change| (both competitors) and the bound for one instance.

    -> {"actual_max", "actual_lse", "bound"}: tensors [H, Tq]; "ratio": max over heads/queries and
    both competitors of actual / bound (0 where the bound is 0 and so is the change).
    """
    kw = inst.kwargs()
    ch = gap_changes(**kw, sink=sink, query_start=query_start)
    a_max, a_lse = ch["max"].abs(), ch["lse"].abs()
    bnd = gap_change_bound(**kw, sink=sink, query_start=query_start)
    act = torch.maximum(a_max, a_lse)
    ratio = torch.where(bnd > 0, act / bnd, torch.where(act > 0, torch.full_like(act, float("inf")), torch.zeros_like(act)))
    return {"actual_max": a_max, "actual_lse": a_lse, "bound": bnd, "ratio": float(ratio.max())}


# ---------------------------------------------------------------------------------------
# Remark 1: sign flips of the sink gap in the planted-sink layer

def flip_fractions(x: Tensor, wq: Tensor, wk: Tensor, spec: QKSpec, rel: float, only_strongest: bool, draws: int,
                   generator: torch.Generator) -> np.ndarray:
    """Fraction of queries whose max-gap changes sign, per head, averaged over ``draws`` Gaussian changes
    with spectral norm ``rel`` times the weight's; with ``only_strongest`` only the last head's blocks
    move. x [T, d], wq [H*dh, d], wk [H*dh, d] (no GQA) -> [H]."""
    H, dh = spec.n_heads, spec.head_dim
    g0 = sink_gap(qk_logits(x, wq, wk, spec))
    fl = torch.zeros(H, dtype=x.dtype)
    for _ in range(draws):
        dq, dk = random_direction(wq, 1.0, generator), random_direction(wk, 1.0, generator)
        if only_strongest:
            keep = torch.zeros(H * dh, 1, dtype=wq.dtype)
            keep[-dh:] = 1
            dq, dk = dq * keep, dk * keep
        dq = dq * rel * torch.linalg.matrix_norm(wq, ord=2) / torch.linalg.matrix_norm(dq, ord=2)
        dk = dk * rel * torch.linalg.matrix_norm(wk, ord=2) / torch.linalg.matrix_norm(dk, ord=2)
        g1 = sink_gap(qk_logits(x, wq + dq, wk + dk, spec))
        fl += (torch.sign(g1) != torch.sign(g0)).double().mean(-1)
    return (fl / draws).numpy()


FLIP_KINDS: tuple[tuple[str, bool], ...] = (("whole matrices", False), ("strongest head only", True))


def flip_table(x: Tensor, wq: Tensor, wk: Tensor, specs: dict[str, QKSpec], head_scales: Tensor, rels: list[float],
               draws: int, generator: torch.Generator, labels: dict[str, str] | None = None) -> pd.DataFrame:
    """`flip_fractions` for both kinds of move (`FLIP_KINDS`), every variant of ``specs`` and every relative
    size, drawn in that order from ``generator``. head_scales [H] ->
    rows {kind, variant (``labels[v]``), rel, head, raw_scale, flips}."""
    labels = labels or {}
    rows = []
    for kind, only in FLIP_KINDS:
        for v, spec in specs.items():
            for rel in rels:
                for h, f in enumerate(flip_fractions(x, wq, wk, spec, rel, only, draws, generator)):
                    rows.append(dict(kind=kind, variant=labels.get(v, v), rel=rel, head=h,
                                     raw_scale=float(head_scales[h]), flips=f))
    return pd.DataFrame(rows)


def weak_head_flips(flips: pd.DataFrame, head_scales: Tensor) -> pd.DataFrame:
    """Mean flip fraction of the weaker half of the heads (the strongest head excluded), per kind of move
    and relative size, one column per variant. flips: a `flip_table`."""
    H = head_scales.numel()
    weak = flips.raw_scale < head_scales[H // 2].item()
    return flips[weak & (flips["head"] < H - 1)].groupby(["kind", "variant", "rel"]).flips.mean().unstack("variant")


# ---------------------------------------------------------------------------------------
# breaking the bound on purpose

def first_order_violations(generator: torch.Generator, n: int, tol: float = 1e-9) -> tuple[int, int]:
    """One-dimensional layers (d = dh = 1, no RoPE) with dW = +-rel*W, input scale in [0.1, 10] and rel in
    [0.1, 3] (log-uniform): in how many of ``n`` layers the first-order bound (`first_order_gap_bound`)
    and Theorem 1 (`gap_change_bound`) are violated. -> (first-order violations, Theorem 1 violations)."""
    viol_first = viol_full = 0
    for _ in range(n):
        inst = random_instance(generator, "none", _logu(generator, 0.1, 10.0), _logu(generator, 0.1, 3.0),
                               direction="scaled_copy", sizes=dict(d=1, dh=1, H=1, Hkv=1, rope=False))
        ch = gap_changes(**inst.kwargs())
        act = torch.maximum(ch["max"].abs(), ch["lse"].abs())
        first = first_order_gap_bound(inst.x, inst.wq, inst.wk, inst.dwq, inst.dwk, inst.spec)
        viol_first += int((act > first * (1 + tol)).any())
        viol_full += int((act > gap_change_bound(**inst.kwargs()) * (1 + tol)).any())
    return viol_first, viol_full


def per_head_formula_on_unnormalised(generator: torch.Generator, n_instances: int, rel: float, scales,
                                     tol: float = 1e-9) -> pd.Series:
    """The per-head bound wrongly evaluated on unnormalised layers (d 32, dh 8, 4 / 2 heads, 12 tokens, RoPE)
    whose inputs are multiplied by each of ``scales``: fraction of (head, query) pairs where it is below the
    actual |change of the max-gap|, averaged over ``n_instances`` layers. -> Series indexed by scale."""
    rows = []
    for _ in range(n_instances):
        inst = random_instance(generator, "none", 1.0, rel, direction="gaussian",
                               sizes=dict(d=32, dh=8, H=4, Hkv=2, T=12, eps=1e-6, rope=True))
        s = inst.spec
        pretend = QKSpec("per_head", s.n_heads, s.n_kv_heads, s.head_dim, s.scaling, 0.0)
        for lam in scales:
            kw = {**inst.kwargs(), "x": lam * inst.x}
            act = gap_changes(**kw)["max"].abs()
            wrong = gap_change_bound(**{**kw, "spec": pretend})
            rows.append(dict(scale=lam, violated=float((act > wrong * (1 + tol)).double().mean())))
    return pd.DataFrame(rows).groupby("scale").violated.mean()


def layerwise_coupling(x: Tensor, wq: Tensor, wk: Tensor, spec: QKSpec, rel: float = 0.1, tol: float = 1e-9) -> dict:
    """Only the strongest (last) head's block of W_Q grows by ``rel`` in a layerwise layer (no GQA): the
    per-head bound of the other heads (0: their weights did not move) against their actual change.
    -> {"per_head_bound_max", "actual_max"} (over heads 0..H-2, all queries), "layerwise_holds"."""
    if spec.norm != "layerwise":
        raise ParameterError(f"layerwise_coupling needs a layerwise spec, got {spec.norm!r}")
    dh = spec.head_dim
    sp_h = QKSpec("per_head", spec.n_heads, spec.n_heads, dh, spec.scaling, spec.eps)
    dq = torch.zeros_like(wq)
    dq[-dh:] = rel * wq[-dh:]
    kw = dict(x=x, wq=wq, wk=wk, dwq=dq, dwk=torch.zeros_like(wk), spec=spec)
    act = gap_changes(**kw)["max"].abs()
    return {"per_head_bound_max": gap_change_bound(**{**kw, "spec": sp_h})[:-1].max().item(),
            "actual_max": act[:-1].max().item(),
            "layerwise_holds": bool((act <= gap_change_bound(**kw) * (1 + tol)).all())}


def null_space_query(generator: torch.Generator, ts, rel: float = 1e-3, d: int = 16, dh: int = 4, T: int = 8,
                     direction_seed: int = 7) -> pd.DataFrame:
    """One per-head-normalised head (eps = 0) whose last query is moved towards the null space of W_Q,h
    (||W_Q,h x|| ~ t for each t of ``ts``), under a change of relative spectral size ``rel`` (the same
    direction for every t). -> rows {t, tau, change (|d gap_max| of the last query), bound, flipped}."""
    wq, wk = torch.randn(dh, d, generator=generator, dtype=torch.float64), torch.randn(
        dh, d, generator=generator, dtype=torch.float64)
    x = torch.randn(T, d, generator=generator, dtype=torch.float64)
    null = torch.linalg.svd(wq, full_matrices=True).Vh[-1]      # W_Q @ null = 0
    spec = QKSpec("per_head", 1, 1, dh, dh**-0.5, 0.0)
    rows = []
    for t in ts:
        x_t = x.clone()
        x_t[-1] = null * x[-1].norm() + t * x[-1]
        dq = random_direction(wq, rel, torch.Generator().manual_seed(direction_seed))
        kw = dict(x=x_t, wq=wq, wk=wk, dwq=dq, dwk=torch.zeros_like(wk), spec=spec)
        ch = gap_changes(**kw)
        g0 = ch["before"]["max"][0, -1]
        rows.append(dict(t=t, tau=float(torch.linalg.matrix_norm(dq, ord=2) * x_t[-1].norm() / (wq @ x_t[-1]).norm()),
                         change=float(ch["max"][0, -1].abs()), bound=float(gap_change_bound(**kw)[0, -1]),
                         flipped=bool(torch.sign(g0 + ch["max"][0, -1]) != torch.sign(g0))))
    return pd.DataFrame(rows)


def input_scaling(generator: torch.Generator, lams, norm: str = "none", sink_only: bool = False, rel: float = 1e-2,
                  sizes: dict | None = None) -> pd.DataFrame:
    """Exercises ch3-ex-sink-only and ch3-ex-eps: one random layer of `norm` (`random_instance`, Gaussian change
    of relative spectral size ``rel``) whose inputs (or, with ``sink_only``, the sink token's input alone) are
    scaled by each lambda of ``lams``. -> rows {lam, actual (largest |gap change| over heads, queries and both
    competitors), bound (largest bound), logit_range (largest over heads)}; `fit_loglog` gives the slopes."""
    inst = random_instance(generator, norm, 1.0, rel, direction="gaussian",
                           sizes={"d": 16, "dh": 4, "H": 2, "Hkv": 1, "T": 10, "rope": False, **dict(sizes or {})})
    rows = []
    for lam in lams:
        x = inst.x.clone()
        if sink_only:
            x[0] = lam * x[0]
        else:
            x = lam * x
        r = check_instance(Instance(x, inst.wq, inst.wk, inst.dwq, inst.dwk, inst.spec, inst.gq, inst.gk, inst.rope))
        rows.append({"lam": float(lam), "actual": float(torch.maximum(r["actual_max"], r["actual_lse"]).max()),
                     "bound": float(r["bound"].max()),
                     "logit_range": float(logit_range(qk_logits(x, inst.wq, inst.wk, inst.spec, inst.gq, inst.gk)).max())})
    return pd.DataFrame(rows)


def fit_loglog(x, y) -> float:
    """Least-squares slope of log y against log x (the benchmark's `fit_loglog_slope`, as a number)."""
    from sinklib.bench.timing import fit_loglog_slope

    return fit_loglog_slope(list(x), list(y))["slope"]


def equalising_gains(head_scales: Tensor, head_dim: int, c: float = 1.0) -> Tensor:
    """Exercise ch3-ex-gains: per-head gains c / (raw head scale) for a layerwise layer, as a flat [H * dh]
    gain vector (each head's block constant)."""
    return (c / head_scales.to(torch.float64)).repeat_interleave(head_dim)


def gain_effect(x: Tensor, wq: Tensor, wk: Tensor, spec: QKSpec, head_scales: Tensor, rel: float = 0.1) -> pd.DataFrame:
    """Exercise ch3-ex-gains on Section 3.4's planted layer: each head's logit range, and the largest actual
    change of the other heads' gaps when only the strongest head's W_Q block grows by ``rel`` (the coupling),
    with unit gains and with `equalising_gains`. -> rows {gains, head, raw_scale, logit_range, coupled_change}."""
    if spec.norm != "layerwise":
        raise ParameterError(f"gain_effect needs a layerwise spec, got {spec.norm!r}")
    dh, rows = spec.head_dim, []
    dq = torch.zeros_like(wq)
    dq[-dh:] = rel * wq[-dh:]
    for name, g in (("unit", None), ("equalising", equalising_gains(head_scales, dh))):
        rng = logit_range(qk_logits(x, wq, wk, spec, g, g))
        moved = gap_changes(x, wq, wk, dq, torch.zeros_like(wk), spec, g, g)["max"].abs().amax(-1)
        for h in range(spec.n_heads):
            rows.append({"gains": name, "head": h, "raw_scale": float(head_scales[h]), "logit_range": float(rng[h]),
                         "coupled_change": float(moved[h]) if h < spec.n_heads - 1 else float("nan")})
    return pd.DataFrame(rows)
