"""Training seeds: chapter 4's conditions retrained with other seeds, paired against one base (sinklib.adapt.seeds)."""
import numpy as np
import pytest
import torch

from sinklib.adapt import pairs, seeds
from sinklib import vl
from sinklib.errors import ParameterError
from sinklib.core.models import tiny_model
from tests.test_isolate import _ev
from tests.test_pairs import cache  # noqa: F401 (the fixture: an empty cache folder)
from tests.test_vl import TOK


def test_names_round_trip_and_are_checked():
    assert seeds.seed_name("vl", 2) == "vl seed 2" and seeds.parse_name("vl seed 2") == ("vl", 2)
    assert seeds.parse_name("text_only seed 10") == ("text_only", 10)
    assert seeds.parse_name("vl") == ("vl", None) and seeds.parse_name("vl step 20") == ("vl step 20", None)
    assert seeds.parse_name("text_sentence seed 1") == ("text_sentence seed 1", None)  # not a seed condition
    with pytest.raises(ParameterError, match="condition"):
        seeds.seed_name("text_sentence", 1)
    assert seeds.check_seeds([2, 1], seed=0) == [2, 1] and seeds.check_seeds([], seed=0) == []
    with pytest.raises(ParameterError, match="own seed 0"):
        seeds.check_seeds([0, 1], seed=0)
    with pytest.raises(ParameterError, match="repeats"):
        seeds.check_seeds([1, 1], seed=0)
    with pytest.raises(ParameterError, match=r"extra_seeds\[1\]"):
        seeds.check_seeds([1, -1], seed=0)


def _evaluations():
    ev = {("m", "base"): {**_ev(0, 0.6, 0.6, 0.5), "S": 0.4}, ("other", "base"): _ev(9, 0.5, 0.5, 0.5),
          ("other", "vl"): _ev(10, 0.5, 0.5, 0.5)}  # a model without extra seeds is left out
    for s, shift in ((0, 0.0), (1, 0.05), (2, -0.05)):
        for cond, p in (("vl", 0.5), ("text_only", 0.1), ("random", 0.6)):
            name = cond if s == 0 else seeds.seed_name(cond, s)
            ev[("m", name)] = _ev(100 * s + len(cond), p + shift, p + shift, 0.5)
            ev[("m", name)]["vqa"] = [0.7, 20] if cond == "vl" else None
            ev[("m", name)]["S"] = 0.5 + s / 10
    ev[("m", "random x4")] = _ev(7, 0.1, 0.1, 0.5)  # other conditions are ignored
    return ev


def test_by_seed_regroups_under_plain_names_with_one_base():
    ev = _evaluations()
    groups = seeds.by_seed(ev, seed=0)
    assert sorted(groups) == [0, 1, 2]
    for s, g in groups.items():
        assert sorted(g) == [("m", c) for c in ("base", "random", "text_only", "vl")]
        assert g[("m", "base")] is ev[("m", "base")]
        assert g[("m", "vl")] is ev[("m", "vl" if s == 0 else f"vl seed {s}")]
    with pytest.raises(ParameterError, match="no base"):
        seeds.by_seed({k: v for k, v in ev.items() if k != ("m", "base")}, seed=0)
    assert seeds.by_seed({("m", "base"): ev[("m", "base")], ("m", "vl"): ev[("m", "vl")]}, seed=0) == {}


def test_summary_matches_the_paired_table_of_each_seed():
    ev = _evaluations()
    per_seed, summ = seeds.summary(ev, seed=0)
    assert sorted(set(per_seed["training seed"])) == [0, 1, 2] and set(per_seed.model) == {"m"}
    one = pairs.paired_table(seeds.by_seed(ev, 0)[1], seeds.CONDITIONS, seed=0)
    got = per_seed[per_seed["training seed"] == 1].drop(columns="training seed").reset_index(drop=True)
    assert np.allclose(got.change, one.change) and list(got.metric) == list(one.metric)
    r = summ[(summ.condition == "text_only") & (summ.metric == "math strict")].iloc[0]
    changes = per_seed[(per_seed.condition == "text_only") & (per_seed.metric == "math strict")].change
    assert r.seeds == 3 and r["mean change"] == pytest.approx(changes.mean()) and r["min"] == changes.min()
    assert r["mean change"] < -30 and r["seeds below zero"] == 3 and not r["seed spread exceeds effect"]
    assert seeds.summary({("m", "base"): ev[("m", "base")]}, seed=0)[1].empty


def test_cells_sentence_and_display():
    row = {"mean change": -10.0, "min": -12.0, "max": -8.0, "seeds": 3, "seeds below zero": 2,
           "seeds above zero": 0, "seed spread exceeds effect": False}
    assert seeds.summary_cell(row) == "-10.0 (-12.0 to -8.0), 2/3 below"
    row.update({"mean change": 1.0, "min": -4.0, "max": 6.0, "seeds below zero": 0, "seeds above zero": 1,
                "seed spread exceeds effect": True})
    assert seeds.summary_cell(row) == "+1.0 (-4.0 to +6.0), 1/3 above !"
    _, summ = seeds.summary(_evaluations(), seed=0)
    s = seeds.sentence(summ)
    assert s.startswith("m (3 training seeds): VL ") and "text-only " in s and "of 3 below zero" in s and "seed spread" in s
    with pytest.raises(ParameterError, match="no rows"):
        seeds.sentence(summ, metric="vqa")
    shown = seeds.display(summ)
    frame = shown[0].frame if len(shown) == 1 else None
    assert frame is not None and list(frame.columns) == ["VL", "text-only", "random"]
    assert frame.loc[("m", "math strict"), "text-only"].startswith("-")


def test_vqa_rows_per_training_seed():
    v = seeds.vqa_rows(_evaluations(), seed=0, image_size=48)
    assert list(v["training seed"]) == [0, 1, 2] and set(v.model) == {"m"}
    assert (v.vqa == 70.0).all() and (v.n == 20).all() and "learned" in v and list(v["S VL"]) == [0.5, 0.6, 0.7]
    assert (v["S base"] == 0.4).all()


def test_labels_and_verdict_notes():
    assert seeds.label("vl seed 2") == "VL s2" and seeds.label("text_only") == "text-only"
    assert seeds.label("random x4") == "random x4"
    _, summ = seeds.summary(_evaluations(), seed=0)
    note = seeds.verdict_note(summ, "m", "text_only")
    assert note.startswith("3 seeds: -") and "3 of 3 below zero outside the noise" in note and note.endswith("the seed spread is smaller than the effect")
    assert seeds.verdict_note(summ, "other", "vl") == "one training seed"
    flat = summ.assign(**{"mean change": 0.0, "min": 0.0, "max": 0.0})
    assert seeds.verdict_note(flat, "m", "vl").endswith("no seed changed it")
    assert seeds.verdict_note(summ.iloc[0:0], "m", "vl") == "one training seed"


def test_run_trains_each_seed_and_pairs_it_with_the_same_items(cache, monkeypatch):
    lm = tiny_model("llama", seed=0)
    lm.tokenizer = TOK
    base = vl.clone_state_dict(lm.model)
    first = pairs.build_pair(lm, pairs.pair_params("tiny-llama", seed=0, stage1_steps=2, stage2_steps=2,
                                                   batch_size=2, weights="random"), progress=False)
    calls = []

    def fake(lm_, pair, condition, **kw):
        calls.append((pair.params["seed"], condition, kw["seed"], kw["vqa_n"], kw["sink_kwargs"]))
        return {"state": {k: v.clone() for k, v in pair.states[condition].items()}}
    monkeypatch.setattr(pairs, "evaluate_condition", fake)
    ev: dict = {}
    info = seeds.run({"m": lm}, {"m": first}, [2, 1], ev, vqa_n=5, seed=0, eval_n={"math": 2},
                     last_k_layers=99, max_tokens=16)
    assert sorted(ev) == sorted(("m", seeds.seed_name(c, s)) for s in (1, 2) for c in seeds.CONDITIONS)
    assert [(s, c, e, v) for s, c, e, v, _ in calls] == [
        (s, c, 0, 5 if c == "vl" else 0) for s in (2, 1) for c in seeds.CONDITIONS]
    assert calls[0][4] == {"max_tokens": 16, "last_k_layers": lm.model.config.num_hidden_layers}  # K clamped
    assert info["m"][2]["trained now"] == {"vl": True, "text_only": True}
    rt = info["m"][2]["runtime"]
    assert [(r["condition"], r["stage"], r["steps"]) for r in rt] == [
        ("vl seed 2", "stage1", 2), ("vl seed 2", "stage2", 2), ("text_only seed 2", "stage2", 2)]
    k = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(ev[("m", "vl seed 1")]["state"][k], ev[("m", "vl seed 2")]["state"][k])
    assert not torch.equal(ev[("m", "vl seed 1")]["state"][k], first.states["vl"][k])
    for kk, v in base.items():  # the model holds the base weights again
        assert torch.equal(lm.model.state_dict()[kk], v)
    again = seeds.run({"m": lm}, {"m": first}, [1], {}, vqa_n=5, seed=0, eval_n={"math": 2},
                      last_k_layers=99, max_tokens=16)
    assert again["m"][1]["trained now"] == {"vl": False, "text_only": False}  # cached
    with pytest.raises(ParameterError, match="own seed"):
        seeds.run({"m": lm}, {"m": first}, [0], {}, seed=0, last_k_layers=2, max_tokens=16)
