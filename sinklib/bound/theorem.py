"""Theorem 1 and Remark 1: how a change of W_Q, W_K moves the sink gap.

Pure functions over tensors. Shapes use: T tokens, d model width, H query heads,
Hkv key/value heads (GQA: query head h reads key head h // (H // Hkv)), dh head dimension,
D = H * dh (the width a layerwise QK-norm normalises over), Tq = T - query_start queries.

The three QK-normalisation variants (``QKSpec.norm``):

* ``"none"``  (Llama, SmolLM2, Qwen2.5): q = W_Q x, k = W_K x.
* ``"per_head"``  (Qwen3, Gemma-3): each head's query/key is RMS-normalised on its own,
  q_h = g_q * N(W_Q,h x) with N(v) = v / sqrt(mean(v^2) + eps) over the dh entries.
* ``"layerwise"`` (OLMo-2, Olmo-3): one RMS over all heads concatenated,
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
from typing import Any

import torch
from torch import Tensor

from sinklib.core.anatomy import QK_NORM_TYPES
from sinklib.errors import AttentionError, ParameterError
from sinklib.core.params import COMMON, Dependent, check_float, integer, list_of, number, text

VARIANTS: tuple[str, ...] = QK_NORM_TYPES  # none, per_head, layerwise (sinklib.core.anatomy)
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
    if spec.norm == "per_head" and g.shape == (dh,):
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
    if spec.norm == "layerwise":
        u = rms_normalize(u, spec.eps)
    u = u.view(T, n_heads, dh).transpose(0, 1)  # [n_heads, T, dh]
    if spec.norm == "per_head":
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

    Computed as sqrt(largest eigenvalue of the smaller Gram matrix): cheaper than an SVD and,
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
    if spec.norm == "per_head":
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
# the parameters of chapter 3

def _in_rel_changes(name: str, value: Any, p: dict) -> float:
    value = check_float(name, value, 1e-12, 10.0)
    if value not in p["rel_changes"]:
        raise ParameterError(f"parameter {name!r} got {value!r}; allowed: one of rel_changes {p['rel_changes']}")
    return value


CHAPTER3_PARAMS = {
    **COMMON, "seed": integer(0), "n_draws": integer(1), "scale_min": number(1e-8),
    "scale_max": Dependent(lambda n, v, p: check_float(n, v, p["scale_min"])), "rel_min": number(1e-12),
    "rel_max": Dependent(lambda n, v, p: check_float(n, v, p["rel_min"], 10.0)), "n_adversarial": integer(0),
    "adversarial_steps": integer(1), "n_sweep_scales": integer(3), "n_sweep_instances": integer(1),
    "sweep_rel": number(1e-12, 10.0), "remark_heads": integer(2, 64), "remark_draws": integer(1),
    "remark_rel": number(1e-12, 10.0), "models": list_of(text()), "n_prompts": integer(1),
    "max_tokens": integer(4, 512), "layer_stride": integer(1), "rel_changes": list_of(number(1e-12, 10.0)),
    "n_directions": integer(1), "sensitivity_rel": Dependent(_in_rel_changes), "device": text()}
