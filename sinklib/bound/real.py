"""Theorem 1 on real layers: capture the inputs of a Hugging Face model's query/key projections
(after each layer's input norm), its weights, QK-norm gains and RoPE tables (`capture_qk_inputs`),
and measure a layer's sensitivity to weight changes against the bound (`layer_sensitivity`), the norm
of the sink token's inputs (`sink_norm_ratios`), an input-scale sweep on a real layer (`real_scale_sweep`),
all of it for one model (`measure_real_model`), summarised per model (`real_models_summary`).
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from sinklib.core.anatomy import decoder_layers
from sinklib.bound.theorem import QKSpec, _block_norms, gap_change_bound, gap_changes, rms_normalize
from sinklib.bound.instances import random_direction
from sinklib.errors import AttentionError, ParameterError

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
    dec = decoder_layers(model)
    chosen = list(range(len(dec))) if layers is None else [int(l) for l in layers]
    for l in chosen:
        if not 0 <= l < len(dec):
            raise ParameterError(f"layer {l} is outside the model's {len(dec)} layers")
    cfg = getattr(model.config, "text_config", model.config)
    if getattr(cfg, "attn_logit_softcapping", None):
        raise AttentionError("this model soft-caps attention logits; the bound here does not model it")
    seen = _capture_layer_inputs(model, dec, chosen, input_ids)
    return [_layer_qk(dec[l].self_attn, l, cfg, T, seen[l], dtype) for l in chosen]


def _capture_layer_inputs(model: Any, dec: list, chosen: list[int], input_ids: Tensor) -> dict[int, dict]:
    """One forward pass with pre-hooks on the chosen decoder layers and their attention modules:
    {layer: {'residual', 'x', 'rope'}} (detached, on the model's device)."""
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
    return seen


def _layer_qk(attn: Any, l: int, cfg: Any, T: int, seen_l: dict, dtype: torch.dtype) -> LayerQK:
    """The `LayerQK` of layer `l` (attention module `attn`) from its captured inputs `seen_l`."""
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
        norm = "per_head" if wq_n == dh else "layerwise"
        gq, eps = _effective_gain(qn, wq_n)
        gk, eps_k = _effective_gain(kn, next(kn.parameters()).numel())
        if eps_k != eps:
            raise AttentionError(f"layer {l}: q_norm eps {eps} differs from k_norm eps {eps_k}")
        gq, gk = gq.to(dtype), gk.to(dtype)
    spec = QKSpec(norm, H, Hkv, int(dh), scaling=float(attn.scaling), eps=float(eps))
    cv = lambda t: None if t is None else t.detach().to("cpu", dtype)  # noqa: E731
    rope = seen_l["rope"]
    return LayerQK(
        layer=l, x=cv(seen_l["x"][0]), residual=cv(seen_l["residual"][0]),
        wq=cv(attn.q_proj.weight), wk=cv(attn.k_proj.weight), spec=spec, gq=gq, gk=gk,
        bq=cv(attn.q_proj.bias), bk=cv(attn.k_proj.bias),
        rope=None if rope is None else (cv(rope[0][0]), cv(rope[1][0])), sliding_window=window)


def sink_norm_ratios(layer: LayerQK) -> dict:
    """Norm of the sink token (position 0) over the median norm of the other tokens, at the input of
    q_proj/k_proj (``x_ratio``) and in the residual stream (``res_ratio``), with the two norms at the input."""
    xn, rn = layer.x.norm(dim=-1), layer.residual.norm(dim=-1)
    return dict(x_ratio=float(xn[0] / xn[1:].median()), res_ratio=float(rn[0] / rn[1:].median()),
                x_sink=float(xn[0]), x_other=float(xn[1:].median()))


def real_scale_sweep(layer: LayerQK, dwq: Tensor, dwk: Tensor, scales, source: str) -> list[dict]:
    """Every input of a real layer multiplied by each of ``scales``, the weight change fixed: median
    |change of the max-gap| and median bound over heads and queries (a projection bias is not scaled).
    -> rows {source, variant, instance (0), scale, change, bound, bias (q_proj or k_proj has one)}."""
    rows, bias = [], layer.bq is not None or layer.bk is not None
    for lam in scales:
        kw = {**layer.kwargs(dwq, dwk), "x": lam * layer.x}
        rows.append(dict(source=source, variant=layer.spec.norm, instance=0, scale=lam, bias=bias,
                         change=float(gap_changes(**kw, competitors=("max",))["max"].abs().median()),
                         bound=float(gap_change_bound(**kw).median())))
    return rows


def measure_real_model(model: Any, prompt_ids: list[list[int]], name: str, layer_stride: int, rel_changes: list[float],
                       n_directions: int, generator: torch.Generator, scales, sweep_rel: float,
                       labels: dict[str, str] | None = None) -> dict:
    """Theorem 1 on one model: every ``layer_stride``-th layer, for each prompt, `layer_sensitivity` and
    `sink_norm_ratios`; on the first prompt also `real_scale_sweep` of the middle captured layer with a
    Gaussian change of Frobenius size ``sweep_rel``. All randomness from ``generator``, in that order.

    -> {"norm": the model's QK-norm variant, "sensitivity": rows of `layer_sensitivity` plus model, norm,
    prompt, depth; "norms": rows {model, layer, depth, prompt, **sink_norm_ratios}; "sweep": sweep rows}.
    """
    labels = labels or {}
    n_layers = model.config.get_text_config().num_hidden_layers
    layers = list(range(0, n_layers, layer_stride))
    out: dict = {"norm": None, "sensitivity": [], "norms": [], "sweep": []}
    for p_i, ids in enumerate(prompt_ids):
        caps = capture_qk_inputs(model, torch.tensor([ids]), layers=layers)
        out["norm"] = caps[0].spec.norm
        for L in caps:
            depth = L.layer / (n_layers - 1)
            for row in layer_sensitivity(L, rel_changes, n_directions, generator):
                out["sensitivity"].append(dict(model=name, norm=L.spec.norm, prompt=p_i, depth=depth, **row))
            out["norms"].append(dict(model=name, layer=L.layer, depth=depth, prompt=p_i, **sink_norm_ratios(L)))
        if p_i == 0:   # input-scale sweep on the middle captured layer
            L = caps[len(caps) // 2]
            dq = random_direction(L.wq, sweep_rel, generator, "fro")
            dk = random_direction(L.wk, sweep_rel, generator, "fro")
            source = f"{name} layer {L.layer} ({labels.get(L.spec.norm, L.spec.norm)})"
            out["sweep"] += real_scale_sweep(L, dq, dk, scales, source)
    return out


#: the modules whose code makes `measure_real_model`'s numbers: a change to any of them recomputes its cached rows
MEASURE_CODE = ("bound/real.py", "bound/theorem.py", "bound/instances.py", "core/anatomy.py")


def measure_loaded(lm: Any, prompt_ids: list[list[int]], name: str, layer_stride: int, rel_changes: list[float],
                   n_directions: int, generator: torch.Generator, scales, sweep_rel: float,
                   labels: dict[str, str] | None = None, tol: float = 1e-9) -> dict:
    """`measure_real_model` of a loaded model (`sinklib.load_model`) with its `real_models_summary` (at `tol`)
    under "summary" and its sensitivity rows without their `ratios` arrays (millions of gap values; the summary
    keeps what the book reads of them), cached under `<cache>/bound/` by everything that makes those numbers: the
    weights' SHA-256, device and dtype, the prompts, the parameters, the generator's state on entry and the code of
    `MEASURE_CODE`. A cached read leaves `generator` where the computation left it, so the next model's draws (and
    every number after) are those of an uncached run. A model without a weights checksum (a Hub model) is measured
    each time."""
    def run() -> dict:
        out = measure_real_model(lm.model, prompt_ids, name, layer_stride, rel_changes, n_directions, generator,
                                 scales, sweep_rel, labels)
        out["summary"] = real_models_summary(pd.DataFrame(out["sensitivity"]), [name], tol)[name]
        out["sensitivity"] = [{k: v for k, v in row.items() if k != "ratios"} for row in out["sensitivity"]]
        return {"measured": out, "generator_after": generator.get_state().numpy().tobytes().hex()}

    if not getattr(lm, "weights_sha256", None):
        return run()["measured"]
    from sinklib.core.cache import cached_json
    from sinklib.core.resources import PACKAGE

    code = hashlib.sha256(b"".join((PACKAGE / f).read_bytes() for f in MEASURE_CODE)).hexdigest()[:16]
    key = {"what": "real bound", "weights": lm.weights_sha256, "device": str(lm.device), "dtype": str(lm.dtype),
           "name": name, "prompts": [list(map(int, ids)) for ids in prompt_ids], "layer_stride": layer_stride,
           "rel_changes": list(rel_changes), "n_directions": n_directions, "scales": [float(x) for x in scales],
           "sweep_rel": sweep_rel, "labels": labels or {}, "tol": tol, "code": code,
           "generator": hashlib.sha256(generator.get_state().numpy().tobytes()).hexdigest()[:16]}
    value = cached_json(key, run, folder="bound")
    generator.set_state(torch.tensor(list(bytes.fromhex(value["generator_after"])), dtype=torch.uint8))
    return value["measured"]


def real_models_summary(real: pd.DataFrame, models: list[str], tol: float = 1e-9) -> dict:
    """Per model, over all rows of `measure_real_model`'s "sensitivity" (as a DataFrame): cells, gap values
    (actual / bound, both competitors), violations (ratio > 1 + tol), median and max tightness."""
    out = {}
    for m in models:
        r = np.concatenate(real[real.model == m].ratios.values)
        out[m] = dict(cells=int((real.model == m).sum()), gap_values=int(len(r)), violations=int((r > 1 + tol).sum()),
                      median_tightness=float(np.median(r)), max_tightness=float(r.max()))
    return out


# --------------------------------------------------------------------------- Remark 1 on trained weights


def remark1_heads(layer: LayerQK, query_start: int = 1) -> pd.DataFrame:
    """Remark 1's quantities for every head of one captured layer (`capture_qk_inputs`), one row per head.

    raw_share: the head's share of the raw query ``u_i = W_Q x_i`` before any normalisation,
    ``||u_ih|| / ||u_i|| * sqrt(H)`` (1 = an equal share), median over queries >= query_start;
    query_norm: the median norm of the head's normalised query (what the logits see); logit_range: largest
    minus smallest causally visible logit; sink_logodds: the median sink gap with a log-sum-exp competitor
    (the log-odds of the sink's attention mass). Remark 1 says that under layerwise QK-RMSNorm query_norm
    and logit_range follow raw_share (weak heads are compressed); under per-head QK-RMSNorm every head's
    query norm is set by its gain whatever its raw share."""
    from sinklib.bound.theorem import project, qk_logits, sink_gap
    from sinklib.bound.instances import logit_range

    sp = layer.spec
    T = layer.x.shape[0]
    if not 0 < query_start < T:
        raise ParameterError(f"query_start={query_start} must lie in 1..{T - 1} for a prompt of {T} tokens")
    u = layer.x @ layer.wq.T
    if layer.bq is not None:
        u = u + layer.bq
    per_head = u.view(T, sp.n_heads, sp.head_dim).norm(dim=-1)              # [T, H]
    share = (per_head / u.norm(dim=-1, keepdim=True).clamp_min(1e-30) * math.sqrt(sp.n_heads))[query_start:]
    q = project(layer.x, layer.wq, sp.n_heads, sp, layer.gq, layer.bq, layer.rope)   # [H, T, dh]
    lg = qk_logits(layer.x, layer.wq, layer.wk, sp, layer.gq, layer.gk, layer.rope, layer.bq, layer.bk)
    gap = sink_gap(lg, sink=0, query_start=query_start, competitor="lse")
    return pd.DataFrame({"layer": layer.layer, "head": range(sp.n_heads), "norm": sp.norm,
                         "raw_share": share.median(0).values.numpy(),
                         "query_norm": q[:, query_start:].norm(dim=-1).median(-1).values.numpy(),
                         "logit_range": logit_range(lg).numpy(), "sink_logodds": gap.median(-1).values.numpy()})


def remark1_table(model: Any, prompt_ids: list[list[int]], layers: list[int] | None = None) -> pd.DataFrame:
    """`remark1_heads` of every chosen layer (default all) averaged over prompts: one row per (layer, head)."""
    if not prompt_ids:
        raise ParameterError("prompt_ids is empty; give at least one tokenised prompt")
    frames = []
    for p, ids in enumerate(prompt_ids):
        for lay in capture_qk_inputs(model, torch.tensor([list(ids)]), layers):
            frames.append(remark1_heads(lay).assign(prompt=p))
    df = pd.concat(frames, ignore_index=True)
    return df.groupby(["layer", "head", "norm"], as_index=False)[
        ["raw_share", "query_norm", "logit_range", "sink_logodds"]].mean()


def remark1_summary(table: pd.DataFrame) -> dict:
    """Spearman rho (with its two-sided permutation p, layers pooled) of a head's raw share against its
    normalised query norm and its logit range, and the spread (max / min) of the query norms and raw shares:
    Remark 1 predicts rho > 0 for both under layerwise QK-norm and no dependence of the query norm under
    per-head QK-norm. A column equal up to 0.1 % gets NaN (its ranks would be rounding noise)."""
    from sinklib.errors import PanelError
    from sinklib.stats.panel import spearman

    out = {"n_heads": int(len(table)), "norm": ",".join(sorted(set(table["norm"])))}
    for col in ("query_norm", "logit_range"):
        v = table[col].to_numpy(dtype=float)
        if v.max() <= 1.001 * v.min():  # equal up to 0.1 % (per-head QK-norm with equal gains): ranks are noise
            out[f"rho_share_{col}"], out[f"p_share_{col}"] = float("nan"), float("nan")
            continue
        try:
            r = spearman(table["raw_share"], table[col], n_perm=9999, n_boot=999)
            out[f"rho_share_{col}"], out[f"p_share_{col}"] = float(r.rho), float(r.p_value)
        except PanelError:  # a constant column (e.g. equal per-head query norms): no rank correlation
            out[f"rho_share_{col}"], out[f"p_share_{col}"] = float("nan"), float("nan")
    for col in ("raw_share", "query_norm"):
        v = table[col].to_numpy(dtype=float)
        out[f"{col}_spread"] = float(v.max() / max(v.min(), 1e-30))
    return out
