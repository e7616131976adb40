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
    assert "the frozen recipe is rate 0.0005 for 60 stage-2 steps" in s and "fell beyond the noise" in s


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
    from sinklib import plots
    assert all(part.width_px() <= plots.COLUMN_PX for part in shown)
    fig = calibrate.figure(t, "m")
    assert len(fig.axes) == 3
