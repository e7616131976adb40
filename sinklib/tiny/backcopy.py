"""Bigram-Backcopy (Guo et al., arXiv 2410.13835) and a minimal GPT-2-style block with three QK-norm variants
(chapter 9).

The corpus: a Markov chain over ``n_chain`` tokens (transition rows drawn from a Dirichlet, fixed by
``world_seed``) with ``n_triggers`` trigger tokens. At every step the next unit is, with probability
``p = share / (1 - share)`` clipped to 1, a trigger followed by a copy of the token before the trigger
(the backcopy rule), else the chain's next token. So ``share`` is the expected fraction of trigger tokens.
Every sequence starts with BOS at position 0 (``bos="fixed"``; BOS never occurs elsewhere) or with a chain
token drawn at random (``bos="resampled"``); no packing.

The model: token + learned absolute position embeddings, ``n_layers`` pre-LayerNorm blocks (attention with
biases, GELU MLP), final LayerNorm, tied LM head, no dropout. The variants differ only in how q and k are
normalised before the dot product: ``none``; ``per_head`` (RMSNorm over each head's ``d_head`` entries,
one gain vector shared by the heads, as Qwen3); ``layerwise`` (one RMSNorm over all heads' queries (keys)
before the head split, as OLMo-2). The attention map is computed explicitly, so it can be returned per layer
and changed by chapter 8's intervention (``sinklib.core.intervene.adjust_logits_and_probs``) with the sink at
position 0.

Token ids: 0 BOS, 1..n_chain chain tokens, then the triggers, then the tokens only the adaptation uses
(answer marker, labels, image descriptions: ``Vocab``).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import nn

from sinklib.errors import ParameterError
from sinklib.core.intervene import adjust_logits_and_probs
from sinklib.core.params import check_choice, check_float, check_int

VARIANTS: tuple[str, ...] = ("none", "per_head", "layerwise")
BOS_MODES: tuple[str, ...] = ("fixed", "resampled")
BOS = 0


@dataclass(frozen=True)
class Vocab:
    """Token ids of the corpus and of the miniature adaptation."""

    n_chain: int = 64
    n_triggers: int = 3
    n_labels: int = 4

    @property
    def triggers(self) -> range:
        return range(1 + self.n_chain, 1 + self.n_chain + self.n_triggers)

    @property
    def answer(self) -> int:
        return 1 + self.n_chain + self.n_triggers

    @property
    def labels(self) -> range:
        return range(self.answer + 1, self.answer + 1 + self.n_labels)

    @property
    def descriptions(self) -> range:
        return range(self.labels.stop, self.labels.stop + self.n_labels)

    @property
    def size(self) -> int:
        return self.descriptions.stop


def transitions(vocab: Vocab, alpha: float, world_seed: int) -> np.ndarray:
    """The chain's transition matrix [n_chain, n_chain] (rows sum to 1), Dirichlet(alpha) rows."""
    rng = np.random.default_rng(world_seed)
    return rng.dirichlet(np.full(vocab.n_chain, alpha), size=vocab.n_chain)


def _trigger_prob(share: float) -> float:
    return min(1.0, share / (1.0 - share)) if share < 1 else 1.0


def sequences(trans: np.ndarray, vocab: Vocab, n: int, length: int, share: float, bos: str,
              rng: np.random.Generator) -> np.ndarray:
    """`n` Bigram-Backcopy sequences of `length` tokens -> int64 [n, length] (see module doc).

    Position 0: BOS (fixed) or a uniform chain token (resampled); position 1: a uniform chain token; from
    position 2 on, a row emits the copy of out[t-2] if out[t-1] is a trigger, else a trigger with
    probability p (when the copy still fits), else the chain's next token from its current state."""
    check_choice("bos", bos, BOS_MODES)
    p_trig = _trigger_prob(share)
    cum = np.cumsum(trans, axis=1)
    out = np.empty((n, length), dtype=np.int64)
    cur = rng.integers(0, vocab.n_chain, size=n)           # chain state (0-based) of the last chain token
    out[:, 0] = BOS if bos == "fixed" else cur + 1
    if bos == "resampled":
        cur = _step(cum, cur, rng, vocab)
    out[:, 1] = cur + 1 if length > 1 else out[:, 0]
    pending = np.zeros(n, dtype=bool)                      # out[t-1] is a trigger
    for t in range(2, length):
        nxt = _step(cum, cur, rng, vocab)
        trig = ~pending & (rng.random(n) < p_trig) & (t + 1 < length)
        trig_tok = vocab.triggers.start + rng.integers(0, vocab.n_triggers, size=n)
        out[:, t] = np.where(pending, out[:, t - 2], np.where(trig, trig_tok, nxt + 1))
        cur = np.where(pending | trig, cur, nxt)
        pending = trig
    return out


def _step(cum: np.ndarray, cur: np.ndarray, rng: np.random.Generator, vocab: Vocab) -> np.ndarray:
    """One chain step from states cur [n] -> next states [n] (0-based)."""
    u = rng.random(len(cur))
    return (cum[cur] < u[:, None]).sum(1).clip(max=vocab.n_chain - 1)


def roles(ids: torch.Tensor, vocab: Vocab) -> dict[str, torch.Tensor]:
    """Masks over target positions of ids [B, T] -> bool [B, T-1] each: 'rule' (the input token is a trigger,
    the target is the copy), 'knowledge' (input and target are chain tokens: a bigram transition),
    'dormant' (queries that do not need the copy head: every input position >= 1 that is not a trigger)."""
    x, y = ids[:, :-1], ids[:, 1:]
    trig = (x >= vocab.triggers.start) & (x < vocab.triggers.stop)
    chain = lambda z: (z >= 1) & (z <= vocab.n_chain)  # noqa: E731
    pos = torch.arange(x.shape[1]).expand_as(x)
    return {"rule": trig, "knowledge": chain(x) & chain(y) & (pos >= 1), "dormant": ~trig & (pos >= 1)}


# ---------------------------------------------------------------------------------------
# the model


@dataclass(frozen=True)
class BlockConfig:
    """The shape of a minimal model (the same for every variant)."""

    d_model: int = 128
    n_layers: int = 1
    n_heads: int = 2
    context: int = 256
    vocab_size: int = Vocab().size
    mlp_ratio: int = 4
    init_std: float = 0.02

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    def as_dict(self) -> dict:
        return asdict(self)


def block_config(**kw) -> BlockConfig:
    """A checked `BlockConfig`."""
    bad = set(kw) - set(BlockConfig.__dataclass_fields__)
    if bad:
        raise ParameterError(f"unknown block parameter(s) {sorted(bad)}; allowed: {', '.join(BlockConfig.__dataclass_fields__)}")
    c = BlockConfig(**kw)
    check_int("d_model", c.d_model, 8, 4096)
    check_int("n_layers", c.n_layers, 1, 64)
    check_int("n_heads", c.n_heads, 1, 64)
    check_int("context", c.context, 4, 1 << 14)
    if c.d_model % c.n_heads:
        raise ParameterError(f"parameter 'd_model' got {c.d_model}; allowed: a multiple of n_heads={c.n_heads}")
    return c


class RMSGain(nn.Module):
    """RMSNorm over the last dimension with a learned gain [width]."""

    def __init__(self, width: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    """Causal self-attention with explicit probabilities; `variant` sets the QK normalisation."""

    def __init__(self, cfg: BlockConfig, variant: str):
        super().__init__()
        self.h, self.dh, self.variant = cfg.n_heads, cfg.d_head, variant
        self.keep_probs = True
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.out = nn.Linear(cfg.d_model, cfg.d_model)
        if variant != "none":
            width = self.dh if variant == "per_head" else cfg.d_model
            self.q_norm, self.k_norm = RMSGain(width), RMSGain(width)

    def forward(self, x: torch.Tensor, plan: dict | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, T, D] -> (output [B, T, D], probabilities [B, H, T, T] (None when `keep_probs` is off and no
        plan is set: SDPA), values [B, H, T, dh])."""
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        if self.variant == "layerwise":
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = (z.view(b, t, self.h, self.dh).transpose(1, 2) for z in (q, k, v))
        if self.variant == "per_head":
            q, k = self.q_norm(q), self.k_norm(k)
        if plan is None and not self.keep_probs:  # training: fused attention, no map kept
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.out(y.transpose(1, 2).reshape(b, t, d)), None, v
        logits = q @ k.transpose(-1, -2) / math.sqrt(self.dh)
        allowed = torch.ones(t, t, dtype=torch.bool, device=x.device).tril().view(1, 1, t, t)
        logits = logits.masked_fill(~allowed, torch.finfo(logits.dtype).min)
        if plan is None:
            probs = torch.softmax(logits, dim=-1)
        else:
            probs, _ = adjust_logits_and_probs(logits, allowed, plan["heads"], torch.zeros(b, dtype=torch.long),
                                               torch.arange(t), plan["mode"])
        y = (probs @ v).transpose(1, 2).reshape(b, t, d)
        return self.out(y), probs, v


class Block(nn.Module):
    def __init__(self, cfg: BlockConfig, variant: str):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg, variant)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model), nn.GELU(),
                                 nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model))

    def forward(self, x, plan=None):
        a, probs, v = self.attn(self.ln1(x), plan)
        x = x + a
        return x + self.mlp(self.ln2(x)), probs, v


@dataclass
class Forward:
    """Logits [B, T, V]; per layer: attention probabilities [B, H, T, T], values [B, H, T, dh], and the
    residual stream after the layer [B, T, D]."""

    logits: torch.Tensor
    probs: list[torch.Tensor]
    values: list[torch.Tensor]
    hidden: list[torch.Tensor]


class BackcopyLM(nn.Module):
    """The minimal GPT-2-style LM of chapter 9 (see module doc). ``plans`` (layer -> intervention plan) is
    consulted when set: {'heads': bool [H], 'mode': 'remove' | 'remove_matched' | 'shift'}."""

    def __init__(self, cfg: BlockConfig, variant: str):
        super().__init__()
        self.cfg, self.variant = cfg, check_choice("variant", variant, VARIANTS)
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.context, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, variant) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.plans: dict[int, dict] = {}

    def keep_probs(self, on: bool) -> None:
        """Compute explicit attention maps (on) or use fused SDPA where no intervention is set (off)."""
        for blk in self.blocks:
            blk.attn.keep_probs = on

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.tok(ids)

    def forward(self, ids: torch.Tensor | None = None, embeds: torch.Tensor | None = None) -> Forward:
        """ids [B, T] (or embeds [B, T, D] from `embed` plus prefix vectors) -> `Forward`."""
        x = self.embed(ids) if embeds is None else embeds
        t = x.shape[1]
        if t > self.cfg.context:
            raise ParameterError(f"a sequence of {t} tokens is longer than the context {self.cfg.context}")
        x = x + self.pos(torch.arange(t, device=x.device))
        probs, values, hidden = [], [], []
        for i, blk in enumerate(self.blocks):
            x, p, v = blk(x, self.plans.get(i))
            probs.append(p)
            values.append(v)
            hidden.append(x)
        return Forward(self.ln_f(x) @ self.tok.weight.T, probs, values, hidden)


@torch.no_grad()
def init_weights(model: nn.Module, seed: int, std: float) -> None:
    """Matrices N(0, std^2) drawn per parameter name from (seed, name), biases 0, norm gains 1: the same
    seed gives the variants the same shared weights."""
    from sinklib.core.cache import RANDOM_SEED_MODULUS, key_seed

    for name, p in model.named_parameters():
        if p.ndim == 1:
            p.fill_(1.0 if name.endswith("weight") else 0.0)
            continue
        g = torch.Generator().manual_seed(key_seed(seed, name, RANDOM_SEED_MODULUS))
        p.copy_(torch.randn(p.shape, generator=g) * std)


def build(variant: str, cfg: BlockConfig | None = None, seed: int = 0) -> BackcopyLM:
    """A freshly initialised `BackcopyLM` of `variant`, in eval mode."""
    cfg = cfg or block_config()
    model = BackcopyLM(cfg, variant)
    init_weights(model, check_int("seed", seed, 0), check_float("init_std", cfg.init_std, 0.0, 1.0))
    return model.eval()
