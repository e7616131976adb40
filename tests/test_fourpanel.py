"""Chapter 11's four-model panel (sinklib.adapt.fourpanel): the frozen recipe read from chapter 10, the job order,
the primary test, and one job on a tiny model in both memory modes (gradient checkpointing gives the same weights;
the low-memory base is read back from disk, never kept)."""
import math

import pytest
import torch

from sinklib import vl
from sinklib.adapt import fourpanel, pairs
from sinklib.core import cache as sk_cache
from sinklib.core.models import tiny_model
from sinklib.errors import ParameterError, ResultsMissing
from tests.test_vl import TOK

RECIPE = {"calibrated_on": "m", "lr_lm": 2e-3, "stage2_steps": 2, "lm_method": "lora", "lora_rank": 4,
          "lora_alpha": 8.0, "lora_targets": ["q_proj", "k_proj", "v_proj", "o_proj"]}


def test_the_recipe_is_chapter_10s_frozen_lora_point():
    method = {k: RECIPE[k] for k in ("lm_method", "lora_rank", "lora_alpha", "lora_targets")}
    doc = {"results": {"lora_method": method, "lora_recipe": {"m": {"lr_lm": 2e-3, "stage2_steps": 2}}}}
    assert fourpanel.frozen_recipe(doc) == RECIPE
    with pytest.raises(ResultsMissing, match="no LoRA recipe"):
        fourpanel.frozen_recipe({"results": {"lora_method": method, "lora_recipe": {"m": None}}})
    with pytest.raises(ParameterError, match="exactly one"):
        fourpanel.frozen_recipe({"results": {"lora_method": method, "lora_recipe": {"a": {"lr_lm": 1, "stage2_steps": 1},
                                                                                    "b": {"lr_lm": 1, "stage2_steps": 1}}}})
    p = fourpanel.panel_params("smollm2-135m", "w", RECIPE, 1, image_size=48, stage1_steps=200, batch_size=32,
                               lr_projector=0.01, schedule="constant")
    assert p["lr_lm"] == p["lr_projector_stage2"] == 2e-3 and p["phrasing"] == "field" and p["lm_method"] == "lora"


def test_jobs_run_the_primary_test_first():
    j = fourpanel.jobs(["a", "b"], [0, 1])
    assert j[:2] == [("a", 0, "vl"), ("b", 0, "vl")]
    assert j[2:4] == [("a", 1, "vl"), ("b", 1, "vl")] and j[4:] == [("a", 0, "text_only"), ("b", 0, "text_only"),
                                                                   ("a", 1, "text_only"), ("b", 1, "text_only")]
    assert fourpanel.jobs(["a", "b"], [0, 1], ["vl"], ["b"])[-1] == ("b", 0, "random")
    with pytest.raises(ParameterError, match="'vl'"):
        fourpanel.jobs(["a"], [0], ["text_only"])


def test_primary_test_is_one_sided_and_says_what_four_models_can_show():
    S = {"a": 0.1, "b": 0.5, "c": 0.9, "d": 1.5}
    t = fourpanel.primary_test(S, {"a": -9.0, "b": -6.0, "c": -3.0, "d": -1.0})   # higher S, less loss
    assert t["rho"] == pytest.approx(1.0) and t["p"] == pytest.approx(1 / 24) and t["p_min"] == pytest.approx(1 / 24)
    assert "only a perfect ordering can reach it" in fourpanel.primary_sentence(t)
    rev = fourpanel.primary_test(S, {"a": -1.0, "b": -3.0, "c": -6.0, "d": -9.0})
    assert rev["rho"] == pytest.approx(-1.0) and rev["p"] == pytest.approx(1.0)
    few = fourpanel.primary_test(S, {"a": 1.0, "b": float("nan")})
    assert few["n"] == 1 and math.isnan(few["rho"]) and fourpanel.primary_sentence(few).startswith("not tested")
    said = fourpanel.primary_sentence(rev, interim=True)                             # both one-sided p, the outcome
    assert said.startswith("interim look, first training seed only: contradicted (one-sided exact p 1.000 in the "
                           "paper's direction and 0.042 against it: the second below 0.05)")
    flat = fourpanel.primary_test(S, {"a": -2.0, "b": -2.0, "c": -2.0, "d": -2.0})  # no ordering: inconclusive
    assert flat["p"] == flat["p_reverse"] == 1.0 and fourpanel.primary_verdict(flat).outcome == "inconclusive"
    assert "the change is the same for every pair" in fourpanel.primary_sentence(flat)


def _run(tmp, monkeypatch, low_memory):
    monkeypatch.setenv("SINKBOOK_CACHE", str(tmp))
    lm = tiny_model("llama", seed=0)
    lm.tokenizer = TOK
    base_sd = vl.clone_state_dict(lm.model)
    params = fourpanel.panel_params("tiny-llama", "random", RECIPE, 1, image_size=48, stage1_steps=2, batch_size=2,
                                    lr_projector=0.01, schedule="constant")
    seen = []

    def fake(lm_, pair, cond, **kw):
        st = pair.states[cond]
        seen.append((cond, pair.projector is not None, kw["vqa_n"], float(st["model.norm.weight"].sum())))
        pair.load_into(lm_.model, "base")
        return {"cond": cond}

    monkeypatch.setattr(pairs, "evaluate_condition", fake)
    base = fourpanel.base_source(lm, params, low_memory=low_memory)
    kw = dict(eval_n={"knowledge": 2}, seed=0, prompts=["a"], sink_kwargs={}, vqa_n=3, eval_batch_size=8)
    out = {k: fourpanel.run_condition(lm, params, k, base, low_memory=low_memory, **kw) for k in fourpanel.KINDS}
    out["base"] = fourpanel.run_base(lm, params, base, low_memory=low_memory, **kw)
    assert all(torch.equal(lm.model.state_dict()[k], v) for k, v in base_sd.items())   # the base again
    snaps = {k: sk_cache.load_state(__import__("sinklib.adapt.dose", fromlist=["x"]).snapshot_dir(params, k, 2),
                                    lm.model) for k in fourpanel.KINDS}
    return out, seen, snaps, base


def test_one_job_in_both_memory_modes_gives_the_same_model(tmp_path, monkeypatch):
    out, seen, snaps, base = _run(tmp_path / "a", monkeypatch, low_memory=False)
    assert out == {"vl": {"cond": "vl step 2"}, "text_only": {"cond": "text_only step 2"}, "base": {"cond": "base"}}
    assert [(c, proj, vqa) for c, proj, vqa, _ in seen] == [("vl step 2", True, 3), ("text_only step 2", False, 0),
                                                           ("base", False, 0)]
    low_out, low_seen, low_snaps, low_base = _run(tmp_path / "b", monkeypatch, low_memory=True)
    assert low_out == out and [s[:3] for s in low_seen] == [s[:3] for s in seen]
    for k in fourpanel.KINDS:   # gradient checkpointing recomputes the same activations: the same weights
        assert all(torch.equal(low_snaps[k][n], snaps[k][n]) for n in snaps[k])
    assert low_base() is not low_base() and base() is base()                      # streamed vs kept
    assert all(torch.equal(low_base()[n], base()[n]) for n in base())


def _ev(instr: int, know: int, n: int = 40, vqa=(0.9, 200), S: float = 0.5) -> dict:
    rows = lambda k: [i < k for i in range(n)]  # noqa: E731
    return {"outcomes": {"instructions strict": rows(instr), "math strict": rows(10), "math lenient": rows(20),
                         "knowledge acc": rows(know)}, "vqa": list(vqa) if vqa else None, "S": S}


def test_the_panel_table_pools_seeds_and_checks_each_pairs_precondition():
    from sinklib.claims import ch11

    panel = {"base": {"a": _ev(30, 30, S=0.9), "b": _ev(30, 30, S=0.1), "c": _ev(30, 30, S=0.5)},
             "evals": {("a", 0, "vl"): _ev(28, 30), ("a", 1, "vl"): _ev(26, 30), ("a", 0, "text_only"): _ev(27, 30, vqa=None),
                       ("b", 0, "vl"): _ev(10, 30), ("b", 1, "vl"): _ev(12, 30),
                       ("c", 0, "vl"): _ev(20, 5), ("c", 1, "vl"): _ev(20, 5, vqa=(0.3, 200))}}
    doc = ch11.outcomes_doc(panel, 0)
    assert set(doc["results"]["outcomes"]["a"]) == {"base", "vl", "vl seed 1", "text_only"}
    rows = ch11.pair_rows(panel, 0, 48).set_index("model")
    assert rows.loc["a", "VL: instructions strict"].v == pytest.approx(-(2 + 4) / 2 / 40 * 100)  # mean over seeds
    assert rows.loc["b", "VL: instructions strict"].hi < 0 and rows.loc["a", "seeds"] == 2
    assert rows.loc["a", "text-only: instructions strict"] is not None and rows.loc["b", "text-only: instructions strict"] is None
    assert rows.loc["a", "VL minus text-only: instructions strict"].v == pytest.approx(2.5)   # seed 0 only has both
    assert rows.loc["a", "precondition"] and rows.loc["b", "precondition"]
    assert not rows.loc["c", "learned"] and not rows.loc["c", "precondition"]   # one seed did not learn; knowledge fell
    t = ch11.primary_of(rows.reset_index())
    assert t["models"] == ["a", "b"] and t["n"] == 2 and t["of"] == 3
    assert fourpanel.primary_sentence(t).startswith("not tested: 2 of 3 pairs pass their preconditions")
    pr = ch11.panel_rows(rows.reset_index(), {"a": "none", "b": "per_head", "c": "none"})
    assert [r["llm"] for r in pr] == ["a", "b"] and pr[0]["source"] == "measured: notebook 11"
    assert pr[0]["delta_instructions_strict"] == pytest.approx(rows.loc["a", "VL: instructions strict"].v)
    shown = ch11.display(rows.reset_index()).frame
    assert shown.loc["in the primary test", "c"] == "no: precondition failed" and "np." not in shown.to_string()
    assert list(shown.columns) == ["a", "b", "c"] and "text-only: instructions strict" in shown.index
    alone = ch11.display(rows.reset_index().assign(**{c: None for c in rows.columns if c.startswith("text-only")}))
    assert not any(i.startswith("text-only") for i in alone.frame.index)   # a control not run: its rows left out
    pt = ch11.primary_table(rows.reset_index(), {"a": 2e-3, "b": 4e-4, "c": 4e-4}, None, "t").frame
    assert list(pt.index) == list(rows.sort_values("S", ascending=False).index) and set(pt.rate) <= {"2e-3", "4e-4"}
    assert "S (chapter 2)" not in pt.columns and pt.loc["c", "in the test"] == "no: precondition failed"
    assert "S (chapter 2)" in ch11.primary_table(rows.reset_index(), {m: 1e-3 for m in "abc"}, {"a": 0.1}, "t").frame



def _random_setup():
    """A fresh tiny model, the pair parameters `_run` trained, two token lists and the evaluation arguments."""
    lm = tiny_model("llama", seed=0)
    lm.tokenizer = TOK
    params = fourpanel.panel_params("tiny-llama", "random", RECIPE, 1, image_size=48, stage1_steps=2, batch_size=2,
                                    lr_projector=0.01, schedule="constant")
    kw = dict(eval_n={"knowledge": 2}, seed=0, prompts=["a"], sink_kwargs={}, vqa_n=3, eval_batch_size=8)
    return lm, params, [[1, 5, 9, 13, 17, 21], [1, 7, 3, 30, 44]], kw


def test_random_control_matches_vl_on_the_kl_yardstick_and_evaluates_there(tmp_path, monkeypatch):
    from sinklib.adapt import isolate

    out, seen, snaps, base = _run(tmp_path, monkeypatch, low_memory=False)   # trains the VL snapshot
    lm, params, seqs, kw = _random_setup()
    r = fourpanel.random_control(lm, params, base, [2.0, 8.0, 32.0, 128.0], seqs=seqs, **kw)
    kl = {c: v["kl"] for c, v in r["kl"].items()}
    assert kl["random"] < kl["vl"] < kl["random x2"]            # this tiny pair: matched between 1x and 2x
    assert 1.0 < r["matched"] < 2.0 and r["size"] == pytest.approx(r["matched"], rel=0.05)
    assert r["evaluation"] == {"cond": isolate.scaled_name(r["size"])}
    assert all(torch.equal(lm.model.state_dict()[k], v) for k, v in base().items())


def test_random_rows_pair_the_matched_control_with_base_and_vl():
    from sinklib.claims import ch11

    panel = {"base": {"a": _ev(30, 30), "b": _ev(30, 30)},
             "evals": {("a", 0, "vl"): _ev(25, 30), ("b", 0, "vl"): _ev(25, 30)},
             "random": {"a": {"kl": {"vl": {"kl": 0.01}}, "size": 6.3, "evaluation": _ev(20, 30)}}}
    t = ch11.random_rows(panel, 0, ["a", "b"]).set_index("model")
    assert t.loc["a", "KL-matched size"] == 6.3 and t.loc["a", "random minus VL: instructions strict"][0] == pytest.approx(-12.5)
    assert t.loc["a", "random minus base: instructions strict"][0] == pytest.approx(-25.0)
    assert t.loc["b", "note"] == "not run in this run" and t.loc["b", "random minus VL: instructions strict"] is None


def test_panelprep_reads_the_chapters_own_parameters(tmp_path):
    """The prepare command runs with the notebook's parameters under the profile: a checkout without chapter 11's
    notebook is a clear error; one with it gives the profile's values over the notebook's."""
    import nbformat

    from sinklib.adapt import panelprep

    with pytest.raises(ParameterError, match="11_four_panel.ipynb not found"):
        panelprep.chapter_params("quick", root=tmp_path)
    cell = nbformat.v4.new_code_cell('models = ["smollm2-135m"]\ndevice = "auto"\nseeds = [0, 1]\nkinds = ["vl"]\n'
                                     'low_memory_models = []\nrandom_scales = []\nimage_size = 48\nstage1_steps = 5\n'
                                     'batch_size = 4\nlr_projector = 0.01\nschedule = "constant"\n'
                                     'lr_lm = "chapter10"\nlr_rule = "recipe-scaled"\ngrid_start = {}\nstopped_models = []\nprimary_only = False\n'
                                     'sensitivity = True\n'
                                     'stage2_steps = 3\nn_prompts = 4\n'
                                     'last_k_layers = 10\n'
                                     'max_tokens = 32\nvqa_n = 16\neval_instructions = 2\neval_math = 2\n'
                                     'eval_knowledge = 8\neval_perplexity = 2\neval_batch_size = 8\n'
                                     'show_progress = False\nprofile = "full"',
                                     metadata={"tags": ["parameters"]})
    (tmp_path / "notebooks").mkdir()
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), tmp_path / "notebooks" / "11_four_panel.ipynb")
    p = panelprep.chapter_params("full", root=tmp_path)
    assert p["seeds"] == [0, 1] and p["lr_lm"] == "chapter10" and p["stage2_steps"] == 3
    assert p["lr_rule"] == "recipe-scaled"


def test_the_random_control_made_in_place_is_random_direction_likes(tmp_path, monkeypatch):
    """sinklib.adapt.inplace: at size 1 the in-place control equals `vl.random_direction_like` exactly, its KLs
    match `yardstick.next_token_kl`, and chapter 11's low-memory random control agrees with the in-memory one."""
    from sinklib.adapt import inplace, isolate
    from sinklib.adapt.yardstick import next_token_kl

    monkeypatch.setenv("SINKBOOK_CACHE", str(tmp_path))
    lm = tiny_model("llama", seed=0)
    base = vl.clone_state_dict(lm.model)
    g = torch.Generator().manual_seed(3)
    adapted = {k: v + 0.01 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v for k, v in base.items()}
    for name, sd in (("b", base), ("a", adapted)):
        lm.model.load_state_dict(sd)
        sk_cache.save_checkpoint(tmp_path / name, lm.model)
    norms = inplace.change_norms(tmp_path / "b", tmp_path / "a")
    lm.model.load_state_dict(base)
    inplace.add_random(lm.model, norms, seed=5)
    want = vl.random_direction_like(base, adapted, seed=5)
    assert all(torch.equal(lm.model.state_dict()[k], want[k]) for k in want)
    seqs = [[1, 5, 9, 13, 17, 21], [1, 7, 3, 30, 44]]
    ref = lambda: lm.model.load_state_dict(base)  # noqa: E731

    def twice():
        ref()
        inplace.add_random(lm.model, norms, seed=5, scale=2.0)

    got = inplace.kl_in_place(lm.model, seqs, {"a": lambda: lm.model.load_state_dict(adapted), "r2": twice},
                              reference=ref, batch_size=1)
    exp = next_token_kl(lm.model, {"base": base, "a": adapted, "r2": vl.scaled_change(base, want, 2.0)}, seqs)
    for n in ("a", "r2"):
        assert got[n]["kl"] == pytest.approx(exp[n]["kl"], rel=1e-4) and got[n]["n_tokens"] == exp[n]["n_tokens"]
    assert all(torch.equal(lm.model.state_dict()[k], v) for k, v in base.items())   # left holding the reference
    with pytest.raises(ParameterError, match="different tensors"):
        (tmp_path / "c").mkdir()
        from safetensors.torch import save_file
        save_file({"x": torch.zeros(2)}, str(tmp_path / "c" / "model.safetensors"))
        inplace.change_norms(tmp_path / "b", tmp_path / "c")


def test_chapter_11s_low_memory_random_control_agrees_with_the_in_memory_one(tmp_path, monkeypatch):
    from sinklib.adapt import isolate

    out, seen, snaps, base = _run(tmp_path, monkeypatch, low_memory=True)   # trains the VL snapshot, saves the base
    lm, params, seqs, kw = _random_setup()
    seen_kw = []
    real = pairs.evaluate_condition

    def spy(lm_, pair, cond, **k):
        seen_kw.append((cond, k.get("key_extra"), k["vqa_n"]))
        return real.__wrapped__(lm_, pair, cond, **k) if hasattr(real, "__wrapped__") else {"cond": cond}

    monkeypatch.setattr(pairs, "evaluate_condition", spy)
    low = fourpanel.random_control_low(lm, params, base, [2.0, 8.0], seqs=seqs, **kw)
    mem_base = fourpanel.base_source(lm, params, low_memory=False)
    mem = fourpanel.random_control(lm, params, mem_base, [2.0, 8.0], seqs=seqs, **kw)
    for n in ("vl", "random", "random x2", "random x8"):
        assert low["kl"][n]["kl"] == pytest.approx(mem["kl"][n]["kl"], rel=1e-3)
    assert low["size"] == mem["size"] and 1.0 < low["matched"] < 2.0
    assert seen_kw[0] == (isolate.scaled_name(low["size"]), {"random": "in place"}, 0)
    assert all(torch.equal(lm.model.state_dict()[k], v) for k, v in base().items())


@pytest.mark.parametrize("low_memory", [False, True])
def test_the_random_control_rebuilds_a_carried_vl_snapshot_instead_of_training(tmp_path, monkeypatch, low_memory):
    """On another machine the VL evaluation is cached and the snapshot is missing: the random control rebuilds the
    snapshot from its LoRA record (`sinklib.adapt.adapters`), never trains, and leaves the base in the model."""
    import shutil

    from sinklib.adapt import dose

    out, seen, snaps, base = _run(tmp_path, monkeypatch, low_memory=low_memory)
    lm, params, seqs, kw = _random_setup()
    d = dose.snapshot_dir(params, "vl", params["stage2_steps"])
    trained = sk_cache.load_state(d, lm.model)
    shutil.rmtree(d)
    monkeypatch.setattr(vl, "train_vl", lambda *a, **k: pytest.fail("trained again"))
    control = fourpanel.random_control_low if low_memory else fourpanel.random_control
    r = control(lm, params, base, [2.0, 8.0], seqs=seqs, **kw)
    assert (d / "rebuilt.json").exists() and 1.0 < r["matched"] < 2.0
    again = sk_cache.load_state(d, lm.model)
    assert all(torch.equal(again[k], trained[k]) for k in trained)
    assert all(torch.equal(lm.model.state_dict()[k], v) for k, v in base().items())


def test_panelprep_can_run_a_part_of_the_panel():
    from sinklib.adapt import panelprep

    p = {"models": ["a", "b", "c"], "seeds": [0, 1], "kinds": ["vl", "text_only"], "random_scales": [4]}
    assert panelprep.subset(p, models=["c", "a"]) == {**p, "models": ["a", "c"]} and panelprep.subset(p) == p
    with pytest.raises(ParameterError, match=r"--models \['d'\] is not among chapter 11's models"):
        panelprep.subset(p, models=["d"])
    assert panelprep.job_filter(p) is None
    keep = panelprep.job_filter(p, seeds=[1])
    assert keep(("a", 1, "vl")) and keep(("a", 1, "text_only")) and not keep(("a", 0, "text_only"))
    keep = panelprep.job_filter(p, kinds=["random", "text_only"])
    assert keep(("a", 0, "random")) and keep(("b", 1, "text_only")) and not keep(("a", 1, "vl"))
    with pytest.raises(ParameterError, match=r"--seeds \[2\] is not among chapter 11's seeds \[0, 1\]"):
        panelprep.job_filter(p, seeds=[2])
    with pytest.raises(ParameterError, match=r"--kinds \['random'\] is not among"):
        panelprep.job_filter({**p, "random_scales": []}, kinds=["random"])


def test_panelprep_can_train_stage_1_alone_for_the_full_job_to_go_on_from(tmp_path, monkeypatch):
    """`--stage1-only` caches stage 1 of the kept VL and random jobs' pairs under the key the full job reads: the
    full job then trains stage 2 only (a job longer than a session, split over two machines by its carried record)."""
    from sinklib.adapt import panelprep, sweep

    monkeypatch.setenv("SINKBOOK_CACHE", str(tmp_path))
    lm = tiny_model("llama", seed=0)
    lm.tokenizer = TOK
    p = {"models": [lm.name], "seeds": [0, 1], "kinds": ["vl", "text_only"], "image_size": 48, "stage1_steps": 2,
         "batch_size": 2, "lr_projector": 0.01, "schedule": "constant", "low_memory_models": [lm.name],
         "show_progress": False, "random_scales": [4.0]}
    calls, train_vl = [], vl.train_vl

    def spy(*a, **k):
        calls.append((k["stage1_steps"], k["stage2_steps"]))
        return train_vl(*a, **k)

    monkeypatch.setattr(vl, "train_vl", spy)
    dirs = panelprep.run_stage1(p, RECIPE, only=panelprep.job_filter(p, seeds=[1]), load=lambda name: lm,
                                log=lambda m: None)
    assert calls == [(2, 0)]                                             # seed 1's stage 1, nothing else
    pp = fourpanel.panel_params(lm.name, lm.weights_sha256, RECIPE, 1, image_size=48, stage1_steps=2, batch_size=2,
                                lr_projector=0.01, schedule="constant", lr=3e-4)   # another stage-2 rate: same key
    assert dirs == [sweep.stage1_dir(pp)] and sk_cache.checkpoint_exists(dirs[0])
    base = fourpanel.base_source(lm, pp, low_memory=True)
    monkeypatch.setattr(pairs, "evaluate_condition", lambda *a, **k: {"ok": True})
    kw = dict(eval_n={"knowledge": 2}, seed=0, prompts=["a"], sink_kwargs={}, vqa_n=3, eval_batch_size=8)
    assert fourpanel.run_condition(lm, pp, "vl", base, low_memory=True, **kw) == {"ok": True}
    assert calls == [(2, 0), (0, 2)]                                     # the full job: stage 2 only
    assert panelprep.run_stage1(p, RECIPE, only=panelprep.job_filter(p, kinds=["random"]), load=lambda name: lm,
                                log=lambda m: None) != dirs and calls[-1] == (2, 0)   # the random job's seed 0


def test_panelprep_says_what_was_wrong_without_a_traceback(monkeypatch, capsys):
    from sinklib.adapt import panelprep
    from sinklib.book import carry

    monkeypatch.setattr(carry, "import_committed", lambda: None)
    monkeypatch.setattr(panelprep, "chapter_params", lambda profile: {"models": ["a"], "seeds": [0, 1],
                                                                       "kinds": ["vl"], "random_scales": []})
    for argv in (["--kinds", "text_only"], ["--primary-only", "--all-jobs"]):
        with pytest.raises(SystemExit) as e:
            panelprep.main(argv)
        assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--kinds ['text_only'] is not among chapter 11's kinds ['vl']" in err and "Traceback" not in err
    assert "not allowed with argument --primary-only" in err


def test_the_chapter_says_where_its_evaluations_ran():
    from sinklib.claims import ch11

    a, b = {"boot": "aaaa1111", "cpu": "EPYC", "cores": 2}, {"boot": "bbbb2222", "cpu": "EPYC", "cores": 2}
    panel = {"base": {"m": {"machine": a}, "n": {}},
             "evals": {("m", 0, "vl"): {"machine": b, "note": {"weights": {"rebuilt from": "LoRA record",
                                                                           "bit_identical": True}}}},
             "random": {"m": {"evaluation": {"machine": a}}, "n": {"evaluation": None}}}
    m = ch11.machines(panel)
    assert m == {"evaluations": 4, "unrecorded": 1, "machines": {"aaaa1111": "EPYC, 2 cores", "bbbb2222": "EPYC, 2 cores"},
                 "rebuilt": ["m 0 vl"], "not bit-identical": []}
    s = ch11.machines_sentence(m)
    assert s.startswith("the 3 evaluations that recorded their machine ran on 2 machines (EPYC, 2 cores); 1 were "
                        "computed before")
    assert "1 read a snapshot trained on another machine and rebuilt or retrained here (m 0 vl), every one bit-identical" in s
    panel["evals"][("m", 0, "vl")]["note"]["weights"]["bit_identical"] = False
    assert "1 of them not bit-identical to the first training: m 0 vl" in ch11.machines_sentence(ch11.machines(panel))
    none = ch11.machines_sentence(ch11.machines({"base": {"m": {}}, "evals": {}, "random": {}}))
    assert none.startswith("the 1 evaluations do not record their machine") and "recorded its machine read" in none


def test_a_job_evaluated_from_a_rebuilt_snapshot_says_so(tmp_path, monkeypatch):
    import shutil

    from sinklib.adapt import dose

    out, seen, snaps, base = _run(tmp_path, monkeypatch, low_memory=False)   # trained here: no note
    lm, params, seqs, kw = _random_setup()
    notes = []
    monkeypatch.setattr(pairs, "evaluate_condition", lambda lm_, pair, cond, **k: notes.append(k.get("note")) or {})
    fourpanel.run_condition(lm, params, "vl", base, **kw)
    shutil.rmtree(dose.snapshot_dir(params, "vl", params["stage2_steps"]))  # as on the next machine
    fourpanel.run_condition(lm, params, "vl", base, **kw)
    assert notes == [None, {"weights": {"rebuilt from": "LoRA record", "bit_identical": True}}]


def test_the_amended_rate_rule_scales_only_the_models_with_a_recipe_rate_of_their_own():
    rec = {**RECIPE, "calibrated_on": "smollm2-135m", "lr_lm": 2e-3}
    assert fourpanel.model_rate("gemma3-270m", rec) == 2e-3                                  # pre-registered
    assert fourpanel.model_rate("gemma3-270m", rec, "recipe-scaled") == pytest.approx(4e-4)  # 1e-5 / 5e-5 of it
    for m in ("smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"):
        assert fourpanel.model_rate(m, rec, "recipe-scaled") == 2e-3
        kw = dict(image_size=48, stage1_steps=200, batch_size=32, lr_projector=0.01, schedule="constant")
        assert (fourpanel.panel_params(m, "w", rec, 0, **kw) ==
                fourpanel.panel_params(m, "w", rec, 0, **kw, lr_rule="recipe-scaled"))     # the same jobs and keys
    g = fourpanel.panel_params("gemma3-270m", "w", rec, 0, image_size=48, stage1_steps=200, batch_size=32,
                               lr_projector=0.01, schedule="constant", lr_rule="recipe-scaled")
    assert g["lr_lm"] == g["lr_projector_stage2"] == pytest.approx(4e-4)
    assert fourpanel.model_rate("gemma3-270m", {**rec, "calibrated_on": None}, "recipe-scaled") == 2e-3
    with pytest.raises(ParameterError, match="lr_rule"):
        fourpanel.model_rate("m", rec, "scaled")


def test_a_pair_left_out_says_why_with_its_numbers():
    from sinklib.claims import ch11
    from sinklib.stats.verdicts import Est

    row = {"model": "g", "VQA": 34.5, "majority": 38.0, "learned": False, "VL: knowledge acc": Est(-33.0, -38.7, -27.7)}
    assert ch11.precondition_sentence(row) == ("g: VQA 34.5 % against the blind majority's 38.0 % (not learned); "
                                               "knowledge -33.0 [-38.7, -27.7] points (fell)")
    ok = {**row, "learned": True, "VQA": 55.0, "VL: knowledge acc": Est(5.0, 1.3, 8.7)}
    assert ch11.precondition_sentence(ok).endswith("(learned at every seed); knowledge +5.0 [+1.3, +8.7] points (held)")


def test_the_stopped_designs_say_what_the_frozen_rate_cost_the_qwen_model():
    """The design box quotes Qwen2.5-Coder-0.5B's knowledge and strict instruction changes at the frozen rate (both
    seen before the second amendment) from the pre-registered design's rows; a profile without them says so."""
    import pandas as pd

    from sinklib.claims import ch11
    from sinklib.stats.verdicts import Est

    rec = {**RECIPE, "calibrated_on": "smollm2-135m", "lr_lm": 2e-3}
    frozen = pd.DataFrame([{"model": "qwen2.5-coder-0.5b", "S": -0.5, "precondition": False, "VQA": 30.0,
                            "majority": 38.0, "learned": False, "VL: knowledge acc": Est(-30.0, -35.0, -25.0),
                            "VL: " + fourpanel.PRIMARY: Est(-27.2, -31.0, -23.4)}])
    out = ch11.stopped_texts({"frozen": frozen}, rec)
    assert out["p11_qwen_knowledge"] == "30.0" and out["p11_qwen_strict"] == "-27.2 [-31.0, -23.4] points"
    assert out["p11_gemma_knowledge"].startswith("many") and out["p11_primary_am1"] == "not run in this profile"
    assert ch11.stopped_texts({}, rec)["p11_qwen_strict"] == "not measured in this profile"


def test_the_rate_grid_steps_by_a_fifth_and_its_second_rate_is_the_first_amendments():
    from sinklib.adapt import ratechoice

    rec = {**RECIPE, "calibrated_on": "smollm2-135m", "lr_lm": 2e-3}
    grid = ratechoice.rate_grid(rec)
    assert grid[0] == 2e-3 and grid == sorted(grid, reverse=True) and len(grid) == ratechoice.GRID_POINTS
    assert grid[1] == fourpanel.model_rate("gemma3-270m", rec, "recipe-scaled")   # the same float: the same job
    assert grid[2] == pytest.approx(8e-5)
    kw = dict(image_size=48, stage1_steps=200, batch_size=32, lr_projector=0.01, schedule="constant")
    assert (fourpanel.panel_params("gemma3-270m", "w", rec, 0, **kw, lr_rule="recipe-scaled") ==
            fourpanel.panel_params("gemma3-270m", "w", rec, 0, **kw, lr_rule="precondition-chosen", lr=grid[1]))
    with pytest.raises(ParameterError, match="chosen by running it"):
        fourpanel.model_rate("m", rec, "precondition-chosen")
    assert grid[:2] == [0.002, 0.00039999999999999996]          # frozen literals: not read from vl.MODEL_RATES
    assert {fourpanel.model_rate(m, rec, "common-rate") for m in fourpanel.MODELS} == {grid[1]}  # sensitivity
    assert ratechoice.common_rate(rec) == grid[ratechoice.COMMON_INDEX]
    assert ratechoice.check_grid_start("g", {"m": 1}) == {"m": 1}
    with pytest.raises(ParameterError, match="grid indices"):
        ratechoice.check_grid_start("g", [1])
    with pytest.raises(ParameterError, match=r"g\['m'\]"):
        ratechoice.check_grid_start("g", {"m": 3})


def test_the_walk_keeps_the_first_rate_that_passes_the_preconditions_blind_to_format():
    from sinklib.adapt import ratechoice

    base, broken, fine = _ev(30, 30), _ev(30, 5, vqa=(0.3, 200)), _ev(2, 30)   # fine: learned, knowledge held
    seen = []

    def run_at(rate):
        seen.append(rate)
        return base, broken if rate > 1e-3 else fine

    t = ratechoice.walk("m", RECIPE, run_at, seed=0, image_size=48)
    assert seen == ratechoice.rate_grid(RECIPE)[:2] and [x["passes"] for x in t] == [False, True]
    assert ratechoice.chosen(t) == seen[1]            # chosen although its format fell by 70 points
    seen.clear()
    t = ratechoice.walk("m", RECIPE, lambda r: (seen.append(r), (base, broken))[1], seed=0, image_size=48, start=1)
    assert seen == ratechoice.rate_grid(RECIPE)[1:] and ratechoice.chosen(t) is None
    rows = ratechoice.walk_rows({"m": t}, 0, 48)
    assert [r["passes"] for r in rows] == ["no", "no"] and all(r["chosen"] == "" for r in rows)
    assert rows[0]["learned"] == "no" and rows[0]["knowledge change (pt)"].startswith("-62.5")


def test_the_panel_walks_each_models_rate_and_runs_its_other_jobs_at_the_chosen_one(monkeypatch):
    """run_panel under 'precondition-chosen': a model's first VL job walks the grid from its start, its other
    jobs run at the chosen rate, and a model with no passing rate runs nothing else."""
    import sinklib.core.data
    import sinklib.core.models

    class LM:
        def __init__(self, name):
            self.name, self.weights_sha256, self.qk_norm, self.model = name, "w", "none", None

    ran = []
    monkeypatch.setattr(sinklib.core.models, "load_model", lambda name, device: LM(name))
    monkeypatch.setattr(sinklib.core.data, "load_prompts", lambda n, seed: ["a"])
    monkeypatch.setattr(fourpanel, "_eval_kwargs", lambda lm, p, prompts: {})
    monkeypatch.setattr(fourpanel, "base_source", lambda lm, pp, low_memory: (lambda: {}))
    keyed = []

    def run_base(lm, pp, base, low_memory, key_rate=None, **kw):
        keyed.append(key_rate)
        return _ev(30, 30)

    monkeypatch.setattr(fourpanel, "run_base", run_base)

    def run_condition(lm, pp, kind, base, low_memory, progress, **kw):
        ran.append((lm.name, pp["seed"], kind, pp["lr_lm"]))
        ok = lm.name == "a" and pp["lr_lm"] < 1e-3
        return _ev(20, 30) if ok else _ev(20, 5, vqa=(0.3, 200))

    monkeypatch.setattr(fourpanel, "run_condition", run_condition)
    p = {"models": ["a", "b"], "seeds": [0, 1], "kinds": ["vl"], "random_scales": [], "low_memory_models": [],
         "lr_rule": "precondition-chosen", "grid_start": {"b": 1}, "n_prompts": 1, "device": "cpu",
         "image_size": 48, "stage1_steps": 2, "batch_size": 2, "lr_projector": 0.01, "schedule": "constant",
         "show_progress": False}
    from sinklib.adapt import ratechoice

    g = ratechoice.rate_grid(RECIPE)
    out = fourpanel.run_panel(p, RECIPE)
    assert keyed and set(keyed) == {RECIPE["lr_lm"]}  # one base evaluation per model, whatever rate is tried
    assert ran == [("a", 0, "vl", g[0]), ("a", 0, "vl", g[1]), ("b", 0, "vl", g[1]), ("b", 0, "vl", g[2]),
                   ("a", 1, "vl", g[1])]                                    # b passed nowhere: no seed-1 job
    assert ratechoice.chosen(out["walks"]["a"]) == g[1] and ratechoice.chosen(out["walks"]["b"]) is None
    assert out["params"][("a", 1)]["lr_lm"] == g[1] and set(out["evals"]) == {("a", 0, "vl"), ("b", 0, "vl"),
                                                                              ("a", 1, "vl")}
    # a part of the panel (panelprep --seeds 1 --kinds text_only): the first seed's VL jobs, the rate walks,
    # still come first, at seed 0, and only the kept jobs follow
    from sinklib.adapt import panelprep

    ran.clear()
    p = {**p, "kinds": ["vl", "text_only"]}
    fourpanel.run_panel(p, RECIPE, only=panelprep.job_filter(p, seeds=[1], kinds=["text_only"]))
    assert ran == [("a", 0, "vl", g[0]), ("a", 0, "vl", g[1]), ("b", 0, "vl", g[1]), ("b", 0, "vl", g[2]),
                   ("a", 1, "text_only", g[1])]
    ran.clear()
    fourpanel.run_panel(p, RECIPE, primary_only=True, only=lambda job: True)  # the primary test's jobs only
    assert [r[1:3] for r in ran] == [(0, "vl")] * 4


def test_the_primary_tests_outcome_is_decided_by_the_books_one_rule():
    S = {"a": 0.1, "b": 0.5, "c": 0.9, "d": 1.5}
    up, down = {"a": -9.0, "b": -6.0, "c": -3.0, "d": -1.0}, {"a": -1.0, "b": -3.0, "c": -6.0, "d": -9.0}
    assert fourpanel.primary_verdict(fourpanel.primary_test(S, up)).outcome == "reproduced"
    t = fourpanel.primary_test(S, down)
    assert t["p_reverse"] == pytest.approx(1 / 24) and fourpanel.primary_verdict(t).outcome == "contradicted"
    swap = fourpanel.primary_test(S, {"a": -9.0, "b": -3.0, "c": -6.0, "d": -1.0})
    assert fourpanel.primary_verdict(swap).outcome == "inconclusive"
    three = fourpanel.primary_test({"a": 0.1, "b": 0.5, "c": 0.9}, {"a": -9.0, "b": -6.0, "c": -3.0})
    assert three["p"] == pytest.approx(1 / 6) and fourpanel.primary_verdict(three).outcome == "inconclusive"
    few = {**fourpanel.primary_test(S, {"a": 1.0}), "of": 4}
    v = fourpanel.primary_verdict(few)
    assert v.outcome == "not tested" and v.why.startswith("1 of 4 pairs pass")


def test_the_chapter_ends_with_its_findings_in_words():
    from sinklib.claims import ch11

    panel = {"base": {"a": _ev(30, 30, S=0.9), "b": _ev(30, 30, S=0.1), "c": _ev(30, 30, S=0.5)},
             "evals": {("a", 0, "vl"): _ev(20, 30), ("b", 0, "vl"): _ev(30, 30), ("c", 0, "vl"): _ev(20, 5)}}
    rows = ch11.pair_rows(panel, 0, 48)
    text = ch11.findings(rows, ch11.primary_of(rows), {"a": 2e-3, "b": 4e-4, "c": None}, interim=True)
    lines = text.splitlines()
    assert lines[0].startswith("- **Does a higher base S go with a smaller VL loss of strict instruction format?** "
                               "The panel could not ask it") and "interim look" in lines[0]
    assert lines[1].startswith("- The primary test: not tested: 2 of 3 pairs pass")
    assert [ln.split(" ")[1] for ln in lines[2:5]] == ["a", "c", "b"]                 # in order of base S
    assert "at rate 2e-3: strict instructions -25.0 [" in lines[2] and "(a loss beyond the paired noise)" in lines[2]
    assert "at no rate of the grid" in lines[3] and "left out (c: VQA" in lines[3]
    assert ("fine-tuning in the VL recipe lowered strict format beyond the item-level paired noise in 1 of the 2 "
            "tested pairs (a) (against the base model: whether the image or the fine-tuning itself costs it waits "
            "for the text-only control)") in lines[5]
    assert "prediction 6's (at most two) held; prediction 2 (at least three of four, least in the 1.5B model) was " \
           "written for the frozen rate and cannot be judged as written; at the chosen rates it would have failed" in lines[5]
    assert "prediction 3 (the primary test inconclusive) could not be judged (the test did not run)" in lines[5]
    assert text.count("pass their preconditions") == 1                               # said once
    three = {**panel, "base": {**panel["base"], "c": _ev(30, 30, S=0.5)}, "evals": {**panel["evals"],
                                                                               ("c", 0, "vl"): _ev(29, 30)}}
    r3 = ch11.pair_rows(three, 0, 48)
    t3 = ch11.findings(r3, ch11.primary_of(r3), {"qwen2.5-coder-0.5b": 4e-4}, second_rate=4e-4,
                       sensitivity=(r3, ch11.primary_of(r3)))
    assert "is not judged: with 3 pairs no ordering can reach p < 0.05" in t3             # 1/6: it could not fail
    assert "The rates chosen (qwen2.5-coder-0.5b 4e-4) agree with prediction 6's (both at 4e-4)." in t3
    assert "Predictions 4 and 5 (the text-only and the random control) are not judged" in t3   # no control ran
    assert t3.splitlines()[-1].startswith("- **Sensitivity analysis** (every model at one rate): inconclusive")
    assert "a, the highest-S model, at that rate: strict instructions -25.0" in t3 and t3.endswith("failed.")
    p1 = ch11.findings(r3, ch11.primary_of(r3), frozen=rows)
    assert "Prediction 1 (every model learns the image task and keeps its knowledge) failed at the frozen rate (c did " \
           "not;" in p1 and "at the rates this design chose, 3 of 3 pairs passed" in p1
    none = ch11.findings(rows[rows.model == "c"], ch11.primary_of(rows[rows.model == "c"]))
    assert none.splitlines()[-2].startswith("- No pair passed its preconditions, so predictions 2, 3 and 6")


def test_the_base_evaluation_is_keyed_at_the_frozen_rate_whatever_rate_is_tried(tmp_path, monkeypatch):
    """run_base(key_rate=...): the base model's cache key carries the recipe's rate, not the walk's, so a model
    walked over two rates is evaluated once as base; without key_rate the pair's own rate keys it."""
    import sinklib.adapt.pairs

    seen = []
    monkeypatch.setattr(sinklib.adapt.pairs, "evaluate_condition", lambda lm, pair, cond, **kw: seen.append(
        (pair.params["lr_lm"], pair.params["lr_projector_stage2"])) or {})
    pp = fourpanel.panel_params("m", "w", RECIPE, 0, image_size=48, stage1_steps=2, batch_size=2, lr_projector=0.01,
                                schedule="constant", lr=4e-4)
    fourpanel.run_base(None, pp, lambda: {}, key_rate=RECIPE["lr_lm"])
    fourpanel.run_base(None, pp, lambda: {})
    assert seen == [(RECIPE["lr_lm"], RECIPE["lr_lm"]), (4e-4, 4e-4)]
    assert pp["lr_lm"] == 4e-4  # the pair's own parameters are not changed


def test_the_recipe_comes_from_chapter_10_or_from_numbers_when_chapter_10_froze_none():
    """recipe_of: chapter 10's frozen recipe with numbers replacing its values; after a chapter 10 run that froze
    nothing (its quick profile) numbers stand alone, and "chapter10" is a clear error."""
    method = {k: RECIPE[k] for k in ("lm_method", "lora_rank", "lora_alpha", "lora_targets")}
    doc = {"results": {"lora_method": method, "lora_recipe": {"m": {"lr_lm": 2e-3, "stage2_steps": 2}}}}
    assert fourpanel.recipe_of(doc, "chapter10", 7) == {**RECIPE, "stage2_steps": 7}
    empty = {"results": {"lora_method": method, "lora_recipe": {"m": None}}}
    alone = fourpanel.recipe_of(empty, 1e-3, 3)
    assert alone["calibrated_on"] is None and alone["lr_lm"] == 1e-3 and alone["stage2_steps"] == 3
    with pytest.raises(ResultsMissing, match="froze no LoRA recipe"):
        fourpanel.recipe_of(empty, "chapter10", 3)


def test_a_rerun_of_chapter_10_that_chooses_another_point_does_not_change_the_panels_recipe():
    """The panel ran on the registered recipe; chapter 10 rerun on SmolLM2 (another CPU's rounding can move its
    paired intervals) may freeze another point: the recipe stays the registered one and the drift is said. A
    chapter 10 calibrated on another model (a Colab design) is that design's recipe."""
    reg = fourpanel.REGISTERED_RECIPE
    method = {k: reg[k] for k in ("lm_method", "lora_rank", "lora_alpha", "lora_targets")}
    same = {"results": {"lora_method": method, "lora_recipe": {"smollm2-135m": {"lr_lm": 2e-3, "stage2_steps": 60}}}}
    assert fourpanel.recipe_drift(same) == "" and fourpanel.recipe_of(same, "chapter10", "chapter10") == reg
    moved = {"results": {"lora_method": method, "lora_recipe": {"smollm2-135m": {"lr_lm": 5e-4, "stage2_steps": 60}}}}
    assert fourpanel.recipe_of(moved, "chapter10", "chapter10") == reg
    assert fourpanel.recipe_drift(moved) == ("chapter 10's rerun now freezes another point for smollm2-135m: lr_lm "
                                             "0.0005 (registered: 0.002); the panel keeps the registered recipe, on "
                                             "which all its jobs ran")
    other = {"results": {"lora_method": method, "lora_recipe": {"Qwen/Qwen3-0.6B": {"lr_lm": 5e-4, "stage2_steps": 60}}}}
    assert fourpanel.recipe_drift(other) == "" and fourpanel.recipe_of(other, "chapter10", "chapter10")["lr_lm"] == 5e-4
    assert fourpanel.recipe_drift(None) == ""


def test_the_orderings_of_s_within_chapter_2s_noise_bound_the_test():
    """s_orderings keeps the order of every pair whose S margin never flipped in chapter 2 and lets the others
    swap; ordering_sentence gives the range of rho and the outcomes over them (the reviewer's recomputation of
    chapter 11's main design: rho from -1.00 to -0.20, one ordering contradicted)."""
    import pandas as pd

    from sinklib.claims import ch11
    from sinklib.stats.verdicts import Est

    S = {"a": 0.7, "b": 0.0, "c": -0.09, "d": -0.10}
    flips = {("b", "c"): 6, ("b", "d"): 11, ("c", "d"): 17}
    margins = [{"a": x, "b": y, "cells": 25, "sign flips": flips.get((x, y), 0)}
               for i, x in enumerate(S) for y in list(S)[i + 1:]]
    orders = ch11.s_orderings(S, margins)
    assert len(orders) == 6 and all(o[0] == "a" for o in orders)
    margins[0]["sign flips"] = 1  # a and b may swap too
    assert len(ch11.s_orderings(S, margins)) == 8   # a still above c and d
    margins[0]["sign flips"] = 0
    change = {"a": -5.0, "b": 0.3, "c": -3.9, "d": -0.3}
    rows = pd.DataFrame({"model": list(S), "S": list(S.values()), "precondition": True,
                         "VL: " + fourpanel.PRIMARY: [Est(change[m], -1, 1) for m in S]})
    text = ch11.ordering_sentence(rows, margins)
    assert "over the 6 orderings of S they allow, rho ranges from -1.00 to -0.20" in text
    assert "inconclusive in 5, contradicted in 1" in text
    assert "c above d, the order measured, holds in only 8 of 25 (N, seed) cells" in text
    assert "b above d, the order measured, holds in 14 of 25" in text
    assert ch11.ordering_sentence(rows.iloc[:2], margins).startswith("not computed")
    assert ch11.ordering_sentence(rows, margins, name_flips=False).startswith("over the 6 orderings")


def test_the_calibration_models_change_here_is_set_beside_chapter_10s():
    import pandas as pd

    from sinklib.claims import ch11
    from sinklib.stats.verdicts import Est

    p = {"lr_lm": 2e-3, "steps": 60, "VQA": 68.5, fourpanel.PRIMARY: -11.4, fourpanel.PRIMARY + " lo": -16.1,
         fourpanel.PRIMARY + " hi": -6.9}
    doc10 = {"results": {"lora_sweep": {"m": [dict(p, lr_lm=5e-4), p]}}}
    rows = pd.DataFrame({"model": ["m"], "VQA": [55.0], "VL: " + fourpanel.PRIMARY: [Est(-5.0, -9.2, -0.8)]})
    text = ch11.calibration_sentence(doc10, rows, {"calibrated_on": "m", "lr_lm": 2e-3, "stage2_steps": 60})
    assert "(rate 2e-3, 60 steps) changed strict instructions by -11.4 [-16.1, -6.9] points in chapter 10" in text
    assert "by -5.0 [-9.2, -0.8] here (VQA 55.0 %)" in text
    assert ch11.calibration_sentence(doc10, rows, {"calibrated_on": "m", "lr_lm": 1e-3, "stage2_steps": 60}) == ""


def test_the_summary_says_which_losses_stay_outside_the_noise_by_instruction_type():
    from sinklib.claims import ch11
    from sinklib.stats.verdicts import Est

    panel = {"base": {"a": _ev(30, 30, S=0.9), "b": _ev(30, 30, S=0.1), "c": _ev(30, 30, S=0.5)},
             "evals": {("a", 0, "vl"): _ev(20, 30), ("b", 0, "vl"): _ev(30, 30), ("c", 0, "vl"): _ev(29, 30)}}
    rows = ch11.pair_rows(panel, 0, 48)
    plain = ch11.short_summary(rows, ch11.primary_of(rows), {})
    assert "instruction types" not in plain
    typed = ch11.short_summary(rows, ch11.primary_of(rows), {}, by_type={"a": Est(-25.0, -40.0, 2.0)})
    assert ("Resampling the suite's instruction types instead of its items (when a model changes, the items of one "
            "type tend to change together), this loss does not stay outside the noise (a -25.0 [-40.0, +2.0]).") in typed
    nan = float("nan")
    assert "instruction types" not in ch11.short_summary(rows, ch11.primary_of(rows), {},
                                                         by_type={"a": Est(-25.0, nan, nan)})
    assert typed.index("Resampling") < typed.index(plain.split(". ")[1][:20])   # right after the losses
    text = ch11.findings(rows, ch11.primary_of(rows), by_type="a sentence")
    assert text.splitlines()[-1] == ("- **Items or instruction types** (a check added after the interim look; it "
                                     "changes no verdict): a sentence.")
    led = ch11.findings(rows, ch11.primary_of(rows), typed={"a": Est(-25.0, -40.0, 2.0)}, orderings="an order")
    assert ("fine-tuning in the VL recipe, with the instruction types resampled, lowered strict format beyond the "
            "noise in 0 of 1 tested pairs; item by item it lowered strict format beyond the item-level paired noise "
            "in 1 of the 3 tested pairs (a)") in led                        # the type-resampled count comes first
    assert led.splitlines()[-1] == ("- **How firm the order by S is** (a description: the rule reads S as measured): "
                                    "an order.")


def test_pair_records_store_changes_as_lists():
    import pandas as pd

    from sinklib.claims import ch11
    from sinklib.stats.verdicts import Est

    rows = pd.DataFrame([{"model": "a", "VL: x": Est(-1.0, -2.0, 0.5), "precondition": True}])
    assert ch11.records(rows) == [{"model": "a", "VL: x": [-1.0, -2.0, 0.5], "precondition": True}]
    assert ch11.rows_of(ch11.records(rows)).loc[0, "VL: x"] == Est(-1.0, -2.0, 0.5)


def test_the_controls_judge_predictions_4_and_5_once_they_have_run():
    """Prediction 4 held with three contrasts in the noise, failed when too few can still be, not judged while the
    missing controls could decide it; the text-only control's math says whether the format or more was lost;
    prediction 5 fails where the matched random change costs more than VL beyond the noise."""
    from sinklib.claims import ch11

    def ev(instr, math_s=10, math_l=20, vqa=(0.9, 200)):
        e = _ev(instr, 30, vqa=vqa)
        e["outcomes"].update({"math strict": [i < math_s for i in range(40)],
                              "math lenient": [i < math_l for i in range(40)]})
        return e

    base = {m: _ev(30, 30, S=s) for m, s in zip("abcd", (0.9, 0.5, 0.1, -0.1))}
    vl = {(m, 0, "vl"): ev(28) for m in "abcd"}
    to = {("a", 0, "text_only"): ev(10, 0, 19), ("b", 0, "text_only"): ev(28, 0, 2), ("c", 0, "text_only"): ev(29)}
    rows = ch11.pair_rows({"base": base, "evals": {**vl, **to}}, 0, 48)
    text = ch11.findings(rows, ch11.primary_of(rows))
    p4 = next(ln for ln in text.splitlines() if ln.startswith("- **Prediction 4**"))
    assert "is not judged yet (3 of the 4 models that can run it have)" in p4      # d could still make it three
    assert "within the noise in 2 (b, c); the text-only control cost more in 1 (a), VL more in 0 (none)" in p4
    assert "Predictions 4 and 5 (the text-only and the random control) are not judged" not in text
    m = next(ln for ln in text.splitlines() if ln.startswith("- **The text-only control and math**"))
    assert "a: strict -25.0 [" in m and "lenient math held, so what it lost is the answer format" in m
    assert "b: strict -25.0 [" in m and "lenient math fell too, so it lost right answers, not only their format" in m
    assert "c: strict 0.0 [0.0, 0.0], lenient 0.0 [0.0, 0.0] points (neither fell beyond the noise)" in m
    four = ch11.pair_rows({"base": base, "evals": {**vl, **to, ("d", 0, "text_only"): ev(10)}}, 0, 48)
    assert "(the text-only control costs strict instruction format about as much as VL: VL minus text-only " \
           "contains zero in at least three models) failed:" in ch11.findings(four, ch11.primary_of(four))
    held = ch11.pair_rows({"base": base, "evals": {**vl, **to, ("d", 0, "text_only"): ev(27)}}, 0, 48)
    assert "at least three models) held:" in ch11.findings(held, ch11.primary_of(held))
    gone = rows.assign(precondition=[True, True, True, False])   # d passed no rate: it runs no control
    assert "at least three models) failed:" in ch11.findings(gone, ch11.primary_of(gone))
    panel = {"base": base, "evals": vl, "random": {"a": {"kl": {"vl": {"kl": 0.01}}, "size": 6.3,
                                                         "evaluation": _ev(12, 30)},
                                                   "b": {"kl": {"vl": {"kl": 0.02}}, "size": 2.0,
                                                         "evaluation": _ev(28, 30)}}}
    rnd = ch11.random_rows(panel, 0, list("abcd"))
    t5 = ch11.findings(held, ch11.primary_of(held), rnd=rnd)
    p5 = next(ln for ln in t5.splitlines() if ln.startswith("- **Prediction 5**"))
    assert "failed: random minus VL of strict instructions, at the first training seed" in p5
    assert "beyond the noise below zero in 1 (a); no matched evaluation for c, d" in p5
    both = ch11.random_rows({**panel, "random": {m: panel["random"]["b"] for m in "abcd"}}, 0, list("abcd"))
    assert "costs strict format no more than VL) held:" in ch11.findings(held, ch11.primary_of(held), rnd=both)
    only_b = ch11.random_rows({**panel, "random": {"b": panel["random"]["b"]}}, 0, list("abcd"))
    assert "is not judged yet (waiting for a, c, d)" in ch11.findings(held, ch11.primary_of(held), rnd=only_b)
    out_acd = held.assign(precondition=[False, True, False, False])   # pairs that passed no rate run no control
    assert "costs strict format no more than VL) held:" in ch11.findings(out_acd, ch11.primary_of(out_acd), rnd=only_b)
