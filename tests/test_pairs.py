"""Adapted pairs are trained once and then loaded from the cache; evaluations are cached too."""
from pathlib import Path

import pytest
import torch

from sinklib import cache as sk_cache
from sinklib import pairs, vl
from sinklib.errors import ParameterError, ResultsMissing
from sinklib.models import tiny_model
from tests.test_vl import TOK


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SINKBOOK_CACHE", str(tmp_path))
    return tmp_path


def _params():
    return pairs.pair_params("tiny-llama", seed=1, stage1_steps=2, stage2_steps=2, batch_size=2, weights="random")


def test_build_then_load_from_cache(cache):
    lm = tiny_model("llama", seed=0)
    lm.tokenizer = TOK
    base = vl.clone_state_dict(lm.model)
    p = pairs.build_pair(lm, _params(), progress=False)
    assert p.trained_now == {"vl": True, "text_only": True}
    assert set(p.states) == set(pairs.CONDITIONS)
    for k, v in base.items():  # the model holds the base weights again
        assert torch.equal(lm.model.state_dict()[k], v)
    assert not torch.equal(p.states["vl"]["model.layers.0.self_attn.q_proj.weight"], base["model.layers.0.self_attn.q_proj.weight"])
    # per-tensor norm of the random change equals that of the VL change
    k = "model.layers.1.mlp.up_proj.weight"
    dv = float((p.states["vl"][k] - base[k]).norm())
    dr = float((p.states["random"][k] - base[k]).norm())
    assert dr == pytest.approx(dv, rel=1e-4)
    again = pairs.load_pair(lm, _params())
    assert again.trained_now == {"vl": False, "text_only": False}
    for cond in ("vl", "text_only"):
        for key in p.states[cond]:
            assert torch.equal(p.states[cond][key], again.states[cond][key])
    assert again.logs["vl"]["budget"] == p.logs["vl"]["budget"]


def test_load_pair_names_the_notebook_when_missing(cache):
    lm = tiny_model("llama", seed=0)
    lm.tokenizer = TOK
    with pytest.raises(ResultsMissing, match="04_vl_adaptation"):
        pairs.load_pair(lm, _params())


def test_one_recipe_for_pairs_trainings_and_chapter_4():
    """sinklib.vl.RECIPE is the one definition: pair defaults, training defaults, chapter 4's parameters."""
    import ast
    import inspect

    import nbformat

    p = pairs.pair_params("m")
    assert {k: p[k] for k in vl.RECIPE} == vl.RECIPE
    sig = inspect.signature(vl.train_vl).parameters
    assert {k: sig[k].default for k in vl.RECIPE} == vl.RECIPE
    sig = inspect.signature(vl.train_text_only).parameters
    assert (sig["steps"].default, sig["lr"].default) == (vl.RECIPE["stage2_steps"], vl.RECIPE["lr_lm"])
    nb = nbformat.read(Path(__file__).parent.parent / "notebooks" / "04_vl_adaptation.ipynb", as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    values = {t.targets[0].id: ast.literal_eval(t.value) for t in ast.parse(cell.source).body
              if isinstance(t, ast.Assign)}
    assert {k: values[k] for k in vl.RECIPE} == vl.RECIPE


def test_vqa_items_are_held_out_and_fixed():
    a, b = vl.heldout_items(20, seed=0), vl.heldout_items(20, seed=0)
    assert [(x.question, x.answer) for x in a] == [(x.question, x.answer) for x in b]
    train = vl.batch_items(0, 20, seed=0, tag="lm")
    assert [x.question for x in a] != [x.question for x in train]


def test_bad_pair_parameters():
    with pytest.raises(ParameterError, match="stage2_steps"):
        pairs.pair_params("m", stage2_steps=0)
    with pytest.raises(ParameterError, match="lr_lm"):
        pairs.pair_params("m", lr_lm="fast")
    with pytest.raises(ParameterError, match="schedule"):
        pairs.pair_params("m", schedule="linear")
    # the schedule is part of the checkpoint key: a cosine pair never loads a constant one
    a, b = pairs.pair_params("m"), pairs.pair_params("m", schedule="cosine")
    assert pairs.condition_dir(a, "vl") != pairs.condition_dir(b, "vl")
    # stage 2's projector rate is explicit in the key: None means "keep stage 1's rate"
    assert pairs.pair_params("m", lr_projector=0.02, lr_projector_stage2=None)["lr_projector_stage2"] == 0.02
    assert pairs.pair_params("m", lr_projector=0.02, lr_lm=1e-5, lr_projector_stage2=1e-5)["lr_projector_stage2"] == 1e-5
    with pytest.raises(ParameterError, match="lr_projector_stage2"):
        pairs.pair_params("m", lr_projector_stage2=-1.0)
    with pytest.raises(ParameterError, match="kind"):
        pairs.condition_dir(_params(), "random")


def test_cached_json_computes_once(cache):
    calls = []

    def compute():
        calls.append(1)
        return {"x": 1.5}

    assert sk_cache.cached_json({"a": 1}, compute) == {"x": 1.5}
    assert sk_cache.cached_json({"a": 1}, compute) == {"x": 1.5}
    assert sk_cache.cached_json({"a": 2}, compute) == {"x": 1.5}
    assert len(calls) == 2
