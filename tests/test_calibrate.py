"""The calibration sweep's rule, choice and table (#29), on made-up evaluations: no model is loaded."""
import numpy as np
import pandas as pd
import pytest

from sinklib.adapt import calibrate
from sinklib.errors import ParameterError


def _ev(instr_pass: int, know_pass: int, n: int = 60, vqa=(0.9, 200), S: float = 0.5) -> dict:
    """An evaluation with `instr_pass` of `n` strict instruction items passed (the first ones) and so on."""
    rows = lambda k: [i < k for i in range(n)]  # noqa: E731
    return {"outcomes": {"instructions strict": rows(instr_pass), "instructions lenient": rows(instr_pass),
                         "math strict": rows(n // 2), "math lenient": rows(n // 2), "knowledge acc": rows(know_pass),
                         "perplexity": {"nll": [1.0] * 4, "n_tokens": [10] * 4}},
            "vqa": list(vqa) if vqa else None, "S": S}


def _res(points) -> dict:
    return {"base": _ev(40, 40), "points": [{"lr_lm": lr, "steps": s, "eval": ev} for lr, s, ev in points]}


def test_rule_needs_learned_task_format_loss_and_knowledge_held():
    t = calibrate.table(_res([
        (5e-5, 60, _ev(40, 40)),                 # nothing moved
        (5e-4, 60, _ev(10, 40)),                 # format lost, knowledge held, task learned: qualifies
        (5e-4, 120, _ev(10, 5)),                 # format and knowledge lost: does not qualify
        (5e-5, 120, _ev(10, 40, vqa=(0.05, 200))),  # format lost, task not learned
    ]), seed=0, image_size=48)
    got = {(r.lr_lm, r.steps): bool(r.qualifies) for _, r in t.iterrows()}
    assert got == {(5e-5, 60): False, (5e-4, 60): True, (5e-4, 120): False, (5e-5, 120): False}
    assert list(t.steps) == sorted(t.steps)                      # sorted by steps, then rate
    assert t.loc[(t.lr_lm == 5e-4) & (t.steps == 60), "instructions strict"].item() == pytest.approx(-50.0)
    assert calibrate.choose(t) == {"lr_lm": 5e-4, "stage2_steps": 60}
    s = calibrate.sentence(t, "m")
    assert "the frozen recipe is rate 5e-4 for 60 stage-2 steps" in s and "fell beyond the noise" in s


def test_choice_prefers_fewer_steps_then_lower_rate_and_none_is_said():
    t = pd.DataFrame({"lr_lm": [1e-3, 1e-4, 1e-4], "steps": [60, 60, 30], "qualifies": [True, True, False]})
    assert calibrate.choose(t) == {"lr_lm": 1e-4, "stage2_steps": 60}
    flat = calibrate.table(_res([(5e-5, 60, _ev(39, 40)), (5e-4, 60, _ev(41, 40))]), seed=0, image_size=48)
    assert calibrate.choose(flat) is None
    s = calibrate.sentence(flat, "m")
    assert "no point cost strict instruction format beyond the paired noise" in s and "no recipe is frozen" in s


def test_missing_interval_or_vqa_never_qualifies():
    assert not calibrate.qualifies({"learned": True, "instructions strict hi": float("nan"), "knowledge acc hi": 1.0})
    assert not calibrate.qualifies({"learned": True, "knowledge acc hi": 1.0})
    t = calibrate.table(_res([(5e-5, 60, _ev(10, 40, vqa=None))]), seed=0, image_size=48)
    assert not t.qualifies.any() and np.isnan(t.VQA.item())


def test_grid_and_point_parameters_are_checked():
    with pytest.raises(ParameterError, match="at least one rate"):
        calibrate.check_grid([], [60])
    with pytest.raises(ParameterError, match="steps"):
        calibrate.check_grid([1e-4], [0])
    assert calibrate.check_grid([5e-4, 5e-5, 5e-4], [120, 60]) == ([5e-5, 5e-4], [60, 120])
    p = calibrate.point_params({"model": "m", "lr_lm": 1.0, "stage2_steps": 1}, 2e-4, 120)
    assert p["lr_lm"] == p["lr_projector_stage2"] == 2e-4 and p["stage2_steps"] == 120


def test_display_and_figure_draw_every_point():
    import matplotlib

    matplotlib.use("Agg")
    t = calibrate.table(_res([(5e-5, 60, _ev(40, 40)), (5e-4, 60, _ev(10, 40)), (5e-4, 120, _ev(5, 40))]),
                        seed=0, image_size=48)
    shown = calibrate.display(t)
    rule, rest = shown
    assert len(rule.frame) == len(rest.frame) == 3 and "qualifies" in rule.frame.columns and "S" in rest.frame.columns
    assert "; the base model: " in rest.legend and f"S {t['S base'].iloc[0]:.3f}." in rest.legend  # read against
    from sinklib import plots
    assert all(part.width_px() <= plots.COLUMN_PX for part in shown)
    fig = calibrate.figure(t, "m")
    assert len(fig.axes) == 3


def test_lora_series_pairs_with_the_full_fine_tunes_base_evaluation(monkeypatch):
    """Section 10.4: the base model's evaluation is keyed without the LoRA keys, so the LoRA sweep reads the
    full sweep's cached base evaluation; a full fine-tune's parameters are unchanged."""
    from sinklib import vl
    from sinklib.adapt import dose, pairs

    full = pairs.pair_params("smollm2-135m", stage2_steps=120, lr_lm=5e-5, weights="w")
    lora = pairs.pair_params("smollm2-135m", stage2_steps=120, lr_lm=5e-5, weights="w", lm_method="lora")
    assert set(lora) - set(full) == set(vl.LORA_KEYS)
    assert calibrate.base_params(full) == full == calibrate.base_params(lora)
    seen = []
    monkeypatch.setattr(vl, "clone_state_dict", lambda m: {})
    monkeypatch.setattr(pairs, "evaluate_condition", lambda lm, pair, cond, **kw: seen.append((cond, pair.params)) or {})
    monkeypatch.setattr(dose, "train_series", lambda *a, **k: None)
    monkeypatch.setattr(dose, "evaluate_series", lambda lm, pair, kind, steps, **kw: {s: {"p": pair.params} for s in steps})
    out = calibrate.run(type("LM", (), {"model": None})(), lora, [2e-3], [60, 120], eval_n={}, seed=0, prompts=[],
                        sink_kwargs={}, vqa_n=1)
    assert seen == [("base", full)]
    assert [p["steps"] for p in out["points"]] == [60, 120]
    assert all(p["eval"]["p"]["lm_method"] == "lora" and p["eval"]["p"]["lr_lm"] == 2e-3 for p in out["points"])


def test_method_check_says_whether_the_verdict_changed():
    full = calibrate.table(_res([(5e-5, 60, _ev(10, 40)), (5e-4, 60, _ev(40, 40))]), seed=0, image_size=48)
    lora_same = calibrate.table(_res([(5e-4, 60, _ev(40, 40)), (2e-3, 60, _ev(12, 40))]), seed=0, image_size=48)
    lora_none = calibrate.table(_res([(5e-4, 60, _ev(40, 40)), (2e-3, 60, _ev(12, 5))]), seed=0, image_size=48)
    s = calibrate.method_check(full, lora_same, "m", "LoRA rank 16")
    assert "with the full fine-tune 1 of 2 points qualified" in s and "does not change" in s
    assert "LoRA recipe frozen for a model too large for a full fine-tune is rate 2e-3 for 60" in s
    s = calibrate.method_check(full, lora_none, "m", "LoRA rank 16")
    assert "with LoRA rank 16 0 of 2 points qualified" in s and "changes whether some dose qualifies" in s
    assert "recipe" not in s
    rule, _ = calibrate.display(lora_same, "LoRA sweep")
    assert rule.legend.startswith("LoRA sweep, the rule's columns")


def test_a_series_whose_evaluations_are_cached_is_neither_trained_nor_read(tmp_path, monkeypatch):
    """A rerun on a machine whose cache holds the evaluations (carried from another machine) but no snapshot:
    `calibrate.run` trains nothing and `dose.evaluate_series` reads no checkpoint."""
    import json

    from sinklib import vl
    from sinklib.adapt import dose, pairs
    from sinklib.core import cache

    monkeypatch.setenv("SINKBOOK_CACHE", str(tmp_path))
    kw = dict(eval_n={"instructions": 2}, seed=0, prompts=["a"], sink_kwargs={}, vqa_n=1, eval_batch_size=8,
              key_extra=calibrate.KEY_EXTRA)
    pp = pairs.pair_params("smollm2-135m", stage2_steps=120, lr_lm=5e-5, weights="w")

    def put(params, condition, value, **over):
        path = cache.root() / "evals" / f"{cache.key(pairs.condition_key(params, condition, **{**kw, **over}))}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))

    put(calibrate.base_params(pp), "base", {"who": "base"}, vqa_n=0)  # the base model has no VQA
    for s in (60, 120):
        put(calibrate.point_params(pp, 2e-3, 120), dose.snapshot_name("vl", s), {"who": s})
    base_kw = {**kw, "vqa_n": 0}
    assert pairs.cached_evaluation(calibrate.base_params(pp), "base", **base_kw) == {"who": "base"}
    assert pairs.cached_evaluation(calibrate.base_params(pp), "base", refresh=True, **base_kw) is None
    assert pairs.cached_evaluation(pp, "vl", **kw) is None
    monkeypatch.setattr(vl, "clone_state_dict", lambda m: {})
    monkeypatch.setattr(dose, "train_series", lambda *a, **k: (_ for _ in ()).throw(AssertionError("trained")))
    run_kw = {k: v for k, v in kw.items() if k != "key_extra"}  # run adds calibrate.KEY_EXTRA itself
    out = calibrate.run(type("LM", (), {"model": None})(), pp, [2e-3], [60, 120], **run_kw)
    assert out["base"] == {"who": "base"} and [p["eval"] for p in out["points"]] == [{"who": 60}, {"who": 120}]


def test_point_sentence_gives_every_measured_change_with_its_interval():
    t = calibrate.table(_res([(2e-3, 60, _ev(10, 40, S=0.9)), (5e-4, 60, _ev(40, 40)), (2e-3, 120, _ev(12, 40))]),
                        seed=0, image_size=48)
    s = calibrate.point_sentence(t[(t.lr_lm == 2e-3) & (t.steps == 60)].iloc[0])
    assert s.startswith("rate 2e-3 for 60 steps: VQA 90.0 % (majority")
    assert "instructions strict -50.0 [" in s and "knowledge 0.0 [" in s and "perplexity 0.00 [" in s
    assert s.endswith("S 0.900 (base 0.500)") and "lenient" in s and "instructions lenient" not in s
    no_vqa = calibrate.table(_res([(2e-3, 60, _ev(10, 40, vqa=None))]), seed=0, image_size=48)
    assert "VQA not measured" in calibrate.point_sentence(no_vqa.iloc[0])
    at = calibrate.points_at(t, 2e-3)
    assert at.count("rate 2e-3") == 2 and "rate 5e-4" not in at
    assert calibrate.points_at(t, frozen=True).startswith("rate 2e-3 for 60 steps")   # fewest steps, then lowest rate
    flat = calibrate.table(_res([(5e-4, 60, _ev(40, 40))]), seed=0, image_size=48)
    assert calibrate.points_at(flat, frozen=True) == "" and calibrate.points_at(flat, 1e-3) == ""


def test_rates_and_zeros_are_written_as_the_text_writes_them():
    assert [calibrate.rate(x) for x in (5e-5, 0.0005, 0.002, 2.5e-4, 1e-5)] == ["5e-5", "5e-4", "2e-3", "2.5e-4", "1e-5"]
    assert calibrate._cell({"m": -0.04, "m lo": -0.4, "m hi": 0.3}, "m") == "0.0 [-0.4, +0.3]"
    assert calibrate._cell({"perplexity ppl": 0.042, "perplexity ppl lo": -0.047, "perplexity ppl hi": 0.13},
                           "perplexity ppl") == "+0.04 [-0.05, +0.13]"
