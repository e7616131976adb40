"""Head-wise repair of an adapted model (chapter 8): put the base model's W_Q and W_K back
for chosen heads of the adapted (VL) model, against two controls: as many randomly chosen heads, and the
same norm of change restored in other weights (rows of V/O and MLP matrices of the decoder layers). It tests
the claim that the text loss flows through the sink heads' queries and keys.

State dicts are those of `sinklib.adapt.pairs.Pair.states` (transformers key names). A query head's rows of
``q_proj`` (and bias) are its ``head_dim`` rows; with grouped-query attention a key head serves
``n_heads / n_kv_heads`` query heads, so restoring W_K for one query head restores its whole key group
(``info['kv_heads']`` says which). QK-norm gains, shared by all heads of a layer, are left as adapted.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from sinklib.errors import ParameterError

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
    from sinklib.core.intervene import top_heads

    return top_heads(np.abs(np.asarray(adapted_mass, float) - np.asarray(base_mass, float)), layers, k)


#: the conditions of one head-wise repair: the chosen heads' W_Q/W_K from the base, as many random heads, the
#: same norm restored in other rows
REPAIR_CONTROLS = ("sink heads", "random heads", "other rows")


def attention_shape(model) -> dict[str, int]:
    """n_heads, n_kv_heads and head_dim of a transformers causal LM (from its config)."""
    cfg = getattr(model.config, "text_config", None) or model.config
    n_heads = int(cfg.num_attention_heads)
    n_kv = int(getattr(cfg, "num_key_value_heads", None) or n_heads)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads
    return {"n_heads": n_heads, "n_kv_heads": n_kv, "head_dim": int(head_dim)}


def repair_plans(adapted: StateDict, base: StateDict, base_mass, adapted_mass, layers: Sequence[int], k: int, *,
                 n_heads: int, n_kv_heads: int, head_dim: int, seed: int = 0) -> list[dict]:
    """The three repaired states of one adapted model, each with `k` query heads' worth of change undone:
    'sink heads' (the k heads of `layers` whose sink mass moved most: `heads_by_mass_change`), 'random heads'
    (k heads drawn with `seed`), 'other rows' (rows outside W_Q/W_K restored to the sink heads' restored norm).
    -> rows {control, heads ({layer: [head]} or {}), state, restored_norm, share (of ||adapted - base|| over
    all tensors)}."""
    from sinklib.core.intervene import random_heads

    shape = {"n_heads": n_heads, "n_kv_heads": n_kv_heads, "head_dim": head_dim}
    total = sum(float((adapted[k_].float() - base[k_].float()).pow(2).sum()) for k_ in adapted
                if adapted[k_].is_floating_point()) ** 0.5
    top = heads_by_mass_change(base_mass, adapted_mass, layers, k)
    s_top, i_top = restore_heads(adapted, base, top, **shape)
    rnd = random_heads(layers, n_heads, k, seed)
    s_rnd, i_rnd = restore_heads(adapted, base, rnd, **shape)
    s_oth, i_oth = restore_other_rows(adapted, base, i_top["restored_norm"], seed=seed)
    rows = [("sink heads", top, s_top, i_top), ("random heads", rnd, s_rnd, i_rnd), ("other rows", {}, s_oth, i_oth)]
    return [{"control": c, "heads": {int(l): list(map(int, h)) for l, h in hs.items()}, "state": s,
             "restored_norm": float(i["restored_norm"]), "share": float(i["restored_norm"] / total) if total else 0.0}
            for c, hs, s, i in rows]


def evaluate_state(lm, state: StateDict, tag: Mapping, *, eval_n: Mapping[str, int], seed: int = 0,
                   eval_batch_size: int = 8) -> dict:
    """`sinklib.causal.suites.evaluate` of `lm` holding `state` (unablated), cached under `tag` (a mapping that
    identifies the state, e.g. the pair's parameters, the control and its heads). `lm.model` gets its own
    weights back afterwards, also when the evaluation fails."""
    from sinklib.core import cache
    from sinklib.causal import suites as causal

    own = {k: v.detach().clone() for k, v in lm.model.state_dict().items()}
    tag_key = "repair:" + cache.key(dict(tag))
    lm.model.load_state_dict(dict(state), strict=True)
    try:
        return causal.evaluate(lm, None, eval_n=eval_n, seed=seed, eval_batch_size=eval_batch_size, tag=tag_key)
    finally:
        lm.model.load_state_dict(own, strict=True)


def repair_changes(base_ev: Mapping, vl_ev: Mapping, repaired: Mapping[str, Mapping], *, seed: int = 0):
    """The table of one model's repair: for each metric, the loss to recover (VL - base, paired) and, for each
    repaired state ({control: evaluation}), its change from the VL model with the paired interval and McNemar
    p. Evaluations are those of `evaluate_state` / `sinklib.causal.suites.evaluate` on the same items.
    -> DataFrame {control, metric, base, vl, repaired, loss, loss_lo, loss_hi, change, lo, hi, p}."""
    import pandas as pd

    from sinklib.evals.paired import paired_changes

    loss = {r["metric"]: r for r in paired_changes(base_ev, vl_ev, seed=seed)}
    rows = []
    for control, ev in repaired.items():
        for r in paired_changes(vl_ev, ev, seed=seed):
            g = loss[r["metric"]]
            rows.append({"control": control, "metric": r["metric"], "base": g["base"], "vl": r["base"],
                         "repaired": r["other"], "loss": g["change"], "loss_lo": g["lo"], "loss_hi": g["hi"],
                         "change": r["change"], "lo": r["lo"], "hi": r["hi"], "p": r["p"]})
    return pd.DataFrame(rows)


REPAIR_CONTROLS = ("sink heads", "random heads", "other rows")


def moved(lo: float, hi: float) -> str:
    """The chapter's rule for one paired 95 % interval of a change: 'up' (excludes zero above), 'down', or
    'no change'."""
    return "up" if lo > 0 else "down" if hi < 0 else "no change"


def repair_outcome(rows: Sequence[Mapping], metrics: Sequence[str]) -> dict:
    """One model's repair by the rule that chapter 8's sentences and claim 9b share: `rows` are
    `repair_changes` records of one fraction; -> {'lost': metrics whose VL - base interval lies below zero,
    'back' / 'down': per control, whether its restore moved a lost metric up / down outside the noise}."""
    by = {(r["control"], r["metric"]): r for r in rows if r["metric"] in metrics}
    lost = [m for m in metrics if any(moved(r["loss_lo"], r["loss_hi"]) == "down"
                                      for (c, mt), r in by.items() if mt == m)]
    return {"lost": lost,
            "back": {c: any(moved(by[(c, m)]["lo"], by[(c, m)]["hi"]) == "up" for m in lost if (c, m) in by)
                     for c in REPAIR_CONTROLS},
            "down": {c: any(moved(by[(c, m)]["lo"], by[(c, m)]["hi"]) == "down" for m in lost if (c, m) in by)
                     for c in REPAIR_CONTROLS}}


def repair_verdict(table, metrics: Sequence[str] = ("instructions strict", "math strict")) -> str:
    """One model's repair in words, by the chapter's rule (a paired 95 % interval that excludes zero): for each
    strict-format metric, whether adaptation lost it, and whether restoring the sink heads' W_Q/W_K brought it
    back, beside the two controls."""
    parts = []
    for m in metrics:
        t = table[table.metric == m]
        if t.empty:
            continue
        g = t.iloc[0]
        lost = m in repair_outcome(t.to_dict(orient="records"), [m])["lost"]
        head = (f"{m}: VL {'lost' if lost else 'did not lose'} it ({g.loss:+.1f} [{g.loss_lo:+.1f}, {g.loss_hi:+.1f}])")
        moves = []
        for r in t.itertuples():
            word = {"up": "back up", "down": "down", "no change": "no change"}[moved(r.lo, r.hi)]
            moves.append(f"{r.control} {r.change:+.1f} [{r.lo:+.1f}, {r.hi:+.1f}] ({word})")
        parts.append(head + "; restored " + ", ".join(moves))
    return ". ".join(parts)


def run_repair(lm, pair, base_mass, prompts: Sequence[str], fractions: Sequence[float], *, last_k_layers: int,
               max_tokens: int, eval_n: Mapping[str, int], seed: int = 0, eval_batch_size: int = 8):
    """Chapter 8's head-wise repair of one model's VL condition (`pair`: `sinklib.adapt.pairs.Pair` of `lm`): the
    evaluations of `repair_evaluations` compared with the VL model and the base (`repair_changes`). -> (DataFrame
    of `repair_changes` rows with model, fraction, k; rows describing each repaired state: control, k, restored
    norm, its share of ||VL - base||, layers, heads)."""
    import pandas as pd

    base_ev, vl_ev, per_fraction = repair_evaluations(lm, pair, base_mass, prompts, fractions,
                                                      last_k_layers=last_k_layers, max_tokens=max_tokens,
                                                      eval_n=eval_n, seed=seed, eval_batch_size=eval_batch_size)
    tables = [repair_changes(base_ev, vl_ev, evs, seed=seed).assign(model=lm.name, fraction=f, k=k)
              for f, k, evs, _ in per_fraction]
    return pd.concat(tables, ignore_index=True), [d for f, k, _, plans in per_fraction
                                                  for d in described(lm.name, f, k, plans)]


def repair_evaluations(lm, pair, base_mass, prompts: Sequence[str], fractions: Sequence[float], *,
                       last_k_layers: int, max_tokens: int, eval_n: Mapping[str, int], seed: int = 0,
                       eval_batch_size: int = 8, eval_seed: int | None = None) -> tuple[dict, dict, list]:
    """The evaluations of one model's repair: the VL model's sink-mass map on `prompts` (last K layers), then for
    each fraction of those layers' heads the three `repair_plans` (random heads drawn with `seed`), each evaluated
    (`evaluate_state`, cached), beside the base and the VL model on the same items (drawn with `eval_seed`; None:
    `seed`). -> (base evaluation, VL evaluation, [(fraction, k, {control: evaluation}, plans)])."""
    from sinklib.core import anatomy, sink
    from sinklib.causal import suites as causal

    K = anatomy.clamp_last_k(last_k_layers, lm.model)
    layers = list(range(anatomy.n_layers(lm.model) - K, anatomy.n_layers(lm.model)))
    pair.load_into(lm.model, "vl")
    try:
        vl_mass = sink.sink_strength(lm.model, prompts, tokenizer=lm.tokenizer, all_layers=True,
                                     max_tokens=max_tokens, last_k_layers=K).mass
    finally:
        pair.load_into(lm.model, "base")
    tag = {"pair": pair.params, "eval": "chapter 8"}
    ev = dict(eval_n=eval_n, seed=seed if eval_seed is None else eval_seed, eval_batch_size=eval_batch_size)
    base_ev = causal.evaluate(lm, None, **ev)
    vl_ev = evaluate_state(lm, pair.states["vl"], {**tag, "control": "vl"}, **ev)
    out = []
    for f in fractions:
        k = max(1, round(f * K * vl_mass.shape[1]))
        plans = repair_plans(pair.states["vl"], pair.states["base"], base_mass, vl_mass, layers, k, seed=seed,
                             **attention_shape(lm.model))
        evs = {p["control"]: evaluate_state(lm, p["state"], {**tag, "control": p["control"], "k": k,
                                                            "heads": p["heads"], "seed": seed}, **ev) for p in plans}
        out.append((f, k, evs, [{q: v for q, v in p.items() if q != "state"} for p in plans]))
    return base_ev, vl_ev, out


def described(name: str, fraction: float, k: int, plans: Sequence[Mapping]) -> list[dict]:
    """Rows describing each repaired state of `repair_plans`: control, k, restored norm, its share of
    ||VL - base||, how many layers, which heads."""
    return [{"model": name, "fraction": fraction, "k": k, "control": p["control"],
             "restored norm": round(p["restored_norm"], 3), "share of ||VL - base||": round(p["share"], 4),
             "layers": len(p["heads"]), "heads": {str(l): hs for l, hs in p["heads"].items()}} for p in plans]
