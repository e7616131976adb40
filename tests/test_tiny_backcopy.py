"""Chapter 9: the Bigram-Backcopy corpus, the minimal block's three QK-norm variants, training with the sink
measured, the miniature adaptation, the panel and the causal check (tiny sizes, a few steps)."""
import math

import numpy as np
import pytest
import torch

from sinklib.errors import ParameterError
from sinklib.tiny import backcopy as bc
from sinklib.tiny import backcopy_adapt as ba
from sinklib.tiny import backcopy_train as bt
from sinklib.tiny import sinkpanel as sp

V = bc.Vocab()
TINY = {"steps": 3, "check_every": 2, "batch": 4, "length": 32, "eval_n": 4, "d_model": 32}
TINY_ADAPT = {"stage1_steps": 2, "stage2_steps": 2, "vqa_n": 12, "batch": 4, "caption_len": 8}


@pytest.fixture()
def cache_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("SINKBOOK_CACHE", str(tmp_path))
    return tmp_path


def _seqs(share=0.27, bos="fixed", n=64, length=128, seed=0):
    trans = bc.transitions(V, 0.1, 0)
    return bc.sequences(trans, V, n, length, share, bos, np.random.default_rng(seed))


def test_sequences_follow_the_backcopy_rule_and_bos_occurs_only_first():
    x = _seqs()
    assert (x[:, 0] == bc.BOS).all() and not (x[:, 1:] == bc.BOS).any()
    trig = (x >= V.triggers.start) & (x < V.triggers.stop)
    i, j = np.nonzero(trig)
    assert (j >= 2).all() and (j < x.shape[1] - 1).all()
    assert (x[i, j + 1] == x[i, j - 1]).all()                       # the copy of the token before the trigger
    assert not (trig[:, :-1] & trig[:, 1:]).any()                   # a copy is never a trigger
    assert abs(trig.mean() - 0.27) < 0.03
    assert x.max() < V.answer                                       # adaptation tokens never occur in pretraining


def test_share_zero_has_no_triggers_and_resampled_bos_starts_with_a_chain_token():
    x = _seqs(share=0.0, bos="resampled")
    assert ((x >= 1) & (x <= V.n_chain)).all()
    with pytest.raises(ParameterError, match="bos"):
        _seqs(bos="sometimes")


def test_sequences_are_seeded():
    assert (_seqs(seed=3) == _seqs(seed=3)).all() and not (_seqs(seed=3) == _seqs(seed=4)).all()


def test_roles_mark_rule_knowledge_and_dormant_positions():
    ids = torch.tensor([[bc.BOS, 5, V.triggers.start, 5, 7]])
    r = bc.roles(ids, V)
    assert r["rule"].tolist() == [[False, False, True, False]]
    assert r["knowledge"].tolist() == [[False, False, False, True]]
    assert r["dormant"].tolist() == [[False, True, False, True]]


@pytest.mark.parametrize("variant", bc.VARIANTS)
def test_explicit_attention_equals_sdpa_and_rows_sum_to_one(variant):
    m = bc.build(variant, bc.block_config(d_model=32, n_heads=2, context=16), seed=1)
    ids = torch.from_numpy(_seqs(n=2, length=16))
    with torch.no_grad():
        m.keep_probs(True)
        a = m(ids)
        m.keep_probs(False)
        b = m(ids)
    torch.testing.assert_close(a.logits, b.logits, rtol=1e-4, atol=1e-5)
    p = a.probs[0]
    torch.testing.assert_close(p.sum(-1), torch.ones(p.shape[:-1]))
    assert torch.triu(p[0, 0], diagonal=1).abs().max() == 0        # causal


def test_variants_differ_only_in_qk_norm_gains_and_per_head_differs_from_layerwise():
    cfg = bc.block_config(d_model=32, n_heads=2, context=16)
    models = {v: bc.build(v, cfg, seed=0) for v in bc.VARIANTS}
    shapes = {v: {k: tuple(t.shape) for k, t in m.state_dict().items()} for v, m in models.items()}
    assert {k for k in shapes["per_head"] if k not in shapes["none"]} == {"blocks.0.attn.q_norm.weight",
                                                                         "blocks.0.attn.k_norm.weight"}
    assert shapes["per_head"]["blocks.0.attn.q_norm.weight"] == (16,)
    assert shapes["layerwise"]["blocks.0.attn.q_norm.weight"] == (32,)
    for k, t in models["none"].state_dict().items():
        torch.testing.assert_close(t, models["per_head"].state_dict()[k])
    ids = torch.from_numpy(_seqs(n=2, length=16))
    with torch.no_grad():  # with two heads the two normalisations give different maps
        assert not torch.allclose(models["per_head"](ids).probs[0], models["layerwise"](ids).probs[0])


def test_a_sequence_longer_than_the_context_is_a_clear_error():
    m = bc.build("none", bc.block_config(d_model=16, n_heads=2, context=8))
    with pytest.raises(ParameterError, match="context"):
        m(torch.zeros(1, 9, dtype=torch.long))


def test_measure_on_a_hand_built_sink():
    """A model whose q is zero attends uniformly; S and Sink_0.3 follow the book's definitions."""
    m = bc.build("none", bc.block_config(d_model=16, n_heads=2, context=8))
    with torch.no_grad():
        m.blocks[0].attn.qkv.weight[:16].zero_()
        m.blocks[0].attn.qkv.bias.zero_()
    ids = torch.from_numpy(_seqs(n=2, length=8))
    r = bt.measure(m, ids, V)
    expect = np.mean([1 / (t + 1) for t in range(1, 8)])              # uniform over t+1 keys, queries 1..7
    assert np.allclose(r["mass"], expect, atol=1e-6)
    assert math.isclose(r["S"], math.log(expect / (1 - expect)), rel_tol=1e-5)
    assert r["sink03"] == 0.0
    with torch.no_grad():                                             # keys that only position 0 matches
        m.plans = {0: {"heads": torch.tensor([True, False]), "mode": "remove"}}
        r2 = bt.measure(m, ids, V)
        m.plans = {}
    assert r2["mass"][0][0] == 0.0 and np.isclose(r2["mass"][0][1], expect)


def test_emergence_step_applies_the_stated_rule():
    h = [{"step": 0, "S": -3.0, "sink03": 0.0}, {"step": 25, "S": -0.5, "sink03": 0.0},
         {"step": 50, "S": -1.5, "sink03": 1.0}, {"step": 75, "S": -0.9, "sink03": 0.5}, {"step": 100, "S": 0.0, "sink03": 1.0}]
    assert bt.emergence_step(h) == 75           # step 25: no head above 0.3; step 50: S up by only 1.5
    assert bt.emergence_step(h[:3]) is None
    assert bt.stable_step(h) == 75
    flicker = h + [{"step": 125, "S": 0.0, "sink03": 0.0}]
    assert bt.emergence_step(flicker) == 75 and bt.stable_step(flicker) is None


def test_training_is_cached_and_records_every_check(cache_tmp):
    rec, model = bt.train_backcopy({"variant": "per_head", **TINY})
    assert [h["step"] for h in rec["history"]] == [0, 2, 3]
    assert model is not None and rec["history"][-1]["train_loss"] > 0
    rec2, none = bt.train_backcopy({"variant": "per_head", **TINY}, need_model=False)
    assert rec2 == rec and none is None
    rec3, m3 = bt.train_backcopy({"variant": "per_head", **TINY})
    for k, t in model.state_dict().items():
        torch.testing.assert_close(t, m3.state_dict()[k])
    with pytest.raises(ParameterError, match="unknown"):
        bt.train_params(lr_typo=1)


def test_training_lowers_the_loss(cache_tmp):
    rec, _ = bt.train_backcopy({"variant": "none", **TINY, "steps": 80, "check_every": 80, "lr": 3e-3, "batch": 16,
                                "length": 64, "d_model": 64, "eval_n": 8})
    first, last = rec["history"][0], rec["history"][-1]
    assert last["know_ppl"] < 0.8 * first["know_ppl"]              # held-out bigram perplexity falls


def test_adaptation_conditions_and_random_control_norm(cache_tmp):
    res = ba.adapt({"variant": "layerwise", **TINY}, TINY_ADAPT)
    assert set(res) == set(ba.CONDITIONS)
    assert 0 <= res["vl"]["task"]["acc"] <= 100 and "learned" in res["text_only"]["task"]
    assert res["base"]["rule_acc"] != res["random"]["rule_acc"] or res["base"]["know_ppl"] != res["random"]["know_ppl"]
    assert ba.adapt({"variant": "layerwise", **TINY}, TINY_ADAPT) == res


def test_items_put_the_description_or_image_after_the_first_token():
    base = bt.train_params(**TINY)
    a = ba.adapt_params(**TINY_ADAPT)
    it = ba.items(base, a, 3, np.random.default_rng(0))
    t = it["text"]
    assert (t[:, 0] == bc.BOS).all() and (t[:, -2] == V.answer).all()
    assert (t[:, -1] - V.labels.start == it["label"]).all()
    assert (t[:, 1:1 + a["n_prefix"]] - V.descriptions.start == it["label"][:, None]).all()
    m = bc.build("none", bt.config_of(base))
    proj = ba.Projector(a["d_img"], m.cfg.d_model, a["n_prefix"])
    e = ba.embeds(m, proj, it)
    assert e.shape == (3, t.shape[1] - 1, m.cfg.d_model)
    torch.testing.assert_close(e[:, 1:1 + a["n_prefix"]], proj(it["image"]))


def test_settings_parse_and_grid():
    assert sp.parse_setting("base") == {}
    assert sp.parse_setting("weight_decay:0.5,bos:resampled") == {"weight_decay": 0.5, "bos": "resampled"}
    with pytest.raises(ParameterError, match="settings"):
        sp.parse_setting("nonsense")
    with pytest.raises(ParameterError, match="settings"):
        sp.parse_setting("variant:none")
    g = sp.model_grid(["none", "per_head"], ["base", "lr:0.001"], [0, 1], TINY)
    assert len(g) == 8 and len({x["name"] for x in g}) == 8
    assert g[-1]["params"]["lr"] == 0.001 and g[-1]["params"]["seed"] == 1
    r = sp.model_grid(["none", "per_head"], ["base", "lr:0.001"], [0, 1], TINY, replicated=["base"])
    assert [x["name"] for x in r] == ["none|base|s0", "per_head|base|s0", "none|lr:0.001|s0", "per_head|lr:0.001|s0",
                                      "none|base|s1", "per_head|base|s1"]
    assert sp.model_grid(["none"], ["base"], [0, 1], TINY, replicated=[]) == sp.model_grid(["none"], ["base"], [0, 1], TINY)
    with pytest.raises(ParameterError, match="replicate_settings"):
        sp.model_grid(["none"], ["base"], [0, 1], TINY, replicated=["lr:0.1"])


def test_panel_tables_statistics_and_causal(cache_tmp):
    g = sp.model_grid(["none", "per_head", "layerwise"], ["base", "weight_decay:0.5"], [0], TINY)
    base = sp.base_table(g)
    assert len(base) == 6 and base["S"].notna().all()
    adapted = sp.adapt_table(g, TINY_ADAPT)
    assert len(adapted) == 6 * len(ba.CONDITIONS)
    df = sp.panel_frame(adapted)
    b = adapted[adapted.condition == "base"].set_index("model")
    c = adapted[adapted.condition == "vl"].set_index("model")
    assert np.allclose(df[sp.KNOW_TASK], (b["know_acc"] - c["know_acc"]).to_numpy())
    t = adapted[adapted.condition == "text_only"].set_index("model")
    assert np.allclose(df[sp.RULE_CTRL], (t["rule_acc"] - c["rule_acc"]).to_numpy())   # controlled: text-only - VL
    assert sp.RULE_CTRL not in sp.panel_frame(adapted[adapted.condition != "text_only"])
    out = sp.claim_test(df, sp.KNOW_TASK, n_perm=99, n_boot=99)
    assert out["n"] == 6 and ("rho" in out or "error" in out)
    ct = sp.causal_table(g)
    assert set(ct.columns) >= {"model", "intervention"} or ct.empty


def test_sink_heads_and_causal_removal_on_a_forced_sink(cache_tmp):
    assert sp.sink_heads([[0.9, 0.1], [0.2, 0.31]]) == {0: [0], 1: [1]}
    p = bt.train_params(variant="none", **TINY)
    bt.train_backcopy(p)
    m = bt.load_model(p)
    none = sp._measure_under(m, p, None, "remove")
    removed = sp._measure_under(m, p, {0: [0, 1]}, "remove")
    assert m.plans == {} and set(none) == set(removed) == {"rule_acc", "know_acc", "know_ppl"}


def test_verdicts_follow_the_stated_rule():
    strong = {"rho": -0.8, "p": 0.001, "lo": -0.95, "hi": -0.5}
    assert sp.claim_verdict(strong, -1, True) == "reproduced"
    assert sp.claim_verdict(strong, +1, True) == sp.CONTRADICTED
    assert sp.claim_verdict(strong, -1, False) == sp.NOT_TESTED
    assert sp.claim_verdict({**strong, "p": 0.3}, -1, True) == "inconclusive"          # too few models
    assert sp.claim_verdict({**strong, "hi": 0.1}, -1, True) == "inconclusive"         # interval contains 0
    assert sp.claim_verdict({"error": "constant"}, -1, True) == "inconclusive"
    assert sp.null_verdict(strong, True).startswith("a relation")
    assert sp.null_verdict({**strong, "hi": 0.1}, True).startswith("no relation")


def test_chapter9_parameters_are_the_schema():
    """The chapter's parameters cell declares exactly the parameters CHAPTER9_PARAMS checks, with valid defaults,
    and every profile's settings parse."""
    import json
    from pathlib import Path

    from sinklib.book import runner as book
    from sinklib.core.params import validate

    nb = json.loads((Path(__file__).resolve().parent.parent / "notebooks/09_sink_panel.ipynb").read_text())
    cell = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    ns: dict = {}
    exec("".join(cell[0]["source"]), ns)
    ns = {k: v for k, v in ns.items() if not k.startswith("__")}
    assert set(ns) == set(sp.CHAPTER9_PARAMS)
    assert validate(sp.CHAPTER9_PARAMS, ns) == ns
    for prof in book.PROFILE_NAMES:
        values = {**ns, **book.load_profile("09_sink_panel", prof)}
        for s in values["settings"]:
            sp.parse_setting(s)
        for t in values["pilot_tries"]:
            sp.parse_setting(sp.split_try(t, values["variants"])[0])


def test_control_heads_avoid_the_sink_heads_when_they_can():
    assert sp.control_heads({0: [1]}, 1, 2, seed=0) == {0: [0]}
    for seed in range(5):
        got = sp.control_heads({0: [0], 1: [1]}, 2, 2, seed=seed)
        assert sum(len(v) for v in got.values()) == 2 and 0 not in got.get(0, []) and 1 not in got.get(1, [])
    assert sp.control_heads({0: [0, 1]}, 1, 2, seed=0) == {0: [0, 1]}   # nothing else left: drawn from all


def test_tries_limited_to_variants_and_the_pilot_sentence():
    import pandas as pd

    v = ["none", "per_head", "layerwise"]
    assert sp.split_try("lr:0.004", v) == ("lr:0.004", v)
    assert sp.split_try("steps:1800 @per_head+layerwise", v) == ("steps:1800", ["per_head", "layerwise"])
    with pytest.raises(ParameterError, match="pilot_tries"):
        sp.split_try("steps:10 @nope", v)
    rows = [{"try": "base", "variant": x, "sink formed": x == "none", "emergence step": 1, "holds from step": 1}
            for x in v] + [{"try": "long", "variant": x, "sink formed": True, "emergence step": 5,
                            "holds from step": 6} for x in v[1:]]
    s = sp.pilot_sentence(pd.DataFrame(rows))
    # a try run on two of three variants never counts as forming the sink "in every variant"
    assert s.startswith("no try formed the sink in every variant") and "the none variant under try 'base'" in s
    rows += [{"try": "long", "variant": "none", "sink formed": True, "emergence step": 5, "holds from step": 6}]
    assert "under try 'long'" in sp.pilot_sentence(pd.DataFrame(rows))


def test_causal_summary_averages_only_the_models_with_a_sink():
    import pandas as pd

    ct = pd.DataFrame([{"model": "a", "intervention": "remove", "rule change": -10.0, "knowledge change": 0.0,
                        "same_heads": False},
                       {"model": "b", "intervention": "remove", "rule change": 0.0, "knowledge change": 0.0,
                        "same_heads": False}])
    assert sp.causal_summary(ct)["rule"].iloc[0] == -5.0
    out = sp.causal_summary(ct, with_sink=["a"])
    assert out["rule"].iloc[0] == -10.0 and out["models"].iloc[0] == 1
    assert sp.causal_summary(ct, with_sink=[]).empty


def test_claim_test_uses_the_fisher_interval():
    import pandas as pd

    df = pd.DataFrame({"pair": list("abcdefgh"), "qk_norm": ["none", "per_head"] * 4,
                       "S": [0.1, 0.5, 0.2, 0.9, 0.4, 0.3, 0.8, 0.7], "x": [5, 1, 4, 0, 2, 3, 0.5, 1.5]})
    out = sp.claim_test(df, "x", n_perm=199, n_boot=199)
    from sinklib.stats.rank import fisher_ci

    lo, hi = fisher_ci(out["rho"], 8)
    assert np.isclose(out["lo"], lo) and np.isclose(out["hi"], hi) and "boot_lo" in out


def test_metrics_sentence_explains_where_s_and_sink03_disagree(monkeypatch):
    recs = {"a": {"history": [{"S": -3.7}], "final": {"S": -3.9, "sink03": 0.5, "mass": [[0.32, 0.001]]}},
            "b": {"history": [{"S": -3.9}], "final": {"S": -0.7, "sink03": 0.5, "mass": [[0.3, 0.4]]}}}
    monkeypatch.setattr(sp.bt, "train_backcopy", lambda p, need_model=True: (recs[p["m"]], None))
    s = sp.metrics_sentence([{"name": "a", "params": {"m": "a"}}, {"name": "b", "params": {"m": "b"}}])
    assert "a: head masses 0.320, 0.001" in s and "b:" not in s          # b's S rose by 3.2: they agree
    assert sp.metrics_sentence([{"name": "b", "params": {"m": "b"}}]).startswith("S and Sink_0.3 agree")


def test_seed_sentence_measures_s_between_seeds_of_one_setting():
    import pandas as pd

    base = pd.DataFrame([
        {"variant": "none", "setting": "base", "seed": 1, "S": -0.9}, {"variant": "none", "setting": "base", "seed": 0, "S": -0.7},
        {"variant": "per_head", "setting": "base", "seed": 0, "S": -2.0}, {"variant": "per_head", "setting": "base", "seed": 1, "S": -1.2},
        {"variant": "per_head", "setting": "lr:0.004", "seed": 0, "S": -3.0},                       # one seed only
    ])
    s = sp.seed_sentence(base)
    assert "over the 2 variant-setting cells trained with two seeds" in s and "0.20-0.80 in size (median 0.50)" in s
    assert "1 of 2 lie within 0.5, beyond it: per_head at base (+0.80)" in s
    assert sp.seed_sentence(base[base.setting != "base"]) == "no setting was trained with a second seed"


def test_test_sentence_never_shows_equal_rounded_errors_as_better():
    t = {"rho": 0.3, "n": 18, "p": 0.2, "lo": -0.1, "hi": 0.6, "lopo_mae": 1.2549, "const_mae": 1.2801}
    s = sp.test_sentence(t, "not tested")
    assert "error 1.25 points against 1.28 for the constant (about the same)" in s          # within 5 %
    assert "error 1.269 points against 1.270 for the constant (about the same)" in sp.test_sentence(
        {**t, "lopo_mae": 1.2691, "const_mae": 1.2701}, "x")                                      # never "1.3 against 1.3"
    assert "error 12.0 points against 13.7 for the constant (better)" in sp.test_sentence(
        {**t, "lopo_mae": 12.0, "const_mae": 13.7}, "x")
    assert "(worse)" in sp.test_sentence({**t, "lopo_mae": 38.9, "const_mae": 37.0 * 0.9}, "x")


def test_protect_sentence_orders_the_variants_and_counts_positive_losses():
    import pandas as pd

    df = pd.DataFrame({"qk_norm": ["none", "none", "per_head", "layerwise"], "rule loss": [4.0, -2.0, -9.0, 3.0]})
    s = sp.protect_sentence(df, "rule loss")
    assert "smallest first: per_head -9.0, none +1.0, layerwise +3.0 points" in s
    assert "per-head QK-norm has the smallest loss; the loss is positive in 2 of 4 models" in s
    assert "does not have" in sp.protect_sentence(df.assign(**{"rule loss": [1.0, 1.0, 5.0, 0.0]}), "rule loss")
    assert "negative loss" in s and "negative loss" not in sp.protect_sentence(
        df.assign(**{"rule loss": [1.0, 1.0, 5.0, 0.0]}), "rule loss")      # said only where a mean is below zero


def test_causal_reading_says_whether_removing_the_sink_moved_the_rule():
    import pandas as pd

    ct = pd.DataFrame({"model": ["a", "a", "b", "b"], "intervention": ["remove", "random", "remove", "random"],
                       "rule change": [0.0, 0.4, -0.5, 0.0]})
    s = sp.causal_reading(ct, ["a", "b"])
    assert "largest rule change per intervention is remove 0.5, random 0.4 points" in s and "where it was" in s
    moved = sp.causal_reading(ct.assign(**{"rule change": [-6.0, 0.0, 0.0, 0.0]}), ["a"])
    assert moved.endswith("remove moved the rule by more than 1 point") and "1 model(s)" in moved
    assert "nothing to remove" in sp.causal_reading(ct, [])
