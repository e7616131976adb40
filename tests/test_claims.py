"""The claims page (#15): every reported number belongs to a claim, every claim's verdict follows its rule on
synthetic results, missing chapters give "not run yet" rows, and the committed page is fresh."""
from pathlib import Path

import pytest

from sinklib.book import runner as book
from sinklib import claims
from sinklib.claims import INCONCLUSIVE, NOT_REPRODUCED, NOT_RUN, NOT_TESTABLE, REPRODUCED, Est
from sinklib.claims.core import render, verdict_words
from sinklib.stats.verdicts import CONTRADICTED, NOT_TESTED, decide, est
from sinklib.errors import ResultsMissing
from sinklib.book.reported import reported_values

ROOT = Path(__file__).resolve().parent.parent
BY_ID = {c.id: c for c in claims.CLAIMS}


# ------------------------------------------------------------------------------------------------
# the registry and the reported values

def test_claim_ids_unique_and_chapters_exist():
    assert len(BY_ID) == len(claims.CLAIMS)
    stems = {p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    assert all(c.chapter in stems or c.chapter == "" for c in claims.CLAIMS)


def test_every_reported_key_has_a_claim_or_a_reason():
    keys = set(reported_values())
    used = {k for c in claims.CLAIMS for k in c.paper_keys}
    assert used <= keys, f"claims name unknown keys: {used - keys}"
    assert not used & set(claims.CONTEXT_ONLY), "a key is both a claim's and context-only"
    assert set(claims.CONTEXT_ONLY) <= keys and all(claims.CONTEXT_ONLY.values())
    assert keys - used - set(claims.CONTEXT_ONLY) == set(), "reported keys with no claim row and no reason"


def test_paper_cells_read_the_csv():
    vals = reported_values()
    for c in claims.CLAIMS:
        text = claims.paper_text(c)
        for k in c.paper_keys:
            assert k in c.paper, f"claim {c.id} names {k} but does not show it"
        assert "{" not in text and (c.paper or text == "—")
    assert "−9.6" in claims.paper_text(BY_ID["5a"]) and vals["ifeval_qwen25vl"]["value"] == -9.6


def test_reviewers_claims_have_rows():
    keys = {k for c in claims.CLAIMS for k in c.paper_keys}
    for k in ("ifeval_per_head_min", "ifeval_none_min", "ifeval_internvl35", "ifeval_molmo2o", "mbpp_mean",
              "tulu_S_after_vl", "merge_settings_not_worse", "rho_ifeval_6", "rho_17", "inject_ifeval_after"):
        assert k in keys
    assert any("Mechanism" in c.text for c in claims.CLAIMS)


def test_interval_arithmetic():
    # Newcombe (1998), method 10: 56/70 - 48/80 = 0.2, interval 0.0524 to 0.3339
    d = claims.diff(claims.wilson_pct(80, 70), claims.wilson_pct(60, 80))
    assert d.v == pytest.approx(20) and d.lo == pytest.approx(5.24, abs=0.01) and d.hi == pytest.approx(33.39, abs=0.01)
    m = claims.mean(Est(0, -3, 4), Est(2, -2, 6))
    assert list(m) == pytest.approx([1, 1 - 5 / 2, 1 + 32 ** 0.5 / 2])   # lower margins 3, 4; upper 4, 4
    assert claims.direction(Est(-5, -9, -1), -1) == REPRODUCED
    assert claims.direction(Est(-5, -9, -1), +1) == NOT_REPRODUCED
    assert claims.direction(Est(-5, -9, 1), -1) == INCONCLUSIVE
    assert claims.combine([REPRODUCED, INCONCLUSIVE]) == REPRODUCED
    assert claims.combine([REPRODUCED, NOT_REPRODUCED]) == INCONCLUSIVE
    assert claims.combine([INCONCLUSIVE, NOT_REPRODUCED]) == NOT_REPRODUCED


# ------------------------------------------------------------------------------------------------
# synthetic chapter results

A, B = "model-a", "model-b"


def _doc(results, params=None, models=(A, B)):
    return {"results": results, "parameters": {"profile": "quick", **(params or {})},
            "provenance": {"profile": "quick", "models": [{"name": m} for m in models]}}


def ch1(mass, uniform=None):
    return _doc({"mass_last10": {A: mass, B: mass}, "massive_activation_peak": [{"model": A, "ratio": 50.0}],
                 **({"uniform_share": {A: uniform, B: uniform}} if uniform else {})}, {"max_tokens": 64})


def test_row_1_compares_with_the_uniform_share_of_the_prompts_used(monkeypatch):
    _fake(monkeypatch, {C1: ch1(0.4, uniform=0.1)})
    ours = claims.evaluate(BY_ID["1"]).row.ours[0]
    assert "4.0x the uniform share 0.100 over the queries of chapter 1's prompts" in ours
    _fake(monkeypatch, {C1: ch1(0.4)})
    assert "if every prompt had 64 tokens" in claims.evaluate(BY_ID["1"]).row.ours[0]


def ch2(ratio=1.0, margin=0.05, ns=(10, 15, 100), step=0.2):
    rob = [{"N": n, "seed": s, A: margin + step * s, B: 0.0} for n in ns for s in range(2)]   # S spread 0.2 at N = 15
    return _doc({"S": {A: 0.7, B: 0.0}, "robustness": rob,
                 "sensitivity": [{"model": m, "choice": "K", "value": "all", "S": s} for m, s in ((A, -0.3), (B, 0.1))],
                 "timing": [{"model": m, "prompts": 15, "method": meth, "ratio to plain forward (SDPA)": r}
                            for m in (A, B) for meth, r in (("plain forward (SDPA)", 1.0), ("S probe (fused)", ratio))]})


def ch3(viol=0, slopes=(2.0, 0.01)):
    return _doc({"random_layers": {"n_per_variant": 10, "violations": viol},
                 "real_models": {A: {"gap_values": 100, "violations": 0}},
                 "adversary": {"none": 0.5, "per-head": 0.6},
                 "scale_sweep_slopes": {"random none": {"slope_change": slopes[0]},
                                        "random per-head": {"slope_change": slopes[1]}}})


def _score_rows(model, cond, scores, n):
    out = []
    for (suite, metric), sc, k in zip((("instructions", "strict"), ("math", "strict"), ("knowledge", "acc")), scores, n):
        e = claims.wilson_pct(sc, k)
        out.append({"model": model, "condition": cond, "suite": suite, "metric": metric, "score": sc,
                    "lo": e.lo, "hi": e.hi, "n": k})
    return out


def ch4(spec, n=(1000, 1000, 1000)):
    """spec: model -> {qk, vqa, S: (base, vl, text_only), scores: cond -> (instructions, math, knowledge)}."""
    scores = [r for m, s in spec.items() for cond, sc in s["scores"].items() for r in _score_rows(m, cond, sc, n)]
    return _doc({"scores": scores,
                 "vqa": [{"model": m, "VL model (%)": s.get("vqa", 70.0), "majority baseline (%)": 38.0, "n": 200}
                         for m, s in spec.items()],
                 "panel_rows": [{"llm": m, "qk_norm": s.get("qk", "none")} for m, s in spec.items()],
                 "S": [{"model": m, **dict(zip(("base", "vl", "text_only"), s.get("S", (0.5, 0.5, 0.5))))}
                       for m, s in spec.items()],
                 "sink_text": {"rows": [{"model": m, "condition": c + (f" seed {k}" if k else ""), "S change": x}
                                        for m, s in spec.items() for c, xs in zip(("vl", "text_only"), s.get("dS", ((), ())))
                                        for k, x in enumerate(xs)]}}, {"n_prompts": 15}, models=tuple(spec))


def pair(vl=(50, 50, 70), base=(50, 50, 70), text_only=None, random=None, **kw):
    sc = {"base": base, "vl": vl, "text_only": text_only or base, "random": random or vl}
    return {"scores": sc, **kw}


def ch5(rho=None):
    r = {"task": "delta_instructions_strict", "n": 2 if rho is None else 6, "rho": None, "ci_fisher_lo": None,
         "ci_fisher_hi": None, "note": "Spearman rho needs at least 3 pairs, got 2"}
    if rho is not None:
        r.update(rho=rho[0], ci_fisher_lo=rho[1], ci_fisher_hi=rho[2], note="")
    return _doc({"measured_rho": [r], "rho_0971_p_exact_one_sided": [0.0056, 0.0056],
                 "measured_lopo": [{"task": r["task"], "mae_model": None, "mae_constant": None}]}, models=())


def ch11(rho=None, n=4, p=None, p_reverse=None, **more):
    """Chapter 11's results: its primary test over n pairs (second amendment) and the two stopped designs (`more`:
    other keys of its results, such as 'interim' and 'sensitivity')."""
    prim = {"n": n, "rho": rho if rho is not None else float("nan"), "p": p if p is not None else float("nan"),
            "p_reverse": p_reverse if p_reverse is not None else float("nan"), "p_min": 1 / 24, "models": [], "of": 4}
    dead = {"n": 1, "rho": float("nan"), "p": float("nan"), "p_reverse": float("nan"), "p_min": float("nan"),
            "models": [], "of": 3}
    return _doc({"primary": prim, "lr_rule": "precondition-chosen",
                 "stopped": {"frozen": {"primary": dead}, "recipe-scaled": {"primary": {**dead, "n": 2}}}, **more},
                models=())


def ch5_tiny(rho=None, partial=None):
    t = "delta_format_strict"
    r = {"task": t, "n": 15, "rho": None, "ci_fisher_lo": None, "ci_fisher_hi": None, "p_value": None, "note": "x"}
    if rho is not None:
        r.update(rho=rho[0], ci_fisher_lo=rho[1], ci_fisher_hi=rho[2], p_value=0.01, note="")
    a = {"task": t, "n": 15, "partial_rho": None, "partial_p": None, "F_p": None, "note": "too few"}
    if partial is not None:
        a.update(partial_rho=partial[0], partial_p=partial[1], F_p=partial[1], note="")
    return _doc({"tiny_rho": [r], "tiny_lopo": [{"task": t, "mae_model": 3.0, "mae_constant": 4.0}],
                 "tiny_architecture": [a]}, models=())


def ch7(sinks=1.0, lost=0.5, lw=(0.8, 0.001, 3.0), ph_spread=1.2, h6=(-5.0, -8.0, -2.0), vqa=1.0, lr=(0.9, 0.1)):
    pre = [{"precondition": "a sink formed in training", "models": f"{round(15 * sinks)} of 15", "share": sinks},
           {"precondition": "VL lost strict-format score", "models": f"{round(15 * lost)} of 15", "share": lost},
           {"precondition": "the VL model learned the visual task", "models": f"{round(15 * vqa)} of 15", "share": vqa}]
    rem = [{"variant": "layerwise", "rho_share_query_norm": lw[0], "p_share_query_norm": lw[1], "n_heads": 32,
            "query_norm_spread": lw[2], "raw_share_spread": lw[2], "rho_share_logit_range": lr[0]},
           {"variant": "none", "rho_share_query_norm": 0.5, "p_share_query_norm": 0.01, "n_heads": 32,
            "query_norm_spread": 3.0, "raw_share_spread": 2.0, "rho_share_logit_range": lr[1]},
           {"variant": "per_head", "rho_share_query_norm": float("nan"), "p_share_query_norm": float("nan"),
            "query_norm_spread": ph_spread, "raw_share_spread": 2.0, "rho_share_logit_range": 0.1, "n_heads": 32}]
    hyp = [{"hypothesis": "H6 the loss is VL-specific", "verdict": "x", "why": "paired t",
            "this panel": f"VL minus text-only {est(Est(*h6))} pt", "interval": None if h6 is None else list(h6)}]
    return _doc({"preconditions": pre, "remark1": rem, "hypotheses": hyp}, models=())


def _no_interval(doc):
    for h in doc["results"]["hypotheses"]:
        h.pop("interval")
    return doc


def test_text_only_row_reads_the_stored_interval_whatever_its_sign(monkeypatch):
    _fake(monkeypatch, {C7: ch7(h6=(21.4, 16.6, 26.2), vqa=0.0)})
    row = claims.evaluate(BY_ID["6d"]).row
    assert row.verdict == NOT_TESTED and "the interval alone: contradicted" in row.reason, row


def _inj_scores(instr, math, n=1000, ppl=30.0):
    return [{"suite": "instructions", "metric": "strict", **dict(zip(("score", "lo", "hi"), claims.wilson_pct(instr, n))),
             "n": n}, {"suite": "math", "metric": "strict", **dict(zip(("score", "lo", "hi"), claims.wilson_pct(math, n))),
             "n": n}, {"suite": "perplexity", "metric": "ppl", "score": ppl, "lo": ppl - 1, "hi": ppl + 1, "n": 12}]


def ch6(top1=0.99, after=(10, 10), control=(50, 50), n=1000, merges=(20, 20), base=(50, 50), vl=(20, 20), vqa=70.0):
    inj = {"original": {"S": 0.7, "scores": _inj_scores(50, 50, n)},
           "injected": {"S": 3.0, "scores": _inj_scores(*after, n)},
           "injected + recovery": {"S": 1.0, "scores": _inj_scores(*after, n)}}
    if control is not None:
        inj["original + recovery"] = {"S": 0.7, "scores": _inj_scores(*control, n)}
    rows = [{"model": A, "condition": c, "VQA (%)": q, "instructions strict": s[0], "math strict": s[1]}
            for c, s, q in [("base", base, None), ("vl", vl, vqa)] + [(f"merge:{k}", merges, vqa) for k in "abcdefg"]]
    return _doc({"injection": inj, "injection_init_error": {"top1_agreement": top1}, "merges": rows},
                {"eval_instructions": n, "eval_math": n, "eval_knowledge": n, "eval_perplexity": n, "vqa_n": 200}, models=(A,))


def ch6_paired(with_items=True):
    """30 items per strict suite: VL loses 5 of the base model's 15 passes, every merge 3 more of VL's, none gained."""
    from sinklib.evals.paired import pack

    passes = {"base": 15, "vl": 10, **{f"merge:{k}": 7 for k in "abcdefg"}}
    doc = ch6(n=30, base=(50, 50), vl=(100 / 3, 100 / 3), merges=(70 / 3, 70 / 3))
    if with_items:
        doc["results"]["outcomes"] = {A: {c: pack({"instructions strict": [i < k for i in range(30)],
                                                   "math strict": [i < k for i in range(30)]})
                                          for c, k in passes.items()}}
    return doc


def ch6_inject_paired(with_items=True):
    """30 items per strict suite: the injected + recovery model passes 3 fewer than its control, none more."""
    from sinklib.evals.paired import pack

    doc = ch6(n=30, after=(40, 40), control=(50, 50))
    if with_items:
        for c, k in (("original", 15), ("injected", 12), ("injected + recovery", 12), ("original + recovery", 15)):
            doc["results"]["injection"][c]["outcomes"] = pack({"instructions strict": [i < k for i in range(30)],
                                                               "math strict": [i < k for i in range(30)]})
    return doc


def _ch4_for_ch6(vqa=70.0):
    return ch4({A: pair(vqa=vqa)})


def _fake(monkeypatch, docs):
    def load(notebook, key=None):
        if notebook not in docs:
            raise ResultsMissing(f"data/results/{notebook}.json does not exist")
        return docs[notebook]
    monkeypatch.setattr(book, "load_results", load)


def ch8_order(f, k, random=(None, None), matched=None, untested=()):
    def row(m, c, fd, kd):
        return {"model": m, "control": c, "format_dose": fd, "knowledge_dose": kd, "verdict": f"{c}: {fd} / {kd}",
                "untested_doses": list(untested) if c == "matched" else []}
    rows = [row(A, "sink", f, k), row(A, "random", *random)] + ([row(A, "matched", *matched)] if matched else [])
    return _doc({"verdicts": rows}, models=(A,))


def ch8_repair(loss_hi, sink_lo, random_lo=-5.0, other_lo=-5.0, sink_hi=10.0):
    rows = []
    for c, lo in (("sink heads", sink_lo), ("random heads", random_lo), ("other rows", other_lo)):
        for mt in ("instructions strict", "math strict"):
            rows.append({"model": A, "fraction": 0.25, "control": c, "metric": mt, "loss": loss_hi - 5,
                         "loss_lo": loss_hi - 10, "loss_hi": loss_hi, "change": lo + 5, "lo": lo,
                         "hi": sink_hi if c == "sink heads" else lo + 10})
    return _doc({"repair": rows}, models=(A,))


def ch8_panel_repair(sink_lo, not_tested=""):
    """chapter 8 with its repair of chapter 11's pair 'p': chapter 4's pair lost nothing (not tested); 'p' lost
    strict instructions at both seeds, and restoring its sink heads moves it by [sink_lo, sink_lo + 10]."""
    doc = ch8_repair(2.0, 1.0)
    rows = []
    for c, lo in (("sink heads", sink_lo), ("random heads", -5.0), ("other rows", -5.0)):
        for mt in ("instructions strict", "math strict"):
            rows.append({"model": "p", "fraction": 0.25, "k": 9, "seeds": 2, "control": c, "metric": mt, "base": 40.0,
                         "loss": -10.0, "loss_lo": -15.0, "loss_hi": -5.0, "change": lo + 5, "lo": lo, "hi": lo + 10,
                         "p": float("nan")})
    doc["results"]["panel_repair"] = {"rows": rows, "sizes": {"instructions": 360, "math": 300},
                                      "not_tested": {"p": not_tested} if not_tested else {}}
    return doc


C1, C2, C3, C4, C5, C6 = ("01_sink_definition", "02_sink_strength", "03_perturbation_bound", "04_vl_adaptation",
                          "05_panel_correlations", "06_negative_controls")
C7, C8, C9, C11 = "07_controlled_panel", "08_causal_tests", "09_sink_panel", "11_four_panel"


def ch9(rho=(-0.7, -0.9, -0.4, 0.001), word="reproduced", sinks=1.0, partial=(-0.6, 0.01)):
    base = [{"holds_from": 100 if i < round(18 * sinks) else None} for i in range(18)]
    t = {"n": 18, "rho": rho[0], "lo": rho[1], "hi": rho[2], "p": rho[3], "within_p": partial[1],
         "partial_rho": partial[0], "f_p": 0.02}
    return _doc({"base": base, "tests": {"rule loss": t}, "verdicts": {"rule loss": word}}, models=())


CASES = [
    ("7f", {C9: ch9()}, REPRODUCED), ("7f", {C9: ch9(rho=(0.7, 0.4, 0.9, 0.001), word="contradicted")}, CONTRADICTED),
    ("7f", {C9: ch9(word="not tested (precondition failed)")}, NOT_TESTED),
    ("7f", {C9: ch9(rho=(-0.2, -0.6, 0.3, 0.4), word="inconclusive")}, INCONCLUSIVE),
    ("7f", {C9: ch9(sinks=0.2)}, NOT_TESTED),                                       # no sink: precondition
    ("7g", {C9: ch9()}, REPRODUCED), ("7g", {C9: ch9(partial=(0.6, 0.01))}, CONTRADICTED),
    ("7g", {C9: ch9(partial=(-0.6, 0.3))}, INCONCLUSIVE), ("7g", {C9: ch9(sinks=0.0)}, NOT_TESTED),
    ("1", {C1: ch1(0.6)}, REPRODUCED), ("1", {C1: ch1(0.03)}, CONTRADICTED), ("1", {C1: ch1(0.2)}, INCONCLUSIVE),
    ("1", {C1: ch1(0.4, uniform=0.1)}, INCONCLUSIVE),   # 4x the prompts' own uniform share (6.7x a 64-token one)
    ("2a", {C2: ch2(1.0)}, REPRODUCED), ("2a", {C2: ch2(4.0)}, CONTRADICTED), ("2a", {C2: ch2(2.0)}, INCONCLUSIVE),
    ("3", {C2: ch2()}, REPRODUCED), ("3", {C2: ch2(margin=-0.05)}, CONTRADICTED),
    ("3", {C2: ch2(ns=(5, 10))}, INCONCLUSIVE),
    ("3", {C2: ch2(margin=0.5, step=0.01)}, INCONCLUSIVE),     # a sign that could not flip: no test
    ("4a", {C3: ch3()}, REPRODUCED), ("4a", {C3: ch3(viol=1)}, CONTRADICTED),
    ("4a", {C3: ch3(slopes=(1.0, 1.0))}, INCONCLUSIVE),
    ("4b", {C7: ch7()}, REPRODUCED), ("4b", {C7: ch7(lr=(0.1, 0.9))}, CONTRADICTED),
    ("4b", {C7: ch7(lr=(0.62, 0.60))}, INCONCLUSIVE),         # the no-norm model shows the same relation
    ("7d", {C5: ch5_tiny((0.6, 0.2, 0.9)), C7: ch7()}, REPRODUCED),
    ("7d", {C5: ch5_tiny((-0.6, -0.9, -0.2)), C7: ch7()}, CONTRADICTED),
    ("7d", {C5: ch5_tiny((0.6, 0.2, 0.9)), C7: ch7(sinks=0.0)}, NOT_TESTED),     # no sink: precondition
    ("7d", {C5: ch5_tiny((0.6, 0.2, 0.9)), C7: ch7(lost=0.0)}, NOT_TESTED),      # nothing lost to predict
    ("7d", {C5: ch5_tiny((0.6, 0.2, 0.9)), C7: ch7(vqa=0.0)}, NOT_TESTED),       # VL did not learn to see
    ("7d", {C5: ch5_tiny(), C7: ch7()}, INCONCLUSIVE),
    ("7e", {C5: ch5_tiny(partial=(0.5, 0.01)), C7: ch7()}, REPRODUCED),
    ("7e", {C5: ch5_tiny(partial=(-0.5, 0.01)), C7: ch7()}, CONTRADICTED),
    ("7e", {C5: ch5_tiny(partial=(0.5, 0.3)), C7: ch7()}, INCONCLUSIVE),
    ("7e", {C5: ch5_tiny(partial=(0.5, 0.01)), C7: ch7(vqa=0.0)}, NOT_TESTED),
    ("6d", {C7: ch7()}, REPRODUCED), ("6d", {C7: ch7(h6=(5.0, 2.0, 8.0))}, CONTRADICTED),
    ("6d", {C7: ch7(h6=(-1.0, -4.0, 2.0))}, INCONCLUSIVE), ("6d", {C7: ch7(vqa=0.0)}, NOT_TESTED),
    ("6d", {C7: ch7(h6=(21.4, 16.6, 26.2))}, CONTRADICTED),     # chapter 7's sign: '+21.4 [+16.6, +26.2]'
    ("6d", {C7: _no_interval(ch7())}, NOT_TESTED),              # a run that stored the interval only as text
    ("5a", {C4: ch4({A: pair(vl=(20, 20, 70))})}, REPRODUCED),
    ("5a", {C4: ch4({A: pair(vl=(20, 20, 40))})}, CONTRADICTED),                   # knowledge lost too
    ("5a", {C4: ch4({A: pair(vl=(20, 20, 70), vqa=40.0)})}, NOT_TESTED),           # VL did not learn to see
    ("5a", {C4: ch4({A: pair(vl=(45, 45, 70))}, n=(30, 30, 100))}, INCONCLUSIVE),
    ("5b", {C4: ch4({A: pair(vl=(20, 20, 70)), B: pair(vl=(50, 50, 70), qk="per_head")})}, REPRODUCED),
    ("5b", {C4: ch4({A: pair(vl=(50, 50, 70)), B: pair(vl=(20, 20, 70), qk="per_head")})}, CONTRADICTED),
    ("5b", {C4: ch4({A: pair(vl=(45, 45, 70)), B: pair(vl=(40, 40, 70), qk="per_head")}, n=(24, 30, 100))},
     INCONCLUSIVE),
    ("5b", {C4: ch4({A: pair(vl=(20, 20, 70)), B: pair(vl=(50, 50, 70), qk="per_head", vqa=40.0)})}, NOT_TESTED),
    ("6a", {C4: ch4({A: pair(vl=(20, 20, 70))})}, REPRODUCED),
    ("6a", {C4: ch4({A: pair(vl=(40, 40, 70), text_only=(20, 20, 70))})}, CONTRADICTED),
    ("6a", {C4: ch4({A: pair(vl=(45, 45, 70))}, n=(24, 30, 100))}, INCONCLUSIVE),
    ("6b", {C4: ch4({A: pair(vl=(40, 40, 70), random=(5, 5, 30))})}, REPRODUCED),
    ("6b", {C4: ch4({A: pair(vl=(20, 20, 70), random=(50, 50, 70))})}, CONTRADICTED),
    ("6b", {C4: ch4({A: pair(vl=(40, 40, 70), random=(35, 35, 70))}, n=(24, 30, 100))}, INCONCLUSIVE),
    ("6c", {C4: ch4({A: pair(dS=((-0.3, -0.25, -0.35), (0.0, 0.01, -0.01)))})}, REPRODUCED),
    ("6c", {C4: ch4({A: pair(dS=((0.04, 0.0, 0.06), (-0.06, -0.07, -0.05)))})}, CONTRADICTED),   # SmolLM2's seeds
    ("6c", {C4: ch4({A: pair(dS=((0.05, -0.1, 0.0), (0.0, 0.05, -0.05)))})}, INCONCLUSIVE),
    ("6c", {C4: ch4({A: pair(dS=((-0.3,), (0.0,)))})}, INCONCLUSIVE),            # one seed: no interval
    ("6c", {C4: ch4({A: pair(dS=((-0.3, -0.25, -0.35), (0.0, 0.01, -0.01)), vqa=40.0)})}, NOT_TESTED),
    ("7a", {C5: ch5((0.9, 0.5, 0.98))}, REPRODUCED), ("7a", {C5: ch5((-0.9, -0.98, -0.5))}, CONTRADICTED),
    ("7a", {C5: ch5()}, INCONCLUSIVE),
    ("7a", {C5: ch5(), C11: ch11(1.0, p=1 / 24, p_reverse=1.0)}, REPRODUCED),          # chapter 11 decides
    ("7a", {C5: ch5((0.9, 0.5, 0.98)), C11: ch11(-1.0, p=1.0, p_reverse=1 / 24)}, CONTRADICTED),
    ("7a", {C5: ch5((0.9, 0.5, 0.98)), C11: ch11(0.4, p=0.33, p_reverse=0.75)}, INCONCLUSIVE),
    ("7a", {C5: ch5((0.9, 0.5, 0.98)), C11: ch11(n=2)}, NOT_TESTED),
    ("8a", {C6: ch6()}, REPRODUCED), ("8a", {C6: ch6(top1=0.32)}, NOT_TESTED),
    ("8a", {C6: ch6(control=None)}, NOT_TESTED), ("8a", {C6: ch6(after=(45, 45), n=24)}, INCONCLUSIVE),
    ("8a", {C6: ch6(after=(60, 60), control=(30, 30))}, CONTRADICTED),
    ("8a", {C6: ch6_inject_paired()}, REPRODUCED), ("8a", {C6: ch6_inject_paired(False)}, INCONCLUSIVE),
    ("8b", {C4: _ch4_for_ch6(), C6: ch6()}, REPRODUCED),
    ("8b", {C4: _ch4_for_ch6(), C6: ch6(merges=(50, 50))}, CONTRADICTED),
    ("8b", {C4: _ch4_for_ch6(), C6: ch6(vl=(48, 48), merges=(48, 48))}, NOT_TESTED),   # nothing to recover
    ("8b", {C4: _ch4_for_ch6(), C6: ch6(n=100, base=(50, 50), vl=(34, 34), merges=(42, 42))}, INCONCLUSIVE),
    ("8c", {C4: _ch4_for_ch6(), C6: ch6(merges=(5, 5))}, REPRODUCED),
    ("8c", {C4: _ch4_for_ch6(), C6: ch6(merges=(45, 45))}, CONTRADICTED),
    ("8c", {C4: _ch4_for_ch6(40.0), C6: ch6(merges=(5, 5), vqa=40.0)}, NOT_TESTED),
    ("8c", {C4: _ch4_for_ch6(), C6: ch6(merges=(21, 21), n=30)}, INCONCLUSIVE),
    ("8c", {C4: _ch4_for_ch6(), C6: ch6_paired()}, REPRODUCED),                 # paired: 3 items lost, none gained
    ("8c", {C4: _ch4_for_ch6(), C6: ch6_paired(with_items=False)}, INCONCLUSIVE),  # the same scores unpaired
    ("9a", {C8: ch8_order(0.1, 0.3)}, REPRODUCED), ("9a", {C8: ch8_order(0.3, None)}, REPRODUCED),
    ("9a", {C8: ch8_order(1.0, 0.3)}, CONTRADICTED), ("9a", {C8: ch8_order(None, 1.0)}, CONTRADICTED),
    ("9a", {C8: ch8_order(None, None)}, INCONCLUSIVE), ("9a", {C8: ch8_order(0.3, 0.3)}, INCONCLUSIVE),
    ("9a", {C8: ch8_order(1.0, None, random=(1.0, None))}, INCONCLUSIVE),   # random heads fall as early: not specific
    ("9a", {C8: ch8_order(0.3, None, random=(1.0, None))}, REPRODUCED),
    ("9a", {C8: ch8_order(0.3, None, random=(1.0, None), matched=(0.3, None))}, INCONCLUSIVE),  # matched falls too
    ("9a", {C8: ch8_order(0.3, None, random=(1.0, None), matched=(0.3, None), untested=(0.3,))}, REPRODUCED),
    ("9a", {C8: ch8_order(0.3, None, random=(1.0, None), matched=(0.5, None))}, REPRODUCED),
    ("9b", {C8: ch8_repair(-2.0, 1.0)}, REPRODUCED),
    ("9b", {C8: ch8_repair(2.0, 1.0)}, NOT_TESTED),                           # nothing lost: nothing to repair
    ("9b", {C8: ch8_repair(-2.0, -3.0, random_lo=1.0)}, CONTRADICTED),        # a control repairs, the sink heads not
    ("9b", {C8: ch8_repair(-2.0, -3.0, sink_hi=-1.0)}, CONTRADICTED),         # the restore makes it worse
    ("9b", {C8: ch8_repair(-2.0, -3.0)}, INCONCLUSIVE),
    ("9b", {C8: ch8_repair(-2.0, 1.0, other_lo=1.0)}, INCONCLUSIVE),           # not specific
    ("9b", {C8: ch8_panel_repair(1.0)}, REPRODUCED),     # chapter 11's pair: its sink heads give the loss back
    ("9b", {C8: ch8_panel_repair(-5.0)}, INCONCLUSIVE),  # ... or nothing moves
    ("9b", {C8: ch8_panel_repair(1.0, "precondition failed: x")}, NOT_TESTED),  # a pair named by hand that failed
]


@pytest.mark.parametrize("cid,docs,expected", CASES, ids=[f"{c}-{v}-{i}" for i, (c, _, v) in enumerate(CASES)])
def test_verdict_follows_the_rule(monkeypatch, cid, docs, expected):
    _fake(monkeypatch, docs)
    e = claims.evaluate(BY_ID[cid])
    assert e.row.verdict == expected, e.row
    assert e.profile == "quick" and e.row.ours


def test_row_7a_on_chapter_11_names_its_design_and_the_stopped_ones(monkeypatch):
    _fake(monkeypatch, {C5: ch5(), C11: ch11(0.4, p=0.33, p_reverse=0.75)})
    ours = claims.evaluate(BY_ID["7a"]).row.ours
    assert ours[0].startswith("ρ = +0.40 over 4 real models, one-sided exact p = 0.330 (chapter 11, its second "
                              "amendment")
    assert ours[1] == ("stopped designs: the pre-registered design: not tested; its first amendment: not tested")
    sens = {"primary": {"n": 3, "rho": 0.5, "p": 0.5, "p_reverse": 0.67, "p_min": 1 / 6, "models": []}}
    _fake(monkeypatch, {C5: ch5(), C11: ch11(0.4, p=0.33, p_reverse=0.75, interim=True, sensitivity=sens)})
    ours = claims.evaluate(BY_ID["7a"]).row.ours
    assert ours[0].endswith("written after three pairs were seen; an interim look at the first training seed only; "
                            "once written it could no longer end reproduced, only inconclusive or contradicted: two "
                            "pairs seen before it already broke the paper's order (section 11.1); the change is the "
                            "strict pass rate of chapter 11's instruction suite)")
    assert ours[2] == "sensitivity analysis, every model at one rate: ρ = +0.50, one-sided exact p = 0.500, inconclusive"
    assert ours[3].startswith("leave-one-pair-out error: not computed on chapter 11's pairs")
    row = claims.evaluate(BY_ID["7a"]).row
    assert row.reason.startswith("interim look (the first training seed, no controls")
    assert verdict_words(row) == "inconclusive (on an interim look)"  # every page marks it so, the table too
    assert "  - **inconclusive (on an interim look)**" in render([claims.evaluate(BY_ID["7a"])]).splitlines()
    _fake(monkeypatch, {C5: ch5(), C11: ch11(0.4, p=0.33, p_reverse=0.75, lr_rule="frozen")})
    assert "could no longer end reproduced" not in claims.evaluate(BY_ID["7a"]).row.ours[0]  # only the main design's


def test_every_computed_claim_has_three_cases():
    from tests.test_claims_ch8 import CASES as CH8_CASES

    covered = {}
    for cid, _, v in CASES + CH8_CASES:
        covered.setdefault(cid, set()).add(v)
    for c in claims.CLAIMS:
        probe = c.compute.__name__ == "<lambda>"
        assert probe or covered.get(c.id, set()) >= {REPRODUCED, CONTRADICTED, INCONCLUSIVE}, c.id


def test_missing_results_give_not_run_rows(monkeypatch):
    _fake(monkeypatch, {})
    rows = [claims.evaluate(c) for c in claims.CLAIMS]
    assert {e.row.verdict for e in rows} == {NOT_RUN, NOT_TESTABLE}
    ch4_row = next(e for e in rows if e.claim.id == "5a")
    assert "--only 04" in ch4_row.row.reason
    text = claims.render(rows)
    assert text.count("  - **not run yet**") == sum(e.row.verdict == NOT_RUN for e in rows)


def test_not_testable_rows_name_a_reason(monkeypatch):
    _fake(monkeypatch, {})
    for c in claims.CLAIMS:
        e = claims.evaluate(c)
        if e.row.verdict == NOT_TESTABLE:
            assert len(e.row.reason) > 20


# ------------------------------------------------------------------------------------------------
# the committed page

def test_committed_claims_table_is_fresh(monkeypatch):
    monkeypatch.setenv("SINKBOOK_RESULTS", str(ROOT / "data" / "results"))
    committed = (ROOT / "book" / "_generated" / "claims_table.md").read_text(encoding="utf-8")
    assert committed == claims.generate(), "book/_generated/claims_table.md is stale: run python -m sinklib.claims"
    assert claims.main(["--check", "--out", str(ROOT / "book" / "_generated" / "claims_table.md")]) == 0


def test_claims_page_includes_the_table_and_types_no_verdict():
    page = (ROOT / "book" / "claims.md").read_text(encoding="utf-8")
    assert "```{include} _generated/claims_table.md" in page
    for typed in ("*partly*", "reproduced in direction", "*not reproduced*"):
        assert typed not in page


def test_generated_table_shape(monkeypatch, tmp_path):
    monkeypatch.setenv("SINKBOOK_RESULTS", str(ROOT / "data" / "results"))
    out = tmp_path / "t.md"
    assert claims.main(["--out", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert text.count("\n* - ") == len(claims.CLAIMS) + 1
    for v, _ in claims.RULES:
        assert f"**{v}**:" in text
    assert claims.main(["--check", "--out", str(tmp_path / "absent.md")]) == 1


def test_chapter4_verdicts_in_words():
    from sinklib import claims as C

    def rows(model, cond, instr, math, know):
        return [{"model": model, "condition": cond, "suite": s, "metric": m, "score": v, "lo": v - 10, "hi": v + 10}
                for s, m, v in (("instructions", "strict", instr), ("math", "strict", math), ("knowledge", "acc", know))]
    scores = rows("m", "base", 40, 40, 70) + rows("m", "vl", 0, 0, 70) + rows("m", "text_only", 40, 40, 70) \
        + rows("m", "random", 40, 38, 70)
    out = C.chapter4_verdicts({"results": {"scores": scores}}, "m")
    assert out["strict format vs knowledge under VL"] == "format fared worse than knowledge (interval excludes zero)"
    assert out["text-only vs VL (strict format)"] == "text-only lost less (interval excludes zero)"
    assert out["VL: strict-format change (pt)"].startswith("−40.0 [")
    scores = rows("m", "base", 40, 40, 70) + rows("m", "vl", 38, 40, 71) + rows("m", "text_only", 40, 40, 70) \
        + rows("m", "random", 40, 40, 70)
    out = C.chapter4_verdicts({"results": {"scores": scores}}, "m")
    assert out["strict format vs knowledge under VL"] == "within noise (interval contains zero)"


def test_chapter4_summary_names_models_outside_noise():
    import pandas as pd
    from sinklib import claims as C

    v = pd.DataFrame([{"model": "a", "strict format vs knowledge under VL": "format fared worse than knowledge (interval excludes zero)",
                       "text-only vs VL (strict format)": "within noise (interval contains zero)",
                       "random vs VL (strict format)": "random lost less (interval excludes zero)", "S under VL": "rose"},
                      {"model": "b", "strict format vs knowledge under VL": "within noise (interval contains zero)",
                       "text-only vs VL (strict format)": "text-only lost less (interval excludes zero)",
                       "random vs VL (strict format)": "within noise (interval contains zero)", "S under VL": "fell"}])
    s = C.chapter4_summary(v)
    assert s == ("format fared worse than knowledge (a difference of two changes, not a fall of format): a; text-only lost less than VL: b; random lost more than VL: "
                 "no model; S fell under VL (point values, no interval): b")


def test_chapter4_verdicts_are_paired_when_items_are_stored():
    """30 items per suite; VL loses 4 strict items of each suite and nothing else moves. Unpaired (MOVER of two
    Wilson intervals) that is noise; paired, every resample loses items, so the interval excludes zero."""
    from sinklib import claims as C
    from sinklib.evals import paired

    base_f, vl_f = [True] * 15 + [False] * 15, [False] * 4 + [True] * 11 + [False] * 15
    know = [True] * 20 + [False] * 10
    outs = {c: {"instructions strict": f, "math strict": f, "knowledge acc": know}
            for c, f in (("base", base_f), ("vl", vl_f), ("text_only", base_f), ("random", vl_f))}

    def rows(cond):
        return [{"model": "m", "condition": cond, "suite": k.split()[0], "metric": k.split()[1],
                 "score": paired.score(o, k), **dict(zip(("lo", "hi"), C.wilson_pct(paired.score(o, k), 30)[1:]))}
                for k, o in ((k, outs[cond]) for k in outs[cond])]
    scores = [r for c in outs for r in rows(c)]
    unpaired = C.chapter4_verdicts({"results": {"scores": scores}}, "m")
    doc = {"results": {"scores": scores, "outcomes": {"m": {c: paired.pack(o) for c, o in outs.items()}}}}
    both = C.chapter4_verdicts(doc, "m")
    assert unpaired["VL: strict-format change (pt)"].startswith("−13.3 [")
    assert unpaired["text-only vs VL (strict format)"] == "within noise (interval contains zero)"
    assert both["text-only vs VL (strict format)"] == "text-only lost less (interval excludes zero)"
    assert both["strict format vs knowledge under VL"] == "format fared worse than knowledge (interval excludes zero)"
    assert both["random vs VL (strict format)"] == "within noise (interval contains zero)"  # identical items
    e = C.delta(doc, "m", "vl", "base", ("math strict",))
    assert e.v == pytest.approx(-40 / 3) and e.hi < 0 and e.lo >= -30


def test_claims_6a_6b_carry_the_isolating_controls(monkeypatch):
    doc = ch4({A: pair(vl=(40, 40, 70), text_only=(20, 20, 70)), B: pair()})
    doc["results"]["decomposition"] = [
        {"model": A, "step": s, "metric": "strict-format mean", "change": c, "lo": c - 3, "hi": c + 3}
        for s, c in (("fine-tuning as such", -1.0), ("one-word answer format", -19.0), ("vision", 10.0))]
    doc["results"]["random_curve"] = [
        {"model": A, "scale": k, "metric": "strict-format mean", "change": c, "lo": c - 2, "hi": c + 2}
        for k, c in ((1.0, 0.0), (4.0, -1.0), (8.0, -9.0))]
    _fake(monkeypatch, {C4: doc})
    a = claims.evaluate(BY_ID["6a"]).row.ours[0]
    e = claims.est
    assert (f"fine-tuning as such {e(claims.Est(-1.0, -4.0, 2.0))} pt, the one-word format "
            f"{e(claims.Est(-19.0, -22.0, -16.0))} pt") in a
    b = claims.evaluate(BY_ID["6b"]).row.ours[0]
    assert "random at 1x/4x/8x the VL norm: strict-format below zero outside the noise from 8x" in b
    assert "format-preserving" not in claims.evaluate(BY_ID["6a"]).row.ours[1]  # model B stored none
    assert "random at" not in claims.evaluate(BY_ID["6b"]).row.ours[1]
    doc["results"]["random_curve"] = [r for r in doc["results"]["random_curve"] if r["scale"] == 1.0]
    assert "random at" not in claims.evaluate(BY_ID["6b"]).row.ours[0]  # 1x alone adds nothing to the row


def test_claims_5a_6a_6b_say_the_seed_spread(monkeypatch):
    doc = ch4({A: pair(vl=(40, 40, 70), text_only=(20, 20, 70)), B: pair()})
    doc["results"]["seeds"] = {"summary": [
        {"model": A, "condition": c, "metric": "strict-format mean", "seeds": 3, "mean change": m, "min": lo,
         "max": hi, "sd": 1.0, "seeds below zero": below, "seeds above zero": 0, "seed spread exceeds effect": ex}
        for c, m, lo, hi, below, ex in (("vl", -2.0, -6.0, 3.0, 1, True), ("text_only", -20.0, -22.0, -18.0, 3, False),
                                         ("random", 0.5, -1.0, 2.0, 0, True))]}
    _fake(monkeypatch, {C4: doc})
    ours = {cid: claims.evaluate(BY_ID[cid]).row.ours for cid in ("5a", "6a", "6b")}
    assert ("(one training seed); strict-format change (pt) over 3 seeds: −2.0 (−6.0 to +3.0), 1 of 3 below zero "
            "outside the noise, the seed spread exceeds the effect;") in ours["5a"][0]
    assert ("over 3 seeds: −20.0 (−22.0 to −18.0), 3 of 3 below zero outside the noise, the seed spread is smaller "
            "than the effect"
            in ours["6a"][0])
    assert "(pt) over 3 seeds: +0.5 (−1.0 to +2.0)" in ours["6b"][0]
    assert all("seeds" not in o[1] for o in ours.values())  # model B has one training seed: no clause


def test_s_margin_row_checks_every_pair_of_models(monkeypatch):
    """#29: with four models the calibration row counts (pair, N, seed) cells over all six pairs, ranked by the
    default S, and names the closest pair; one pair whose margin flips is against the claim."""
    models = ("a", "b", "c", "d")
    S = {"a": 0.7, "b": 0.0, "c": -0.1, "d": -2.0}
    rob = [{"N": n, "seed": s, "a": 0.7 + 0.1 * s, "b": 0.0 + 0.05 * s, "c": -0.1 + 0.3 * s, "d": -2.0}
           for n in (10, 15, 100) for s in range(2)]
    _fake(monkeypatch, {C2: _doc({"S": S, "robustness": rob, "sensitivity": [], "timing": []}, models=models)})
    row = claims.evaluate(BY_ID["3"]).row
    assert row.verdict == CONTRADICTED
    assert "of the 6 pairs of models" in row.ours[0] and "in 33 of 36 (pair, N, seed) cells" in row.ours[0]
    assert "the smallest is S(b) − S(c) = −0.15" in row.ours[0]
    assert "cells (for: the sign of the margin kept; against: it flips)" in row.reason
    assert "the flips fall in S(b) − S(c) (3 cells;" in row.reason and "pairs that never flip lie" in row.reason
    steady = [{**c, "c": -0.1} for c in rob]
    _fake(monkeypatch, {C2: _doc({"S": S, "robustness": steady, "sensitivity": [], "timing": []}, models=models)})
    row = claims.evaluate(BY_ID["3"]).row
    assert "36 of 36" in row.ours[0] and row.verdict in (REPRODUCED, INCONCLUSIVE)


def test_row_9b_names_chapter_11s_pairs_and_their_suites(monkeypatch):
    _fake(monkeypatch, {C8: ch8_panel_repair(1.0)})
    row = claims.evaluate(BY_ID["9b"]).row
    assert len(row.ours) == 2 and row.ours[1].startswith("p (chapter 11's LoRA pair): instructions strict VL minus base")
    assert "(chapter 11's 360 + 300-item strict suites, pooled over 2 seed(s); smallest fall" in row.ours[1]


def test_merge_verdict_says_when_a_merge_cannot_be_decided():
    """Chapter 6's per-merge verdict goes through `decide`: not tested while the VL loss is within noise (or the VL
    model did not learn VQA), contradicted when the merge recovers, reproduced below the base, else inconclusive."""
    from sinklib.claims import NO_VQA, merge_verdict, vqa_not_learned
    from sinklib.stats.verdicts import Est

    lost = Est(-10.0, -15.0, -5.0)
    assert merge_verdict(Est(-8, -12, -4), Est(2, -1, 5), Est(-1, -6, 4)).outcome == NOT_TESTED
    assert "nothing to recover" in merge_verdict(Est(-8, -12, -4), Est(2, -1, 5), Est(-1, -6, 4)).why
    assert merge_verdict(Est(-8, -12, -4), Est(2, -1, 5), lost).outcome == REPRODUCED
    assert merge_verdict(Est(-2, -7, 3), Est(8, 3, 13), lost).outcome == CONTRADICTED  # not below base, above VL
    assert merge_verdict(Est(6, 1, 11), Est(16, 11, 21), lost).outcome == CONTRADICTED
    v = merge_verdict(Est(-2, -7, 3), Est(1, -3, 5), lost)
    assert v.outcome == INCONCLUSIVE and "contains zero" in v.why
    assert vqa_not_learned(63.0, 200, 40.0) == ""
    why = vqa_not_learned(45.0, 200, 40.0)
    assert why.startswith(NO_VQA) and why.endswith("%)")
    assert merge_verdict(Est(-8, -12, -4), Est(2, -1, 5), lost, why).outcome == NOT_TESTED


def test_outcome_counts_in_words():
    from sinklib.claims import outcome_counts

    assert outcome_counts([NOT_TESTED, REPRODUCED, NOT_TESTED]) == "1 reproduced, 2 not tested"
    assert outcome_counts([]) == "none"


def test_undecided_reasons_name_each_open_verdict_once():
    import pandas as pd

    from sinklib.claims import undecided_reasons

    v = pd.DataFrame({"model": ["a", "a", "a", "b"], "outcome": [NOT_TESTED, NOT_TESTED, REPRODUCED, REPRODUCED],
                      "why": ["nothing to recover", "nothing to recover", "below", "below"]})
    assert undecided_reasons(v) == "a: 2 of 3 merges not tested (nothing to recover)"
    assert undecided_reasons(v[v.model == "b"]).startswith("none")


def test_s_under_vl_uses_the_seeds_and_the_summary_says_so():
    import pandas as pd
    from sinklib import claims as C

    rows = pd.DataFrame([{"model": "a", "condition": c, "S change": v} for c, v in
                         (("vl", 0.06), ("vl seed 1", 0.07), ("vl seed 2", 0.065), ("text_only", -0.2))]
                        + [{"model": "b", "condition": "vl", "S change": -0.01}])
    assert C.s_under_vl(rows, "a").startswith("rose: +0.065 [") and "(t interval over 3 training seeds)" in C.s_under_vl(rows, "a")
    assert C.s_under_vl(rows, "b") == "fell (point value, training seed 0)"
    assert C.s_under_vl(rows, "c") == "not measured"
    v = pd.DataFrame([{"model": m, "strict format vs knowledge under VL": "within noise", "text-only vs VL (strict format)":
                       "within noise", "random vs VL (strict format)": "within noise", "S under VL": C.s_under_vl(rows, m)}
                      for m in ("a", "b")])
    assert C.chapter4_summary(v).endswith("S fell under VL (t interval over the training seeds): b")


def test_row_9b_names_a_perplexity_loss_and_what_each_restore_gives_back():
    from sinklib.claims.ch8 import _ppl_repair

    def r(c, change, lo, hi, loss_lo=0.39):
        return {"control": c, "fraction": 0.25, "metric": "perplexity ppl", "loss": 0.6, "loss_lo": loss_lo,
                "loss_hi": 0.83, "change": change, "lo": lo, "hi": hi}

    rows = [r("sink heads", -0.034, -0.06, -0.007), r("random heads", -0.048, -0.065, -0.03)]
    text = _ppl_repair(rows, 0.25)
    assert text.startswith("; perplexity VL minus base +0.60 [+0.39, +0.83] (a loss outside the noise): restored, "
                           "sink heads −0.03 [−0.06, −0.01], random heads −0.05")
    assert text.endswith("(the sink heads give back less than a control)")
    assert _ppl_repair([r("sink heads", -0.03, -0.06, -0.01, loss_lo=-0.1)], 0.25) == ""   # no loss: nothing said
