"""Chapter 8's head-wise repair on chapter 11's pairs that lost strict instruction format
(`sinklib.adapt.panelpairs`).

Chapter 4's VL models lost no strict format outside the noise, so the repair of section 8.5 had nothing to
recover. Here the same repair (`repair.repair_evaluations`: the sink heads' W_Q/W_K restored, beside as many
random heads and the same norm restored in other rows) runs on each chosen pair of chapter 11 at every training
seed chapter 11 ran, on chapter 11's suites and sizes, and every change is pooled over the seeds
(`evals.pooling.pooled`) into rows of `repair.repair_changes`'s layout, so that `repair.repair_outcome`,
`repair.repair_verdict` and claim 9b read them as they read section 8.5's.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pandas as pd

from sinklib.causal.repair import REPAIR_CONTROLS

#: the metrics of the pooled rows: the strict and lenient instruction and math rates, knowledge, as section 8.5's
METRICS = ("instructions strict", "instructions lenient", "math strict", "math lenient", "knowledge acc")


def condition(control: str, fraction: float) -> str:
    """The outcome record's name of one repaired state: 'sink heads @ 0.25'."""
    return f"{control} @ {fraction:g}"


def run(doc11: Mapping[str, Any], names: Sequence[str], fractions: Sequence[float], *,
        mass_of: Callable[[Any], Any], prompts: Sequence[str], last_k_layers: int, max_tokens: int, seed: int = 0,
        device: str = "auto") -> dict:
    """The repair of each pair of `names` at each seed chapter 11 ran (`mass_of(lm)`: the base model's sink-mass map
    on `prompts`, which ranks the heads; `seed` draws the random heads), evaluated on chapter 11's suites, items
    (`fourpanel.EVAL_SEED`) and batch size (cached). -> {'outcomes': {model: {'base' | 'vl' | 'vl seed 1' |
    'sink heads @ 0.25' | 'sink heads @ 0.25 seed 1' | ...: packed outcomes}}, 'described': rows of
    `repair.described` with 'seed', 'k': {model: {fraction: k}}, 'same_as_ch11': {model: {condition: whether its
    per-item outcomes are chapter 11's own}} (the base and VL models evaluated again here, on the same items)}."""
    from sinklib.adapt import panelpairs
    from sinklib.adapt.fourpanel import EVAL_SEED
    from sinklib.causal.repair import described, repair_evaluations
    from sinklib.core.models import load_model
    from sinklib.evals import counts
    from sinklib.evals.paired import pack

    eval_n = counts(doc11["parameters"])
    ch11 = doc11["results"].get("outcomes", {})
    outcomes, rows, ks, same = {}, [], {}, {}
    for name in names:
        lm = load_model(name, device=device)
        mass = mass_of(lm)
        out = outcomes.setdefault(name, {})
        for s in panelpairs.seeds_run(doc11):
            pair = panelpairs.load(lm, doc11, s)
            base_ev, vl_ev, per = repair_evaluations(
                lm, pair, mass, prompts, fractions, last_k_layers=last_k_layers, max_tokens=max_tokens,
                eval_n=eval_n, seed=seed, eval_seed=EVAL_SEED, eval_batch_size=doc11["parameters"]["eval_batch_size"])
            for c, ev in (("base", base_ev), (panelpairs.condition("vl", s, doc11), vl_ev)):
                out[c] = pack(ev["outcomes"])
                if c in ch11.get(name, {}):
                    same.setdefault(name, {})[c] = _shared(out[c], ch11[name][c])
            for f, k, evs, plans in per:
                ks.setdefault(name, {})[f] = k
                for control, ev in evs.items():
                    out[panelpairs.condition(condition(control, f), s, doc11)] = pack(ev["outcomes"])
                rows += [{**r, "seed": s} for r in described(name, f, k, plans)]
            del pair
        del lm
    return {"outcomes": outcomes, "described": rows, "k": ks, "same_as_ch11": same}


def _shared(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two packed outcome records agree on every metric they share (pass/fail lists item by item)."""
    keys = [k for k in a if k in b and isinstance(a[k], str) and isinstance(b[k], str)]
    return bool(keys) and all(a[k] == b[k] for k in keys)


def pooled_changes(doc: Mapping[str, Any], names: Sequence[str], fractions: Sequence[float],
                   k: Mapping[str, Mapping[float, int]], metrics: Sequence[str] = METRICS) -> pd.DataFrame:
    """Rows in `repair.repair_changes`'s layout (control, metric, base (the base model's pass rate, %), loss,
    loss_lo, loss_hi, change, lo, hi; p is NaN: no exact test of a pooled change) with model, fraction, k and
    seeds: the loss (VL minus base) and each
    restore's change from VL, pooled over the seeds of `doc` (results.outcomes as `run` returns them)."""
    from sinklib.evals.paired import unpack
    from sinklib.evals.pooling import pooled

    rows = []
    for name in names:
        base = unpack(doc["results"]["outcomes"][name]["base"])
        for f in fractions:
            for control in REPAIR_CONTROLS:
                c = condition(control, f)
                if c not in doc["results"]["outcomes"].get(name, {}):
                    continue
                for m in metrics:
                    loss, n = pooled(doc, name, "vl", "base", [m])
                    ch = pooled(doc, name, c, "vl", [m])[0]
                    rows.append({"model": name, "fraction": f, "k": k[name][f], "seeds": n, "control": control,
                                 "metric": m, "base": 100.0 * sum(base[m]) / len(base[m]), "loss": loss.v, "loss_lo": loss.lo, "loss_hi": loss.hi,
                                 "change": ch.v, "lo": ch.lo, "hi": ch.hi, "p": float("nan")})
    return pd.DataFrame(rows)
