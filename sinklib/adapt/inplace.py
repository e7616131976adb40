"""The random control for a model too large for three copies of its weights (chapter 11's 1.5B model).

`vl.random_direction_like` returns a new state dict and needs the base and the adapted state besides it: three
copies of the weights beside the model's own. Here the control is made inside the model instead: the norm of the
adapted change of every tensor is read from the two checkpoints one tensor at a time (`change_norms`), the base
weights are loaded into the model, and each tensor moves by a Gaussian direction of that norm, drawn from the same
per-key generator as `random_direction_like` (`add_random`; each storage once, so tied tensors move together).
At size 1 the result equals `random_direction_like`'s; at size k it is base + k times the direction (the same
direction as `vl.scaled_change` of it, equal up to float32 rounding). The next-token KL from the base model is
computed against the base's log-probabilities computed once (`kl_in_place`), so only the model and those
log-probabilities are in memory.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sinklib.core.anatomy import pad_batch
from sinklib.core.cache import RANDOM_SEED_MODULUS, key_seed
from sinklib.errors import ParameterError


def change_norms(base_dir: str | Path, other_dir: str | Path) -> dict[str, float]:
    """||other_k - base_k||_F of every floating-point tensor stored in both checkpoints (`model.safetensors`; tied
    tensors are stored once), read one tensor at a time."""
    from safetensors import safe_open

    from sinklib.core import cache

    for d in (base_dir, other_dir):  # one carried without its weights is made first (or a clear error)
        cache.ensure_weights(d)
    out: dict[str, float] = {}
    with safe_open(str(Path(base_dir) / "model.safetensors"), "pt") as fb, \
            safe_open(str(Path(other_dir) / "model.safetensors"), "pt") as fo:
        missing = sorted(set(fb.keys()) ^ set(fo.keys()))
        if missing:
            raise ParameterError(f"the two checkpoints hold different tensors (e.g. {missing[:3]}): compare a model "
                                 "with one trained from it")
        for k in fb.keys():
            b = fb.get_tensor(k)
            if b.is_floating_point():
                out[k] = float(torch.linalg.vector_norm(fo.get_tensor(k).double() - b.double()))
    return out


def add_random(model: torch.nn.Module, norms: Mapping[str, float], seed: int, scale: float = 1.0) -> None:
    """Move every floating-point tensor of `model` (holding the base weights) in place by `scale` times a Gaussian
    direction whose norm is the tensor's `norms` entry (found under any key of its storage), drawn from the
    generator `random_direction_like` uses for the storage's first key; each storage once."""
    sd = model.state_dict()
    keys_of: dict[int, list[str]] = {}
    for k, t in sd.items():
        if t.is_floating_point():
            keys_of.setdefault(t.data_ptr(), []).append(k)
    with torch.no_grad():
        for keys in keys_of.values():
            t = sd[keys[0]]
            target = next((norms[k] for k in keys if k in norms), None)
            if target is None:
                raise ParameterError(f"no change norm for {keys[0]}: the norms come from another model's checkpoints")
            g = torch.Generator().manual_seed(key_seed(seed, keys[0], RANDOM_SEED_MODULUS))
            r = torch.randn(t.shape, generator=g, dtype=torch.float32)
            s = float(target / torch.linalg.vector_norm(r, dtype=torch.float64)) if target > 0 else 0.0
            t.copy_((t.double() + r.double() * (s * scale)).to(t.dtype))


def kl_in_place(model: torch.nn.Module, seqs: Sequence[Sequence[int]], states: Mapping[str, Callable[[], None]], *,
                reference: Callable[[], None], batch_size: int = 4, pad_id: int = 0) -> dict[str, dict]:
    """`yardstick.next_token_kl` for states made inside the model: `reference()` puts the base weights in, each
    `states[name]()` puts one changed state in; the base's log-probabilities (float32) are computed once. The model
    ends holding the reference. -> {name: {'kl', 'per_seq', 'n_tokens'}}."""
    from sinklib.adapt.yardstick import _logprobs

    seqs = [list(map(int, s)) for s in seqs]
    if not seqs or min(map(len, seqs)) < 1:
        raise ParameterError("kl_in_place needs at least one non-empty token sequence")
    batches = [pad_batch(seqs[b:b + batch_size], pad_id, "right") for b in range(0, len(seqs), batch_size)]
    reference()
    ref = [_logprobs(model, ids, att).float() for ids, att in batches]
    out = {}
    for name, make in states.items():
        make()
        per_seq: list[float] = []
        for (ids, att), lp_ref in zip(batches, ref):
            lp_ref = lp_ref.double()
            kl = (lp_ref.exp() * (lp_ref - _logprobs(model, ids, att))).sum(-1)
            per_seq += [float(kl[r][att[r].bool()].mean()) for r in range(len(ids))]
        lengths = np.array([len(s) for s in seqs], dtype=float)
        out[name] = {"kl": float(np.dot(per_seq, lengths) / lengths.sum()), "per_seq": per_seq,
                     "n_tokens": int(lengths.sum())}
    reference()
    return out


__all__ = ["change_norms", "add_random", "kl_in_place"]
