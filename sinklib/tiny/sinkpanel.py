"""Chapter 9's panel: Bigram-Backcopy models in three QK-norm variants at settings that move the sink, their
miniature VL adaptation, the test of the claim with chapter 5's statistics, and chapter 8's causal check.

A setting is a string ``"name"`` or ``"knob=value,knob=value"`` over the training parameters of
``backcopy_train.TRAIN_DEFAULTS`` (``"base"`` = the defaults): e.g. ``"weight_decay=0.5"``, ``"bos=resampled"``.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from .. import cache, panel
from ..architecture import architecture_test
from ..errors import ParameterError
from ..intervene import head_plan, random_heads
from . import backcopy as bc
from . import backcopy_adapt as ba
from . import backcopy_train as bt

_VERSION = 1
#: the panel's task columns: points lost from base to VL (positive = a loss)
RULE_TASK, KNOW_TASK = "rule loss", "knowledge loss"


def parse_setting(setting: str) -> dict:
    """'base' -> {}; 'lr=0.001,bos=resampled' -> {'lr': 0.001, 'bos': 'resampled'} (numbers parsed)."""
    if setting == "base":
        return {}
    out: dict = {}
    for part in setting.split(","):
        if "=" not in part:
            raise ParameterError(f"parameter 'settings' got {setting!r}; allowed: 'base' or 'knob=value,...'")
        k, val = (s.strip() for s in part.split("=", 1))
        if k not in bt.TRAIN_DEFAULTS or k in ("variant", "seed"):
            raise ParameterError(f"parameter 'settings' names {k!r}; allowed: {', '.join(bt.TRAIN_DEFAULTS)}")
        out[k] = type(bt.TRAIN_DEFAULTS[k])(val) if not isinstance(bt.TRAIN_DEFAULTS[k], str) else val
    return out


def model_grid(variants: Sequence[str], settings: Sequence[str], seeds: Sequence[int], common: Mapping) -> list[dict]:
    """One entry per model: {'name', 'variant', 'setting', 'seed', 'params'} (params: training parameters)."""
    grid = []
    for setting in settings:
        for seed in seeds:
            for variant in variants:
                p = bt.train_params(**{**dict(common), **parse_setting(setting), "variant": variant, "seed": int(seed)})
                grid.append({"name": f"{variant}|{setting}|s{seed}", "variant": variant, "setting": setting,
                             "seed": int(seed), "params": p})
    return grid


def base_table(grid: Sequence[Mapping]) -> pd.DataFrame:
    """Trains (or reads) every base model: name, variant, setting, seed, S, Sink_0.3, strongest head,
    emergence step, skills, seconds."""
    rows = []
    for g in grid:
        rec, _ = bt.train_backcopy(g["params"], need_model=False)
        f = rec["final"]
        rows.append({"model": g["name"], "variant": g["variant"], "setting": g["setting"], "seed": g["seed"],
                     "S": f["S"], "sink03": f["sink03"], "top_head": f["top_head"],
                     "emergence_step": rec["emergence_step"], "rule_acc": 100 * f["rule_acc"],
                     "know_acc": 100 * f["know_acc"], "know_ppl": f["know_ppl"], "seconds": rec["seconds"]})
    return pd.DataFrame(rows)


def adapt_table(grid: Sequence[Mapping], adapt_overrides: Mapping) -> pd.DataFrame:
    """Every condition of every model (``backcopy_adapt.adapt``, cached), one row per (model, condition)."""
    rows = []
    for g in grid:
        res = ba.adapt(g["params"], adapt_overrides)
        for cond in ba.CONDITIONS:
            r = res[cond]
            task = r.get("task", {})
            rows.append({"model": g["name"], "variant": g["variant"], "setting": g["setting"], "condition": cond,
                         "S": r["S"], "sink03": r["sink03"], "rule_acc": 100 * r["rule_acc"],
                         "know_acc": 100 * r["know_acc"], "know_ppl": r["know_ppl"],
                         "task_acc": task.get("acc", np.nan), "task_lo": task.get("lo", np.nan),
                         "majority": task.get("majority", np.nan), "learned": task.get("learned", np.nan)})
    return pd.DataFrame(rows)


def panel_frame(adapted: pd.DataFrame, condition: str = "vl") -> pd.DataFrame:
    """chapter 5's panel layout: pair, qk_norm, S (base), and the losses under `condition` in points
    (base minus adapted: positive = the skill got worse)."""
    b = adapted[adapted.condition == "base"].set_index("model")
    c = adapted[adapted.condition == condition].set_index("model")
    return pd.DataFrame({"pair": b.index, "qk_norm": b["variant"].to_numpy(), "S": b["S"].to_numpy(),
                         RULE_TASK: (b["rule_acc"] - c["rule_acc"]).to_numpy(),
                         KNOW_TASK: (b["know_acc"] - c["know_acc"]).to_numpy(),
                         "ppl ratio": (c["know_ppl"] / b["know_ppl"]).to_numpy()}).reset_index(drop=True)


def claim_test(df: pd.DataFrame, task: str, *, n_perm: int = 9999, n_boot: int = 9999, seed: int = 0) -> dict:
    """rho of base S vs `task` (permutation p, Fisher and bootstrap intervals), LOPO vs the constant, the
    within-variant permutation test and the nested F-test (chapter 5's functions); NaN where undefined."""
    out: dict = {"task": task, "n": int(len(df))}
    try:
        sp = panel.spearman(df["S"], df[task], n_perm=n_perm, n_boot=n_boot, seed=seed)
        out.update(rho=sp.rho, p=sp.p_value, lo=sp.ci_bootstrap[0], hi=sp.ci_bootstrap[1])
        lo = panel.lopo(df, task)
        out.update(lopo_mae=lo.mae_model, const_mae=lo.mae_constant)
        ar = architecture_test(df, task, n_perm=n_perm, seed=seed)
        out.update(within_p=ar.partial_p, partial_rho=ar.partial_rho, f_stat=ar.f_stat, f_p=ar.f_pvalue,
                   caveats=ar.caveats)
    except Exception as e:  # a constant side or too few models: reported, not raised
        out["error"] = str(e)
    return out


# ---------------------------------------------------------------------------------------
# chapter 8's causal check on a base model


def _measure_under(model: bc.BackcopyLM, p: Mapping, heads: Mapping[int, Sequence[int]] | None, mode: str) -> dict:
    plans = {} if not heads else head_plan(heads, model.cfg.n_layers, model.cfg.n_heads)
    model.plans = {layer: {"heads": m, "mode": mode} for layer, m in plans.items()}
    try:
        m = bt.measure(model, bt.eval_ids(p), bt.vocab_of(p))
    finally:
        model.plans = {}
    return {"rule_acc": 100 * m["rule_acc"], "know_acc": 100 * m["know_acc"], "know_ppl": m["know_ppl"]}


def sink_heads(mass: Sequence[Sequence[float]], eps: float = bt.SINK_EPS) -> dict[int, list[int]]:
    """{layer: [head, ...]} of the heads whose first-token mass exceeds eps (the heads that use the sink)."""
    out: dict[int, list[int]] = {}
    for layer, row in enumerate(mass):
        for h, m in enumerate(row):
            if m > eps:
                out.setdefault(layer, []).append(h)
    return out


def _causal(p: dict, seed: int) -> dict:
    rec, model = bt.train_backcopy(p)
    heads = sink_heads(rec["final"]["mass"])
    k = sum(len(v) for v in heads.values())
    out = {"sink_heads": {str(l): h for l, h in heads.items()}, "k": k, "none": _measure_under(model, p, None, "remove")}
    if k == 0:
        return out
    rnd = random_heads(list(range(model.cfg.n_layers)), model.cfg.n_heads, k, seed=seed)
    out["random_heads"] = {str(l): h for l, h in rnd.items()}
    out["remove"] = _measure_under(model, p, heads, "remove")
    out["random"] = _measure_under(model, p, rnd, "remove")
    out["matched"] = _measure_under(model, p, heads, "remove_matched")
    return out


def causal(p: Mapping, seed: int = 0) -> dict:
    """Remove the sink (chapter 8's ``remove``) in the heads with first-token mass > 0.3, in as many random heads,
    and the mass-matched control (``remove_matched``) in the sink heads; rule and knowledge scores. Cached."""
    p = bt.train_params(**dict(p))
    key = {"kind": "backcopy-causal", "version": _VERSION, "base": p, "seed": seed}
    return cache.cached_json(key, lambda: _causal(p, seed), folder="backcopy")


def causal_table(grid: Sequence[Mapping], seed: int = 0) -> pd.DataFrame:
    """One row per (model, intervention): rule and knowledge change in points against no intervention."""
    rows = []
    for g in grid:
        c = causal(g["params"], seed)
        for cond in ("remove", "random", "matched"):
            if cond not in c:
                continue
            rows.append({"model": g["name"], "variant": g["variant"], "intervention": cond, "k": c["k"],
                         "same_heads": c.get("random_heads") == c["sink_heads"],
                         "rule change": c[cond]["rule_acc"] - c["none"]["rule_acc"],
                         "knowledge change": c[cond]["know_acc"] - c["none"]["know_acc"]})
    return pd.DataFrame(rows)


def torch_threads(n: int = 1) -> None:
    """One torch thread (the 2-core machine is shared; DEVELOPING.md)."""
    torch.set_num_threads(n)
