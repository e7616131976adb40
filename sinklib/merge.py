"""Merging a VLM's language backbone back towards its reference LLM, and QK-RMSNorm injection.

Two negative controls of the paper (the book's page of reported numbers, "negative control"):

1. **Seven merging settings** that pull the adapted (VL-fine-tuned) backbone theta_a back
   towards its reference LLM theta_b. With the task vector tau = theta_a - theta_b
   (one tensor per parameter, same shape), every setting returns theta_b + g(tau):

   | name              | g(tau)                                              | implemented by |
   | ----------------- | --------------------------------------------------- | -------------- |
   | `task_arithmetic` | lam * tau (default lam = 0.7)                       | mergekit `task_arithmetic` |
   | `uniform`         | 0.5 * tau (0.5 base + 0.5 adapted)                  | mergekit `linear` |
   | `mix_95_5`        | 0.95 * tau (0.05 base + 0.95 adapted)               | mergekit `linear` |
   | `tsv`             | lam * (top-k singular directions of tau), k = ceil(rank_fraction * min(m, n)) | here (Gargiulo et al. 2025) |
   | `star`            | lam * (tau truncated to eta of its spectral mass, kept singular values rescaled so the nuclear norm is unchanged) | here (Lee et al. 2025) |
   | `ties`            | lam * (top-density entries of tau by magnitude)     | mergekit `ties` |
   | `dare`            | lam * (Bernoulli(density) mask of tau, rescaled to tau's L1 norm) | mergekit `dare_linear` |

   The 95/5 mix keeps 95 % of the *adapted* model: it is the mildest pull-back. The other
   way round (95 % base) would be almost the reference LLM itself and would trivially
   recover text skills, which contradicts the paper's report that no setting recovers
   IFEval and that only the two mildest mixes avoid making things worse.

   `task_arithmetic` defaults to lam = 0.7 because lam = 0.5 is exactly `uniform`; the
   paper does not report its lam. Defaults of TSV (rank fraction 0.1, TSV-C's "10 % of
   the size"), STAR (eta = 0.4) and TIES (density 0.2) follow their papers; DARE uses
   density 0.1 (drop rate p = 0.9 of the DARE paper). With a single task vector, TIES'
   sign election and disjoint mean are trivial (every kept entry agrees with itself), so
   TIES reduces to magnitude trimming; TSV-M's decorrelation is trivial too, so TSV
   reduces to TSV-C's per-matrix rank truncation.

   Rules for tensors that are not matrices: TSV and STAR act on every 2-D tensor
   (projections, embeddings and LM head alike, as in their papers); 1-D tensors (norm
   gains, biases) get the linear rule theta_b + lam * tau. mergekit's methods treat every
   tensor alike (TIES and DARE sparsify norm gains too).

   Only keys present in both state dicts with equal shapes are merged; everything else
   (the vision tower, the projector, an embedding resized for image tokens) stays as in
   the adapted model. Arithmetic is in float32 (float64 if the inputs are float64) and
   the result is cast to the adapted tensor's dtype.

2. **QK-RMSNorm injection** into a backbone without it (Llama, e.g. SmolLM2-135M): the
   model becomes a `Qwen3ForCausalLM` (Qwen3 = Llama + per-head RMSNorm over head_dim on
   queries and keys after projection, before RoPE, one gain vector [head_dim] per layer
   shared across heads), so it still runs through transformers' attention registry.
"""
from __future__ import annotations

import copy
import math
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from .errors import ParameterError
from .params import check_choice, check_float, check_int

__all__ = [
    "SEVEN_SETTINGS",
    "MERGE_METHODS",
    "MERGE_DEFAULTS",
    "MERGE_REFERENCES",
    "AlreadyHasQKNorm",
    "task_vector_rank_truncate",
    "star_truncate",
    "tensor_seed",
    "split_keys",
    "merge",
    "merge_backbone",
    "inject_qk_norm",
    "injection_error",
    "recovery_finetune",
]

StateDict = Mapping[str, torch.Tensor]

# ----------------------------------------------------------------------------------------
# tensor-level methods: f(base [*S], adapted [*S], **params) -> merged [*S]
# ----------------------------------------------------------------------------------------


def _work_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _mergekit(tensors: list[torch.Tensor], method: str, parameters: dict[str, Any],
              base_index: int | None) -> torch.Tensor:
    from mergekit.merge_methods import merge_tensors

    return merge_tensors(tensors, method, parameters=parameters, base_index=base_index)


def _task_arithmetic(base: torch.Tensor, adapted: torch.Tensor, *, lam: float, seed: int = 0) -> torch.Tensor:
    """theta_b + lam * (theta_a - theta_b) via mergekit `task_arithmetic` (weight 1, lambda lam)."""
    return _mergekit([base, adapted], "task_arithmetic", {"weight": 1.0, "lambda": lam}, 0)


def _linear(base: torch.Tensor, adapted: torch.Tensor, *, adapted_weight: float, seed: int = 0) -> torch.Tensor:
    """(1 - w) * theta_b + w * theta_a via mergekit `linear` (normalised weights)."""
    return _mergekit([base, adapted], "linear", {"weight": [1.0 - adapted_weight, adapted_weight]}, None)


def _uniform(base: torch.Tensor, adapted: torch.Tensor, *, seed: int = 0) -> torch.Tensor:
    return _linear(base, adapted, adapted_weight=0.5)


def _mix_95_5(base: torch.Tensor, adapted: torch.Tensor, *, seed: int = 0) -> torch.Tensor:
    return _linear(base, adapted, adapted_weight=0.95)


def _ties(base: torch.Tensor, adapted: torch.Tensor, *, density: float, lam: float, seed: int = 0) -> torch.Tensor:
    """mergekit `ties` with base_index=0: top-`density` magnitudes of tau, scaled by lam.

    mergekit's TIES normalises by the summed weights of agreeing inputs, so with one task
    vector the `weight` cancels; the strength knob is mergekit's `lambda`.
    """
    return _mergekit([base, adapted], "ties", {"weight": 1.0, "density": density, "lambda": lam}, 0)


def _dare(base: torch.Tensor, adapted: torch.Tensor, *, density: float, lam: float, seed: int = 0) -> torch.Tensor:
    """mergekit `dare_linear` with base_index=0; mask from the global torch RNG seeded with `seed`.

    mergekit rescales the kept entries so the masked delta has tau's L1 norm (not by
    1/density as in the DARE paper; equal in expectation).
    """
    with torch.random.fork_rng(devices=[adapted.device] if adapted.device.type == "cuda" else []):
        torch.manual_seed(seed)
        return _mergekit([base, adapted], "dare_linear", {"weight": 1.0, "density": density, "lambda": lam}, 0)


def task_vector_rank_truncate(tau: torch.Tensor, rank_fraction: float) -> torch.Tensor:
    """TSV-C (Gargiulo et al. 2025, arXiv:2412.00081): keep the top-k singular directions of tau.

    tau: [m, n]; k = ceil(rank_fraction * min(m, n)) (at least 1). Returns U_k S_k V_k^T,
    [m, n], the best rank-k approximation of tau. k = min(m, n) returns tau itself.
    """
    if tau.dim() != 2:
        raise ParameterError(f"task_vector_rank_truncate needs a 2-D tensor, got shape {tuple(tau.shape)}")
    r = min(tau.shape)
    k = max(1, math.ceil(rank_fraction * r - 1e-9))
    if k >= r:
        return tau
    u, s, vh = torch.linalg.svd(tau, full_matrices=False)
    return (u[:, :k] * s[:k]) @ vh[:k]


def star_truncate(tau: torch.Tensor, eta: float) -> torch.Tensor:
    """STAR (Lee et al. 2025, NAACL, "Spectral Truncation and Rescale"): tau [m, n] -> [m, n].

    Keep the smallest r such that the top-r singular values hold at least a fraction `eta`
    of the spectral mass sum(sigma) (the nuclear norm), then rescale the kept singular
    values by sum(sigma) / sum(sigma[:r]) so the nuclear norm is unchanged.
    """
    if tau.dim() != 2:
        raise ParameterError(f"star_truncate needs a 2-D tensor, got shape {tuple(tau.shape)}")
    u, s, vh = torch.linalg.svd(tau, full_matrices=False)
    total = s.sum()
    if total <= 0:
        return torch.zeros_like(tau)
    cum = torch.cumsum(s, 0)
    r = int(torch.searchsorted(cum, total * eta).item()) + 1
    r = min(r, s.numel())
    if r >= s.numel():
        return tau
    kept = s[:r] * (total / s[:r].sum())
    return (u[:, :r] * kept) @ vh[:r]


def _tsv(base: torch.Tensor, adapted: torch.Tensor, *, rank_fraction: float, lam: float, seed: int = 0) -> torch.Tensor:
    tau = adapted - base
    if tau.dim() == 2:
        tau = task_vector_rank_truncate(tau, rank_fraction)
    return base + lam * tau


def _star(base: torch.Tensor, adapted: torch.Tensor, *, eta: float, lam: float, seed: int = 0) -> torch.Tensor:
    tau = adapted - base
    if tau.dim() == 2:
        tau = star_truncate(tau, eta)
    return base + lam * tau


#: The paper's seven settings, in its order.
SEVEN_SETTINGS: tuple[str, ...] = ("task_arithmetic", "uniform", "mix_95_5", "tsv", "star", "ties", "dare")

#: name -> tensor function f(base, adapted, *, seed, **params) -> merged tensor (same shape).
MERGE_METHODS: dict[str, Callable[..., torch.Tensor]] = {
    "task_arithmetic": _task_arithmetic,
    "uniform": _uniform,
    "mix_95_5": _mix_95_5,
    "tsv": _tsv,
    "star": _star,
    "ties": _ties,
    "dare": _dare,
    "linear": _linear,  # general linear mix; `uniform` and `mix_95_5` are its presets
}

#: name -> default parameters (every parameter a method accepts, besides seed).
MERGE_DEFAULTS: dict[str, dict[str, float]] = {
    "task_arithmetic": {"lam": 0.7},
    "uniform": {},
    "mix_95_5": {},
    "tsv": {"rank_fraction": 0.1, "lam": 1.0},
    "star": {"eta": 0.4, "lam": 1.0},
    "ties": {"density": 0.2, "lam": 1.0},
    "dare": {"density": 0.1, "lam": 1.0},
    "linear": {"adapted_weight": 0.5},
}

#: name -> where the method comes from (paper and implementation).
MERGE_REFERENCES: dict[str, str] = {
    "task_arithmetic": "Ilharco et al. 2023, arXiv:2212.04089; mergekit task_arithmetic",
    "uniform": "Wortsman et al. 2022 (model soups), arXiv:2203.05482; mergekit linear",
    "mix_95_5": "linear 0.05 base / 0.95 adapted; mergekit linear",
    "tsv": "Gargiulo et al. 2025, Task Singular Vectors, arXiv:2412.00081; sinklib (TSV-C truncation)",
    "star": "Lee et al. 2025, STAR: Spectral Truncation and Rescale, NAACL 2025; sinklib",
    "ties": "Yadav et al. 2023, TIES-Merging, arXiv:2306.01708; mergekit ties",
    "dare": "Yu et al. 2024, DARE, arXiv:2311.03099; mergekit dare_linear (L1 rescale)",
    "linear": "mergekit linear",
}

_RANGES: dict[str, tuple[float, float, bool]] = {
    # name: (lo, hi, lo_exclusive)
    "lam": (0.0, 1.0, False),
    "adapted_weight": (0.0, 1.0, False),
    "density": (0.0, 1.0, True),
    "rank_fraction": (0.0, 1.0, True),
    "eta": (0.0, 1.0, True),
}


def _resolve(method: str, params: dict[str, Any]) -> dict[str, float]:
    check_choice("method", method, list(MERGE_METHODS))
    allowed = MERGE_DEFAULTS[method]
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ParameterError(
            f"merge method {method!r} got unknown parameter(s) {unknown}; "
            f"allowed: {sorted(allowed) or 'none (besides seed)'}"
        )
    out = dict(allowed)
    for name, value in params.items():
        lo, hi, lo_excl = _RANGES[name]
        v = check_float(name, value, lo, hi)
        if lo_excl and v <= lo:
            raise ParameterError(f"parameter {name!r} got {value!r}; allowed: a number in ({lo}, {hi}]")
        out[name] = v
    return out


def tensor_seed(seed: int, key: str) -> int:
    """The seed used for one tensor: depends on (seed, key) only, not on which other keys merge."""
    return (int(seed) * 1_000_003 + zlib.crc32(key.encode())) % (2**63 - 1)


# ----------------------------------------------------------------------------------------
# state-dict level
# ----------------------------------------------------------------------------------------


def split_keys(base_sd: StateDict, adapted_sd: StateDict) -> dict[str, list[str]]:
    """Partition the adapted model's keys.

    Returns {"merged": keys in both with equal shapes and floating dtypes,
    "adapted_only": keys the base lacks, "shape_mismatch": keys in both with different
    shapes, "not_float": keys in both that are not floating point (copied from adapted)}.
    """
    out: dict[str, list[str]] = {"merged": [], "adapted_only": [], "shape_mismatch": [], "not_float": []}
    for key, a in adapted_sd.items():
        if key not in base_sd:
            out["adapted_only"].append(key)
        elif tuple(base_sd[key].shape) != tuple(a.shape):
            out["shape_mismatch"].append(key)
        elif not (a.is_floating_point() and base_sd[key].is_floating_point()):
            out["not_float"].append(key)
        else:
            out["merged"].append(key)
    return out


def merge(base_sd: StateDict, adapted_sd: StateDict, method: str, *, seed: int = 0,
          show_progress: bool = False, **params: Any) -> dict[str, torch.Tensor]:
    """Merge two state dicts of the same architecture: theta_b + g(theta_a - theta_b).

    base_sd: the reference LLM; adapted_sd: the VL-adapted backbone. Returns a new dict
    with adapted_sd's keys: keys listed as "merged" by `split_keys` hold the merged tensor
    (adapted dtype and device), every other key holds adapted_sd's tensor unchanged (the
    same object). `params` override MERGE_DEFAULTS[method]; `seed` drives DARE's masks
    (per tensor, via `tensor_seed(seed, key)`). Tensors that share storage in both inputs
    (tied embeddings) are merged once, so they stay identical.
    """
    resolved = _resolve(method, params)
    seed = check_int("seed", seed, 0)
    fn = MERGE_METHODS[method]
    parts = split_keys(base_sd, adapted_sd)
    to_merge = set(parts["merged"])
    done: dict[tuple, torch.Tensor] = {}
    out: dict[str, torch.Tensor] = {}
    keys = list(adapted_sd)
    if show_progress:
        from tqdm import tqdm

        keys = tqdm(keys, desc=f"merge {method}")
    with torch.no_grad():
        for key in keys:
            a = adapted_sd[key]
            if key not in to_merge:
                out[key] = a
                continue
            b = base_sd[key]
            alias = (a.data_ptr(), b.data_ptr(), tuple(a.shape)) if a.numel() else None
            if alias is not None and alias in done:
                out[key] = done[alias]
                continue
            wd = _work_dtype(a)
            merged = fn(b.detach().to(device=a.device, dtype=wd), a.detach().to(wd),
                        seed=tensor_seed(seed, key), **resolved)
            merged = merged.to(a.dtype)
            if alias is not None:
                done[alias] = merged
            out[key] = merged
    return out


_WRAPPER_PREFIXES = ("model.language_model.", "language_model.model.", "language_model.", "model.")


def _normalise_key(key: str) -> str:
    for p in _WRAPPER_PREFIXES:
        if key.startswith(p):
            return key[len(p):]
    return key


def _match_keys(base_keys: Sequence[str], adapted_keys: Sequence[str]) -> dict[str, str]:
    """base key -> adapted key: exact name, else the unique adapted key with the same name
    after stripping a wrapper prefix (`model.`, `model.language_model.`, `language_model.`)."""
    adapted_set = set(adapted_keys)
    by_norm: dict[str, list[str]] = {}
    for k in adapted_keys:
        by_norm.setdefault(_normalise_key(k), []).append(k)
    out = {}
    for k in base_keys:
        if k in adapted_set:
            out[k] = k
        else:
            cands = by_norm.get(_normalise_key(k), [])
            if len(cands) == 1:
                out[k] = cands[0]
    return out


def merge_backbone(base_model: torch.nn.Module, adapted_model: torch.nn.Module, method: str, *,
                   seed: int = 0, key_map: Mapping[str, str] | None = None, inplace: bool = False,
                   show_progress: bool = False, **params: Any) -> tuple[torch.nn.Module, dict[str, list[str]]]:
    """Merge the language-model weights of `adapted_model` towards `base_model`.

    Keys are matched by name (`key_map`: base key -> adapted key, default: exact names,
    else names equal after stripping a wrapper prefix such as `model.language_model.`).
    Only matched keys with equal shapes are merged; the vision tower, the projector and any
    resized tensor stay as in the adapted model. Returns (model, report): the model is a
    deep copy of adapted_model (or adapted_model itself with inplace=True) holding the
    merged weights; report = {"merged", "shape_mismatch", "kept" (adapted keys left as
    they were), "base_unmatched" (base keys with no adapted counterpart)}.
    """
    base_sd = base_model.state_dict()
    adapted_sd = adapted_model.state_dict()
    mapping = dict(key_map) if key_map is not None else _match_keys(list(base_sd), list(adapted_sd))
    bad = [v for v in mapping.values() if v not in adapted_sd]
    if bad:
        raise ParameterError(f"key_map names adapted keys that do not exist, e.g. {bad[:3]}")
    if not mapping:
        raise ParameterError(
            "merge_backbone found no key of base_model in adapted_model; pass key_map "
            "(base key -> adapted key) to say which tensors correspond"
        )
    base_renamed = {mapping[k]: base_sd[k] for k in mapping if k in base_sd}
    merged = merge(base_renamed, adapted_sd, method, seed=seed, show_progress=show_progress, **params)
    parts = split_keys(base_renamed, adapted_sd)
    model = adapted_model if inplace else copy.deepcopy(adapted_model)
    target = model.state_dict()
    with torch.no_grad():
        for key in parts["merged"]:
            target[key].copy_(merged[key])
    report = {
        "merged": parts["merged"],
        "shape_mismatch": parts["shape_mismatch"],
        "kept": [k for k in adapted_sd if k not in set(parts["merged"])],
        "base_unmatched": [k for k in base_sd if k not in mapping],
    }
    return model, report


# ----------------------------------------------------------------------------------------
# QK-RMSNorm injection
# ----------------------------------------------------------------------------------------


class AlreadyHasQKNorm(ParameterError):
    """inject_qk_norm was given a model that already normalises queries and keys."""


GAIN_RULES = ("match_rms", "ones")


def _qk_norm_modules(model: torch.nn.Module) -> list[str]:
    return [n for n, _ in model.named_modules() if n.split(".")[-1] in ("q_norm", "k_norm")]


@torch.no_grad()
def _mean_head_rms(model: torch.nn.Module, input_ids: torch.Tensor,
                   attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean over real tokens and heads of the per-(token, head) RMS of q and k, per layer.

    Returns (q_rms [L], k_rms [L]) measured on the projections' outputs (before RoPE,
    where the injected norm acts).
    """
    cfg = model.config
    hd = cfg.head_dim
    layers = model.model.layers
    sums = torch.zeros(len(layers), 2, dtype=torch.float64)
    mask = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    n_tok = int(mask.sum())
    hooks = []

    def make(i: int, j: int):
        def hook(_mod, _inp, out):
            B, T, D = out.shape
            rms = out.float().view(B, T, D // hd, hd).pow(2).mean(-1).sqrt()  # [B, T, H]
            sums[i, j] += rms[mask.to(rms.device)].mean(-1).double().sum().cpu()
        return hook

    for i, layer in enumerate(layers):
        hooks.append(layer.self_attn.q_proj.register_forward_hook(make(i, 0)))
        hooks.append(layer.self_attn.k_proj.register_forward_hook(make(i, 1)))
    try:
        dev = next(model.parameters()).device
        model(input_ids=input_ids.to(dev),
              attention_mask=None if attention_mask is None else attention_mask.to(dev), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    mean = (sums / n_tok).float()
    return mean[:, 0], mean[:, 1]


def inject_qk_norm(model: torch.nn.Module, calib_input_ids: torch.Tensor | None = None, *,
                   attention_mask: torch.Tensor | None = None, gain_rule: str = "match_rms") -> torch.nn.Module:
    """Return a Qwen3ForCausalLM equal to the Llama `model` plus per-head QK-RMSNorm.

    Every weight is copied; each layer gets q_norm/k_norm (RMSNorm over head_dim, eps =
    rms_norm_eps, gain [head_dim] shared across heads, applied after the projection and
    before RoPE). Gain rules:
    - "match_rms" (default): every entry of layer l's q_norm gain is the mean over
      calibration tokens (calib_input_ids [B, T], attention_mask [B, T] optional) and heads
      of the per-(token, head) RMS of that layer's query projection; likewise for keys.
      Directions of all queries and keys are kept exactly and their average length is
      kept; each token's deviation from the average length is lost, so the outputs cannot
      be identical. On tiny random Llamas the relative logit error is ~3e-3, but in a
      pretrained model lengths vary a lot: in SmolLM2-135M the first token's q/k RMS is
      4-9x below the other tokens' in late layers, and the injected model's next-token
      distribution moves far (measured on 15 held-out prompts: mean KL 1.9 nats, top-1
      agreement 0.32), which is why `recovery_finetune` exists.
    - "ones": Qwen3's own initialisation (unit gains); queries and keys get RMS 1.

    Raises AlreadyHasQKNorm if the model already has q_norm/k_norm modules (Qwen3,
    Gemma-3, OLMo-2, ...), ParameterError for any other architecture than Llama.
    """
    from transformers import Qwen3Config, Qwen3ForCausalLM

    gain_rule = check_choice("gain_rule", gain_rule, GAIN_RULES)
    cfg = model.config
    existing = _qk_norm_modules(model)
    if existing:
        raise AlreadyHasQKNorm(
            f"model (model_type={getattr(cfg, 'model_type', '?')!r}) already has QK-norm "
            f"(e.g. {existing[0]!r}); inject_qk_norm applies only to backbones without it, "
            "such as Llama / SmolLM2"
        )
    if getattr(cfg, "model_type", None) != "llama" or not hasattr(model, "model"):
        raise ParameterError(
            f"inject_qk_norm supports a LlamaForCausalLM (model_type 'llama'); got "
            f"{type(model).__name__} (model_type {getattr(cfg, 'model_type', None)!r})"
        )
    if getattr(cfg, "mlp_bias", False):
        raise ParameterError("inject_qk_norm: a Llama with mlp_bias=True has no Qwen3 counterpart")
    if gain_rule == "match_rms":
        if calib_input_ids is None or calib_input_ids.dim() != 2 or calib_input_ids.numel() == 0:
            raise ParameterError(
                "gain_rule 'match_rms' needs calib_input_ids, a non-empty LongTensor [B, T] of calibration prompts"
            )
        if attention_mask is not None and attention_mask.shape != calib_input_ids.shape:
            raise ParameterError(
                f"attention_mask shape {tuple(attention_mask.shape)} must equal calib_input_ids shape "
                f"{tuple(calib_input_ids.shape)}"
            )

    fields = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "initializer_range",
              "rms_norm_eps", "use_cache", "tie_word_embeddings", "rope_parameters", "attention_bias",
              "attention_dropout", "pad_token_id", "bos_token_id", "eos_token_id"]
    kwargs = {f: copy.deepcopy(getattr(cfg, f)) for f in fields if getattr(cfg, f, None) is not None}
    qcfg = Qwen3Config(**kwargs, use_sliding_window=False)
    qcfg._attn_implementation = cfg._attn_implementation
    p0 = next(model.parameters())
    new = Qwen3ForCausalLM(qcfg).to(device=p0.device, dtype=p0.dtype)
    missing, unexpected = new.load_state_dict(model.state_dict(), strict=False)
    bad_missing = [k for k in missing if not k.endswith(("q_norm.weight", "k_norm.weight"))]
    if bad_missing or unexpected:
        raise ParameterError(
            f"inject_qk_norm could not map every weight (missing {bad_missing[:3]}, unexpected {unexpected[:3]})"
        )
    if gain_rule == "match_rms":
        was_training = model.training
        model.eval()
        q_rms, k_rms = _mean_head_rms(model, calib_input_ids, attention_mask)
        model.train(was_training)
    else:
        q_rms = k_rms = torch.ones(cfg.num_hidden_layers)
    with torch.no_grad():
        for i, layer in enumerate(new.model.layers):
            layer.self_attn.q_norm.weight.fill_(float(q_rms[i]))
            layer.self_attn.k_norm.weight.fill_(float(k_rms[i]))
    if getattr(model, "generation_config", None) is not None:
        new.generation_config = copy.deepcopy(model.generation_config)
    new.train(model.training)
    return new


@torch.no_grad()
def injection_error(original: torch.nn.Module, injected: torch.nn.Module, input_ids: torch.Tensor,
                    attention_mask: torch.Tensor | None = None) -> dict[str, float]:
    """How far the injected model's next-token outputs are from the original's.

    input_ids, attention_mask: [B, T]. Over real positions: max and mean |logit difference|,
    relative Frobenius error ||dz|| / ||z||, mean KL(p_original || p_injected) in nats,
    and top-1 agreement (fraction of positions with the same argmax).
    """
    was = (original.training, injected.training)
    original.eval(), injected.eval()
    dev = next(original.parameters()).device
    kw = {"attention_mask": None if attention_mask is None else attention_mask.to(dev), "use_cache": False}
    z0 = original(input_ids=input_ids.to(dev), **kw).logits.float()
    z1 = injected(input_ids=input_ids.to(dev), **kw).logits.float()
    original.train(was[0]), injected.train(was[1])
    m = torch.ones(input_ids.shape, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    m = m.to(z0.device)
    a, b = z0[m], z1[m]  # [N, V]
    d = (a - b).abs()
    lp0, lp1 = a.log_softmax(-1), b.log_softmax(-1)
    kl = (lp0.exp() * (lp0 - lp1)).sum(-1)
    return {
        "max_abs_logit_diff": float(d.max()),
        "mean_abs_logit_diff": float(d.mean()),
        "rel_logit_error": float((a - b).norm() / a.norm()),
        "mean_kl": float(kl.mean()),
        "top1_agreement": float((a.argmax(-1) == b.argmax(-1)).float().mean()),
    }


def recovery_finetune(model: torch.nn.Module, tokenizer: Any, texts: Sequence[str] | Sequence[Sequence[int]], *,
                      steps: int = 50, lr: float = 1e-4, batch_size: int = 8, seed: int = 0,
                      max_length: int = 128, train: str = "all", show_progress: bool = True) -> list[float]:
    """Short causal-LM fine-tune on text, in place; returns the loss of every step.

    texts: strings (tokenised with `tokenizer`, truncated to max_length) or, with
    tokenizer=None, lists of token ids. Each step draws `batch_size` texts (seeded
    shuffling, cycling), right-pads them into [B, T] and takes one AdamW step on the mean
    next-token cross-entropy over all real tokens. train="all" updates every weight,
    "qk_norm" only the q_norm/k_norm gains. Gradients clipped to norm 1.
    """
    steps = check_int("steps", steps, 1)
    batch_size = check_int("batch_size", batch_size, 1)
    max_length = check_int("max_length", max_length, 2)
    seed = check_int("seed", seed, 0)
    lr = check_float("lr", lr, 0.0)
    train = check_choice("train", train, ("all", "qk_norm"))
    if not texts:
        raise ParameterError("recovery_finetune needs at least one text in `texts`")
    if tokenizer is None:
        ids = [list(map(int, t))[:max_length] for t in texts]
    else:
        ids = [tokenizer(t, truncation=True, max_length=max_length)["input_ids"] for t in texts]
    if any(len(x) < 2 for x in ids):
        raise ParameterError("every text must have at least 2 tokens for a next-token loss")
    if train == "qk_norm":
        names = _qk_norm_modules(model)
        if not names:
            raise ParameterError("train='qk_norm' needs a model with q_norm/k_norm (run inject_qk_norm first)")
        params = [p for n, p in model.named_parameters() if n.rsplit(".", 2)[-2] in ("q_norm", "k_norm")]
    else:
        params = [p for p in model.parameters()]
    saved_grad = {p: p.requires_grad for p in model.parameters()}
    for p in model.parameters():
        p.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    dev = next(model.parameters()).device
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    order: list[int] = []
    losses: list[float] = []
    was_training = model.training
    model.train()
    from tqdm import tqdm

    try:
        with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
            torch.manual_seed(seed)
            for _ in tqdm(range(steps), desc="recovery fine-tune", disable=not show_progress):
                batch = []
                while len(batch) < batch_size:
                    if not order:
                        order = torch.randperm(len(ids), generator=gen).tolist()
                    batch.append(ids[order.pop()])
                T = max(len(x) for x in batch)
                inp = torch.zeros(len(batch), T, dtype=torch.long)
                att = torch.zeros(len(batch), T, dtype=torch.long)
                for i, x in enumerate(batch):
                    inp[i, : len(x)] = torch.tensor(x)
                    att[i, : len(x)] = 1
                labels = inp.masked_fill(att == 0, -100)
                out = model(input_ids=inp.to(dev), attention_mask=att.to(dev), labels=labels.to(dev), use_cache=False)
                loss = out.loss
                if not torch.isfinite(loss):
                    raise ParameterError(f"recovery_finetune: loss became {float(loss)}; lower lr (got {lr})")
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                opt.step()
                losses.append(float(loss.detach()))
    finally:
        model.train(was_training)
        for p, rg in saved_grad.items():
            p.requires_grad_(rg)
    return losses
