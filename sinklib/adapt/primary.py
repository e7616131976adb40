"""Chapter 11's primary test (#29), its verdict by the book's one rule and its sentence: across the pairs that pass
their preconditions, Spearman's rho of base S against the VL change of the strict instruction pass rate, one-sided
in the paper's direction (higher S, less loss), exact over the n! orderings (`sinklib.adapt.fourpanel` re-exports
all three)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

#: the primary metric: the strict instruction pass rate
PRIMARY = "instructions strict"


def primary_test(S: Mapping[str, float], change: Mapping[str, float]) -> dict:
    """Spearman's rho of base S against the VL change of the primary metric (points, mean over seeds) across the
    models of both mappings, with the exact one-sided permutation p (rho > 0, the paper's direction), the opposite
    one-sided p ('p_reverse') and the smallest p that n models allow. -> {'n', 'rho', 'p', 'p_reverse', 'p_min',
    'models'}."""
    from sinklib.stats.rank import spearman_permutation

    models = [m for m in S if m in change and np.isfinite(S[m]) and np.isfinite(change[m])]
    n = len(models)
    if n < 3:
        return {"n": n, "rho": float("nan"), "p": float("nan"), "p_reverse": float("nan"), "p_min": float("nan"),
                "models": models}
    x, y = [S[m] for m in models], [change[m] for m in models]
    if len(set(x)) < 2 or len(set(y)) < 2:  # no ordering to test: every p is 1, the outcome inconclusive
        return {"n": n, "rho": float("nan"), "p": 1.0, "p_reverse": 1.0, "p_min": 1.0 / float(np.prod(range(1, n + 1))),
                "models": models, "constant": "S" if len(set(x)) < 2 else "the change"}
    r = spearman_permutation(x, y, alternative="greater")
    return {"n": n, "rho": float(r.rho), "p": float(r.p_value),
            "p_reverse": float(spearman_permutation(x, y, alternative="less").p_value),
            "p_min": 1.0 / float(np.prod(range(1, n + 1))), "models": models}


def primary_verdict(t: Mapping[str, Any], level: float = 0.05):
    """The primary test's outcome by the book's one rule (`stats.verdicts.decide`, one setting): reproduced when the
    one-sided p in the paper's direction is below `level`, contradicted when the opposite one-sided p is, not tested
    with fewer than three pairs, inconclusive otherwise. -> a `Verdict` whose reason gives both one-sided p."""
    from sinklib.stats.verdicts import Verdict, decide

    if t["n"] < 3:
        return decide(None, not_tested=f"{t['n']} of {t.get('of', t['n'])} pairs pass their preconditions (the test "
                                       "needs three or more)")
    v = decide(None, counts=(int(t["p"] < level), int(t.get("p_reverse", 1.0) < level), 1),
               quantity=f"one-sided exact test at the {level:g} level")
    ps = f"one-sided exact p {t['p']:.3f} in the paper's direction and {t.get('p_reverse', 1.0):.3f} against it"
    if t.get("constant"):
        return Verdict(v.outcome, f"{t['constant']} is the same for every pair, so there is no ordering to test")
    side = ("the first" if t["p"] < level else "the second" if t.get("p_reverse", 1.0) < level else "neither")
    return Verdict(v.outcome, f"{ps}: {side} below {level:g}")


def primary_sentence(t: Mapping[str, Any], level: float = 0.05, *, interim: bool = False, bounds: bool = True) -> str:
    """The primary test in words: its outcome and why (both one-sided p), rho, and (`bounds`) what n pairs can
    show; `interim` labels a look at the first training seed alone."""
    v = primary_verdict(t, level)
    look = "interim look, first training seed only: " if interim else ""
    if t["n"] < 3:  # the reason in one place: the verdict's
        return f"{look}not tested: {v.why}"
    reach = ("only a perfect ordering can reach it" if t["p_min"] <= level < 2 * t["p_min"] else
             "no ordering can reach it" if t["p_min"] > level else "several orderings can reach it")
    rho = "undefined" if t.get("constant") else f"{t['rho']:+.2f}"
    said = (f"{look}{v.outcome} ({v.why}); Spearman rho of base S against the VL change of the strict instruction "
            f"pass rate {rho} over {t['n']} pairs")
    return said + (f" (the smallest p {t['n']} pairs allow: {t['p_min']:.3f}; at the {level:g} level {reach})"
                   if bounds else "")
