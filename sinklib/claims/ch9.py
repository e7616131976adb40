"""Claims 7f and 7g: S against the format-like loss on chapter 9's panel of tiny models trained where a sink can
form (Bigram-Backcopy), and S beyond the QK-norm variant there."""
from __future__ import annotations

from sinklib.claims.core import Row, claim
from sinklib.stats.verdicts import Est, decide, est, num

CH9 = "09_sink_panel"


def _sink_panel(res) -> tuple[dict, str, str]:
    """Chapter 9's results, its sink precondition as text, and the failed precondition ('' when none): fewer than
    half of the panel's base models have a sink at the end of training (chapter 9's stated rule), or fewer than
    half of the VL models learned the image task (chapter 9's verdict word)."""
    r = res(CH9)["results"]
    base = r.get("base") or []
    n_sink = sum(b.get("holds_from") is not None for b in base)
    text = f"{n_sink} of {len(base)} panel models have a sink by chapter 9's rule."
    failed = "" if base and n_sink >= len(base) / 2 else "precondition failed: fewer than half of them have a sink"
    if not failed and str(r.get("verdicts", {}).get("rule loss", "")).startswith("not tested"):
        failed = "precondition failed: fewer than half of the VL models learned the image task"
    return r, text, failed


def _primary(r) -> tuple[dict, str]:
    """The controlled test (VL's rule loss beyond the text-only control) where chapter 9 computed it, else the
    uncontrolled one (base minus VL), with its name."""
    t = r["tests"]
    if "rule loss vs text-only" in t:
        return t["rule loss vs text-only"], "VL's rule loss beyond the text-only control"
    return t.get("rule loss", {}), "rule loss, base minus VL"


@claim("7f", "S predicts the format-like loss on a panel whose models form a sink (chapter 9: Bigram-Backcopy "
       "models, the backcopy rule lost under miniature VL adaptation)", ("rho_ifeval_6",), CH9,
       "ρ = {rho_ifeval_6:.3f} on six real pairs")
def sink_panel_predicts(res):
    r, ctx, failed = _sink_panel(res)
    t, what = _primary(r)
    if t.get("rho") is None:
        return Row((f"no ρ: {t.get('error', 'not computed')}", ctx),
                   *decide(None, not_tested=failed, too_small="too few models or a constant side"))
    e = Est(t["rho"], t["lo"], t["hi"])
    method = "Fisher" if "boot_lo" in t else "bootstrap"
    ours = (f"ρ(S, {what}) = {est(e, 2)} ({method}, n = {t['n']}, permutation p = {t['p']:.2g}; the paper "
            "predicts ρ < 0: lower S, larger loss).", ctx)
    return Row(ours, *decide(e, -1, quantity=f"the {method} interval of ρ", not_tested=failed))


@claim("7g", "S adds to the QK-norm architecture on a panel whose models form a sink (chapter 9)", (), CH9)
def sink_panel_beyond(res):
    r, ctx, failed = _sink_panel(res)
    t, _ = _primary(r)
    if t.get("within_p") is None or t.get("partial_rho") is None:
        return Row(("architecture test not computed", ctx),
                   *decide(None, not_tested=failed, too_small=t.get("error") or "too few models"))
    ours = (f"partial ρ of S given the variant = {num(t['partial_rho'], 2)}, within-variant permutation p = "
            f"{t['within_p']:.2g}; nested F-test p = {t['f_p']:.2g} (n = {t['n']}).", ctx)
    if not t["within_p"] < 0.05:
        return Row(ours, *decide(None, not_tested=failed, too_small="within-variant permutation p is 0.05 or more"))
    x = t["partial_rho"]
    return Row(ours, *decide(Est(x, x, x), -1, quantity="the partial ρ (significant at 5 %)", not_tested=failed))
