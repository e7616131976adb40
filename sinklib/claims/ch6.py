"""Claims 8a to 8c: injecting QK-RMSNorm after pretraining, and model merging (chapter 6)."""
from __future__ import annotations

from collections.abc import Callable

from sinklib import evals
from sinklib.claims.core import (CH4, CH6, NO_VQA, Results, Row, claim, outcomes_of, paired_delta, per_model,
    power_note, strict_metrics)
from sinklib.stats.verdicts import Est, Verdict, decide, diff, est, mean, wilson_pct

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

    def strict(c: str) -> Est:
        return mean(*(sc[c][m] for m in strict_metrics()))

    def d(a: str, b: str) -> Est:
        return paired_d(a, b) or diff(strict(a), strict(b))

    ppl = " → ".join(f"{sc[c]['perplexity ppl'].v:.0f}" for c in sc)
    n = list(dict.fromkeys(s["n"] for v in inj.values() for s in v["scores"] if f"{s['suite']} {s['metric']}"
                           in strict_metrics()))
    ours = (f"on chapter 6's {' + '.join(map(str, n))}-item strict suites: {final} minus original {est(d(final, 'original'))} "
            f"pt (uncontrolled)",)
    ctl = "original + recovery" in sc and final != "injected"
    if ctl:
        ours += (f"{final} minus original + recovery (the controlled contrast) {est(d(final, 'original + recovery'))} "
                 f"pt; the recovery fine-tune alone (original + recovery minus original) "
                 f"{est(d('original + recovery', 'original'))} pt",)
    ours += (f"top-1 agreement at initialisation {top1:.2f}; perplexity {ppl} ({' → '.join(sc)})",)
    broken = (f"precondition failed: the injection breaks the model at initialisation (top-1 agreement {top1:.2f} < "
              f"{INJECT_TOP1_MIN}), "
              "so a drop measures a broken start, not the norm" if top1 < INJECT_TOP1_MIN else "")
    no_control = final != "injected" and not ctl
    v = decide(d(final, "original + recovery") if ctl else d(final, "original"), -1,
               quantity="the strict-format change against its control",
               not_tested="; ".join(x for x in (broken, "precondition failed: the recovery fine-tune has no control "
                                                "(the original model fine-tuned the same way)" if no_control else "")
                                    if x))
    return Row(ours, *v)


def merge_recovers(to_base: Est, to_vl: Est) -> bool:
    """A merge recovers the VL loss: its strict-format change from the base is above zero outside the noise, or
    not below it while the change from the VL model is above zero outside the noise (paired where stored)."""
    return to_base.lo > 0 or (to_base.hi >= 0 and to_vl.lo > 0)


def merge_worse(to_vl: Est) -> bool:
    """A merge makes the text loss worse: its strict-format change from the VL model is below zero outside the noise."""
    return to_vl.hi < 0


NOTHING_TO_RECOVER = "precondition failed: the VL loss is within noise (nothing to recover)"


def vqa_not_learned(vqa_pct: float, vqa_n: int, majority: float) -> str:
    """'' when the VL model's VQA interval (Wilson, `vqa_n` items) lies above the blind majority baseline, else the
    not-tested reason: a merge of a model that did not learn the visual task tests nothing about keeping it."""
    e = wilson_pct(vqa_pct, vqa_n)
    return "" if e.lo > majority else f"{NO_VQA} (VQA {e.v:.0f} % [{e.lo:.0f}, {e.hi:.0f}] vs majority {majority:.0f} %)"


def merge_verdict(to_base: Est, to_vl: Est, vl_loss: Est, not_tested: str = "") -> Verdict:
    """One merge against the paper's 'no merging setting recovers the VL loss', by the claims page's rule
    (`decide`): not tested while the VL model's own strict-format change from the base (`vl_loss`) is within noise
    or `not_tested` names another failed precondition; contradicted when the merge recovers (`merge_recovers`);
    reproduced when it stays below the base outside the noise; inconclusive otherwise (paired intervals, points)."""
    why = not_tested or (NOTHING_TO_RECOVER if vl_loss.hi >= 0 else "")
    if not why and merge_recovers(to_base, to_vl) and to_base.lo <= 0:  # not below the base, above VL outside noise
        return decide(to_vl, -1, quantity="the change from the VL model (the merge is not below the base)")
    return decide(to_base, -1, quantity="the merge's strict-format change from the base", not_tested=why)


def outcome_counts(outcomes) -> str:
    """Verdict outcomes in words, in the rule's order: '2 reproduced, 5 not tested'."""
    from sinklib.stats.verdicts import VERDICTS

    out = list(outcomes)
    return ", ".join(f"{out.count(v)} {v}" for v in VERDICTS if out.count(v)) or "none"


def undecided_reasons(verdicts) -> str:
    """Chapter 6's merges that `merge_verdict` could not decide, in words: per model, how many of its merges are
    inconclusive or not tested and why; `verdicts` has columns model, outcome, why (one row per merge)."""
    from sinklib.stats.verdicts import INCONCLUSIVE, NOT_TESTED

    parts = []
    for model, g in verdicts.groupby("model", sort=False):
        open_ = g[g.outcome.isin([INCONCLUSIVE, NOT_TESTED])]
        parts += [f"{model}: {n} of {len(g)} merges {o} ({w})"
                  for (o, w), n in open_.groupby(["outcome", "why"], sort=False).size().items()]
    return "; ".join(parts) or "none: every merge's verdict was decided"


def _merges(res: Results, test: Callable[[Callable[[str, str], Est], list[str]], tuple[str, Verdict]]) -> Row:
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
        maj = next(x["majority baseline (%)"] for x in res(CH4)["results"]["vqa"] if x["model"] == m)
        o, v = test(d, [c for c in conds if c.startswith("merge:")])
        no_vqa = vqa_not_learned(vl["VQA (%)"], doc["parameters"]["vqa_n"], maj)
        if no_vqa:
            v = decide(None, not_tested=f"{no_vqa[:-1]}; the test alone: {v.outcome})")
        base = next(r for r in rows if r["model"] == m and r["condition"] == "base")
        pw = power_note({k: (n[k.split()[0]], base[k]) for k in strict_metrics()})
        out[m] = (f"{o} (chapter 6's {n['instructions']} + {n['math']}-item strict suites; {pw})", v.outcome, v.why)
    return per_model(out)


@claim("8b", "No merging setting recovers the VL loss", ("merge_settings",), CH6, "{merge_settings:.0f} settings, none recovers")
def no_recovery(res):
    def test(d, merges):
        vl = d("vl", "base")
        merged = {c: d(c, "base") for c in merges}
        rec = [c for c, e in merged.items() if merge_recovers(e, d(c, "vl"))]
        below = [c for c, e in merged.items() if e.hi < 0]
        ours = f"VL strict-format {est(vl)} pt; below base outside noise: {len(below)} of {len(merged)}"
        return ours, decide(None, counts=(len(below), len(rec), len(merged)), need=1.0,
                            quantity="merges (on the claim's side: below the base outside noise; against: recovers)",
                            not_tested=NOTHING_TO_RECOVER if vl.hi >= 0 else "")
    return _merges(res, test)


@claim("8c", "Most merging settings make the text loss worse", ("merge_settings", "merge_settings_not_worse"), CH6,
       "{merge_settings_not_worse:.0f} of {merge_settings:.0f} avoid making it worse")
def most_merges_worse(res):
    def test(d, merges):
        dd = {c: d(c, "vl") for c in merges}
        worse, better = sum(merge_worse(e) for e in dd.values()), sum(e.lo > 0 for e in dd.values())
        pts = sum(e.v < 0 for e in dd.values())
        return (f"worse than VL: {pts} of {len(dd)} by point value, {worse} outside noise; better outside noise: {better}",
                decide(None, counts=(worse, better, len(dd)), need=0.5,
                       quantity="merges (on the claim's side: worse than VL outside noise; against: better)"))
    return _merges(res, test)
