"""Claims 9a and 9b: the causal tests of the mechanism, ablation order and repair (chapter 8)."""
from __future__ import annotations

from sinklib.claims.core import CH8, claim, per_model, strict_metrics
from sinklib.stats.verdicts import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED


@claim("9a", "Mechanism (causal test, ours): removing the sink from the heads that use it most hurts format-sensitive "
       "skills before knowledge", (), CH8)
def ablation_order(res):
    doc = res(CH8)
    ver = doc["results"]["verdicts"]
    out = {}
    for m in dict.fromkeys(r["model"] for r in ver):
        by = {r["control"]: r for r in ver if r["model"] == m}
        s = by.get("sink")
        if s is None:
            continue
        f, k = s["format_dose"], s["knowledge_dose"]
        rf = (by.get("random") or {}).get("format_dose")
        specific = f is not None and (rf is None or rf > f)
        if f is not None and (k is None or f < k) and specific:
            v, why = REPRODUCED, "format falls before knowledge, and as many random heads do not make it fall at that dose"
        elif k is not None and (f is None or k < f):
            v, why = NOT_REPRODUCED, "knowledge falls first"
        elif f is not None and (k is None or f < k):
            v, why = INCONCLUSIVE, ("format falls before knowledge, but as many random heads make it fall at the same "
                                    "dose (at dose 1 both are every head), so the fall is not specific to the sink heads")
        else:
            v, why = INCONCLUSIVE, "neither falls first outside the noise"
        ctl = "; ".join(f"{c}: {r['verdict']}" for c, r in by.items() if c != "sink")
        out[m] = (f"sink heads: {s['verdict']}" + (f" (controls: {ctl})" if ctl else ""), v,
                  why + " (rule: the smallest dose whose paired 95 % interval lies below zero)")
    return per_model(out)


@claim("9b", "Mechanism (causal test, ours): the VL loss flows through the sink heads' W_Q/W_K; restoring them "
       "brings strict formats back, random heads or other weights of the same norm do not", (), CH8)
def repair(res):
    from sinklib.causal.repair import repair_outcome

    doc = res(CH8)
    rows = doc["results"]["repair"]
    out = {}
    for m in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == m]
        f0 = mine[0]["fraction"]
        t = [r for r in mine if r["fraction"] == f0 and r["metric"] in strict_metrics()]
        o = repair_outcome(t, strict_metrics())
        lost, back = o["lost"], o["back"]
        by = {(r["control"], r["metric"]): r for r in t}
        loss = "; ".join(f"{mt} VL - base {r['loss']:+.1f} [{r['loss_lo']:+.1f}, {r['loss_hi']:+.1f}]"
                         for mt in strict_metrics() for r in [by.get(("sink heads", mt))] if r)
        moves = "; ".join(f"{c} {mt} {r['change']:+.1f} [{r['lo']:+.1f}, {r['hi']:+.1f}]"
                          for (c, mt), r in by.items() if mt in lost)
        ours = f"{loss}" + (f"; restored ({f0:.0%} of heads): {moves}" if moves else "")
        if not lost:
            out[m] = (ours, NOT_REPRODUCED, "precondition failed: the VL loss is within noise (nothing to recover)")
            continue
        worse = o["down"]["sink heads"]
        if back["sink heads"] and not (back["random heads"] or back["other rows"]):
            v, w = REPRODUCED, "the sink heads' restore brings a lost score back outside noise; neither control does"
        elif worse or not back["sink heads"] and (back["random heads"] or back["other rows"]):
            v, w = NOT_REPRODUCED, "a control repairs, or the sink heads' restore makes it worse"
        else:
            v, w = INCONCLUSIVE, ("the sink heads and a control both repair" if back["sink heads"] else
                                  "no restore moves a lost score outside noise")
        out[m] = (ours, v, w)
    return per_model(out)
