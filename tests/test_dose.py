"""Dose-response along training: snapshots of a rerun of the pair's training (sinklib.adapt.dose)."""
import pandas as pd
import pytest
import torch

from sinklib.core import cache as sk_cache
from sinklib.adapt import dose, pairs
from sinklib import vl
from sinklib.errors import ParameterError
from sinklib.core.models import tiny_model
from tests.test_pairs import cache  # noqa: F401 (the fixture: an empty cache folder)
from tests.test_vl import TOK


def _params():
    return pairs.pair_params("tiny-llama", seed=1, stage1_steps=2, stage2_steps=3, batch_size=2, weights="random")


def _lm():
    lm = tiny_model("llama", seed=0)
    lm.tokenizer = TOK
    return lm


def test_series_reproduces_the_pair_and_is_cached(cache):
    lm = _lm()
    base = vl.clone_state_dict(lm.model)
    pair = pairs.build_pair(lm, _params(), progress=False)
    for kind in dose.KINDS:
        dirs = dose.train_series(lm, _params(), kind, [3, 1])
        assert sorted(dirs) == [1, 3] and all(sk_cache.checkpoint_exists(d) for d in dirs.values())
        for k, v in base.items():  # the model holds the base weights again
            assert torch.equal(lm.model.state_dict()[k], v)
        # the last snapshot is the pair's own condition: same recipe, seed and data order
        assert dose.final_matches(lm, _params(), kind, pair.states[kind]) == 0.0
        mtime = {s: (d / "meta.json").stat().st_mtime_ns for s, d in dirs.items()}
        again = dose.train_series(lm, _params(), kind, [1, 3])  # cached: nothing retrained
        assert {s: (d / "meta.json").stat().st_mtime_ns for s, d in again.items()} == mtime
    # the gap is cached under both checkpoints' stamps: a rerun reads neither
    real = sk_cache.load_state
    sk_cache.load_state = lambda *a: pytest.fail("read again")
    try:
        assert dose.final_matches(lm, _params(), "vl", lambda: pytest.fail("read again")) == 0.0
    finally:
        sk_cache.load_state = real
    early = vl.load_checkpoint(dose.snapshot_dir(_params(), "vl", 1), lm.model)
    assert early.projector is not None
    k = "model.layers.0.self_attn.q_proj.weight"
    step1 = lm.model.state_dict()[k].clone()
    assert not torch.equal(step1, base[k]) and not torch.equal(step1, pair.states["vl"][k])


def test_steps_are_checked():
    with pytest.raises(ParameterError, match=r"steps\[1\]"):
        dose.check_steps(_params(), [1, 4])
    with pytest.raises(ParameterError, match="empty"):
        dose.check_steps(_params(), [])
    assert dose.check_steps(_params(), [3, 1, 3]) == [1, 3]
    assert dose.snapshot_name("vl", 15) == "vl step 15"
    with pytest.raises(ParameterError, match="kind"):
        dose.snapshot_name("random", 1)


def test_evaluate_series_uses_each_snapshot_and_its_projector(cache, monkeypatch):
    lm = _lm()
    pair = pairs.build_pair(lm, _params(), progress=False)
    dose.train_series(lm, _params(), "vl", [1, 2])
    seen = []

    def fake(lm_, p, condition, **kw):
        seen.append((condition, p.params, p.states[condition]["model.layers.0.self_attn.q_proj.weight"].clone(),
                     p.projector is not None, kw))
        return {"S": 0.0}
    monkeypatch.setattr(pairs, "evaluate_condition", fake)
    kw_in = {"eval_n": {"math": 2}, "prompts": ["a"], "sink_kwargs": {}}
    out = dose.evaluate_series(lm, pair, "vl", [2, 1], **kw_in)
    assert sorted(out) == [1, 2] and [c for c, *_ in seen] == ["vl step 1", "vl step 2"]
    assert all(p == pair.params and proj and kw == kw_in for _, p, _, proj, kw in seen)
    assert not torch.equal(seen[0][2], seen[1][2])
    k = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(lm.model.state_dict()[k], pair.states["base"][k])
    with pytest.raises(ParameterError, match="train_series"):
        dose.evaluate_series(lm, pair, "text_only", [1])


def test_series_table_parses_kind_and_step():
    rows = pd.DataFrame({"model": ["m"] * 3, "condition": ["vl step 15", "text_only step 30", "random"]})
    t = dose.series_table(rows)
    assert list(t.kind) == ["vl", "text_only", "random"] and list(t.step)[:2] == [15, 30]
    assert t.step.iloc[2] is None or t.step.iloc[2] != t.step.iloc[2]


def test_dose_table_puts_the_pair_at_the_last_step():
    from tests.test_isolate import _ev

    def ev(seed, p, mass):
        e = _ev(seed, p, p, 0.5)
        e["mass"], e["S"] = [[mass, mass]], mass
        return e
    evs = {("m", "base"): ev(0, 0.6, 0.8), ("m", "vl"): ev(1, 0.3, 0.5), ("m", "text_only"): ev(2, 0.4, 0.6),
           ("m", "vl step 2"): ev(3, 0.5, 0.7), ("m", "text_only step 2"): ev(4, 0.5, 0.75),
           ("m", "random"): ev(5, 0.6, 0.8), ("m", "vl step 1"): ev(6, 0.6, 0.8)}  # step 1 not asked for
    t = dose.dose_table(evs, [2], stage2_steps=3, last_k=1)
    assert list(zip(t.kind, t.step)) == [("text_only", 2), ("text_only", 3), ("vl", 2), ("vl", 3)]
    assert t.loc[(t.kind == "vl") & (t.step == 3), "sink mass change"].iloc[0] == pytest.approx(-0.3)


def test_plot_has_two_rows_per_model():
    from tests.test_isolate import _ev

    evs = {}
    for i, c in enumerate(["base", "vl", "text_only", "vl step 2", "text_only step 2"]):
        e = _ev(i, 0.5, 0.5, 0.5)
        e["mass"], e["S"] = [[0.8 - i / 20]], 0.5
        evs[("m", c)] = e
    fig = dose.plot(dose.dose_table(evs, [2], stage2_steps=3, last_k=1))
    assert len(fig.axes) == 2 and fig.axes[1].get_xlabel() == "stage-2 step"


def test_a_lora_series_from_the_cached_stage_1_is_one_uninterrupted_run(cache):
    """A VL series trains stage 1 once per model and seed (`sweep.stage1_dir`, without the LM's weights) and stage
    2 from it: at two stage-2 rates (chapter 11's rate walk) stage 1 is not trained again, and each last snapshot
    has the very weights of one uninterrupted `train_vl` run with LoRA."""
    from sinklib.adapt import sweep

    lm = _lm()
    base = vl.clone_state_dict(lm.model)
    lora = {"lm_method": "lora", "lora_rank": 2, "lora_alpha": 4.0, "lora_targets": ["q_proj", "v_proj"]}
    for i, rate in enumerate((2e-3, 4e-4)):
        p = {**_params(), **lora, "lr_lm": rate, "lr_projector_stage2": rate}
        d = dose.train_series(lm, p, "vl", [3])[3]
        s1 = sweep.stage1_dir(p)
        assert sk_cache.checkpoint_exists(s1) and not sk_cache.weights_present(s1)  # the LM is the base
        if i == 0:
            mtime = (s1 / "meta.json").stat().st_mtime_ns
        assert (s1 / "meta.json").stat().st_mtime_ns == mtime  # the second rate reused it
        series = sk_cache.load_state(d, lm.model)
        lm.model.load_state_dict(base, strict=True)
        whole = vl.train_vl(lm.model, lm.tokenizer, stage1_steps=p["stage1_steps"], stage2_steps=3,
                            batch_size=p["batch_size"], seed=p["seed"], image_size=p["image_size"],
                            lr_projector=p["lr_projector"], lr_lm=rate, lr_projector_stage2=rate,
                            progress=False, **vl.lm_method_of(p).params())
        assert all(torch.equal(series[k], v) for k, v in lm.model.state_dict().items())
        assert all(torch.equal(a, b) for a, b in zip(vl.load_checkpoint(d, lm.model, weights=False)
                                                     .projector.state_dict().values(),
                                                     whole.projector.state_dict().values()))
        lm.model.load_state_dict(base, strict=True)


def test_a_series_can_restore_the_base_from_elsewhere_instead_of_a_copy(cache, monkeypatch):
    """`restore` (the low-memory path of chapter 11): no copy of the base is taken, the model ends holding what
    `restore()` returns, and the snapshots are those of the default path."""
    lm = _lm()
    base = vl.clone_state_dict(lm.model)
    calls = []
    monkeypatch.setattr(vl, "clone_state_dict", lambda m: pytest.fail("copied the base"))
    dirs = dose.train_series(lm, _params(), "text_only", [3], restore=lambda: calls.append(1) or base)
    assert calls == [1] and all(torch.equal(lm.model.state_dict()[k], v) for k, v in base.items())
    monkeypatch.undo()
    again = sk_cache.load_state(dirs[3], lm.model)
    pair = pairs.build_pair(lm, _params(), progress=False)
    assert all(torch.equal(again[k], pair.states["text_only"][k]) for k in again)


def test_complete_sentence_says_whether_the_spread_lies_between_the_runs():
    from sinklib.adapt.dose import complete_sentence

    def rows(vl, text):
        return pd.DataFrame([{"model": "m", "kind": k, "step": s, "strict-format mean change": v,
                              "sink mass change": v / 1000} for k, vs in (("text_only", text), ("vl", vl))
                             for s, v in zip((20, 40, 60), vs)])

    done = complete_sentence(rows([1.0, 1.4, -0.01], [-18.7, -19.8, -19.6]))
    assert "text-only -18.7 at step 20" in done and "0.0 at step 60" in done
    assert "each run's changes were complete by step 20, and the rho contrasts the two runs" in done
    growing = complete_sentence(rows([-2.0, -6.0, -10.0], [-5.0, -12.0, -20.0]))
    assert "complete by" not in growing and "traces a dose as well" in growing
