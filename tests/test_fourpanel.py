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
