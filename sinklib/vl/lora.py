"""LoRA: a low-rank adapter on the LM's linear layers, the `lm_method='lora'` option of `train_vl` (stage 2) and of
`train_text_only`, for models whose full fine-tune does not fit in memory.

Each targeted `nn.Linear` (weight W `[out, in]`, frozen) is replaced during training by `LoRALinear`, whose output
is `W x + scale * B A x` with A `[rank, in]` (uniform in +-1/sqrt(in), as `nn.Linear` and peft initialise it; drawn
from a generator seeded by the training seed and the module's name) and B `[out, rank]` (zeros, so training starts
from the base model exactly), `scale = alpha / rank`. Only A and B are trained: no embedding, norm, bias or LM
head. After training `merge` writes `W + scale * B @ A` into W and puts the original `nn.Linear` back, so every
reader downstream (checkpoints, evaluations, S, the random-change control, merges) sees a plain model of the
original architecture; a training callback sees such a plain model too (`plain_view`).

Memory rule of thumb for the training state (activations come on top): a full fine-tune with AdamW in fp32 holds
about 16 bytes per parameter (weights, gradients, two AdamW moments); LoRA about 4 bytes per frozen parameter (fp32
weights, no gradient, no moments) plus 16 per adapter parameter (`training_bytes`, `adapter_parameters`).
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from sinklib.core.anatomy import decoder_layers
from sinklib.core.cache import key_seed
from sinklib.core.params import check_choice, check_float, check_int, check_list, check_str
from sinklib.errors import ParameterError

LM_METHODS = ("full", "lora")
#: the attention and MLP projections, by the module names Llama, Qwen2/3, Gemma-3 and OLMo-2 share
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
DEFAULT_RANK = 16
DEFAULT_ALPHA = 32.0
#: the pair / training parameters of the method; present in a parameter dict only when lm_method != 'full'
LORA_KEYS = ("lm_method", "lora_rank", "lora_alpha", "lora_targets")
LORA_SEED_MODULUS = 2**63  # per-module generators of the A initialisation
BYTES_FULL, BYTES_FROZEN, BYTES_ADAPTER = 16, 4, 16


@dataclass(frozen=True)
class LMMethod:
    """How the LM's weights are trained: 'full' (every parameter) or 'lora' (adapters of `rank`, `alpha` on the
    linear layers named `targets`)."""

    name: str = "full"
    rank: int = DEFAULT_RANK
    alpha: float = DEFAULT_ALPHA
    targets: tuple[str, ...] = DEFAULT_TARGETS

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def params(self) -> dict:
        """The parameters that identify the method: {} for 'full' (so the cache keys of full fine-tunes stay what
        they were), else the four `LORA_KEYS`; also the keyword arguments of `train_vl` / `train_text_only`."""
        if self.name == "full":
            return {}
        return {"lm_method": self.name, "lora_rank": self.rank, "lora_alpha": self.alpha,
                "lora_targets": list(self.targets)}


def check_lm_method(lm_method: str = "full", lora_rank: int | None = None, lora_alpha: float | None = None,
                    lora_targets: Sequence[str] | str | None = None) -> LMMethod:
    """The checked method; the LoRA options (None: `DEFAULT_RANK`, `DEFAULT_ALPHA`, `DEFAULT_TARGETS`) are an error
    with 'full', where they would be silently ignored."""
    name = check_choice("lm_method", lm_method, LM_METHODS)
    given = {k: v for k, v in (("lora_rank", lora_rank), ("lora_alpha", lora_alpha), ("lora_targets", lora_targets))
             if v is not None}
    if name == "full":
        if given:
            raise ParameterError(f"parameter(s) {', '.join(map(repr, given))} apply only with lm_method='lora' "
                                 "(got lm_method='full'); drop them or set lm_method='lora'")
        return LMMethod()
    targets = DEFAULT_TARGETS if lora_targets is None else tuple(
        check_list("lora_targets", lora_targets, item_check=check_str))
    if len(set(targets)) != len(targets):
        raise ParameterError(f"parameter 'lora_targets' got {list(targets)!r}, which repeats a name; list each "
                             "module name once")
    return LMMethod("lora", check_int("lora_rank", DEFAULT_RANK if lora_rank is None else lora_rank, 1, 1 << 16),
                    check_float("lora_alpha", DEFAULT_ALPHA if lora_alpha is None else lora_alpha, 1e-12), targets)


def lm_method_of(params: Mapping[str, Any]) -> LMMethod:
    """The method of a parameter dict (pair parameters, a training's `params`): 'full' when it has no `LORA_KEYS`."""
    return check_lm_method(**{k: params[k] for k in LORA_KEYS if k in params})


class LoRALinear(nn.Module):
    """`base(x) + scale * B A x` for x `[..., in]` -> `[..., out]`; `base` (an `nn.Linear`) is frozen by the
    caller, `lora_A` `[rank, in]` and `lora_B` `[out, rank]` are trained."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, seed: int) -> None:
        super().__init__()
        self.base = base
        self.scale = alpha / rank
        w = base.weight
        g = torch.Generator().manual_seed(seed)
        bound = 1.0 / math.sqrt(base.in_features)
        a = (torch.rand(rank, base.in_features, generator=g, dtype=torch.float32) * 2 - 1) * bound
        self.lora_A = nn.Parameter(a.to(device=w.device, dtype=w.dtype))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, device=w.device, dtype=w.dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.scale * F.linear(F.linear(x, self.lora_A), self.lora_B)

    @torch.no_grad()
    def delta(self) -> torch.Tensor:
        """The weight change `scale * B @ A` `[out, in]` that `merge` adds to the base weight."""
        return self.scale * (self.lora_B @ self.lora_A)


def _linear_names(model: nn.Module) -> list[str]:
    return sorted({n.rsplit(".", 1)[-1] for layer in decoder_layers(model) for n, m in layer.named_modules()
                   if isinstance(m, nn.Linear)})


def target_modules(model: nn.Module, targets: Sequence[str]) -> list[tuple[nn.Module, str, str, nn.Linear]]:
    """(parent, attribute, name, linear) of every `nn.Linear` inside the decoder layers whose own name is one of
    `targets` (the LM head and the embeddings are never targets); ParameterError for a target that matches no
    module, and for a model that carries adapters already."""
    if any(isinstance(m, LoRALinear) for m in model.modules()):
        raise ParameterError("the model already carries LoRA adapters; merge them first (sinklib.vl.lora.merge)")
    found: list[tuple[nn.Module, str, str, nn.Linear]] = []
    for i, layer in enumerate(decoder_layers(model)):
        for pname, parent in layer.named_modules():
            for attr, child in parent.named_children():
                if isinstance(child, nn.Linear) and attr in targets:
                    found.append((parent, attr, f"layers.{i}.{pname + '.' if pname else ''}{attr}", child))
    missing = [t for t in targets if not any(attr == t for _, attr, _, _ in found)]
    if missing:
        raise ParameterError(f"parameter 'lora_targets' names {missing}, which match no linear layer of "
                             f"{type(model).__name__}'s decoder layers; allowed: {', '.join(_linear_names(model))}")
    return found


def adapter_parameters(model: nn.Module, method: LMMethod) -> int:
    """Trainable parameters LoRA would add to `model`: rank * (in + out) per targeted linear layer (0 for 'full')."""
    if method.name == "full":
        return 0
    return sum(method.rank * (lin.in_features + lin.out_features)
               for _, _, _, lin in target_modules(model, method.targets))


def training_bytes(n_params: int, n_adapter: int = 0) -> int:
    """The rule of thumb for the training state: 16 bytes per parameter for a full AdamW fine-tune in fp32
    (`n_adapter` = 0), else 4 per frozen parameter plus 16 per adapter parameter (activations not included)."""
    if n_adapter == 0:
        return BYTES_FULL * int(n_params)
    return BYTES_FROZEN * int(n_params) + BYTES_ADAPTER * int(n_adapter)


def attach(model: nn.Module, method: LMMethod, seed: int = 0) -> list[nn.Parameter]:
    """Replace every targeted linear layer by a `LoRALinear` (A drawn from the seed and the module's name, B zero);
    returns the adapter parameters, A and B per module in model order. The base weights are not frozen here."""
    out: list[nn.Parameter] = []
    for parent, attr, name, lin in target_modules(model, method.targets):
        wrapped = LoRALinear(lin, method.rank, method.alpha, key_seed(seed, "lora:" + name, LORA_SEED_MODULUS))
        setattr(parent, attr, wrapped)
        out += [wrapped.lora_A, wrapped.lora_B]
    return out


def _wrappers(model: nn.Module) -> list[tuple[nn.Module, str, LoRALinear]]:
    return [(parent, attr, child) for parent in model.modules() for attr, child in parent.named_children()
            if isinstance(child, LoRALinear)]


@torch.no_grad()
def merge(model: nn.Module) -> int:
    """Add each adapter's `scale * B @ A` to its base weight in place and put the base `nn.Linear` back (the same
    module and Parameter objects as before `attach`); returns the number of merged layers."""
    ws = _wrappers(model)
    for parent, attr, w in ws:
        w.base.weight.add_(w.delta())
        setattr(parent, attr, w.base)
    return len(ws)


@contextlib.contextmanager
def plain_view(model: nn.Module) -> Iterator[nn.Module]:
    """Inside: `model` with every `LoRALinear` swapped for a plain `nn.Linear` holding the merged weight (a new
    tensor: the base weight and the adapters are untouched), so its state dict has the original keys; the adapters
    are put back afterwards. A model without adapters is yielded as it is."""
    ws = _wrappers(model)
    try:
        for parent, attr, w in ws:
            plain = nn.Linear(w.base.in_features, w.base.out_features, bias=w.base.bias is not None,
                              device="meta")
            plain.weight = nn.Parameter(w.base.weight.detach() + w.delta(), requires_grad=False)
            plain.bias = w.base.bias
            setattr(parent, attr, plain)
        yield model
    finally:
        for parent, attr, w in ws:
            setattr(parent, attr, w)


@torch.no_grad()
def adapter_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """{'<module>.lora_A': A, '<module>.lora_B': B} of every `LoRALinear` in `model`, copied to the CPU, where
    '<module>' is the name of the linear layer the adapter wraps (its merged weight is '<module>.weight')."""
    return {f"{n}.{p}": getattr(m, p).detach().cpu().clone() for n, m in model.named_modules()
            if isinstance(m, LoRALinear) for p in ("lora_A", "lora_B")}


@torch.no_grad()
def merged_weights(model: nn.Module, adapters: Mapping[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """{'<module>.weight': base weight + scale * B @ A} for every adapter pair of `adapters` (`adapter_tensors`),
    the base weights read from `model` (plain, no adapters attached): new tensors, the same arithmetic as
    `merge` (and so the same floats on the same machine); `model` is not changed."""
    out = {}
    for name in sorted({k.rsplit(".", 1)[0] for k in adapters}):
        w = model.get_submodule(name).weight
        a, b = (adapters[f"{name}.{p}"].to(device=w.device, dtype=w.dtype) for p in ("lora_A", "lora_B"))
        out[f"{name}.weight"] = w.detach() + scale * (b @ a)
    return out


@contextlib.contextmanager
def adapted(model: nn.Module, method: LMMethod, seed: int = 0,
            keep: dict[str, torch.Tensor] | None = None) -> Iterator[list[nn.Parameter]]:
    """Inside: the LM parameters to train with `method`. 'full': every parameter of `model` (nothing else changes).
    'lora': `attach`'s adapters (the caller freezes the base weights); on leaving, even by an error, they are
    merged into the base weights and the wrappers removed, after their final values are copied into `keep`
    (when given; `adapter_tensors`)."""
    if method.name == "full":
        yield list(model.parameters())
        return
    params = attach(model, method, seed)
    try:
        yield params
    finally:
        if keep is not None:
            keep.update(adapter_tensors(model))
        merge(model)
