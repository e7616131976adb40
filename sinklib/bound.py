"""Theorem 1 and Remark 1: how a change of W_Q, W_K moves the sink gap.

Pure functions over tensors. Shapes use: T tokens, d model width, H query heads,
Hkv key/value heads (GQA: query head h reads key head h // (H // Hkv)), dh head dimension,
D = H * dh (the width a layerwise QK-norm normalises over), Tq = T - query_start queries.

The three QK-normalisation variants (``QKSpec.norm``):

* ``"none"``  (Llama, SmolLM2, Qwen2.5): q = W_Q x, k = W_K x.
* ``"head"``  (Qwen3, Gemma-3): each head's query/key is RMS-normalised on its own,
  q_h = g_q * N(W_Q,h x) with N(v) = v / sqrt(mean(v^2) + eps) over the dh entries.
* ``"layer"`` (OLMo-2, Olmo-3): one RMS over all heads concatenated,
  q = g_q * N(W_Q x) over the D entries, then split into heads.

Gains ``gq``/``gk`` are the *effective* multiplicative gains (Gemma's RMSNorm multiplies by
``1 + weight``: pass ``1 + weight``). RoPE, when given as ``(cos, sin)`` tables, is applied
after the normalisation, as in every architecture above. Logits are multiplied by
``spec.scaling`` (1/sqrt(dh) for Llama; ``query_pre_attn_scalar ** -0.5`` for Gemma-3).

The sink gap of query i is the logit of the sink key minus a competitor over the other
visible keys (causal: j <= i, j != sink): ``"max"`` (the largest other logit) or ``"lse"``
(their log-sum-exp; then the gap equals the log-odds of the attention mass at the sink).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor

from .errors import AttentionError, ParameterError

Norm = Literal["none", "head", "layer"]
VARIANTS: tuple[str, ...] = ("none", "head", "layer")
COMPETITORS: tuple[str, ...] = ("max", "lse")


@dataclass(frozen=True)
class QKSpec:
    """Shape and normalisation of one attention layer's query/key path."""

    norm: str
    n_heads: int
    n_kv_heads: int
    head_dim: int
    scaling: float
    eps: float = 1e-6

    def __post_init__(self) -> None:
        if self.norm not in VARIANTS:
            raise ParameterError(f"QKSpec.norm got {self.norm!r}; allowed: {', '.join(VARIANTS)}")
        for name in ("n_heads", "n_kv_heads", "head_dim"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ParameterError(f"QKSpec.{name} got {v!r}; allowed: a positive integer")
        if self.n_heads % self.n_kv_heads:
            raise ParameterError(f"QKSpec: n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
        if not (self.scaling > 0 and math.isfinite(self.scaling)):
            raise ParameterError(f"QKSpec.scaling got {self.scaling!r}; allowed: a positive finite number")
        if not (self.eps >= 0 and math.isfinite(self.eps)):
            raise ParameterError(f"QKSpec.eps got {self.eps!r}; allowed: a finite number >= 0")

    @property
    def groups(self) -> int:
        """Query heads per key head (1 without GQA)."""
        return self.n_heads // self.n_kv_heads


# ---------------------------------------------------------------------------------------
# the forward computation (exact)

def rms_normalize(v: Tensor, eps: float) -> Tensor:
    """N(v) = v / sqrt(mean(v^2) + eps) over the last dimension. [..., n] -> [..., n]."""
    return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)


def rope_tables(T: int, head_dim: int, base: float = 10000.0, dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor]:
    """Standard RoPE tables (Hugging Face ``rotate_half`` layout) for positions 0..T-1. -> cos, sin [T, dh]."""
    if head_dim % 2:
        raise ParameterError(f"RoPE needs an even head_dim, got {head_dim}")
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(v: Tensor) -> Tensor:
    a, b = v.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


def apply_rope(v: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE in the ``rotate_half`` layout: v * cos + rotate_half(v) * sin. v [H, T, dh], cos/sin [T, dh]."""
    return v * cos + _rotate_half(v) * sin


def rope_gain(cos: Tensor, sin: Tensor) -> Tensor:
    """Operator norm of the RoPE map at each position (1 for a pure rotation). cos/sin [T, dh] -> [T].

    In the rotate_half layout entries (m, m + dh/2) mix through the 2x2 block
    [[cos_m, -sin_m], [sin_{m+dh/2}, cos_{m+dh/2}]]; the map's norm is the largest block norm.
    """
    h = cos.shape[-1] // 2
    c1, c2, s1, s2 = cos[..., :h], cos[..., h:], sin[..., :h], sin[..., h:]
    blocks = torch.stack([torch.stack([c1, -s1], -1), torch.stack([s2, c2], -1)], -2)  # [T, h, 2, 2]
    return torch.linalg.matrix_norm(blocks, ord=2).amax(-1)


def _check_inputs(x: Tensor, w: Tensor, n_heads: int, spec: QKSpec, what: str) -> None:
    if x.ndim != 2:
        raise ParameterError(f"x must have shape [T, d], got {tuple(x.shape)}")
    if w.ndim != 2 or w.shape != (n_heads * spec.head_dim, x.shape[1]):
        raise ParameterError(f"{what} must have shape [{n_heads}*{spec.head_dim}, {x.shape[1]}] = "
                             f"[{n_heads * spec.head_dim}, {x.shape[1]}], got {tuple(w.shape)}")


def _gain(g: Tensor | None, n_heads: int, spec: QKSpec, what: str, like: Tensor) -> Tensor:
    """Effective gain as [n_heads, dh] (ones when g is None)."""
    dh = spec.head_dim
    if g is None:
        return torch.ones(n_heads, dh, dtype=like.dtype, device=like.device)
    g = g.to(like.dtype)
    if spec.norm == "head" and g.shape == (dh,):
        return g.expand(n_heads, dh)
    if g.shape == (n_heads, dh):
        return g
    if g.numel() == n_heads * dh and g.ndim == 1:
        return g.view(n_heads, dh)
    raise ParameterError(f"{what} has shape {tuple(g.shape)}; allowed for norm={spec.norm!r}: "
                         f"[{dh}] (shared by heads), [{n_heads}, {dh}] or [{n_heads * dh}]")


def project(x: Tensor, w: Tensor, n_heads: int, spec: QKSpec, g: Tensor | None = None,
            b: Tensor | None = None, rope: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """Queries (or keys) of one layer: normalise per ``spec.norm``, then RoPE.

    x [T, d], w [n_heads*dh, d], g effective gain ([dh], [n_heads, dh] or [n_heads*dh]),
    b bias [n_heads*dh] or None, rope (cos, sin) [T, dh] or None -> [n_heads, T, dh].
    """
    _check_inputs(x, w, n_heads, spec, "weight")
    T, dh = x.shape[0], spec.head_dim
    u = x @ w.T
    if b is not None:
        u = u + b
    if spec.norm == "layer":
        u = rms_normalize(u, spec.eps)
    u = u.view(T, n_heads, dh).transpose(0, 1)  # [n_heads, T, dh]
    if spec.norm == "head":
        u = rms_normalize(u, spec.eps)
    if spec.norm != "none":
        u = u * _gain(g, n_heads, spec, "gain", u)[:, None, :]
    if rope is not None:
        u = apply_rope(u, rope[0].to(u.dtype), rope[1].to(u.dtype))
    return u


def qk_logits(x: Tensor, wq: Tensor, wk: Tensor, spec: QKSpec, gq: Tensor | None = None, gk: Tensor | None = None,
              rope: tuple[Tensor, Tensor] | None = None, bq: Tensor | None = None, bk: Tensor | None = None) -> Tensor:
    """Attention logits scaling * <q_i, k_j> of every head (no mask). x [T, d] -> [H, T, T]."""
    q = project(x, wq, spec.n_heads, spec, gq, bq, rope)
    k = project(x, wk, spec.n_kv_heads, spec, gk, bk, rope)
    k = k.repeat_interleave(spec.groups, dim=0)
    return spec.scaling * q @ k.transpose(-1, -2)


def _visible(T: int, sink: int, device: Any) -> Tensor:
    """[T, T] bool: key j is a competitor of query i (j <= i and j != sink)."""
    i = torch.arange(T, device=device)
    return (i[None, :] <= i[:, None]) & (i[None, :] != sink)


def _check_positions(T: int, sink: int, query_start: int) -> None:
    if not (0 <= sink < T):
        raise ParameterError(f"sink index {sink} is outside the sequence of length {T}")
    if not (sink < query_start < T):
        raise ParameterError(f"query_start={query_start} must satisfy sink < query_start < T "
                             f"(sink={sink}, T={T}) so that every query sees the sink and a competitor")


def sink_gap(logits: Tensor, sink: int = 0, query_start: int = 1, competitor: str = "max") -> Tensor:
    """Sink gap of each query: logit of the sink key minus the competitor over the other visible keys.

    logits [..., T, T] (query x key, unmasked) -> [..., Tq] for queries query_start..T-1.
    competitor "max": the largest other logit. "lse": their log-sum-exp, so the gap equals
    log(p_sink / (1 - p_sink)) of the causal softmax.
    """
    if competitor not in COMPETITORS:
        raise ParameterError(f"competitor got {competitor!r}; allowed: {', '.join(COMPETITORS)}")
    T = logits.shape[-1]
    _check_positions(T, sink, query_start)
    if not torch.isfinite(logits).all():
        raise AttentionError("attention logits contain NaN or inf; check the inputs and eps")
    vis = _visible(T, sink, logits.device)
    other = logits.masked_fill(~vis, float("-inf"))
    comp = other.amax(-1) if competitor == "max" else torch.logsumexp(other, -1)
    gap = logits[..., :, sink] - comp
    return gap[..., query_start:]


def gap_changes(x: Tensor, wq: Tensor, wk: Tensor, dwq: Tensor, dwk: Tensor, spec: QKSpec,
                gq: Tensor | None = None, gk: Tensor | None = None, rope: tuple[Tensor, Tensor] | None = None,
                sink: int = 0, query_start: int = 1, bq: Tensor | None = None, bk: Tensor | None = None,
                competitors: tuple[str, ...] = COMPETITORS) -> dict[str, Tensor]:
    """Exact signed change of the sink gap when W_Q -> W_Q + dwq, W_K -> W_K + dwk, for each competitor.

    -> {competitor: [H, Tq]} plus "before": {competitor: [H, Tq]} (the unperturbed gaps).
    Both gaps are computed from scratch by the forward path (no linearisation).
    """
    lg0 = qk_logits(x, wq, wk, spec, gq, gk, rope, bq, bk)
    lg1 = qk_logits(x, wq + dwq, wk + dwk, spec, gq, gk, rope, bq, bk)
    out: dict = {"before": {}}
    for c in competitors:
        g0 = sink_gap(lg0, sink, query_start, c)
        out["before"][c] = g0
        out[c] = sink_gap(lg1, sink, query_start, c) - g0
    return out


def gap_change(x: Tensor, wq: Tensor, wk: Tensor, dwq: Tensor, dwk: Tensor, spec: QKSpec,
               gq: Tensor | None = None, gk: Tensor | None = None, rope: tuple[Tensor, Tensor] | None = None,
               sink: int = 0, query_start: int = 1, competitor: str = "max",
               bq: Tensor | None = None, bk: Tensor | None = None) -> Tensor:
    """Exact signed change of the sink gap when W_Q -> W_Q + dwq, W_K -> W_K + dwk. -> [H, Tq]."""
    if competitor not in COMPETITORS:
        raise ParameterError(f"competitor got {competitor!r}; allowed: {', '.join(COMPETITORS)}")
    return gap_changes(x, wq, wk, dwq, dwk, spec, gq, gk, rope, sink, query_start, bq, bk, (competitor,))[competitor]


# ---------------------------------------------------------------------------------------
# the bound (Theorem 1)

def normalised_change_bound(u_norm: Tensor, du_bound: Tensor, dim: int, eps: float) -> Tensor:
    """Bound on |N(u') - N(u)| given |u| and a bound on |u' - u|, N normalising over ``dim`` entries.

    sqrt(dim) * |du| / sqrt(a(u) * a_lo), a(u) = sqrt(|u|^2 + dim*eps), a_lo = sqrt(max(|u| - |du|, 0)^2 + dim*eps)
    (a_lo is a lower bound on a(u')). Elementwise over broadcastable tensors; inf where a_lo = 0.
    """
    c = dim * eps
    a = torch.sqrt(u_norm ** 2 + c)
    a_lo = torch.sqrt(torch.clamp(u_norm - du_bound, min=0.0) ** 2 + c)
    out = math.sqrt(dim) * du_bound / torch.sqrt(a * a_lo)
    return torch.where(du_bound == 0, torch.zeros_like(out), torch.nan_to_num(out, nan=float("inf")))


def spectral_norm(a: Tensor) -> Tensor:
    """Largest singular value of a matrix or a batch of matrices. [..., m, n] -> [...].

    Computed as sqrt(largest eigenvalue of the smaller Gram matrix): 2-5x faster than an SVD and,
    in float64, within about 1e-15 relative of torch.linalg.matrix_norm(a, ord=2). Under autograd the
    SVD route is used (eigvalsh's gradient is undefined at repeated eigenvalues, e.g. zero blocks).
    """
    if a.requires_grad:
        return torch.linalg.matrix_norm(a, ord=2)
    m, n = a.shape[-2:]
    G = a @ a.transpose(-1, -2) if m <= n else a.transpose(-1, -2) @ a
    return torch.linalg.eigvalsh(G)[..., -1].clamp_min(0).sqrt()


def _block_norms(w: Tensor, n_heads: int, dh: int) -> Tensor:
    """Spectral norm of each head's [dh, d] block. w [n_heads*dh, d] -> [n_heads]."""
    return spectral_norm(w.view(n_heads, dh, -1))


def norm_and_change_bounds(x: Tensor, w: Tensor, dw: Tensor, n_heads: int, spec: QKSpec,
                           g: Tensor | None = None, b: Tensor | None = None,
                           w_block_norms: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Per head and token: a bound n >= |q| and a bound delta >= |q' - q| (before RoPE). -> ([n_heads, T], [n_heads, T]).

    none : n = ||W_h|| |x| + |b_h|,  delta = ||dW_h|| |x|                    (grow with |x|)
    head : n = |g_h * N(u_h)|,        delta = min(||g_h||_inf * L, n + ||g_h||_inf sqrt(dh)),
           L = normalised_change_bound(|u_h|, ||dW_h|| |x|, dh, eps)            (scale-free in x)
    layer: n = |g_h * N(u)_h|,        delta = ||g_h||_inf * min(sqrt(D)(b_h + |u_h| b/a(u)) / a_lo,
           normalised_change_bound(|u|, b, D, eps)), capped by n + ||g_h||_inf sqrt(D),
           with b_h = ||dW_h|| |x|, b = ||dW|| |x|.
    ||.|| is the spectral norm (``spectral_norm``); |.| the Euclidean norm. ``w_block_norms`` [n_heads]
    may carry the precomputed ||W_h|| (only "none" uses them) to save time in loops.
    """
    _check_inputs(x, w, n_heads, spec, "weight")
    _check_inputs(x, dw, n_heads, spec, "weight change")
    dh, T = spec.head_dim, x.shape[0]
    xn = x.norm(dim=-1)                                     # [T]
    dW_h = _block_norms(dw, n_heads, dh)                    # [n_heads]
    beta_h = dW_h[:, None] * xn[None, :]                    # [n_heads, T] >= |dW_h x|
    u = x @ w.T + (b if b is not None else 0.0)             # [T, n_heads*dh]
    uh = u.view(T, n_heads, dh).transpose(0, 1)             # [n_heads, T, dh]
    if spec.norm == "none":
        wn = _block_norms(w, n_heads, dh) if w_block_norms is None else w_block_norms.to(x.dtype)
        n = wn[:, None] * xn[None, :]
        if b is not None:
            n = n + b.view(n_heads, dh).norm(dim=-1)[:, None]
        return n, beta_h
    gain = _gain(g, n_heads, spec, "gain", x)               # [n_heads, dh]
    gmax = gain.abs().amax(-1)[:, None]                     # [n_heads, 1]
    if spec.norm == "head":
        n = (gain[:, None, :] * rms_normalize(uh, spec.eps)).norm(dim=-1)
        lip = normalised_change_bound(uh.norm(dim=-1), beta_h, dh, spec.eps)
        delta = torch.minimum(gmax * lip, n + gmax * math.sqrt(dh))
        return n, delta
    D = n_heads * dh
    nu = rms_normalize(u, spec.eps).view(T, n_heads, dh).transpose(0, 1)
    n = (gain[:, None, :] * nu).norm(dim=-1)
    beta = spectral_norm(dw) * xn         # [T] >= |dW x|
    un = u.norm(dim=-1)                                     # [T]
    c = D * spec.eps
    a = torch.sqrt(un ** 2 + c)
    a_lo = torch.sqrt(torch.clamp(un - beta, min=0.0) ** 2 + c)
    t1 = math.sqrt(D) * (beta_h + uh.norm(dim=-1) * (beta / a)[None, :]) / a_lo[None, :]
    t1 = torch.where(beta[None, :] == 0, torch.zeros_like(t1), torch.nan_to_num(t1, nan=float("inf")))
    t2 = normalised_change_bound(un, beta, D, spec.eps)[None, :].expand_as(t1)
    delta = torch.minimum(gmax * torch.minimum(t1, t2), n + gmax * math.sqrt(D))
    return n, delta


def logit_change_bound(x: Tensor, wq: Tensor, wk: Tensor, dwq: Tensor, dwk: Tensor, spec: QKSpec,
                       gq: Tensor | None = None, gk: Tensor | None = None, rope: tuple[Tensor, Tensor] | None = None,
                       bq: Tensor | None = None, bk: Tensor | None = None,
                       w_block_norms: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """B_ij >= |l'_ij - l_ij| for every head, query i and key j. -> [H, T, T].

    B_ij = scaling * r_i r_j * (dq_i m_j + n_i dk_j + dq_i dk_j), with (n, dq) the query bounds and
    (m, dk) the key bounds of ``norm_and_change_bounds`` and r the RoPE gain (1 for rotations).
    """
    wn = w_block_norms or (None, None)
    nq, dq = norm_and_change_bounds(x, wq, dwq, spec.n_heads, spec, gq, bq, wn[0])
    nk, dk = norm_and_change_bounds(x, wk, dwk, spec.n_kv_heads, spec, gk, bk, wn[1])
    nk, dk = nk.repeat_interleave(spec.groups, 0), dk.repeat_interleave(spec.groups, 0)
    B = dq[:, :, None] * nk[:, None, :] + nq[:, :, None] * dk[:, None, :] + dq[:, :, None] * dk[:, None, :]
    B = spec.scaling * B
    if rope is not None:
        r = rope_gain(rope[0].to(x.dtype), rope[1].to(x.dtype))
        B = B * r[None, :, None] * r[None, None, :]
    return B


def gap_change_bound(x: Tensor, wq: Tensor, wk: Tensor, dwq: Tensor, dwk: Tensor, spec: QKSpec,
                     gq: Tensor | None = None, gk: Tensor | None = None, rope: tuple[Tensor, Tensor] | None = None,
                     sink: int = 0, query_start: int = 1,
                     bq: Tensor | None = None, bk: Tensor | None = None,
                     w_block_norms: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """Theorem 1: |change of the sink gap| <= B_{i,sink} + max_{j<=i, j!=sink} B_ij, for both competitors. -> [H, Tq].

    ``w_block_norms`` = (||W_Q,h|| [H], ||W_K,h|| [Hkv]) may be precomputed (see ``head_norms``).
    """
    B = logit_change_bound(x, wq, wk, dwq, dwk, spec, gq, gk, rope, bq, bk, w_block_norms)
    T = B.shape[-1]
    _check_positions(T, sink, query_start)
    vis = _visible(T, sink, B.device)
    comp = B.masked_fill(~vis, float("-inf")).amax(-1)
    return (B[..., :, sink] + comp)[..., query_start:]


def first_order_gap_bound(x: Tensor, wq: Tensor, wk: Tensor, dwq: Tensor, dwk: Tensor, spec: QKSpec,
                          sink: int = 0, query_start: int = 1) -> Tensor:
    """The bound WITHOUT its second-order term (norm "none" only): a deliberately wrong bound for
    the "Breaking the bound" section (RoPE, if any, must be a pure rotation). -> [H, Tq]."""
    if spec.norm != "none":
        raise ParameterError("first_order_gap_bound is defined for norm='none' only")
    nq, dq = norm_and_change_bounds(x, wq, dwq, spec.n_heads, spec)
    nk, dk = norm_and_change_bounds(x, wk, dwk, spec.n_kv_heads, spec)
    nk, dk = nk.repeat_interleave(spec.groups, 0), dk.repeat_interleave(spec.groups, 0)
    B = spec.scaling * (dq[:, :, None] * nk[:, None, :] + nq[:, :, None] * dk[:, None, :])
    vis = _visible(B.shape[-1], sink, B.device)
    return (B[..., :, sink] + B.masked_fill(~vis, float("-inf")).amax(-1))[..., query_start:]


# ---------------------------------------------------------------------------------------
# instances: random directions, random layers, real layers

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
    100). Weights: anisotropic (column scales in [0.1, 10]); for "layer" each head gets its own raw
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
        if norm == "layer":
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
        width_q = dh if norm == "head" else H * dh
        width_k = dh if norm == "head" else Hkv * dh
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


# ---------------------------------------------------------------------------------------
# real layers from a Hugging Face model

@dataclass
class LayerQK:
    """What one real attention layer needs for the bound: its inputs, weights and spec."""

    layer: int
    x: Tensor                           # [T, d] input of q_proj/k_proj (after the layer's input norm)
    residual: Tensor                    # [T, d] residual stream entering the decoder layer
    wq: Tensor                          # [H*dh, d]
    wk: Tensor                          # [Hkv*dh, d]
    spec: QKSpec
    gq: Tensor | None = None            # effective gains of q_norm/k_norm
    gk: Tensor | None = None
    bq: Tensor | None = None            # projection biases (Qwen2)
    bk: Tensor | None = None
    rope: tuple[Tensor, Tensor] | None = None   # cos, sin [T, dh]
    sliding_window: int | None = None

    def kwargs(self, dwq: Tensor, dwk: Tensor) -> dict:
        return dict(x=self.x, wq=self.wq, wk=self.wk, dwq=dwq, dwk=dwk, spec=self.spec, gq=self.gq,
                    gk=self.gk, rope=self.rope, bq=self.bq, bk=self.bk)


def _decoder_layers(model: Any) -> list:
    for path in ("model.layers", "model.language_model.layers", "layers", "language_model.model.layers"):
        obj = model
        try:
            for p in path.split("."):
                obj = getattr(obj, p)
            return list(obj)
        except AttributeError:
            continue
    raise AttentionError(f"cannot find the decoder layers of {type(model).__name__}: "
                         "capture_qk_inputs supports Llama-, Qwen-, Gemma-3- and OLMo-2-style models")


def _effective_gain(norm_mod: Any, width: int) -> tuple[Tensor, float]:
    """Effective gain g and eps of an RMSNorm module, checked on a random vector: norm(v) = g * N(v)."""
    eps = getattr(norm_mod, "eps", getattr(norm_mod, "variance_epsilon", None))
    if eps is None:
        raise AttentionError(f"{type(norm_mod).__name__} has no eps attribute; not an RMSNorm sinklib knows")
    p = next(norm_mod.parameters())
    with torch.no_grad():
        ones = torch.ones(width, dtype=torch.float32, device=p.device)
        g = (norm_mod(ones.to(p.dtype)).float() * math.sqrt(1 + eps)).double().cpu()
        v = torch.randn(3, width, dtype=torch.float32, device=p.device)
        ref = (g * rms_normalize(v.double().cpu(), eps))
        got = norm_mod(v.to(p.dtype)).double().cpu()
    tol = 1e-4 if p.dtype == torch.float32 else 5e-2
    if not torch.allclose(got, ref, rtol=tol, atol=tol * float(ref.abs().max())):
        raise AttentionError(f"{type(norm_mod).__name__} is not of the form g * v / sqrt(mean(v^2) + eps); "
                             "the bound does not cover it")
    return g, float(eps)


def head_norms(wq: Tensor, wk: Tensor, spec: QKSpec) -> tuple[Tensor, Tensor]:
    """Spectral norms of the head blocks: (||W_Q,h|| [H], ||W_K,h|| [Hkv]) (for ``w_block_norms``)."""
    return _block_norms(wq, spec.n_heads, spec.head_dim), _block_norms(wk, spec.n_kv_heads, spec.head_dim)


def layer_sensitivity(layer: LayerQK, rel_changes: list[float], n_directions: int, generator: torch.Generator,
                      norm: str = "fro", sink: int = 0, query_start: int = 1) -> list[dict]:
    """Random weight changes of controlled relative size on one real layer: actual gap change vs bound.

    For each relative size and direction, dW_Q and dW_K are Gaussian with ||dW|| = rel * ||W|| (``norm``).
    -> rows {layer, rel, direction, violations, ratio_max, ratio_median, change_median (|d gap_lse|,
    median over heads and queries), change_max_median (|d gap_max|), bound_median, gap_lse_median,
    flips_max (fraction of (head, query) whose max-gap changes sign), ratios (np.ndarray of all
    actual/bound values, both competitors)}.
    """
    wn = head_norms(layer.wq, layer.wk, layer.spec)
    rows = []
    for rel in rel_changes:
        for r in range(n_directions):
            dwq = random_direction(layer.wq, rel, generator, norm)
            dwk = random_direction(layer.wk, rel, generator, norm)
            kw = layer.kwargs(dwq, dwk)
            ch = gap_changes(**kw, sink=sink, query_start=query_start)
            bnd = gap_change_bound(**kw, sink=sink, query_start=query_start, w_block_norms=wn)
            ratios = torch.cat([(ch["max"].abs() / bnd).flatten(), (ch["lse"].abs() / bnd).flatten()])
            g0 = ch["before"]["max"]
            rows.append(dict(
                layer=layer.layer, rel=rel, direction=r, violations=int((ratios > 1 + 1e-9).sum()),
                ratio_max=float(ratios.max()), ratio_median=float(ratios.median()),
                change_median=float(ch["lse"].abs().median()), change_max_median=float(ch["max"].abs().median()),
                bound_median=float(bnd.median()), gap_lse_median=float(ch["before"]["lse"].median()),
                flips_max=float((torch.sign(g0 + ch["max"]) != torch.sign(g0)).double().mean()),
                ratios=ratios.numpy()))
    return rows


def capture_qk_inputs(model: Any, input_ids: Tensor, layers: list[int] | None = None,
                      dtype: torch.dtype = torch.float64) -> list[LayerQK]:
    """Run one forward pass and return, for each chosen layer, the input of q_proj/k_proj, the residual
    stream, the weights, gains, RoPE tables and spec (all on CPU in ``dtype``).

    input_ids [1, T] (one unpadded prompt). Sliding-window layers are accepted only when T fits in the
    window (then the window changes nothing); logit soft-capping is refused.
    """
    if input_ids.ndim != 2 or input_ids.shape[0] != 1:
        raise ParameterError(f"input_ids must have shape [1, T], got {tuple(input_ids.shape)}")
    T = input_ids.shape[1]
    if T < 3:
        raise ParameterError(f"the prompt has {T} tokens; the sink gap needs at least 3")
    dec = _decoder_layers(model)
    chosen = list(range(len(dec))) if layers is None else [int(l) for l in layers]
    for l in chosen:
        if not 0 <= l < len(dec):
            raise ParameterError(f"layer {l} is outside the model's {len(dec)} layers")
    cfg = getattr(model.config, "text_config", model.config)
    if getattr(cfg, "attn_logit_softcapping", None):
        raise AttentionError("this model soft-caps attention logits; the bound here does not model it")
    seen: dict[int, dict] = {l: {} for l in chosen}
    handles = []

    def pre_layer(l: int):
        def hook(mod, args, kwargs):
            h = args[0] if args else kwargs["hidden_states"]
            seen[l]["residual"] = h.detach()
        return hook

    def pre_attn(l: int):
        def hook(mod, args, kwargs):
            h = args[0] if args else kwargs["hidden_states"]
            seen[l]["x"] = h.detach()
            pe = kwargs.get("position_embeddings")
            seen[l]["rope"] = None if pe is None else (pe[0].detach(), pe[1].detach())
        return hook

    try:
        for l in chosen:
            handles.append(dec[l].register_forward_pre_hook(pre_layer(l), with_kwargs=True))
            handles.append(dec[l].self_attn.register_forward_pre_hook(pre_attn(l), with_kwargs=True))
        with torch.no_grad():
            model(input_ids=input_ids.to(next(model.parameters()).device), use_cache=False)
    finally:
        for h in handles:
            h.remove()

    out = []
    for l in chosen:
        attn = dec[l].self_attn
        H = cfg.num_attention_heads
        Hkv = getattr(cfg, "num_key_value_heads", None) or H
        dh = getattr(attn, "head_dim", None) or getattr(cfg, "head_dim", None) or cfg.hidden_size // H
        window = getattr(attn, "sliding_window", None)
        if window is not None and T > window:
            raise ParameterError(f"layer {l} attends within a sliding window of {window} tokens but the prompt "
                                 f"has {T}; shorten the prompt (max_tokens) so the sink stays visible")
        qn, kn = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        gq = gk = None
        eps = 1e-6
        if qn is None:
            norm = "none"
        else:
            wq_n = next(qn.parameters()).numel()
            norm = "head" if wq_n == dh else "layer"
            gq, eps = _effective_gain(qn, wq_n)
            gk, eps_k = _effective_gain(kn, next(kn.parameters()).numel())
            if eps_k != eps:
                raise AttentionError(f"layer {l}: q_norm eps {eps} differs from k_norm eps {eps_k}")
            gq, gk = gq.to(dtype), gk.to(dtype)
        spec = QKSpec(norm, H, Hkv, int(dh), scaling=float(attn.scaling), eps=float(eps))
        cv = lambda t: None if t is None else t.detach().to("cpu", dtype)  # noqa: E731
        rope = seen[l]["rope"]
        out.append(LayerQK(
            layer=l, x=cv(seen[l]["x"][0]), residual=cv(seen[l]["residual"][0]),
            wq=cv(attn.q_proj.weight), wk=cv(attn.k_proj.weight), spec=spec, gq=gq, gk=gk,
            bq=cv(attn.q_proj.bias), bk=cv(attn.k_proj.bias),
            rope=None if rope is None else (cv(rope[0][0]), cv(rope[1][0])), sliding_window=window))
    return out
