"""The bottom line and the other findings (#31): generated from data/results/, included by the landing page and
the claims page, stale files caught, and each sentence follows the data it reads (not typed)."""
from pathlib import Path

from sinklib import claims
from sinklib.book import runner as book
from sinklib.claims import findings
from sinklib.claims.core import Results
from sinklib.errors import ResultsMissing

ROOT = Path(__file__).resolve().parent.parent


def _fake(monkeypatch, docs):
    def load(notebook, key=None):
        if notebook not in docs:
            raise ResultsMissing(notebook)
        return docs[notebook]
    monkeypatch.setattr(book, "load_results", load)


def test_pages_include_the_generated_bottom_line():
    intro = (ROOT / "book" / "intro.md").read_text(encoding="utf-8")
    page = (ROOT / "book" / "claims.md").read_text(encoding="utf-8")
    assert "```{include} _generated/bottom_line.md" in intro and "{doc}`course_guide`" in intro
    assert "```{include} _generated/bottom_line.md" in page and "```{include} _generated/other_findings.md" in page
    assert page.index("bottom_line.md") < page.index("claims_table.md")   # the bottom line opens the page


def test_check_fails_while_the_bottom_line_is_stale(monkeypatch, tmp_path):
    monkeypatch.setenv("SINKBOOK_RESULTS", str(ROOT / "data" / "results"))
    out = tmp_path / "claims_table.md"
    assert claims.main(["--out", str(out)]) == 0
    assert claims.main(["--check", "--out", str(out)]) == 0
    (tmp_path / "bottom_line.md").write_text("an old bottom line\n", encoding="utf-8")
    assert claims.main(["--check", "--out", str(out)]) == 1
    text = (ROOT / "book" / "_generated" / "bottom_line.md").read_text(encoding="utf-8")
    assert "public review" in text and 5 <= len([x for x in text.splitlines() if x and not x.startswith("%")]) <= 9


def test_no_chapter_run_invents_no_finding(monkeypatch):
    _fake(monkeypatch, {})
    assert findings.other_findings() == ""          # no chapter run: no sentence invented


def test_head_ablation_sentence_reads_chapter_8s_tables(monkeypatch):
    ver = [{"model": "m", "control": "sink", "format_dose": 0.5, "knowledge_dose": None}]
    dose = [{"model": "m", "dose": 0.5, "control": "sink", "metric": mt, "change": -20.0, "lo": -30.0, "hi": -10.0}
            for mt in ("math strict", "math lenient")]
    spec = [{"model": "m", "dose": 0.5, "against": "random", "metric": "math strict", "sink minus control": -2.0,
             "lo": -9.0, "hi": 5.0, "tested": True}]
    _fake(monkeypatch, {"08_causal_tests": {"results": {"verdicts": ver, "dose_response": dose, "specificity": spec}}})
    s = findings.head_ablation(Results())
    assert s.startswith("Switching the sink off (chapter 8")
    assert "math lenient fell with it" in s and "As many random heads cost about as much" in s
    _fake(monkeypatch, {"08_causal_tests": {"results": {"first_token": []}}})
    assert findings.head_ablation(Results()) == ""  # an earlier run without H2's contrasts: no sentence


def test_rows_reporting_the_same_change_name_their_suites(monkeypatch):
    """One quantity, several numbers (#31): the VL strict-format change of a model appears in rows 5a/5b
    (chapter 4's suites), 8b (chapter 6's) and 9b (chapter 8's) on different items; each row names its suites and
    their sizes, and row 2a names both probe variants of chapter 2's timing."""
    monkeypatch.setenv("SINKBOOK_RESULTS", str(ROOT / "data" / "results"))
    by = {c.id: c for c in claims.CLAIMS}
    for cid, chapter in (("5a", "chapter 4's"), ("5b", "chapter 4's"), ("8b", "chapter 6's"), ("9b", "chapter 8's"),
                         ("8a", "chapter 6's")):
        text = " ".join(claims.evaluate(by[cid]).row.ours)
        assert f"{chapter} " in text and "-item strict suites" in text, (cid, text[:200])
    a = " ".join(claims.evaluate(by["2a"]).row.ours)
    assert "fused" in a and "chunked" in a


#: committed results produced from a working tree with uncommitted changes, before this test existed; each
#: entry goes when its producer reruns from committed code (the test below fails until it is removed)
DIRTY_BEFORE_31: set[str] = set()  # bench_cpu reran from committed code in session 50


def test_committed_results_come_from_committed_code():
    """A results file whose provenance says '+dirty' was computed by code that is in no commit: refused, except
    the files listed above (which must still be dirty: a rerun removes its entry)."""
    import json

    dirty = {p.stem for p in (ROOT / "data" / "results").glob("*.json")
             if str((json.loads(p.read_text()).get("provenance") or {}).get("git_commit", "")).endswith("+dirty")}
    assert dirty <= DIRTY_BEFORE_31, f"results from uncommitted code: {sorted(dirty - DIRTY_BEFORE_31)}"
    assert DIRTY_BEFORE_31 <= dirty, f"rerun from committed code: remove {sorted(DIRTY_BEFORE_31 - dirty)} here"


def test_every_chapter_ends_with_what_it_found(monkeypatch):
    """Each chapter's summary opens with "What we found", generated from the claim rows it tests (fresh with the
    claims page), and each generated passage lists exactly that chapter's rows."""
    import json

    monkeypatch.setenv("SINKBOOK_RESULTS", str(ROOT / "data" / "results"))
    rows = [claims.evaluate(c) for c in claims.CLAIMS]
    for nb in sorted((ROOT / "notebooks").glob("0[1-9]_*.ipynb")):
        md = "\n".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "markdown")
        assert f"```{{include}} ../_generated/found/{nb.stem}.md" in md, nb.name
        assert md.index("## What we found") < md.index("## Summary"), nb.name
        text = findings.chapter_found(nb.stem, rows)
        ids = [c.id for c in claims.CLAIMS if c.chapter == nb.stem]
        assert [t.split(",")[0] for t in text.split("**Row ")[1:]] == ids, nb.name


def test_chapter4_verdicts_pool_the_training_seeds():
    """Seed 0 loses 6 of 30 strict items, seed 1 none: the pooled change is their mean (-10 points), and its
    interval, which resamples the seeds too, is wider than seed 0's alone."""
    from sinklib.claims import chapter4_verdicts, delta, pooled
    from sinklib.evals.paired import pack

    base = [True] * 15 + [False] * 15
    lost6 = [False] * 6 + [True] * 9 + [False] * 15
    know = [True] * 20 + [False] * 10

    def out(f):
        return pack({"instructions strict": f, "math strict": f, "knowledge acc": know})
    conds = {"base": base, "vl": lost6, "vl seed 1": base, "text_only": base, "random": lost6}
    doc = {"results": {"scores": [], "outcomes": {"m": {c: out(f) for c, f in conds.items()}}}}
    e, k = pooled(doc, "m", "vl", "base", ("instructions strict", "math strict"))
    one = delta(doc, "m", "vl", "base", ("instructions strict", "math strict"))
    assert k == 2 and abs(e.v + 10) < 1e-9 and abs(one.v + 20) < 1e-9 and e.hi - e.lo > one.hi - one.lo
    assert chapter4_verdicts(doc, "m")["VL: strict-format change (pt)"].startswith("−10.0 [")


def _ch9(pilot, base):
    return {"results": {"pilot": [{"try": t, "variant": v, "sink formed": f} for t, v, f in pilot],
                        "base": [{"model": m, "variant": m.split("|")[0], "holds_from": h} for m, h in base]}}


def test_tiny_sink_sentence_counts_each_model_once(monkeypatch):
    pilot = [("base", "none", True), ("base", "per_head", False), ("steps:1800", "per_head", False)]
    base = [("none|base|s0", 425), ("per_head|base|s0", None), ("none|base|s1", None)]
    _fake(monkeypatch, {"09_sink_panel": _ch9(pilot, base)})
    s = findings.tiny_sinks_by_norm(Results())
    # none|base|s0 is the pilot's base model: counted once
    assert "1 of 2 without QK-norm, 0 of 2 with per-head QK-norm" in s and "No sink formed with QK normalisation" in s
    assert "with 1 model with a sink in all it is a hint, not a tested difference (Fisher's exact p = 1.00" in s
    assert "which the paper does not claim" in s
    _fake(monkeypatch, {"09_sink_panel": _ch9([("base", "per_head", True)], [])})
    assert "No sink formed" not in findings.tiny_sinks_by_norm(Results())
    one = pilot + [("n_heads:1,d_model:64", "per_head", False), ("n_heads:1,d_model:64", "layerwise", False)]
    _fake(monkeypatch, {"09_sink_panel": _ch9(one, base)})
    s = findings.tiny_sinks_by_norm(Results())     # the one-head model is one function: counted once, not twice
    assert "0 of 3 with per-head QK-norm" in s and "layerwise" not in s.split("(")[0] and "counted once" in s


def test_s_by_norm_names_every_model_with_its_qk_norm(monkeypatch):
    """#29: chapter 2 records each model's QK-norm type with S, so models chapter 4 never trained (the Qwen2.5-Coder
    models) are named with theirs; with more than two models the lowest S is "the lowest"."""
    s = {"smollm2-135m": 0.72, "gemma3-270m": 0.0, "qwen2.5-coder-0.5b": -0.1, "qwen2.5-coder-1.5b": -0.09}
    qk = {"smollm2-135m": "none", "gemma3-270m": "per_head", "qwen2.5-coder-0.5b": "none", "qwen2.5-coder-1.5b": "none"}
    ch7 = {"results": {"tiny_panel_rows": []}}
    _fake(monkeypatch, {"02_sink_strength": {"results": {"S": s, "qk_norm": qk}}, "07_controlled_panel": ch7})
    text = findings.s_by_norm(Results())
    assert "qwen2.5-coder-0.5b (no QK-norm) -0.10" in text and "gemma3-270m (per-head QK-norm) 0.00" in text
    assert "per-head QK-norm model has the" not in text           # the lowest S is a model without QK-norm
    _fake(monkeypatch, {"02_sink_strength": {"results": {"S": {**s, "gemma3-270m": -1.0}, "qk_norm": qk}},
                        "07_controlled_panel": ch7})
    assert "The per-head QK-norm model has the lowest S" in findings.s_by_norm(Results())
    # an older chapter 2 without the record: chapter 4's panel rows name the two models it trained
    old = {"02_sink_strength": {"results": {"S": {"a": 0.7, "b": 0.0}}},
           "04_vl_adaptation": {"results": {"panel_rows": [{"llm": "a", "qk_norm": "none"}, {"llm": "b", "qk_norm": "per_head"}]}},
           "07_controlled_panel": ch7}
    _fake(monkeypatch, old)
    assert "The per-head QK-norm model has the lower S" in findings.s_by_norm(Results())


def _ch10(instr, lo, hi):
    pt = {"lr_lm": 5e-5, "steps": 60, "VQA": 64.0, "majority": 38.0, "instructions strict": instr,
          "instructions strict lo": lo, "instructions strict hi": hi, "knowledge acc": 5.0, "knowledge acc lo": 2.0,
          "knowledge acc hi": 8.0, "math strict": 1.0, "math strict lo": -5.0, "math strict hi": 8.0}
    other = {**pt, "lr_lm": 5e-4, "instructions strict": -40.0}
    power = [{"suite": "m: instructions strict", "items": 360, "paired, flip 0.05": 6.5}]
    return {"results": {"recipe": {"m": {"lr_lm": 5e-5, "stage2_steps": 60}}, "sweep": {"m": [other, pt]}, "power": power}}


def test_powered_dose_reads_the_frozen_recipes_point_beside_both_suites_power(monkeypatch):
    """The bottom line qualifies chapter 4's null with chapter 10's powered suite: the frozen recipe's own point
    (not another point of the sweep), both suites' smallest detectable falls, and nothing without chapter 10."""
    ch4 = {"results": {"power": [{"suite": "m: instructions strict", "items": 72, "paired, flip 0.05": 18.0}]}}
    _fake(monkeypatch, {"10_calibration": _ch10(-5.6, -9.4, -1.7), "04_vl_adaptation": ch4})
    s = findings.powered_dose(Results())
    assert "360-prompt" in s and "−5.6 [−9.4, −1.7]" in s and "−40" not in s and "6.5 points" in s
    assert "72-prompt instruction suite can see only falls of 18.0" in s and "+1.0 [−5.0, +8.0]" in s
    _fake(monkeypatch, {"10_calibration": _ch10(-5.6, -9.4, -1.7)})
    assert "360-prompt" in findings.powered_dose(Results()) and "72-prompt" not in findings.powered_dose(Results())
    _fake(monkeypatch, {"04_vl_adaptation": ch4})
    assert findings._safe(findings.powered_dose, Results()) == ""
    assert s.startswith("On a suite with more power, the same dose does cost format: ")   # no type-level check stored


def test_powered_dose_says_when_the_loss_is_not_firm_by_instruction_type(monkeypatch):
    doc = _ch10(-5.6, -9.4, -1.7)
    row = {"lr_lm": 5e-5, "steps": 60, "items": [-5.6, -9.4, -1.7], "types": [-5.6, -11.0, 0.4], "design effect": 1.9,
           "smallest detectable fall, types": 9.5}
    doc["results"]["by_type"] = {"full": {"m": [{**row, "lr_lm": 5e-4, "types": [-40, -50, -30]}, row]}}
    _fake(monkeypatch, {"10_calibration": doc})
    s = findings.powered_dose(Results())
    assert ("−5.6 [−9.4, −1.7] points (−5.6 [−11.0, +0.4] with the suite's instruction types resampled, which detects "
            "falls of 9.5 points or more)") in s
    assert "smallest detectable fall 6.5 points with the items taken as independent" in s
    assert s.startswith("On a suite with more power, the same dose costs format on these items, but not clearly")
    assert s.endswith("the interval contains zero.")
    row["types"] = [-5.6, -10.0, -0.5]
    doc["results"]["by_type"]["full"]["m"] = [row]
    assert findings.powered_dose(Results()).startswith("On a suite with more power, the same dose does cost format: ")
    row["types"] = [-5.6, float("nan"), float("nan")]                      # one type: no interval, no claim either way
    assert "resampled" not in findings.powered_dose(Results())
    assert findings.powered_dose(Results()).startswith("On a suite with more power, the same dose does cost format: ")


def test_a_row_decided_by_another_chapter_shows_there_too():
    """Row 7a lives on chapter 5's page, but once chapter 11 has a primary test its results alone decide the
    row: chapter 11's passage lists it, chapter 5's keeps it, and the claims table links both."""
    from sinklib.claims.core import Evaluated, Row, render
    from sinklib.claims.registry import CLAIMS

    c7a = next(c for c in CLAIMS if c.id == "7a")
    row = Row(("ρ = −0.40 over 4 real models", "sensitivity analysis: inconclusive"), "inconclusive", "p 0.792")
    e = Evaluated(c7a, row, [], "full", ["11_four_panel"])
    assert e.decided_by == ["11_four_panel"]
    assert "**Row 7a, inconclusive.**" in findings.chapter_found("11_four_panel", [e])
    assert "4 real models; sensitivity analysis" in findings.chapter_found("05_panel_correlations", [e])
    assert "decided by {doc}`ch. 11 </book/chapters/11_four_panel>`" in render([e])
    own = Evaluated(c7a, row, [], "full", ["05_panel_correlations", "07_controlled_panel"])
    assert own.decided_by == [] and findings.chapter_found("07_controlled_panel", [own]) == ""


def test_four_panel_sentence_follows_chapter_11s_results(monkeypatch):
    def pair(model, S, change, ok=True):
        return {"model": model, "S": S, "precondition": ok, "VL: instructions strict": change}

    pairs = [pair("a", 0.7, [-5.0, -9.0, -1.0]), pair("b", 0.1, [0.3, -2.0, 2.5]), pair("c", -0.1, [-4.0, -7.0, -0.5]),
             pair("d", -0.2, [-30.0, -35.0, -25.0], ok=False)]
    primary = {"n": 3, "rho": -0.5, "p": 0.83, "p_reverse": 0.5, "p_min": 1 / 6}
    sens = {"rate": 4e-4, "primary": {"n": 3, "rho": 1.0, "p": 1 / 6}, "pairs": [pair("a", 0.7, [0.6, -2.5, 3.9])]}
    doc = {"pairs": pairs, "primary": primary, "interim": True, "rates": {"a": 2e-3, "b": 4e-4, "c": 4e-4},
           "sensitivity": sens}
    _fake(monkeypatch, {"11_four_panel": {"results": doc}})
    text = findings.four_panel(Results())
    assert text.startswith("On 4 real models (chapter 11)") and "beyond the paired noise in 2 of the 3 tested pairs" in text
    assert "(a −5.0 [−9.0, −1.0] points at rate 2e-3; c −4.0 [−7.0, −0.5] points at rate 4e-4)" in text
    assert "cannot say whether base S orders the losses: Spearman ρ −0.50 over 3 pairs, one-sided exact p 0.830" in text
    assert "a, the model with the highest S, trained at 2e-3; at 4e-4" in text and "+0.6 [−2.5, +3.9] points (within" in text
    assert "the two analyses differ only in this model's rate" in text and "interim look" in text
    doc["stopped"] = {"frozen": {"pairs": [pair("a", 0.7, [-5.0, -9.0, -1.0]), pair("d", -0.2, [0, 0, 0], ok=False)]}}
    assert "The recipe's frozen rate had destroyed 1 of the first 2 models" in findings.four_panel(Results())
    doc["rates"]["a"] = 4e-4   # trained at the common rate already: nothing more to say about it
    assert "the model with the highest S" not in findings.four_panel(Results())
    doc["pairs"] = pairs[:2] + pairs[3:]  # fewer than three pairs in the test: no sentence
    assert findings.four_panel(Results()) == ""


def test_s_trajectory_says_which_way_s_moved_per_model(monkeypatch):
    def rows(m, vl, to):
        return ([{"model": m, "condition": "vl" + ("" if i == 0 else f" seed {i}"), "S change": v} for i, v in enumerate(vl)]
                + [{"model": m, "condition": "text_only" + ("" if i == 0 else f" seed {i}"), "S change": v}
                   for i, v in enumerate(to)])
    doc = {"results": {"scores": [{"model": "a"}, {"model": "b"}],
                       "sink_text": {"rows": rows("a", [0.06, 0.07, 0.065], [-0.05, -0.06, -0.07])
                                     + rows("b", [-0.1, 0.1, 0.0], [0.01, 0.02, -0.01])}}}
    s = findings.s_trajectory(lambda stem: doc)
    assert s.startswith("Sink Strength S under VL training rose in a (the paper's trajectory has it fall)")
    assert "a: VL +0.065 [" in s and "(rose; 3 of 3 seeds above zero), text-only −0.060 [" in s and "(fell; 0 of 3" in s
    assert "b: VL 0.000 [" in s and "(did not move outside the noise; 1 of 3 seeds above zero)" in s
    none = {"results": {"scores": [{"model": "b"}], "sink_text": {"rows": rows("b", [-0.1, 0.1, 0.0], [0.0, 0.1])}}}
    assert findings.s_trajectory(lambda stem: none).startswith("Sink Strength S under VL training moved outside the noise in no model")
