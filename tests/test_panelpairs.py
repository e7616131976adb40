"""Chapter 11's pairs for the chapters downstream (sinklib.adapt.panelpairs): which pairs lost strict instruction
format, their parameters at each seed, and a pair loaded with chapter 11's own base and VL evaluations."""
import pytest
import torch

from sinklib import vl
from sinklib.adapt import fourpanel, pairs, panelpairs
from sinklib.core.models import tiny_model
from sinklib.errors import ParameterError
from tests.test_fourpanel import RECIPE
from tests.test_vl import TOK


def _doc(interim=True, pairs_=None):
    rows = pairs_ or [
        {"model": "a", "precondition": True, "VL: instructions strict": [-5.0, -9.2, -0.8]},   # lost
        {"model": "b", "precondition": True, "VL: instructions strict": [-2.0, -6.0, +1.0]},   # inside the noise
        {"model": "c", "precondition": False, "VL: instructions strict": [-30.0, -35.0, -25.0]},  # not tested
        {"model": "d", "precondition": True, "VL: instructions strict": [-4.0, -7.8, -0.3]}]   # lost
    params = {"models": ["a", "b", "c", "d", "tiny-llama"], "seeds": [0, 1], "image_size": 48, "stage1_steps": 2, "batch_size": 2,
              "lr_projector": 0.01, "schedule": "constant", "low_memory_models": ["d"], "n_prompts": 2,
              "last_k_layers": 2, "max_tokens": 16, "vqa_n": 3, "eval_batch_size": 8, "eval_instructions": 0,
              "eval_math": 0, "eval_knowledge": 2, "eval_perplexity": 0}
    return {"parameters": params, "results": {"pairs": rows, "interim": interim, "recipe": RECIPE,
                                              "rates": {"a": 2e-3, "b": 4e-4, "d": 4e-4, "tiny-llama": 4e-4}}}


def test_the_pairs_that_lost_format_by_one_rule():
    assert panelpairs.lost_format(_doc()) == ["a", "d"]  # a failed precondition is not a loss to recover
    assert panelpairs.choose(_doc(), "lost") == ["a", "d"]
    assert panelpairs.choose(_doc(), "lost", exclude=["d"]) == ["a"]
    assert panelpairs.choose(_doc(), ["d", "b"]) == ["b", "d"]  # the chapter's order
    with pytest.raises(ParameterError, match=r"names \['e'\], which chapter 11 did not run"):
        panelpairs.choose(_doc(), ["e"])
    with pytest.raises(ParameterError, match="allowed: 'lost'"):
        panelpairs.choose(_doc(), "all")
    text = panelpairs.chosen_sentence(_doc() | {"results": {**_doc()["results"], "pairs": [
        {**r, "seeds": 2} for r in _doc()["results"]["pairs"]]}}, "lost", exclude=["d"])
    assert text == ("the pairs whose strict instruction format fell outside the noise: a (-5.0 [-9.2, -0.8] points "
                    "over 2 seed(s)); d (-4.0 [-7.8, -0.3] points over 2 seed(s)); left out here by `panel_exclude`: d")
    assert panelpairs.chosen_sentence(_doc(), ["b"], exclude=["b"]).endswith("so this run acts on no pair")
    with pytest.raises(ParameterError, match=r"'panel_exclude' names \['z'\]"):
        panelpairs.choose(_doc(), "lost", exclude=["z"])
    assert panelpairs.precondition_failed(_doc(), "a") == ""
    assert panelpairs.precondition_failed(_doc(), "c").startswith("precondition failed: chapter 11's pair did not")
    assert "no evaluated pair" in panelpairs.precondition_failed(_doc(), "tiny-llama")
    none = _doc(pairs_=[{"model": "a", "precondition": True, "VL: instructions strict": None}])
    assert panelpairs.lost_format(none) == []  # not evaluated: nothing lost


def test_the_parameter_naming_the_pairs_is_checked():
    assert panelpairs.check_panel_models("panel_models", "lost") == "lost"
    assert panelpairs.check_panel_models("panel_models", ["a"]) == ["a"]
    for bad in ("all", [], [3]):
        with pytest.raises(ParameterError, match="panel_models"):
            panelpairs.check_panel_models("panel_models", bad)


def test_seeds_conditions_and_parameters_follow_chapter_11():
    assert panelpairs.seeds_run(_doc()) == [0] and panelpairs.seeds_run(_doc(interim=False)) == [0, 1]
    assert panelpairs.condition("merge:star", 0, _doc()) == "merge:star"
    assert panelpairs.condition("merge:star", 1, _doc()) == "merge:star seed 1"  # as `pooling.pooled` pairs them
    p = panelpairs.params_of(_doc(), "b", 1, "w")
    assert p == fourpanel.panel_params("b", "w", RECIPE, 1, image_size=48, stage1_steps=2, batch_size=2,
                                       lr_projector=0.01, schedule="constant", lr=4e-4)
    with pytest.raises(ParameterError, match="no rate for 'c'"):
        panelpairs.params_of({**_doc(), "results": {**_doc()["results"], "lr_rule": "precondition-chosen"}}, "c", 0, "w")
    with pytest.raises(ParameterError, match="no rate for 'e'"):
        panelpairs.params_of(_doc(), "e", 0, "w")
    frozen = {**_doc(), "results": {**_doc()["results"], "lr_rule": "frozen", "rates": {}}}  # chapter 11's quick profile
    assert panelpairs.params_of(frozen, "c", 0, "w")["lr_lm"] == RECIPE["lr_lm"]
    assert panelpairs.low_memory(_doc(), "d") and not panelpairs.low_memory(_doc(), "a")


def test_a_loaded_pair_is_chapter_11s_and_its_base_and_vl_evaluations_are_chapter_11s(tmp_path, monkeypatch):
    monkeypatch.setenv("SINKBOOK_CACHE", str(tmp_path))
    lm = tiny_model("llama", seed=0)
    lm.tokenizer = TOK
    base_sd = vl.clone_state_dict(lm.model)
    doc = _doc()
    calls = []

    def fake(lm_, pair, cond, **kw):
        calls.append((cond, pair.params["lr_lm"], kw.get("key_extra"), float(pair.states[cond]["model.norm.weight"]
                                                                                .sum())))
        return {"cond": cond}

    monkeypatch.setattr(pairs, "evaluate_condition", fake)
    pair = panelpairs.load(lm, doc, 0)
    assert pair.params == panelpairs.params_of(doc, "tiny-llama", 0, lm.weights_sha256) and pair.projector is not None
    assert all(torch.equal(pair.states["base"][k], v) for k, v in base_sd.items())
    k = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(pair.states["vl"][k], base_sd[k])  # the VL snapshot chapter 11 trains (LoRA merged in)
    pair.states["half"] = {n: (pair.states["base"][n] + pair.states["vl"][n]) / 2 for n in base_sd}
    got = [panelpairs.evaluate(lm, pair, doc, c, key_extra={"x": 1} if c == "half" else None)
           for c in ("base", "vl", "half")]
    assert got == [{"cond": "base"}, {"cond": "vl step 2"}, {"cond": "half"}]  # chapter 11's condition names
    assert [c[:3] for c in calls] == [("base", RECIPE["lr_lm"], None), ("vl step 2", 4e-4, None),
                                      ("half", 4e-4, {"x": 1})]  # the base keyed at the frozen rate, as chapter 11
    assert all(torch.equal(lm.model.state_dict()[n], v) for n, v in base_sd.items())


def test_chapter_6s_merges_on_a_panel_pair_are_made_evaluated_and_judged_pooled_over_seeds(tmp_path, monkeypatch):
    """`controls.panelmerge.run` on a tiny pair at two seeds: each merge made from the pair's own base and VL
    states, evaluated under its method's key (the base once), the outcomes named per seed as the pooled changes
    read them; `verdicts` judges each merge on the strict instruction rate pooled over both seeds."""
    import sinklib.core.models
    from sinklib.claims import ch6panel
    from sinklib.controls import merge, panelmerge

    monkeypatch.setenv("SINKBOOK_CACHE", str(tmp_path))
    lm = tiny_model("llama", seed=0)
    lm.tokenizer = TOK
    monkeypatch.setattr(sinklib.core.models, "load_model", lambda name, device: lm)
    doc = _doc(interim=False)
    seen = []

    def fake(lm_, pair, cond, **kw):
        st = pair.states[cond]
        if cond.startswith("merge:"):
            m = cond[len("merge:"):]
            want = merge.merge(pair.states["base"], pair.states["vl"], m, seed=0)
            assert kw["key_extra"] == {**merge.evaluation_extra(m), "merge_seed": 0}  # the mask seed joins the key
            assert all(torch.equal(st[k], want[k]) for k in want)
        seen.append((cond, pair.params["seed"]))
        k = {"base": 30, "vl step 2": 20, "merge:uniform": 25, "merge:star": 10}[cond]  # items passed of 40
        return {"outcomes": {"instructions strict": [i < k for i in range(40)]}, "vqa": [0.9, 3], "S": 0.1,
                "scores": [{"suite": "instructions", "metric": "strict", "score": 100 * k / 40}]}

    monkeypatch.setattr(pairs, "evaluate_condition", fake)
    out = panelmerge.run(doc, ["tiny-llama"], ["uniform", "star"])
    assert seen == [("base", 0), ("vl step 2", 0), ("merge:uniform", 0), ("merge:star", 0),
                    ("vl step 2", 1), ("merge:uniform", 1), ("merge:star", 1)]
    assert list(out["outcomes"]["tiny-llama"]) == ["base", "vl", "merge:uniform", "merge:star", "vl seed 1",
                                                   "merge:uniform seed 1", "merge:star seed 1"]
    assert {r["seed"] for r in out["rows"]} == {0, 1} and len(out["seconds"]) == 4
    v = ch6panel.verdicts({"results": {"outcomes": out["outcomes"]}}, ["tiny-llama"], ["uniform", "star"],
                            out["rows"])
    assert list(v.seeds) == [2, 2] and v["VL minus base (pt)"][0].v == -25.0
    assert v["merge minus VL (pt)"][0].v == 12.5 and v["merge minus VL (pt)"][1].v == -25.0
    assert list(v.outcome) == ["reproduced", "reproduced"]  # below the base outside the noise: no recovery
    assert list(v["VQA kept (% of VL)"]) == [100.0, 100.0]
    assert [r["condition"] for r in out["rows"]][-3:] == ["vl seed 1", "merge:uniform seed 1", "merge:star seed 1"]
    text = ch6panel.sentence(v)
    assert text.startswith("tiny-llama (VL minus base -25.0 [") and "over 2 seed(s)): none of the 2 merges recovers" \
        in text and "1 is worse than VL outside the noise (star)" in text and text.endswith("verdicts: 2 reproduced")
    shown = ch6panel.verdict_table(v)
    assert list(shown.frame.columns) == ["merge - VL (pt)", "merge - base (pt)", "VQA kept (%)", "verdict: no recovery"]
    assert ch6panel.sentence(v.iloc[:0]) == "no pair of chapter 11 was merged"
    # a rerun whose evaluations are all cached loads no pair
    from sinklib.adapt import panelpairs as pp_

    got = {}
    for r, (cond, s) in zip(out["rows"], seen):
        got[(s, cond.replace("vl step 2", "vl"))] = {"outcomes": {"instructions strict": [i < (
            {"base": 30, "vl step 2": 20, "merge:uniform": 25, "merge:star": 10}[cond]) for i in range(40)]},
            "vqa": [0.9, 3], "S": 0.1, "scores": []}
    monkeypatch.setattr(pp_, "cached", lambda lm_, doc_, s, c, extra=None: got.get((s, c)) or got.get((0, c)))
    monkeypatch.setattr(pp_, "load", lambda *a: pytest.fail("loaded a pair although everything was cached"))
    again = panelmerge.run(doc, ["tiny-llama"], ["uniform", "star"])
    assert again["outcomes"] == out["outcomes"]
    # TSV keeps every direction of a rank-4 change in the tiny model: the merge is the VL model, not tested
    p4 = panelpairs.params_of(doc, "tiny-llama", 0, "w")
    assert "is the VL model up to rounding" in panelmerge.same_as_vl("tsv", lm.model, p4)
    assert panelmerge.same_as_vl("tsv", lm.model, {**p4, "lora_rank": 16}) == ""
    assert panelmerge.same_as_vl("star", lm.model, p4) == ""
    v2 = ch6panel.verdicts({"results": {"outcomes": out["outcomes"]}}, ["tiny-llama"], ["uniform", "star"],
                             out["rows"], same={"tiny-llama": {"star": "why"}})
    assert list(v2.outcome) == ["reproduced", "not tested"] and v2.why[1] == "precondition failed: why"


def test_chapter_8s_repair_on_a_panel_pair_pools_each_restore_over_the_seeds(tmp_path, monkeypatch):
    """`causal.panelrepair.run` on a tiny pair at two seeds: the repair's evaluations (faked: a pass count per
    state) named per seed; `pooled_changes` gives rows in `repair_changes`'s layout that the shared rule reads."""
    import numpy as np

    import sinklib.core.models
    from sinklib.causal import panelrepair, repair
    from sinklib.causal import suites as causal
    from sinklib.core import sink

    monkeypatch.setenv("SINKBOOK_CACHE", str(tmp_path))
    lm = tiny_model("llama", seed=0)
    lm.tokenizer = TOK
    monkeypatch.setattr(sinklib.core.models, "load_model", lambda name, device: lm)
    L, H = 4, 4
    monkeypatch.setattr(sink, "sink_strength", lambda model, prompts, **kw: type("R", (), {
        "mass": np.linspace(0, 1, L * H).reshape(L, H), "S": 0.5})())
    base = {k: v.clone() for k, v in lm.model.state_dict().items()}
    vl_seen = []

    def fake(lm_, heads, *, eval_n, seed, eval_batch_size, tag="", **kw):
        assert eval_n == {"instructions": 0, "math": 0, "knowledge": 2, "perplexity": 0}  # chapter 11's suites
        assert seed == 0 and eval_batch_size == 8  # chapter 11's items and batch, whatever chapter 8's seed
        k = "model.layers.0.self_attn.q_proj.weight"
        w = lm_.model.state_dict()[k]
        if torch.equal(w, base[k]):
            passes = 30 if not tag else 36         # the base; a restore that put layer 0's W_Q back
        else:
            vl_seen.append(tag)
            passes = 20                            # VL and the restores that left layer 0 as adapted
        return {"outcomes": {"instructions strict": [i < passes for i in range(40)]}}

    monkeypatch.setattr(causal, "evaluate", fake)
    from sinklib.evals.paired import pack

    doc = _doc(interim=False)
    doc["results"]["outcomes"] = {"tiny-llama": {"base": pack({"instructions strict": [i < 30 for i in range(40)]}),
                                                 "vl": pack({"instructions strict": [i < 21 for i in range(40)]})}}
    out = panelrepair.run(doc, ["tiny-llama"], [0.25], mass_of=lambda lm_: np.zeros((L, H)), prompts=["a"],
                          last_k_layers=2, max_tokens=8, seed=5)
    assert out["same_as_ch11"] == {"tiny-llama": {"base": True, "vl": False}}  # said on the page when they differ
    names = list(out["outcomes"]["tiny-llama"])
    assert names[:2] == ["base", "vl"] and "sink heads @ 0.25 seed 1" in names and "vl seed 1" in names
    assert len(names) == 1 + 2 * 4 and out["k"] == {"tiny-llama": {0.25: 2}}
    assert {r["seed"] for r in out["described"]} == {0, 1}
    rows = panelrepair.pooled_changes({"results": {"outcomes": out["outcomes"]}}, ["tiny-llama"], [0.25], out["k"],
                                      metrics=["instructions strict"])
    assert list(rows.control) == list(repair.REPAIR_CONTROLS) and set(rows.seeds) == {2}
    assert rows.loss.iloc[0] == -25.0 and rows.loss_hi.iloc[0] < 0      # VL lost 10 of 40 items at both seeds
    assert repair.repair_outcome(rows.to_dict(orient="records"), ["instructions strict"])["lost"] == \
        ["instructions strict"]
