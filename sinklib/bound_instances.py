"""Instances for testing Theorem 1: random weight directions, random attention layers of each
QK-norm variant, a planted-sink layer (Remark 1), the tightness of the bound on an instance and a
gradient adversary that searches for the direction closest to breaking it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from .bound import VARIANTS, QKSpec, gap_change, gap_change_bound, gap_changes, rope_tables, spectral_norm
from .errors import ParameterError

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


def worst_direction(inst: Instance, steps: int = 100, lr: float = 0.05, sink: int = 0, query_start: int = 1,
                    competitor: str = "max") -> tuple[float, Instance]:
    """Gradient ascent on actual / bound over the directions of dW_Q, dW_K (their spectral norms held
    fixed): an adversary looking for a violation. -> (best ratio found, the instance attaining it)."""
    rq = float(torch.linalg.matrix_norm(inst.dwq, ord=2))
    rk = float(torch.linalg.matrix_norm(inst.dwk, ord=2))
    pq = inst.dwq.clone().requires_grad_(rq > 0)
    pk = inst.dwk.clone().requires_grad_(rk > 0)
    params = [p for p in (pq, pk) if p.requires_grad]
    if not params:
        return 0.0, inst
    opt = torch.optim.Adam(params, lr=lr)

    def scaled() -> tuple[Tensor, Tensor]:
        dq = pq * (rq / torch.linalg.matrix_norm(pq, ord=2)) if rq > 0 else pq
        dk = pk * (rk / torch.linalg.matrix_norm(pk, ord=2)) if rk > 0 else pk
        return dq, dk

    best, best_inst = -1.0, inst
    for _ in range(steps):
        dq, dk = scaled()
        kw = {**inst.kwargs(), "dwq": dq, "dwk": dk}
        act = gap_change(**kw, sink=sink, query_start=query_start, competitor=competitor).abs()
        bnd = gap_change_bound(**kw, sink=sink, query_start=query_start)
        ratio = (act / bnd.clamp_min(1e-300)).max()
        r = float(ratio.detach())
        if r > best:
            best = r
            best_inst = Instance(**{**inst.__dict__, "dwq": dq.detach().clone(), "dwk": dk.detach().clone()})
        opt.zero_grad()
        (-ratio).backward()
        for p in params:  # ties in max / degenerate singular values can give NaN gradients: skip those entries
            p.grad = torch.nan_to_num(p.grad, nan=0.0, posinf=0.0, neginf=0.0)
        opt.step()
        if not all(bool(torch.isfinite(p).all()) and float(p.detach().abs().max()) > 0 for p in params):
            break
    return best, best_inst
