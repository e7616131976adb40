"""Merging a VLM's language backbone back towards its reference LLM: a negative control of the paper
(the book's page of reported numbers, "negative control"); QK-RMSNorm injection is `sinklib.controls.inject`.

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

Each method is a record (`MergeMethod`: name, tensor function, reference, defaults taken from
the function's signature, allowed ranges), registered by the `merge_method` decorator in `METHODS`.
"""
from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from sinklib.core.cache import MERGE_SEED_MODULUS, key_seed
from sinklib.errors import ParameterError
from sinklib.core.params import check_choice, check_float, check_int

StateDict = Mapping[str, torch.Tensor]

#: allowed range of a method parameter: (lo, hi, lo_exclusive)
UNIT = (0.0, 1.0, False)
OPEN_UNIT = (0.0, 1.0, True)


@dataclass(frozen=True)
class MergeMethod:
    """One merge method: f(base [*S], adapted [*S], *, seed, **params) -> merged [*S].

    `defaults` are the keyword defaults of `fn` (besides seed); `ranges` maps each parameter to
    (lo, hi, lo_exclusive)."""

    name: str
    fn: Callable[..., torch.Tensor] = field(repr=False)
    reference: str
    defaults: dict[str, float]
    ranges: dict[str, tuple[float, float, bool]]

    def resolve(self, params: Mapping[str, Any]) -> dict[str, float]:
        """The defaults overridden by `params`, each checked against its range."""
        unknown = sorted(set(params) - set(self.defaults))
        if unknown:
            raise ParameterError(f"merge method {self.name!r} got unknown parameter(s) {unknown}; "
                                 f"allowed: {sorted(self.defaults) or 'none (besides seed)'}")
        out = dict(self.defaults)
        for name, value in params.items():
            lo, hi, lo_excl = self.ranges[name]
            v = check_float(name, value, lo, hi)
            if lo_excl and v <= lo:
                raise ParameterError(f"parameter {name!r} got {value!r}; allowed: a number in ({lo}, {hi}]")
            out[name] = v
        return out


#: name -> MergeMethod, in registration order
METHODS: dict[str, MergeMethod] = {}


def merge_method(name: str, reference: str, **ranges: tuple[float, float, bool]) -> Callable:
    """Register a tensor function as a merge method (compare mergekit's `@merge_method`)."""
    def register(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        sig = inspect.signature(fn).parameters
        defaults = {k: p.default for k, p in sig.items()
                    if p.kind is p.KEYWORD_ONLY and k != "seed" and p.default is not p.empty}
        if set(defaults) != set(ranges):
            raise TypeError(f"merge method {name!r}: ranges {sorted(ranges)} must name its parameters {sorted(defaults)}")
        METHODS[name] = MergeMethod(name, fn, reference, defaults, dict(ranges))
        return fn
    return register


def evaluation_extra(method: str) -> dict:
    """What a merged condition adds to its evaluation key (sinklib.adapt.pairs.evaluate_condition's key_extra)."""
    return {"merge": dict(METHODS[method].defaults)}


# ----------------------------------------------------------------------------------------
# tensor-level methods: f(base [*S], adapted [*S], *, seed, **params) -> merged [*S]
# ----------------------------------------------------------------------------------------


def _work_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _mergekit(tensors: list[torch.Tensor], method: str, parameters: dict[str, Any],
              base_index: int | None) -> torch.Tensor:
    from mergekit.merge_methods import merge_tensors

    return merge_tensors(tensors, method, parameters=parameters, base_index=base_index)


@merge_method("task_arithmetic", "Ilharco et al. 2023, arXiv:2212.04089; mergekit task_arithmetic", lam=UNIT)
def task_arithmetic(base: torch.Tensor, adapted: torch.Tensor, *, lam: float = 0.7, seed: int = 0) -> torch.Tensor:
    """theta_b + lam * (theta_a - theta_b) via mergekit `task_arithmetic` (weight 1, lambda lam)."""
    return _mergekit([base, adapted], "task_arithmetic", {"weight": 1.0, "lambda": lam}, 0)


@merge_method("linear", "mergekit linear", adapted_weight=UNIT)
def linear(base: torch.Tensor, adapted: torch.Tensor, *, adapted_weight: float = 0.5, seed: int = 0) -> torch.Tensor:
    """(1 - w) * theta_b + w * theta_a via mergekit `linear` (normalised weights); general linear mix."""
    return _mergekit([base, adapted], "linear", {"weight": [1.0 - adapted_weight, adapted_weight]}, None)


@merge_method("uniform", "Wortsman et al. 2022 (model soups), arXiv:2203.05482; mergekit linear")
def uniform(base: torch.Tensor, adapted: torch.Tensor, *, seed: int = 0) -> torch.Tensor:
    """0.5 base + 0.5 adapted (`linear` preset)."""
    return linear(base, adapted, adapted_weight=0.5)


@merge_method("mix_95_5", "linear 0.05 base / 0.95 adapted; mergekit linear")
def mix_95_5(base: torch.Tensor, adapted: torch.Tensor, *, seed: int = 0) -> torch.Tensor:
    """0.05 base + 0.95 adapted (`linear` preset)."""
    return linear(base, adapted, adapted_weight=0.95)


@merge_method("ties", "Yadav et al. 2023, TIES-Merging, arXiv:2306.01708; mergekit ties", density=OPEN_UNIT, lam=UNIT)
def ties(base: torch.Tensor, adapted: torch.Tensor, *, density: float = 0.2, lam: float = 1.0,
         seed: int = 0) -> torch.Tensor:
    """mergekit `ties` with base_index=0: top-`density` magnitudes of tau, scaled by lam.

    mergekit's TIES normalises by the summed weights of agreeing inputs, so with one task
    vector the `weight` cancels; the strength knob is mergekit's `lambda`.
    """
    return _mergekit([base, adapted], "ties", {"weight": 1.0, "density": density, "lambda": lam}, 0)


@merge_method("dare", "Yu et al. 2024, DARE, arXiv:2311.03099; mergekit dare_linear (L1 rescale)",
              density=OPEN_UNIT, lam=UNIT)
def dare(base: torch.Tensor, adapted: torch.Tensor, *, density: float = 0.1, lam: float = 1.0,
         seed: int = 0) -> torch.Tensor:
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


@merge_method("tsv", "Gargiulo et al. 2025, Task Singular Vectors, arXiv:2412.00081; sinklib (TSV-C truncation)",
              rank_fraction=OPEN_UNIT, lam=UNIT)
def tsv(base: torch.Tensor, adapted: torch.Tensor, *, rank_fraction: float = 0.1, lam: float = 1.0,
        seed: int = 0) -> torch.Tensor:
    """theta_b + lam * (rank truncation of tau) on 2-D tensors; the linear rule on the others."""
    tau = adapted - base
    if tau.dim() == 2:
        tau = task_vector_rank_truncate(tau, rank_fraction)
    return base + lam * tau


@merge_method("star", "Lee et al. 2025, STAR: Spectral Truncation and Rescale, NAACL 2025; sinklib",
              eta=OPEN_UNIT, lam=UNIT)
def star(base: torch.Tensor, adapted: torch.Tensor, *, eta: float = 0.4, lam: float = 1.0,
         seed: int = 0) -> torch.Tensor:
    """theta_b + lam * (spectral truncation and rescale of tau) on 2-D tensors; the linear rule on the others."""
    tau = adapted - base
    if tau.dim() == 2:
        tau = star_truncate(tau, eta)
    return base + lam * tau


#: The paper's seven settings, in its order.
SEVEN_SETTINGS: tuple[str, ...] = ("task_arithmetic", "uniform", "mix_95_5", "tsv", "star", "ties", "dare")


def tensor_seed(seed: int, key: str) -> int:
    """The seed used for one tensor: depends on (seed, key) only, not on which other keys merge."""
    return key_seed(seed, key, MERGE_SEED_MODULUS)


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
    same object). `params` override METHODS[method].defaults; `seed` drives DARE's masks
    (per tensor, via `tensor_seed(seed, key)`). Tensors that share storage in both inputs
    (tied embeddings) are merged once, so they stay identical.
    """
    check_choice("method", method, list(METHODS))
    resolved = METHODS[method].resolve(params)
    seed = check_int("seed", seed, 0)
    fn = METHODS[method].fn
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


# ----------------------------------------------------------------------------------------
# the parameters of chapter 6 (merging and QK-norm injection)
# ----------------------------------------------------------------------------------------


def _chapter6_params() -> dict:
    from sinklib.evals import COUNT_PARAMS
    from sinklib.controls.inject import GAIN_RULES
    from sinklib.core.models import MODEL_PARAMS
    from sinklib.core.params import COMMON, boolean, choice, integer, list_of, number, text
    from sinklib.core.sink import prompt_count

    return {**MODEL_PARAMS, "seed": integer(0), "methods": list_of(choice(SEVEN_SETTINGS)), "inject_model": text(),
            "inject_gain_rule": choice(GAIN_RULES), "inject_calib_prompts": prompt_count,
            "recovery_steps": integer(0, 100_000), "recovery_lr": number(0.0, 1.0),
            "recovery_batch_size": integer(1, 1024), "vqa_n": integer(0, 100_000), **COUNT_PARAMS,
            "eval_batch_size": integer(1, 1024), "show_progress": boolean(), **COMMON}


CHAPTER6_PARAMS = _chapter6_params()


def recovery_figure(merged, models):
    """Chapter 6's merges as points, one panel per model of `models`: the VQA accuracy of each merged model (x) against
    its strict-format mean minus the VL model's (y), the base LLM's level dashed; `merged` holds
    `sinklib.adapt.pairs.condition_row` rows (model, condition 'base', 'vl', 'merge:<method>', scores). Points are
    labelled by method with `sinklib.plots.label_points` (no label overlaps another text; points that coincide share
    one label). Returns the Figure."""
    import numpy as np

    from sinklib import plots
    from sinklib.adapt.pairs import strict_mean

    fig, axes = plots.subplots(len(models), 1, height=4.0)
    points = []
    for ax, name in zip(axes, models):
        d = merged[merged.model == name].set_index("condition")
        fmt = strict_mean(d)
        conds = [c for c in d.index if c != "base"]
        x = d.loc[conds, "VQA (%)"].to_numpy(float)
        y = (fmt[conds] - fmt["vl"]).to_numpy(float)
        vl = np.array([c == "vl" for c in conds])
        ax.scatter(x[~vl], y[~vl], s=40, zorder=3, color="tab:blue")
        ax.scatter(x[vl], y[vl], s=40, zorder=4, color="black")  # the VL model on top of a merge that equals it
        ax.axhline(0, color="grey", lw=0.8)
        ax.axhline(fmt["base"] - fmt["vl"], color="tab:green", ls="--", lw=1, label="base LLM level")
        ax.margins(x=0.12, y=0.12)
        ax.set_title(f"{name}: text recovery against visual retention")
        ax.set_xlabel("VQA accuracy of the merged model (%)")
        ax.set_ylabel("strict score minus VL (points)")
        ax.legend(loc="lower right")
        points.append((ax, x, y, [c.replace("merge:", "") for c in conds]))
    fig.tight_layout()
    for ax, x, y, labels in points:
        plots.label_points(ax, x, y, labels, fontsize=plots.MIN_FONT_PT)
    return fig
