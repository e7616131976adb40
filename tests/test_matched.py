"""Chapter 8's mass-matched control: the share-of-non-sink-attention form of `remove_matched`, the knob that adds
heads, the search that matches the sink condition's removed mass within the tolerance, and the flag that marks
a matched condition outside it as not tested."""
import numpy as np
import pandas as pd
import pytest
import torch

from sinklib.causal import matched, suites as causal
from sinklib.core import intervene
from sinklib.core.models import tiny_model
from sinklib.errors import ParameterError


def _one_head(p):
    logits = torch.tensor(p).log().view(1, 1, 1, -1)
    allowed = torch.ones_like(logits, dtype=torch.bool)
    return logits, allowed, torch.tensor([True]), torch.tensor([0]), torch.tensor([len(p) - 1])


def test_take_removes_a_share_of_the_non_sink_attention_most_attended_first():
    args = _one_head([0.7, 0.2, 0.1])
    probs, m = intervene.adjust_logits_and_probs(*args, "remove_matched", take=torch.tensor([0.5]))
    assert float(m) == pytest.approx(0.15)  # half of 0.3, all from the most-attended other key
    assert probs.flatten().tolist() == pytest.approx([0.7 / 0.85, 0.05 / 0.85, 0.1 / 0.85])
    probs, m = intervene.adjust_logits_and_probs(*args, "remove_matched", take=torch.tensor([1.0]))
    assert float(m) == pytest.approx(0.3) and probs.flatten().tolist() == pytest.approx([1.0, 0.0, 0.0])
    # a head with no sink mass that loses everything attends to the sink alone (no 0 / 0)
    logits, allowed, heads, sink, q = _one_head([0.5, 0.5])
    logits[..., 0] = torch.finfo(torch.float32).min
    probs, m = intervene.adjust_logits_and_probs(logits, allowed, heads, sink, q, "remove_matched",
                                                 take=torch.tensor([1.0]))
    assert torch.isfinite(probs).all() and probs.flatten().tolist() == [1.0, 0.0]
    # without take: the old rule (the sink's mass, capped at the other keys')
    _, m = intervene.adjust_logits_and_probs(*args, "remove_matched")
    assert float(m) == pytest.approx(0.3)


def test_take_plan_checks_heads_and_mode():
    plan = intervene.head_plan({1: [0, 2]}, 2, 3)
    t = intervene.take_plan({1: {2: 0.25}}, plan)
    assert t[1].tolist() == [1.0, 0.0, 0.25] and intervene.take_plan(None, plan) is None
    with pytest.raises(ParameterError, match="not intervened"):
        intervene.take_plan({1: {1: 0.5}}, plan)
    lm = tiny_model("llama", seed=0)
    with pytest.raises(ParameterError, match="remove_matched"):
        with intervene.sink_intervention(lm.model, {0: [0]}, mode="remove", take={0: {0: 0.5}}):
            pass


def test_candidate_heads_and_the_knob():
    mass = np.array([[0.1, 0.2], [0.9, 0.3], [0.8, 0.4], [0.95, 0.5]])
    order = matched.candidate_heads(mass, [2, 3], {3: [0]})
    assert order == [(2, 1), (3, 1), (2, 0), (1, 1), (1, 0), (0, 0), (0, 1)]  # considered layers first, least mass
    top = {3: [0]}
    assert matched.knob_plan(top, order, 0.4) == ({3: [0]}, {3: {0: 0.4}})
    assert matched.knob_plan(top, order, 1.0) == ({3: [0]}, {3: {0: 1.0}})
    assert matched.knob_plan(top, order, 3.0) == ({2: [1], 3: [0, 1]}, {})
    assert matched.knob_plan(top, order, 3.25) == ({2: [0, 1], 3: [0, 1]}, {2: {0: 0.25}})


def test_search_finds_the_knob_within_tolerance():
    f = lambda x: 0.3 * min(x, 1) + 0.1 * max(x - 1, 0)  # noqa: E731  monotone, as the removed mass
    x = matched._search(f, 0.72, 10, 0.02, 12)
    assert abs(f(x) - 0.72) <= 0.01
    assert matched._search(f, 0.2, 10, 0.02, 12) < 1
    assert matched._search(f, 5.0, 10, 0.02, 12) == 11  # cannot match: every candidate head


def test_match_control_matches_the_sink_mass_on_a_tiny_model():
    lm = tiny_model("llama", seed=0)
    L, H = lm.model.config.num_hidden_layers, lm.model.config.num_attention_heads
    seqs = torch.randint(3, 128, (4, 12), generator=torch.Generator().manual_seed(1)).tolist()
    mass = np.random.default_rng(0).random((L, H))
    top = intervene.heads_by_sink_mass(mass, [L - 1], 0.5)
    k = sum(map(len, top.values()))
    r = matched.match_control(lm.model, seqs, mass, [L - 1], top, tolerance=0.02, steps=12)
    assert r["target"] == pytest.approx(matched.removed_mass(lm.model, seqs, top, k))
    assert r["achieved"] == pytest.approx(matched.removed_mass(lm.model, seqs, r["heads"], k, mode="remove_matched",
                                                               take=r["take"]))
    assert r["within"] == (abs(r["achieved"] - r["target"]) <= 0.02)
    assert all(h in r["heads"][l] for l, hs in top.items() for h in hs)  # the sink heads stay in the set


def test_removed_mass_skips_the_lm_head_and_measures_what_the_whole_model_does():
    lm = tiny_model("llama", seed=0)
    seqs = torch.randint(3, 128, (3, 10), generator=torch.Generator().manual_seed(2)).tolist()
    heads = {0: [0, 1], 1: [1]}
    with torch.no_grad(), intervene.sink_intervention(lm.model, heads, mode="remove") as plan:
        for s in seqs:
            lm.model(input_ids=torch.tensor([s]))  # the whole model, head included
    assert matched.removed_mass(lm.model, seqs, heads, 3) == pytest.approx(plan.mean_taken)
    calls = []
    h = lm.model.lm_head.register_forward_hook(lambda *a: calls.append(1))
    matched.removed_mass(lm.model, seqs, heads, 3)
    h.remove()
    assert not calls  # the LM head did not run


def _table(matched_mass):
    rows = []
    for c, mass, n in (("sink", 0.7, 2), ("random", 0.6, 2), ("matched", matched_mass, 5)):
        for d in (0.5, 1.0):
            rows += [{"model": "m", "dose": d, "control": c, "k": 2, "n_heads": n, "mass_removed": mass + (d == 1.0) * 0.1,
                      "metric": "math strict", "lo": -20, "hi": -5},
                     {"model": "m", "dose": d, "control": c, "k": 2, "n_heads": n, "mass_removed": mass + (d == 1.0) * 0.1,
                      "metric": "knowledge acc", "lo": -3, "hi": 4}]
    return pd.DataFrame(rows)


def test_flag_and_mass_table_mark_an_unmatched_condition_not_tested():
    ok = matched.flag(_table(0.68), 0.05)
    assert ok.matched_ok.all() and ok[ok.control == "matched"].mass_diff.round(6).eq(-0.02).all()
    assert causal.order_verdict(ok, "matched")["verdict"] == "strict math falls (from dose 0.5), knowledge does not"
    bad = matched.flag(_table(0.3), 0.05)
    assert not bad[bad.control == "matched"].matched_ok.any() and bad[bad.control != "matched"].matched_ok.all()
    v = causal.order_verdict(bad, "matched")
    assert v["verdict"].startswith("not tested") and v["format_dose"] is None and v["untested_doses"] == [0.5, 1.0]
    shown = matched.mass_table(bad, 0.05)
    assert shown.loc[("m", 0.5), "within ±0.05"] == "no: not tested" and shown.loc[("m", 0.5), "matched heads"] == 5
    assert shown.loc[("m", 1.0), "matched - sink"] == pytest.approx(-0.4)
    assert matched.sentence(ok, 0.05) == "m: within ±0.05 at dose 0.5, 1 (largest |difference| 0.020)"
    assert matched.sentence(bad, 0.05) == ("m: within ±0.05 at no dose, not tested at dose 0.5, 1 (differences "
                                           "-0.400, -0.400)")


def test_set_overlap_says_where_sink_and_random_heads_differ():
    mass = np.random.default_rng(0).random((4, 4))
    plans = causal.dose_plans(mass, [2, 3], [0.0, 0.5, 1.0], seed=0)
    ov = causal.set_overlap(plans)
    assert [(r["dose"], r["differ"]) for r in ov] == [(0.5, True), (1.0, False)] and ov[1]["shared"] == 8
    assert causal.overlap_sentence({"m": ov}) == ("m: the sink and random heads are different sets at dose 0.5 and "
                                                  "the same set at dose 1 (every head of the considered layers)")


def test_evaluate_keys_the_take_shares(monkeypatch, tmp_path):
    from sinklib import evals
    from tests.test_causal import _fake

    monkeypatch.setenv("SINKBOOK_CACHE", str(tmp_path))
    lm = tiny_model("llama", seed=0)
    runs = []

    def fake_run_suites(model, tok, suites, n_items, seed, batch_size):
        runs.append(1)
        ids = torch.randint(3, 128, (2, 9), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            model(input_ids=ids, attention_mask=torch.ones_like(ids))
        return _fake({"is": [1, 0], "il": [1, 1], "k": [1, 1]})

    monkeypatch.setattr(evals, "run_suites", fake_run_suites)
    kw = dict(eval_n={"instructions": 2, "knowledge": 2, "perplexity": 2}, mode="remove_matched")
    old = causal.evaluate(lm, {1: [0, 1]}, **kw)
    full = causal.evaluate(lm, {1: [0, 1]}, take={}, **kw)
    half = causal.evaluate(lm, {1: [0, 1]}, take={1: {0: 0.5, 1: 0.5}}, **kw)
    assert len(runs) == 3 and half["mean_mass_taken"] < full["mean_mass_taken"]
    assert full["mean_mass_taken"] >= old["mean_mass_taken"] - 1e-9


def test_match_plans_matches_on_given_sequences(monkeypatch, tmp_path):
    """With `seqs` (chapter 8: the suites' own inputs) the search runs on exactly those sequences; the cache key
    holds them, so other sequences are matched anew; prompts and seqs together, or neither, are refused."""
    monkeypatch.setenv("SINKBOOK_CACHE", str(tmp_path))
    lm = tiny_model("llama", seed=0)
    L, H = lm.model.config.num_hidden_layers, lm.model.config.num_attention_heads
    mass = np.random.default_rng(0).random((L, H))
    plans = causal.dose_plans(mass, [L - 1], [0.5], controls=("sink", "matched"))
    seqs = torch.randint(3, 128, (3, 10), generator=torch.Generator().manual_seed(2)).tolist()
    out = matched.match_plans(lm, None, plans, mass, [L - 1], seqs=seqs)
    row = next(p for p in out if p["control"] == "matched")
    top = next(p for p in plans if p["control"] == "matched")["heads"]
    direct = matched.match_control(lm.model, seqs, mass, [L - 1], top)
    assert row["match"]["target"] == pytest.approx(direct["target"])
    assert row["match"]["achieved"] == pytest.approx(direct["achieved"])
    other = torch.randint(3, 128, (3, 30), generator=torch.Generator().manual_seed(3)).tolist()
    row2 = next(p for p in matched.match_plans(lm, None, plans, mass, [L - 1], seqs=other) if p["control"] == "matched")
    assert row2["match"]["target"] != pytest.approx(direct["target"])
    with pytest.raises(ParameterError, match="not both"):
        matched.match_plans(lm, ["a prompt"], plans, mass, [L - 1], seqs=seqs)
    with pytest.raises(ParameterError, match="not both"):
        matched.match_plans(lm, None, plans, mass, [L - 1])
    with pytest.raises(ParameterError, match="fewer than 2 tokens"):
        matched.match_plans(lm, None, plans, mass, [L - 1], seqs=[[5]])


def test_mass_table_shows_the_further_random_sets_as_their_mean():
    t = _table(0.68)
    extra = t[t.control == "random"].assign(control="random 2", mass_removed=0.5)
    extra3 = extra.assign(control="random 3", mass_removed=0.7)
    shown = matched.mass_table(pd.concat([t, extra, extra3], ignore_index=True), 0.05)
    assert shown.loc[("m", 0.5), "random 2-3 (mean)"] == 0.6
    assert not any(c.startswith("random 2") for c in matched.mass_table(t, 0.05).columns)
    assert matched.mass_table(pd.concat([t, extra], ignore_index=True), 0.05).loc[("m", 0.5), "random 2"] == 0.5
