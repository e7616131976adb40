"""Chapter 8's matched control matched in the evaluation's own measurement (`sinklib.causal.rematch`): the
corrected target, the search to a given target, and the loop that re-searches and re-evaluates a dose outside
the tolerance, on a tiny model whose "evaluation" measures the mass on the same inputs plus a known gap."""
import numpy as np
import pandas as pd
import pytest
import torch

from sinklib.causal import matched, rematch, suites as causal
from sinklib.core import intervene
from sinklib.core.models import tiny_model
from sinklib.errors import ParameterError

GAP = 0.08   # what the evaluation adds to the matched control's mass on the inputs (session 48: +0.067 to +0.090)


def _setup():
    lm = tiny_model("llama", seed=0)
    L, H = lm.model.config.num_hidden_layers, lm.model.config.num_attention_heads
    mass = np.random.default_rng(0).random((L, H))
    seqs = torch.randint(3, 128, (4, 12), generator=torch.Generator().manual_seed(1)).tolist()
    return lm, L, mass, seqs


def test_corrected_target_subtracts_the_evaluations_gap():
    plans = [{"dose": 0.5, "control": "matched", "match": {"achieved": 0.60}},
             {"dose": 0.7, "control": "matched", "match": {"achieved": 0.70}},
             {"dose": 0.5, "control": "sink"}]
    table = pd.DataFrame([{"dose": 0.5, "control": "sink", "mass_removed": 0.62},
                          {"dose": 0.5, "control": "matched", "mass_removed": 0.70},    # +0.08: outside 0.05
                          {"dose": 0.7, "control": "sink", "mass_removed": 0.72},
                          {"dose": 0.7, "control": "matched", "mass_removed": 0.74}])   # +0.02: within
    assert rematch.corrected_targets(plans, table, 0.05) == {0.5: pytest.approx(0.62 - (0.70 - 0.60))}
    table.loc[1, "mass_removed"] = 5.0
    assert rematch.corrected_targets(plans, table, 0.05) == {0.5: 0.0}                 # never below zero


def test_search_to_reaches_a_given_target_on_a_tiny_model():
    lm, L, mass, seqs = _setup()
    top = intervene.heads_by_sink_mass(mass, [L - 1], 0.5)
    k = sum(map(len, top.values()))
    sink = matched.removed_mass(lm.model, seqs, top, k)
    for target in (0.5 * sink, sink):
        r = rematch.search_to(lm.model, seqs, mass, [L - 1], top, target, tolerance=0.04)
        assert abs(r["achieved"] - target) <= 0.02 and r["target"] == target
        assert r["achieved"] == pytest.approx(matched.removed_mass(lm.model, seqs, r["heads"], k,
                                                                   mode="remove_matched", take=r["take"]))
        assert all(h in r["heads"][l] for l, hs in top.items() for h in hs)
    with pytest.raises(ParameterError, match="target"):
        rematch.search_to(lm.model, seqs, mass, [L - 1], top, -0.1)


def test_the_loop_brings_a_control_with_a_constant_gap_inside_the_tolerance(monkeypatch, tmp_path):
    monkeypatch.setenv("SINKBOOK_CACHE", str(tmp_path))
    lm, L, mass, seqs = _setup()
    evaluated = []

    def fake_dose_response(lm_, plans, *, eval_n, seed, eval_batch_size, log, tolerance):
        rows = []
        for p in plans:
            if p["k"] == 0:
                continue
            m = matched.removed_mass(lm_.model, seqs, p["heads"], p["k"], mode=p["mode"], take=p.get("take"))
            m += GAP if p["control"] == "matched" and p["dose"] == 0.5 else 0.0   # dose 0.3: no gap
            evaluated.append((p["dose"], p["control"], round(m, 9)))
            rows.append({"model": lm_.name, "dose": float(p["dose"]), "control": p["control"], "k": p["k"],
                         "mass_removed": m, "metric": "math strict"})
        return matched.flag(pd.DataFrame(rows), tolerance), {}

    monkeypatch.setattr(rematch, "dose_response", fake_dose_response)
    from sinklib.core import progress

    reported = []
    monkeypatch.setattr(progress, "report", lambda what, step=None, total=None: reported.append((what, step, total)))
    plans = causal.dose_plans(mass, [L - 1], [0.3, 0.5], controls=("sink", "matched"))
    table, _, history = rematch.match_in_evaluation(lm, plans, mass, [L - 1], seqs, eval_n={"math": 2},
                                                    tolerance=0.05, rounds=2)
    assert [(h["dose"], h["round"]) for h in history] == [(0.3, 0), (0.5, 0), (0.5, 1)]
    assert history[0]["within"]          # no gap at 0.3: matched on the inputs is matched in the evaluation
    first, second = history[1:]
    assert not first["within"] and first["difference"] == pytest.approx(GAP, abs=0.026)  # the first search stops within 0.025
    assert second["within"] and abs(second["difference"]) <= 0.025
    assert second["target on the inputs"] == pytest.approx(first["sink in evaluation"] - GAP, abs=1e-6)
    assert table[table.control == "matched"].matched_ok.all()
    what = f"{lm.name}: matching the control's mass"
    assert reported == [(what, 0, 2), (what, 1, 2), (what, 0, 1)]   # one per search: two, then the one re-searched
    none = rematch.match_in_evaluation(lm, plans, mass, [L - 1], seqs, eval_n={"math": 2}, tolerance=0.05, rounds=0)
    assert [h["round"] for h in none[2]] == [0, 0]
    assert list(none[0][none[0].control == "matched"].drop_duplicates("dose").matched_ok) == [True, False]


def test_rounds_are_shown_with_short_column_names():
    from sinklib.causal import rematch

    row = {"model": "m", "dose": 0.3, "round": 1, "x": 0.5, "extra heads": 2, "target on the inputs": 0.71234,
           "removed on the inputs": 0.7, "removed in evaluation": 0.72, "sink in evaluation": 0.7, "difference": 0.02,
           "within": True}
    shown = rematch.rounds_display([row])
    assert list(shown.index.names) == ["model", "dose", "round"]
    assert "added" in shown.columns and "target (inputs)" in shown.columns and "extra heads" not in shown.columns
    assert shown["target (inputs)"].iloc[0] == 0.712 and shown["within"].iloc[0] == "yes"
    assert "removed on the inputs" not in shown.columns and "removed (inputs)" not in shown.columns
    assert list(shown.columns) == ["x", "added", "target (inputs)", "removed (eval.)", "sink (eval.)", "diff.", "within"]


def test_input_gap_is_the_largest_miss_of_a_search():
    from sinklib.causal import rematch

    rows = [{"target on the inputs": 0.70, "removed on the inputs": 0.69},
            {"target on the inputs": 0.50, "removed on the inputs": 0.53}]
    assert abs(rematch.input_gap(rows) - 0.03) < 1e-12
    assert rematch.input_gap([]) != rematch.input_gap([])
