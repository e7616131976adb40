"""Claims 8a to 8c: injecting QK-RMSNorm after pretraining, and model merging (chapter 6)."""
from __future__ import annotations

from collections.abc import Callable

from sinklib import evals
from sinklib.claims.core import (CH4, CH6, NO_VQA, Results, Row, claim, outcomes_of, paired_delta, per_model,
    strict_metrics)
from sinklib.stats.verdicts import (INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, Est, diff, direction, est, mean,
    wilson_pct)

INJECT_TOP1_MIN = 0.9   # a fair injection starts as the same function: top-1 agreement with the original


@claim("8a", "Injecting QK-RMSNorm after pretraining fails", ("inject_ifeval_before", "inject_ifeval_after"), CH6,
       "IFEval {inject_ifeval_before:.1f} → {inject_ifeval_after:.0f}")
def injection(res):
    r = res(CH6)["results"]
    inj, top1 = r["injection"], r["injection_init_error"]["top1_agreement"]
    sc = {c: {f"{s['suite']} {s['metric']}": Est(s["score"], s["lo"], s["hi"]) for s in v["scores"]}
          for c, v in inj.items()}
    final = "injected + recovery" if "injected + recovery" in sc else "injected"
    outs = {c: v.get("outcomes") for c, v in inj.items()}

    def paired_d(a: str, b: str) -> Est | None:  # a - b on the shared items, when both stored them
        return paired_delta(outs.get(a), outs.get(b), strict_metrics())

    d = paired_d(final, "original") or diff(mean(*(sc[final][m] for m in strict_metrics())),
                                            mean(*(sc["original"][m] for m in strict_metrics())))
    ppl = " → ".join(f"{sc[c]['perplexity ppl'].v:.0f}" for c in sc)
    ours = (f"{final} minus original, strict-format {est(d)} pt", f"top-1 agreement at initialisation {top1:.2f}; "
            f"perplexity {ppl} ({' → '.join(sc)})")
    no_control = final != "injected" and "original + recovery" not in sc
    if top1 < INJECT_TOP1_MIN:
        return Row(ours, NOT_REPRODUCED, f"precondition failed: the injection breaks the model at initialisation "
                   f"(top-1 agreement {top1:.2f} < {INJECT_TOP1_MIN}), so the drop measures a broken start, not the "
                   f"norm{'; the recovery fine-tune has no control either' if no_control else ''}")
    if no_control:
        return Row(ours, NOT_REPRODUCED, "precondition failed: the recovery fine-tune has no control "
                   "(the original model fine-tuned the same way)")
    if "original + recovery" in sc:
        d = paired_d(final, "original + recovery") or diff(d, diff(mean(*(sc["original + recovery"][m] for m in strict_metrics())),
                                                                   mean(*(sc["original"][m] for m in strict_metrics()))))
    return Row(ours, direction(d, -1), f"strict-format change against its control {est(d)} pt")


def merge_recovers(to_base: Est, to_vl: Est) -> bool:
    """A merge recovers the VL loss: its strict-format change from the base is above zero outside the noise, or
    not below it while the change from the VL model is above zero outside the noise (paired where stored)."""
    return to_base.lo > 0 or (to_base.hi >= 0 and to_vl.lo > 0)


def merge_worse(to_vl: Est) -> bool:
    """A merge makes the text loss worse: its strict-format change from the VL model is below zero outside the noise."""
    return to_vl.hi < 0


def _merges(res: Results, test: Callable[[Callable[[str, str], Est], list[str]], tuple[str, str, str]]) -> Row:
    """Per model of chapter 6: `test(d, merges)` where d(a, b) is the strict-format change a - b (points) with a
    paired interval when chapter 6 stored per-item outcomes, else with MOVER intervals of Wilson intervals from
    chapter 6's n; merges are the model's 'merge:...' conditions."""
    doc = res(CH6)
    n, rows = evals.counts(doc["parameters"]), doc["results"]["merges"]  # the saved flat eval_* parameters
    out = {}
    for m in dict.fromkeys(r["model"] for r in rows):
        conds = {r["condition"]: mean(*(wilson_pct(r[k], n[k.split()[0]]) for k in strict_metrics()))
                 for r in rows if r["model"] == m}

        def d(a: str, b: str, m=m, conds=conds) -> Est:
            e = paired_delta(outcomes_of(doc, m, a), outcomes_of(doc, m, b), strict_metrics())
            return diff(conds[a], conds[b]) if e is None else e

        vl = next(r for r in rows if r["model"] == m and r["condition"] == "vl")
        e = wilson_pct(vl["VQA (%)"], doc["parameters"]["vqa_n"])
        maj = next(x["majority baseline (%)"] for x in res(CH4)["results"]["vqa"] if x["model"] == m)
        o, v, w = test(d, [c for c in conds if c.startswith("merge:")])
        out[m] = (o, v, w) if e.lo > maj else (o, NOT_REPRODUCED, f"{NO_VQA} (VQA {e.v:.0f} % [{e.lo:.0f}, "
                                               f"{e.hi:.0f}] vs majority {maj:.0f} %; without it: {v}, {w})")
    return per_model(out)


@claim("8b", "No merging setting recovers the VL loss", ("merge_settings",), CH6, "{merge_settings:.0f} settings, none recovers")
def no_recovery(res):
    def test(d, merges):
        vl = d("vl", "base")
        merged = {c: d(c, "base") for c in merges}
        rec = [c for c, e in merged.items() if merge_recovers(e, d(c, "vl"))]
        below = [c for c, e in merged.items() if e.hi < 0]
        ours = f"VL strict-format {est(vl)} pt; below base outside noise: {len(below)} of {len(merged)}"
        if vl.hi >= 0:
            return ours, NOT_REPRODUCED, "precondition failed: the VL loss is within noise (nothing to recover)"
        v = NOT_REPRODUCED if rec else REPRODUCED if len(below) == len(merged) else INCONCLUSIVE
        return ours, v, f"{len(rec)} merges recover outside noise, {len(below)} stay below the base"
    return _merges(res, test)


@claim("8c", "Most merging settings make the text loss worse", ("merge_settings", "merge_settings_not_worse"), CH6,
       "{merge_settings_not_worse:.0f} of {merge_settings:.0f} avoid making it worse")
def most_merges_worse(res):
    def test(d, merges):
        dd = {c: d(c, "vl") for c in merges}
        worse, better = sum(merge_worse(e) for e in dd.values()), sum(e.lo > 0 for e in dd.values())
        pts = sum(e.v < 0 for e in dd.values())
        v = REPRODUCED if worse > len(dd) / 2 else NOT_REPRODUCED if better >= len(dd) / 2 else INCONCLUSIVE
        return (f"worse than VL: {pts} of {len(dd)} by point value, {worse} outside noise; better outside noise: {better}",
                v, f"{worse} of {len(dd)} worse outside noise (rule: more than half)")
    return _merges(res, test)
