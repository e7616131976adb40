"""Head-wise repair of an adapted model (chapter 8, in progress, #14): put the base model's W_Q and W_K back
for chosen heads of the adapted (VL) model, against two controls: as many randomly chosen heads, and the
same norm of change restored in other weights (rows of V/O and MLP matrices of the decoder layers). It tests
the claim that the text loss flows through the sink heads' queries and keys.

State dicts are those of `sinklib.pairs.Pair.states` (transformers key names). A query head's rows of
``q_proj`` (and bias) are its ``head_dim`` rows; with grouped-query attention a key head serves
``n_heads / n_kv_heads`` query heads, so restoring W_K for one query head restores its whole key group
(``info['kv_heads']`` says which). QK-norm gains, shared by all heads of a layer, are left as adapted.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from .errors import ParameterError

StateDict = Mapping[str, torch.Tensor]
_QK = ("q_proj", "k_proj")


def _attn_keys(state: StateDict, layer: int, part: str) -> list[str]:
    pat = re.compile(rf"(^|\.)layers\.{layer}\.self_attn\.{part}\.(weight|bias)$")
    keys = [k for k in state if pat.search(k)]
    if not any(k.endswith(".weight") for k in keys):
        raise ParameterError(f"no {part}.weight of layer {layer} in the state dict; head-wise repair needs "
                             "Llama-style attention module names (q_proj, k_proj)")
    return keys


def restore_heads(adapted: StateDict, base: StateDict, heads: Mapping[int, Sequence[int]], *, n_heads: int,
                  n_kv_heads: int, head_dim: int) -> tuple[dict[str, torch.Tensor], dict]:
    """A new state dict: `adapted` with the base model's W_Q rows (and bias) of every chosen query head and the
    W_K rows of their key heads. -> (state, {'restored_norm': norm of the change undone, 'q_heads', 'kv_heads'})."""
    if n_heads % n_kv_heads:
        raise ParameterError(f"n_heads={n_heads} is not a multiple of n_kv_heads={n_kv_heads}")
    group = n_heads // n_kv_heads
    out, sq = dict(adapted), 0.0
    info = {"q_heads": {}, "kv_heads": {}}
    for layer, hs in sorted(heads.items()):
        hs = sorted({int(h) for h in hs})
        if any(not 0 <= h < n_heads for h in hs):
            raise ParameterError(f"heads of layer {layer} must lie in 0..{n_heads - 1}, got {hs}")
        kv = sorted({h // group for h in hs})
        for part, rows in (("q_proj", hs), ("k_proj", kv)):
            for key in _attn_keys(adapted, layer, part):
                t = out[key].clone()
                for r in rows:
                    sl = slice(r * head_dim, (r + 1) * head_dim)
                    sq += float((base[key][sl].float() - t[sl].float()).pow(2).sum())
                    t[sl] = base[key][sl].to(t.dtype)
                out[key] = t
        info["q_heads"][int(layer)], info["kv_heads"][int(layer)] = hs, kv
    info["restored_norm"] = sq ** 0.5
    return out, info


def restore_other_rows(adapted: StateDict, base: StateDict, target_norm: float, *, seed: int = 0) -> tuple[dict, dict]:
    """The norm-matched control: rows of the decoder layers' 2-D weights other than W_Q and W_K (V, O, MLP),
    in a seeded random order, moved back to the base model until the change undone has norm `target_norm`
    (the last row only partly, so the norm matches exactly). -> (state, {'restored_norm', 'rows', 'keys'})."""
    if target_norm < 0:
        raise ParameterError(f"parameter 'target_norm' got {target_norm}; allowed: >= 0")
    cands = [(k, r) for k in sorted(adapted) if ".layers." in k and adapted[k].ndim == 2
             and not any(f".{p}." in k for p in _QK) for r in range(adapted[k].shape[0])]
    order = np.random.default_rng(seed).permutation(len(cands))
    out, sq, n_rows, keys = dict(adapted), 0.0, 0, set()
    for i in order:
        if sq >= target_norm ** 2 * (1 - 1e-12):
            break
        k, r = cands[i]
        d = base[k][r].float() - adapted[k][r].float()
        dn = float(d.pow(2).sum())
        if dn == 0:
            continue
        t = min(1.0, ((target_norm ** 2 - sq) / dn) ** 0.5)
        if k not in keys:
            out[k] = out[k].clone()
            keys.add(k)
        out[k][r] = (adapted[k][r].float() + t * d).to(out[k].dtype)
        sq += t * t * dn
        n_rows += 1
    if sq < target_norm ** 2 * (1 - 1e-9):
        raise ParameterError(f"the other weights differ from the base by only {sq ** 0.5:.3g} in norm, less than "
                             f"the {target_norm:.3g} to match")
    return out, {"restored_norm": sq ** 0.5, "rows": n_rows, "keys": sorted(keys)}


def heads_by_mass_change(base_mass, adapted_mass, layers: Sequence[int], k: int) -> dict[int, list[int]]:
    """The `k` (layer, head) pairs of `layers` whose sink mass [L, H] moved most (|adapted - base|) under adaptation."""
    from .intervene import top_heads

    return top_heads(np.abs(np.asarray(adapted_mass, float) - np.asarray(base_mass, float)), layers, k)
