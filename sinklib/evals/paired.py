"""Paired comparisons of two evaluations on the same items: per-item outcomes, the exact McNemar test and
paired bootstrap intervals, also of derived quantities (a mean of two suites' changes, a difference of two
changes).

Every bootstrap here resamples the items of one suite with indices that depend only on (seed, suite, number of
items) (`resample_index`). Two conditions evaluated on the same items are therefore resampled together (a
paired interval), and two quantities built from the same suite share their draws, so their difference is
paired too. Different suites are resampled independently.

    out = outcomes(evals.run_suites(...))        # {'math strict': [True, False, ...], 'perplexity': {...}}
    d = change_draws(base_out, vl_out, "math strict")   # [n_boot] changes in points
    est = estimate(point_change(base_out, vl_out, "math strict"), d)
"""
from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sinklib.errors import ParameterError
from sinklib.stats.verdicts import Est
from sinklib.evals.grading import mcnemar_exact

#: the pass/fail metrics kept per item (suite, per-item field); perplexity keeps NLL and token counts
PASS_FAIL = (("instructions", "strict"), ("instructions", "lenient"), ("math", "strict"), ("math", "lenient"),
             ("knowledge", "acc"), ("format", "strict"), ("format", "lenient"))
N_BOOT = 2000


def outcomes(results: Mapping[str, Any]) -> dict:
    """Per-item outcomes of `evals.run_suites` results: {'suite metric': [bool, ...]} for `PASS_FAIL`, and
    'perplexity': {'nll': [...], 'n_tokens': [...]} per document (same item order as the suite's sample)."""
    out: dict = {}
    for suite, metric in PASS_FAIL:
        if suite in results:
            out[f"{suite} {metric}"] = [bool(p[metric]) for p in results[suite].per_item]
    if "perplexity" in results:
        per = results["perplexity"].per_item
        out["perplexity"] = {"nll": [float(p["nll"]) for p in per], "n_tokens": [int(p["n_tokens"]) for p in per]}
    return out


def pack(out: Mapping[str, Any]) -> dict:
    """`outcomes` in a compact JSON form (pass/fail lists as '0'/'1' strings), for results files."""
    return {k: v if isinstance(v, Mapping) else "".join("1" if x else "0" for x in v) for k, v in out.items()}


def unpack(out: Mapping[str, Any]) -> dict:
    """The inverse of `pack` (lists of bools pass through)."""
    return {k: [c == "1" for c in v] if isinstance(v, str) else v for k, v in out.items()}


def paired_changes(base: Mapping, other: Mapping, *, seed: int = 0) -> list[dict]:
    """Every metric's change from `base` to `other` (two evaluations with 'outcomes' on the same items): score
    before and after (%, perplexity as exp of nats per token), change, its paired bootstrap 95 % interval (the
    suite's shared resampling indices, as `change`, so that the same change has the same interval wherever it is
    computed) and, for pass/fail metrics, the exact McNemar p-value and the discordant counts. -> rows {metric,
    base, other, change, lo, hi, p, lost, gained}."""
    rows = []
    bo, oo = unpack(base["outcomes"]), unpack(other["outcomes"])
    for name in bo:
        if name not in oo:
            continue
        if name == "perplexity":
            if bo[name]["n_tokens"] != oo[name]["n_tokens"]:
                raise ParameterError("paired_changes: the two perplexity runs scored different documents")
            e = estimate(*change(bo, oo, "perplexity ppl", seed=seed))
            rows.append({"metric": "perplexity ppl", "base": score(bo, "perplexity ppl"),
                         "other": score(oo, "perplexity ppl"), "change": e.v, "lo": e.lo, "hi": e.hi,
                         "p": float("nan"), "lost": 0, "gained": 0})
            continue
        b, o = bo[name], oo[name]
        if len(b) != len(o):
            raise ParameterError(f"paired_changes: {name} has {len(b)} items in one run and {len(o)} in the other")
        e = estimate(*change(bo, oo, name, seed=seed))
        m = mcnemar_exact(b, o)
        rows.append({"metric": name, "base": score(bo, name), "other": score(oo, name), "change": e.v,
                     "lo": e.lo, "hi": e.hi, "p": m["p"], "lost": m["b"], "gained": m["c"]})
    return rows


# ---------------------------------------------------------------------------------------
# bootstrap draws shared across conditions (paired) and across quantities of one suite

def resample_index(n_items: int, suite: str, *, n_boot: int = N_BOOT, seed: int = 0) -> np.ndarray:
    """[n_boot, n_items] item indices drawn with replacement; the same for every call with these arguments."""
    if n_items < 1:
        raise ParameterError(f"resample_index: suite {suite!r} has no items")
    s = int.from_bytes(hashlib.sha256(f"{seed}:{suite}:{n_items}".encode()).digest()[:8], "little")
    return np.random.default_rng(s).integers(0, n_items, size=(int(n_boot), int(n_items)))


def _suite(metric: str) -> str:
    return "perplexity" if metric.startswith("perplexity") else metric.split(" ", 1)[0]


def score(out: Mapping[str, Any], metric: str) -> float:
    """The score of one metric from per-item outcomes: % for pass/fail, perplexity for 'perplexity ppl'."""
    out = unpack(out)
    if _suite(metric) == "perplexity":
        d = out["perplexity"]
        return float(np.exp(sum(d["nll"]) / sum(d["n_tokens"])))
    if metric not in out:
        raise ParameterError(f"no per-item outcomes for {metric!r}; held: {', '.join(out)}")
    return 100 * float(np.mean(out[metric]))


def score_draws(out: Mapping[str, Any], metric: str, *, n_boot: int = N_BOOT, seed: int = 0) -> np.ndarray:
    """[n_boot] bootstrap draws of `score(out, metric)` with the suite's shared resampling indices."""
    out = unpack(out)
    if _suite(metric) == "perplexity":
        d = out["perplexity"]
        nll, nt = np.asarray(d["nll"], float), np.asarray(d["n_tokens"], float)
        idx = resample_index(nll.size, "perplexity", n_boot=n_boot, seed=seed)
        return np.exp(nll[idx].sum(1) / nt[idx].sum(1))
    if metric not in out:
        raise ParameterError(f"no per-item outcomes for {metric!r}; held: {', '.join(out)}")
    x = np.asarray(out[metric], float)
    return 100 * x[resample_index(x.size, _suite(metric), n_boot=n_boot, seed=seed)].mean(1)


def change(base: Mapping[str, Any], other: Mapping[str, Any], metrics: str | Sequence[str], *,
           n_boot: int = N_BOOT, seed: int = 0) -> tuple[float, np.ndarray]:
    """The paired change other - base of one metric, or of the mean of several (e.g. the strict-format mean),
    as (point value, [n_boot] draws). Both outcome sets must hold the same items."""
    metrics = [metrics] if isinstance(metrics, str) else list(metrics)
    bo, oo = unpack(base), unpack(other)
    for m in metrics:
        key = "perplexity" if _suite(m) == "perplexity" else m
        nb = len(bo[key]["nll"] if key == "perplexity" else bo.get(key, []))
        no = len(oo[key]["nll"] if key == "perplexity" else oo.get(key, []))
        if nb != no or nb == 0:
            raise ParameterError(f"paired change of {m!r}: {nb} items in one evaluation and {no} in the other "
                                 "(evaluate both on the same items)")
    point = float(np.mean([score(oo, m) - score(bo, m) for m in metrics]))
    draws = np.mean([score_draws(oo, m, n_boot=n_boot, seed=seed) - score_draws(bo, m, n_boot=n_boot, seed=seed)
                     for m in metrics], axis=0)
    return point, draws


def estimate(point: float, draws: np.ndarray, level: float = 0.95) -> Est:
    """A point value with the percentile interval of its bootstrap draws."""
    a = (1 - level) / 2
    return Est(float(point), float(np.quantile(draws, a)), float(np.quantile(draws, 1 - a)))


def p_two_sided(draws: np.ndarray) -> float:
    """Bootstrap two-sided p-value of 'the quantity is 0': twice the smaller share of draws on either side of
    zero (capped at 1; at least 1 / n_boot)."""
    d = np.asarray(draws, float)
    return float(min(1.0, max(1.0 / d.size, 2 * min(np.mean(d <= 0), np.mean(d >= 0)))))
