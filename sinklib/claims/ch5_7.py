"""Claims 4b, 5c, 6d and 7a to 7e: Remark 1 and the controlled tiny panel (chapter 7), and whether S predicts
the loss (chapter 5)."""
from __future__ import annotations


from sinklib.claims.core import CH5, CH7, CH11, INTERIM, Row, claim, not_testable
from sinklib.errors import ResultsMissing
from sinklib.stats.verdicts import Est, decide, est, fisher_diff, num



@claim("4b", "Remark 1: layerwise QK-RMSNorm compresses weak heads", (), CH7)
def remark(res):
    r = {x["variant"]: x for x in res(CH7)["results"]["remark1"]}
    lw, ph, no = r.get("layerwise"), r.get("per_head"), r.get("none")
    if lw is None or ph is None:
        return Row(("no trained layerwise and per-head model in chapter 7's run",),
                   *decide(None, not_tested="chapter 7 measures the remark on its trained layerwise and per-head models"))
    rho, p = lw["rho_share_query_norm"], lw["p_share_query_norm"]
    ours = (f"trained layerwise model: raw query shares vary {lw['raw_share_spread']:.2f}-fold, normalised query "
            f"norms {lw['query_norm_spread']:.2f}-fold, ρ(share, query norm) = {num(rho, 2)} (p = {p:.2g}), "
            f"ρ(share, logit range) = {num(lw['rho_share_logit_range'], 2)}",
            f"trained per-head model: query norms vary {ph['query_norm_spread']:.2f}-fold")
    if no is None or rho != rho:
        return Row(ours, *decide(None, too_small="no model without QK-norm to compare with" if no is None else
                                 "the layerwise model's query norms are equal: nothing to rank"))
    d = fisher_diff(lw["rho_share_logit_range"], no["rho_share_logit_range"], int(lw["n_heads"]), int(no["n_heads"]))
    ours += (f"the model without QK-norm shows the same relation: ρ(share, logit range) = "
             f"{num(no['rho_share_logit_range'], 2)}; layerwise minus none {est(d, 2)} (Fisher, {lw['n_heads']} heads "
             "each)",)
    return Row(ours, *decide(d, +1, quantity="what is specific to layerwise norm (its ρ(share, logit range) minus "
                             "the no-norm model's)"))


internvl35 = not_testable("5c", "InternVL3.5 (Qwen3 backbone, per-head QK-RMSNorm) loses little IFEval", ("ifeval_internvl35",),
                          "05_panel_correlations", "{ifeval_internvl35:+.1f} pt", "a 7B VLM pair and the real IFEval; no Qwen3 "
                          "model runs offline here")


@claim("6d", "Text-only fine-tuning to the same endpoint does not cause the loss (controlled tiny panel)",
       ("text_only_ifeval",), CH7, "{text_only_ifeval:+.1f} pt (text-only)")
def tiny_text_only(res):
    hyp = [h for h in res(CH7)["results"]["hypotheses"] if h["hypothesis"].startswith("H6")]
    if not hyp:
        return Row(("no text-only control in chapter 7's run",),
                   *decide(None, not_tested="run chapter 7 with its text-only control"))
    h, (ctx, failed) = hyp[0], _tiny_precondition(res, sink_needed=False)
    if h.get("interval") is None:
        return Row((h["this panel"], ctx), *decide(None, not_tested="chapter 7's run stored this interval only "
                                                                    "as text: rerun chapter 7"))
    e = Est(*h["interval"])
    # chapter 7 stores "VL minus text-only": the paper's side (text-only loses less) is below zero
    return Row((h["this panel"], ctx), *decide(e, -1, quantity=h["why"].split(" (")[0],
               not_tested=f"{failed}; the interval alone: {decide(e, -1).outcome}" if failed else ""))


@claim("7a", "S predicts the loss: Spearman ρ(S, IFEval change) over six pairs; leave-one-pair-out error below a "
       "constant's", ("rho_ifeval_6", "lopo_S", "lopo_constant"), CH5,
       "ρ = {rho_ifeval_6:.3f} (n = 6); LOPO {lopo_S:.2f} vs {lopo_constant:.2f} pt")
def predicts(res):
    from sinklib.stats.schema import STRICT_TASK

    try:
        r11 = res(CH11)["results"]
    except ResultsMissing:  # chapter 11 not run yet: the pairs chapter 5 pools decide
        r11 = None
    if r11 and r11.get("primary"):
        return _four_panel(r11)
    r = res(CH5)["results"]
    rho = next(x for x in r["measured_rho"] if x["task"] == STRICT_TASK)
    lopo = next(x for x in r["measured_lopo"] if x["task"] == STRICT_TASK)
    p = max(r["rho_0971_p_exact_one_sided"])
    ctx = f"the reported ρ at n = 6 has exact one-sided p = {p:.4f} (computed)"
    if rho["rho"] is None or rho["ci_fisher_lo"] is None:
        return Row((f"{rho['n']} measured pairs: no ρ", ctx),
                   *decide(None, too_small=f"too few pairs: {rho['note'] or 'no interval'}"))
    e = Est(rho["rho"], rho["ci_fisher_lo"], rho["ci_fisher_hi"])
    ours = (f"ρ = {est(e, 2)} (n = {rho['n']}, Fisher interval)", f"LOPO {lopo['mae_model']:.2f} vs "
            f"{lopo['mae_constant']:.2f} pt" if lopo["mae_model"] is not None else "LOPO: too few pairs", ctx)
    return Row(ours, *decide(e, +1, quantity=f"the Fisher interval of ρ on {rho['n']} measured pairs"))


#: chapter 11's designs in words, by its `lr_rule`
_DESIGNS = {"frozen": "the pre-registered design, one rate for all", "recipe-scaled": "its first amendment, rates "
            "scaled by each model's recipe rate", "precondition-chosen": "its second amendment, each model's rate "
            "chosen by its preconditions alone, written after three pairs were seen"}


def _four_panel(r: dict) -> Row:
    """Row 7a on chapter 11's four-model panel: its primary test (Spearman's rho of base S against the VL change of
    strict instructions, one-sided exact) decides by the book's rule (`fourpanel.primary_verdict`); the designs it
    stopped are named with their own outcomes."""
    from sinklib.adapt.fourpanel import primary_sentence, primary_verdict

    t, rule = r["primary"], r.get("lr_rule", "frozen")
    v = primary_verdict(t)
    said = (f"ρ = {num(t['rho'], 2)} over {t['n']} real models, one-sided exact p = {t['p']:.3f}"
            if t["n"] >= 3 and not t.get("constant") else primary_sentence(t))
    look = "; an interim look at the first training seed only" if r.get("interim") else ""
    stopped = "; ".join(f"{_DESIGNS[k].split(',')[0]}: {primary_verdict(d['primary']).outcome}"
                        for k, d in (r.get("stopped") or {}).items())
    sens = r.get("sensitivity")
    st = sens["primary"] if sens else None
    n = next((x["n"] for b in (r.get("base") or {}).values() for x in b["scores"] if (x["suite"], x["metric"]) ==
              ("instructions", "strict")), None)
    suite = f"{n}-item instruction suite" if n else "instruction suite"
    reach = ("; once written it could no longer end reproduced, only inconclusive or contradicted: two pairs seen "
             "before it already broke the paper's order (section 11.1)" if rule == "precondition-chosen" else "")
    ours = ((f"{said} (chapter 11, {_DESIGNS[rule]}{look}{reach}; the change is the strict pass rate of chapter 11's "
             f"{suite})",) + ((f"stopped designs: {stopped}",) if stopped else ())
            + ((f"sensitivity analysis, every model at one rate: ρ = {num(st['rho'], 2)}, one-sided exact p = "
                f"{st['p']:.3f}, {primary_verdict(st).outcome}",) if sens else ())
            + ("leave-one-pair-out error: not computed on chapter 11's pairs (the row rests on its primary test)",))
    why = (f"{INTERIM} (the first training seed, no controls; the confirmatory look may change the verdict): "
           if r.get("interim") else "") + v.why
    return Row(ours, v.outcome, why)


four_tasks = not_testable("7b", "ρ ≥ 0.82 on each of four format-sensitive tasks (IFEval, EQ-Bench, GSM8K-CoT, GPQA-Diamond-CoT)",
                          ("rho_four_tasks_min",), CH5, "min ρ = {rho_four_tasks_min:.2f} (n = 6)",
                          "needs EQ-Bench and GPQA-Diamond and six VLM-LLM pairs; chapter 5 computes only what n = 6 can support")
rho_17 = not_testable("7c", "ρ = 0.88 on a 17-pair panel", ("rho_17",), CH5, "ρ = {rho_17:.2f} (n = 17)",
                      "the 17 pairs and their per-pair values are not reported; we have two measured pairs")


def _tiny_precondition(res, sink_needed: bool = True) -> tuple[str, str]:
    """Chapter 7's preconditions as text, and the failed one that leaves a controlled-panel row not tested ('' when
    none): fewer than half the VL models learned the visual task (every row on the panel), or (`sink_needed`, rows
    about S) fewer than half the models formed a sink, or none lost strict-format score."""
    pre = {x["precondition"]: x for x in res(CH7)["results"]["preconditions"]}
    sink, lost = pre["a sink formed in training"], pre["VL lost strict-format score"]
    vqa = pre.get("the VL model learned the visual task")
    text = (f"sink formed in {sink['models']} models; VL lost strict-format score outside the noise in "
            f"{lost['models']}" + (f"; the VL model learned the visual task in {vqa['models']}" if vqa else ""))
    if vqa is not None and vqa["share"] < 0.5:
        return text, (f"precondition failed: the VL model learned the visual task in {vqa['models']} tiny models, so "
                      "their 'VL adaptation' is not one")
    if sink_needed and sink["share"] < 0.5:
        return text, (f"precondition failed: a sink formed in {sink['models']} tiny models, so S varies among models "
                      f"{'without' if sink['share'] == 0 else 'mostly without'} a sink")
    if sink_needed and lost["share"] == 0:
        return text, "precondition failed: no tiny model lost strict-format score outside the noise: no loss to predict"
    return text, ""


def _panel_missing() -> tuple[str, str]:
    return decide(None, not_tested="no controlled panel in chapter 5's run (run chapter 7, then chapter 5)")


@claim("7d", "S predicts the strict-format loss on a controlled panel (tiny models identical but for the QK-norm "
       "variant and one training setting)", ("rho_ifeval_6",), CH5, "ρ = {rho_ifeval_6:.3f} on six real pairs")
def tiny_predicts(res):
    from sinklib.stats.schema import TINY_STRICT_TASK

    r = res(CH5)["results"]
    if not r.get("tiny_rho"):
        return Row(("no controlled panel in chapter 5's run",), *_panel_missing())
    rho = next(x for x in r["tiny_rho"] if x["task"] == TINY_STRICT_TASK)
    lopo = next(x for x in r["tiny_lopo"] if x["task"] == TINY_STRICT_TASK)
    ctx, failed = _tiny_precondition(res)
    if rho["rho"] is None or rho["ci_fisher_lo"] is None:
        return Row((f"{rho['n']} tiny models: no ρ", ctx),
                   *decide(None, not_tested=failed, too_small=f"too few models: {rho['note']}"))
    e = Est(rho["rho"], rho["ci_fisher_lo"], rho["ci_fisher_hi"])
    ours = (f"ρ = {est(e, 2)} (n = {rho['n']}, Fisher interval, p = {rho['p_value']:.2g})",
            f"LOPO {lopo['mae_model']:.2f} vs constant {lopo['mae_constant']:.2f} pt", ctx)
    q = f"the Fisher interval of ρ on {rho['n']} tiny models"
    alone = decide(e, +1, quantity=q).outcome
    return Row(ours, *decide(e, +1, quantity=q, not_tested=f"{failed}; the interval alone: {alone}" if failed else ""))


@claim("7e", "S adds to the QK-norm architecture (the paper's panel cannot tell: S co-clusters with the QK-norm "
       "type)", (), CH5)
def tiny_beyond(res):
    from sinklib.stats.schema import TINY_STRICT_TASK
    from sinklib.tiny.panel import beyond_architecture

    r = res(CH5)["results"]
    if not r.get("tiny_architecture"):
        return Row(("no controlled panel in chapter 5's run",), *_panel_missing())
    a = next(x for x in r["tiny_architecture"] if x["task"] == TINY_STRICT_TASK)
    ctx, failed = _tiny_precondition(res)
    if a.get("partial_rho") is None:
        return Row(("architecture test not computed", ctx),
                   *decide(None, not_tested=failed, too_small=a.get("note") or "too few models"))
    ours = (f"partial ρ of S given the variant = {num(a['partial_rho'], 2)}, within-variant permutation p = "
            f"{a['partial_p']:.2g}; nested F-test p = {a['F_p']:.2g} (n = {a['n']})", ctx)
    v = beyond_architecture(a["partial_rho"], a["partial_p"])
    # a permutation p-value, no interval: its outcome enters the one rule as a count of one test
    return Row(ours, *decide(None, counts=(int(v == "reproduced"), int(v == "contradicted"), 1),
                             not_tested=f"{failed}; the test alone: {v}" if failed else "",
                             quantity="two-sided within-variant permutation tests at 5 %"))
