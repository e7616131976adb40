"""Weight-space controls of a VL adaptation: a snapshot of a state dict and the norm-matched
random weight change (the same norm per tensor as the VL change, a random direction)."""
from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from sinklib.core.cache import RANDOM_SEED_MODULUS, key_seed
from sinklib.errors import ParameterError
from sinklib.core.params import check_choice, check_int

def clone_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """A detached copy of the model's state dict (tied weights stay tied: one copy, two keys)."""
    seen: dict[int, torch.Tensor] = {}
    out = {}
    for k, v in model.state_dict().items():
        key = (v.data_ptr(), v.shape, v.stride()) if v.numel() else None
        if key is not None and key in seen:
            out[k] = seen[key]
        else:
            out[k] = v.detach().clone()
            if key is not None:
                seen[key] = out[k]
    return out


def _check_pair(base_sd: Mapping[str, torch.Tensor], other_sd: Mapping[str, torch.Tensor], name: str) -> None:
    if set(base_sd) != set(other_sd):
        miss = sorted(set(base_sd) ^ set(other_sd))[:5]
        raise ParameterError(f"parameter '{name}' has different keys from 'base_sd' (e.g. {miss}); "
                             "use state dicts of the same architecture")
    for k in base_sd:
        if base_sd[k].shape != other_sd[k].shape:
            raise ParameterError(f"parameter '{name}': shape of {k!r} is {tuple(other_sd[k].shape)}, base has "
                                 f"{tuple(base_sd[k].shape)}")


def random_direction_like(base_sd: Mapping[str, torch.Tensor], adapted_sd: Mapping[str, torch.Tensor], seed: int = 0,
                          *, one_d: str = "match") -> dict[str, torch.Tensor]:
    """The norm-matched random weight change: `base + r_k` for every tensor k, where `r_k` is a
    Gaussian random direction rescaled so that ||r_k||_F = ||adapted_k - base_k||_F.

    Every floating-point tensor with >= 2 dimensions (weight matrices, embeddings, LM head) gets
    this treatment. 1-D tensors (RMSNorm/LayerNorm gains, QK-norm gains, biases) follow `one_d`:
    'match' (default: the same norm-matched random change, as an L2-norm-matched vector),
    'keep' (left at the base value), or 'copy' (given the VL change itself). Non-float tensors are
    copied from the base. Tied tensors (keys whose base and adapted values are equal) get the same
    random change. The direction of key k comes from a generator seeded by (seed, crc32(k)), so it
    does not depend on the order of keys. Returns new tensors in the base dtype.
    """
    seed = check_int("seed", seed, 0)
    one_d = check_choice("one_d", one_d, ("match", "keep", "copy"))
    _check_pair(base_sd, adapted_sd, "adapted_sd")
    out: dict[str, torch.Tensor] = {}
    done: list[tuple[str, torch.Tensor, torch.Tensor]] = []  # (key, base, adapted) already drawn
    for k in base_sd:
        b, a = base_sd[k], adapted_sd[k]
        if not b.is_floating_point():
            out[k] = b.clone()
            continue
        tied = next((kk for kk, bb, aa in done if bb.shape == b.shape
                     and (bb.data_ptr() == b.data_ptr() or (torch.equal(bb.flatten()[:16], b.flatten()[:16])
                                                            and torch.equal(bb, b)))
                     and (aa.data_ptr() == a.data_ptr() or torch.equal(aa, a))), None)
        if tied is not None:
            out[k] = out[tied]
            continue
        done.append((k, b, a))
        if b.dim() < 2 and one_d == "keep":
            out[k] = b.clone()
            continue
        if b.dim() < 2 and one_d == "copy":
            out[k] = a.clone()
            continue
        target = torch.linalg.vector_norm(a.double() - b.double())
        g = torch.Generator().manual_seed(key_seed(seed, k, RANDOM_SEED_MODULUS))
        r = torch.randn(b.shape, generator=g, dtype=torch.float32).to(b.device)
        scale = float(target / torch.linalg.vector_norm(r, dtype=torch.float64)) if target > 0 else 0.0
        out[k] = (b.double() + r.double() * scale).to(b.dtype)
    return out


#: tensor groups of `relative_change_by_group`, matched in order on the key (first match wins)
TENSOR_GROUPS = (("embeddings / LM head", ("embed", "lm_head", "wte", "wpe")),
                 ("attention Q, K", ("q_proj", "k_proj", "q_norm", "k_norm")),
                 ("attention V, O", ("v_proj", "o_proj")),
                 ("MLP", ("mlp", "gate_proj", "up_proj", "down_proj")),
                 ("norm gains", ("norm",)))


def tensor_group(key: str) -> str:
    """The `TENSOR_GROUPS` name of a state-dict key ('other' when none matches)."""
    for name, parts in TENSOR_GROUPS:
        if any(p in key for p in parts):
            return name
    return "other"


def relative_change_by_group(base_sd: Mapping[str, torch.Tensor], other_sd: Mapping[str, torch.Tensor], *,
                             whole: bool = False) -> list[dict]:
    """How large a weight change is against the weights, per tensor group: rows {group, tensors, parameters,
    'relative change' = ||other - base||_F / ||base||_F over the group's tensors together, 'largest tensor' =
    the largest per-tensor ratio}. Tied tensors (one storage, two keys) count once; non-float tensors are
    skipped. `whole=True`: one row, group 'whole model', over every tensor together."""
    _check_pair(base_sd, other_sd, "other_sd")
    acc: dict[str, dict] = {}
    seen: set = set()
    for k, b in base_sd.items():
        if not b.is_floating_point() or not b.numel():
            continue
        ident = (b.data_ptr(), tuple(b.shape))
        if ident in seen:
            continue
        seen.add(ident)
        d2 = float(torch.sum((other_sd[k].double() - b.double()) ** 2))
        w2 = float(torch.sum(b.double() ** 2))
        g = acc.setdefault(tensor_group(k), {"tensors": 0, "parameters": 0, "d2": 0.0, "w2": 0.0, "max": 0.0})
        g["tensors"] += 1
        g["parameters"] += b.numel()
        g["d2"] += d2
        g["w2"] += w2
        g["max"] = max(g["max"], (d2 / w2) ** 0.5 if w2 > 0 else float("inf") if d2 > 0 else 0.0)
    order = [n for n, _ in TENSOR_GROUPS] + ["other"]
    if whole:
        d2, w2 = sum(g["d2"] for g in acc.values()), sum(g["w2"] for g in acc.values())
        return [{"group": "whole model", "tensors": sum(g["tensors"] for g in acc.values()),
                 "parameters": sum(g["parameters"] for g in acc.values()),
                 "relative change": (d2 / w2) ** 0.5 if w2 > 0 else float("nan"),
                 "largest tensor": max((g["max"] for g in acc.values()), default=0.0)}]
    return [{"group": n, "tensors": acc[n]["tensors"], "parameters": acc[n]["parameters"],
             "relative change": (acc[n]["d2"] / acc[n]["w2"]) ** 0.5 if acc[n]["w2"] > 0 else float("nan"),
             "largest tensor": acc[n]["max"]} for n in order if n in acc]


def scaled_change(base_sd: Mapping[str, torch.Tensor], other_sd: Mapping[str, torch.Tensor],
                  scale: float) -> dict[str, torch.Tensor]:
    """base + scale * (other - base) for every floating-point tensor (non-float tensors from the base): the
    random control at `scale` times the VL change's norm, when `other_sd` is `random_direction_like`'s result.
    Tied tensors stay tied (one new tensor per shared storage)."""
    from sinklib.core.params import check_float

    scale = check_float("scale", scale, 0.0, 1000.0)
    _check_pair(base_sd, other_sd, "other_sd")
    out: dict[str, torch.Tensor] = {}
    made: dict[tuple, torch.Tensor] = {}
    for k, b in base_sd.items():
        o = other_sd[k]
        if not b.is_floating_point():
            out[k] = b.clone()
            continue
        ident = (b.data_ptr(), o.data_ptr(), tuple(b.shape)) if b.numel() else None
        if ident is not None and ident in made:
            out[k] = made[ident]
            continue
        out[k] = (b.double() + scale * (o.double() - b.double())).to(b.dtype)
        if ident is not None:
            made[ident] = out[k]
    return out
