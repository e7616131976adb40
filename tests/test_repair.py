"""Head-wise repair: the chosen heads' W_Q / W_K rows come back from the base, nothing else moves; the
norm-matched control restores exactly that norm elsewhere."""
import numpy as np
import pytest
import torch

from sinklib.causal import repair
from sinklib.errors import ParameterError
from sinklib.core.models import tiny_model


def _pair(arch="llama"):
    lm = tiny_model(arch, seed=0)  # 4 layers, 4 query heads, 2 kv heads, head_dim 16
    base = {k: v.clone() for k, v in lm.model.state_dict().items()}
    g = torch.Generator().manual_seed(1)
    adapted = {k: v + 0.01 * torch.randn(v.shape, generator=g) for k, v in base.items()}
    return lm, base, adapted


def test_restore_heads_puts_back_exactly_the_chosen_rows():
    lm, base, adapted = _pair()
    new, info = repair.restore_heads(adapted, base, {1: [0, 3], 2: [1]}, n_heads=4, n_kv_heads=2, head_dim=16)
    assert info["kv_heads"] == {1: [0, 1], 2: [0]} and info["q_heads"] == {1: [0, 3], 2: [1]}
    q1, k1 = "model.layers.1.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight"
    q2, k2 = "model.layers.2.self_attn.q_proj.weight", "model.layers.2.self_attn.k_proj.weight"
    assert torch.equal(new[q1][0:16], base[q1][0:16]) and torch.equal(new[q1][48:64], base[q1][48:64])
    assert torch.equal(new[q1][16:48], adapted[q1][16:48])  # heads 1, 2 untouched
    assert torch.equal(new[k1], base[k1])  # both kv heads of layer 1
    assert torch.equal(new[q2][16:32], base[q2][16:32]) and torch.equal(new[k2][0:16], base[k2][0:16])
    assert torch.equal(new[k2][16:32], adapted[k2][16:32])
    changed = [k for k in adapted if not torch.equal(new[k], adapted[k])]
    assert sorted(changed) == sorted([q1, k1, q2, k2])
    expect = sum(float((base[k] - new_k_old).pow(2).sum()) for k, new_k_old in
                 ((q1, torch.cat([adapted[q1][0:16], base[q1][16:48], adapted[q1][48:64]])), (k1, adapted[k1]),
                  (q2, torch.cat([base[q2][0:16], adapted[q2][16:32], base[q2][32:]])),
                  (k2, torch.cat([adapted[k2][0:16], base[k2][16:]])))) ** 0.5
    assert info["restored_norm"] == pytest.approx(expect, rel=1e-6)
    lm.model.load_state_dict(new)  # a valid state dict of the model
    assert adapted[q1] is not new[q1]  # the adapted state is not modified in place


def test_restore_other_rows_matches_the_norm_and_leaves_qk_alone():
    _, base, adapted = _pair()
    _, info = repair.restore_heads(adapted, base, {1: [0, 3]}, n_heads=4, n_kv_heads=2, head_dim=16)
    new, ctl = repair.restore_other_rows(adapted, base, info["restored_norm"], seed=0)
    assert ctl["restored_norm"] == pytest.approx(info["restored_norm"], rel=1e-9)
    undone = sum(float((new[k] - adapted[k]).pow(2).sum()) for k in adapted) ** 0.5
    assert undone == pytest.approx(info["restored_norm"], rel=1e-5)
    assert all(torch.equal(new[k], adapted[k]) for k in adapted if "q_proj" in k or "k_proj" in k or ".layers." not in k)
    again, _ = repair.restore_other_rows(adapted, base, info["restored_norm"], seed=0)
    assert all(torch.equal(again[k], new[k]) for k in new)
    with pytest.raises(ParameterError, match="differ from the base by only"):
        repair.restore_other_rows(adapted, base, 1e6)


def test_heads_by_mass_change_and_errors():
    b = np.array([[0.1, 0.5], [0.9, 0.2]])
    a = np.array([[0.1, 0.1], [0.3, 0.25]])
    assert repair.heads_by_mass_change(b, a, [0, 1], 2) == {0: [1], 1: [0]}
    with pytest.raises(ParameterError, match="'k'"):
        repair.heads_by_mass_change(b, a, [0], 3)
    _, base, adapted = _pair()
    with pytest.raises(ParameterError, match="0..3"):
        repair.restore_heads(adapted, base, {0: [4]}, n_heads=4, n_kv_heads=2, head_dim=16)
    with pytest.raises(ParameterError, match="q_proj.weight of layer 9"):
        repair.restore_heads(adapted, base, {9: [0]}, n_heads=4, n_kv_heads=2, head_dim=16)


def test_repair_plans_undo_the_chosen_heads_and_match_the_control_norm():
    lm, base, adapted = _pair()
    shape = repair.attention_shape(lm.model)
    assert shape == {"n_heads": 4, "n_kv_heads": 2, "head_dim": 16}
    bm = np.zeros((4, 4))
    am = np.zeros((4, 4))
    am[3, 2], am[2, 0] = 0.5, -0.4  # the two heads whose sink mass moved most
    plans = repair.repair_plans(adapted, base, bm, am, [2, 3], 2, seed=0, **shape)
    assert [p["control"] for p in plans] == list(repair.REPAIR_CONTROLS)
    sink, rnd, other = plans
    assert sink["heads"] == {2: [0], 3: [2]}
    assert sum(map(len, rnd["heads"].values())) == 2 and all(l in (2, 3) for l in rnd["heads"])
    assert other["heads"] == {} and other["restored_norm"] == pytest.approx(sink["restored_norm"], rel=1e-9)
    total = sum(float((adapted[k] - base[k]).pow(2).sum()) for k in base) ** 0.5
    assert sink["share"] == pytest.approx(sink["restored_norm"] / total) and 0 < sink["share"] < 1
    q3 = "model.layers.3.self_attn.q_proj.weight"
    assert torch.equal(sink["state"][q3][32:48], base[q3][32:48])
    assert torch.equal(sink["state"][q3][:32], adapted[q3][:32])


def test_evaluate_state_evaluates_the_given_weights_and_gives_the_model_back(monkeypatch, tmp_path):
    from sinklib.causal import suites as causal
    from sinklib import evals

    monkeypatch.setenv("SINKBOOK_CACHE", str(tmp_path))
    lm, base, adapted = _pair()
    seen = []

    def fake_run_suites(model, tok, suites, n_items, seed, batch_size):
        w = model.state_dict()["model.layers.0.self_attn.q_proj.weight"]
        seen.append(float(w.sum()))
        per = [{"acc": True, "acc_norm": True}]
        return {"knowledge": evals.SuiteResult("knowledge", 1, {}, {}, per, 0.0)}

    monkeypatch.setattr(evals, "run_suites", fake_run_suites)
    kw = dict(eval_n={"knowledge": 1}, seed=0, eval_batch_size=1)
    r = repair.evaluate_state(lm, adapted, {"pair": "x", "control": "vl"}, **kw)
    key_w = "model.layers.0.self_attn.q_proj.weight"
    assert seen == [pytest.approx(float(adapted[key_w].sum()))]
    assert torch.equal(lm.model.state_dict()[key_w], base[key_w])  # the model holds its own weights again
    assert r["n_heads"] == 0 and r["outcomes"]
    again = repair.evaluate_state(lm, adapted, {"pair": "x", "control": "vl"}, **kw)
    assert again == r and len(seen) == 1  # cached under its tag
    repair.evaluate_state(lm, base, {"pair": "x", "control": "base"}, **kw)
    assert len(seen) == 2  # another tag, another evaluation
    assert causal.evaluate(lm, None, **kw) is not None and len(seen) == 3  # the untagged model is a third key


def test_repair_changes_and_verdict_follow_the_paired_rule():
    from sinklib.causal import suites as causal
    from sinklib import evals

    def ev(strict):
        per = [{"strict": bool(s), "lenient": True} for s in strict]
        return {"outcomes": causal.outcomes({"instructions": evals.SuiteResult("instructions", len(per), {}, {}, per, 0.0)})}

    n = 40
    base, vl = ev([1] * n), ev([1] * 10 + [0] * 30)          # VL lost 75 points
    back, rnd = ev([1] * n), ev([1] * 10 + [0] * 30)           # the sink heads bring it all back; random nothing
    t = repair.repair_changes(base, vl, {"sink heads": back, "random heads": rnd})
    s = t[t.metric == "instructions strict"].set_index("control")
    assert s.loc["sink heads", "loss"] == pytest.approx(-75.0) and s.loc["sink heads", "loss_hi"] < 0
    assert s.loc["sink heads", "change"] == pytest.approx(75.0) and s.loc["sink heads", "lo"] > 0
    assert s.loc["random heads", "change"] == 0.0 and s.loc["random heads", "p"] == 1.0
    v = repair.repair_verdict(t, metrics=["instructions strict"])
    assert "VL lost it (-75.0" in v and "sink heads +75.0" in v and "(back up)" in v and "random heads +0.0" in v
    assert "(no change)" in v


def test_repair_outcome_is_the_shared_rule():
    """repair_outcome: a metric is lost when VL - base lies below zero; a control repairs it when its restore's
    interval lies above zero; chapter 8's sentence (repair_verdict) and claim 9b both read it."""
    import pandas as pd

    from sinklib.causal.repair import moved, repair_outcome, repair_verdict

    def row(c, m, loss_hi, lo, hi):
        return {"control": c, "metric": m, "loss": loss_hi - 5, "loss_lo": loss_hi - 10, "loss_hi": loss_hi,
                "change": (lo + hi) / 2, "lo": lo, "hi": hi}
    rows = [row("sink heads", "math strict", -2, 1, 9), row("random heads", "math strict", -2, -3, 4),
            row("other rows", "math strict", -2, -8, -1), row("sink heads", "instructions strict", 3, 2, 8)]
    o = repair_outcome(rows, ["instructions strict", "math strict"])
    assert o["lost"] == ["math strict"]  # instructions were not lost, so their 'up' does not count
    assert o["back"] == {"sink heads": True, "random heads": False, "other rows": False}
    assert o["down"] == {"sink heads": False, "random heads": False, "other rows": True}
    assert [moved(1, 2), moved(-2, -1), moved(-1, 1)] == ["up", "down", "no change"]
    text = repair_verdict(pd.DataFrame(rows))
    assert "math strict: VL lost it" in text and "instructions strict: VL did not lose it" in text
    assert "sink heads +5.0 [+1.0, +9.0] (back up)" in text and "other rows -4.5 [-8.0, -1.0] (down)" in text
