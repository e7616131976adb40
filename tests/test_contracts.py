"""Chapter contracts in code: what one chapter writes and another reads goes through sinklib
(panel rows and their columns, strict-format means, seed offsets, the clamp of K, parameter schemas)."""
from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from sinklib.core import anatomy, params, sink
from sinklib import evals, vl
from sinklib.controls import merge
from sinklib.adapt import pairs
from sinklib.stats import panel
from sinklib.bound import CHAPTER3_PARAMS, VARIANTS
from sinklib.errors import PanelError, ParameterError
from sinklib.core.models import tiny_model


def _scores() -> pd.DataFrame:
    rows = []
    for cond, shift in (("base", 0.0), ("vl", -10.0), ("text_only", -2.0), ("random", -30.0)):
        for (s, m), v in zip(pairs.MAIN_METRICS, (50, 60, 40, 45, 30, 12)):
            rows.append({"model": "m", "condition": cond, "suite": s, "metric": m, "score": v + shift})
    return pd.DataFrame(rows)


def test_panel_rows_of_chapter_4_are_what_chapter_5_reads(tmp_path):
    deltas = pairs.score_deltas(_scores())
    assert set(deltas.condition) == {"vl", "text_only", "random"} and (deltas.change[deltas.condition == "vl"] == -10).all()
    vl_changes = deltas[deltas.condition == "vl"].set_index("metric").change
    rows = [pairs.panel_row(f"m{i}", S=float(i), qk_norm=q, changes=vl_changes + i)
            for i, q in enumerate(("none", "per_head", "layerwise"))]
    assert panel.STRICT_TASK in rows[0] and rows[0][panel.STRICT_TASK] == -10.0
    (tmp_path / "04_vl_adaptation.json").write_text(json.dumps({"results": {"panel_rows": rows}}))
    measured = panel.collect_panel_rows(tmp_path)
    assert len(measured) == 3 and panel.STRICT_TASK in panel.task_columns(measured)
    summary = panel.panel_summary(measured, n_boot=99, n_perm=99)
    assert panel.task_name(panel.STRICT_TASK) in panel.measured_statistic(summary, "rho")  # words, not the column
    assert panel.measured_statistic(None, "rho").startswith("n/a")


def test_strict_mean_of_a_mapping_and_of_a_frame():
    assert pairs.strict_mean({"instructions strict": 10.0, "math strict": 20.0, "knowledge acc": 99.0}) == 15.0
    assert pairs.strict_mean({"instructions strict": 10.0}) == 10.0
    df = pd.DataFrame({"instructions strict": [10.0, 0.0], "math strict": [20.0, 4.0]})
    assert pairs.strict_mean(df).tolist() == [15.0, 2.0]


def test_condition_row_flattens_an_evaluation():
    ev = {"S": 1.5, "vqa": [0.25, 16], "scores": [{"suite": "math", "metric": "strict", "score": 40.0}]}
    assert pairs.condition_row("m", "vl", ev) == {"model": "m", "condition": "vl", "S": 1.5, "VQA (%)": 25.0,
                                                  "math strict": 40.0}


def test_seed_offsets_give_separate_item_streams():
    assert vl.VQA_EVAL_SEED_OFFSET != vl.VQA_TRACK_SEED_OFFSET
    held, track = vl.heldout_items(8, seed=0), vl.tracking_items(8, seed=0)
    assert [it.question for it in held] == [it.question for it in vl.eval_items(8, seed=vl.VQA_EVAL_SEED_OFFSET)]
    assert [it.question for it in track] == [it.question for it in vl.eval_items(8, seed=vl.VQA_TRACK_SEED_OFFSET)]


def test_k_is_clamped_to_the_model_depth():
    m = tiny_model("llama", seed=0).model
    L = anatomy.n_layers(m)
    assert anatomy.clamp_last_k(10 * L, m) == L and anatomy.clamp_last_k(1, m) == 1
    assert pairs.sink_settings(m, 99, 32) == {"max_tokens": 32, "last_k_layers": L}
    assert len(anatomy.decoder_layers(m)) == L


def test_anatomy_head_and_padding():
    m = tiny_model("llama", seed=0).model
    h = torch.randn(3, m.config.hidden_size)
    torch.testing.assert_close(anatomy.head_logits(m, h), m.get_output_embeddings()(h).float())
    assert torch.equal(anatomy.apply_softcap(torch.tensor([100.0]), 30.0), torch.tanh(torch.tensor([100 / 30])) * 30)
    ids, att = anatomy.pad_batch([[5, 6, 7], [8]], pad_id=0, side="left")
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and att.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert anatomy.positions(att).tolist() == [[0, 1, 2], [0, 0, 0]]


def test_one_vocabulary_of_qk_norm_types():
    assert VARIANTS == panel.QK_NORM_TYPES == anatomy.QK_NORM_TYPES == ("none", "per_head", "layerwise")


def test_validate_returns_the_checked_parameters_and_names_the_bad_one():
    good = {"models": "smollm2-135m", "device": "auto", "n_prompts": 3.0, "seed": 0, "max_tokens": 64,
            "map_layers": [2, -1], "map_heads": 3, "first_word": "Hello", "profile": "quick"}
    p = params.validate(sink.CHAPTER1_PARAMS, good)
    assert p["models"] == ["smollm2-135m"] and p["n_prompts"] == 3 and list(p) == list(sink.CHAPTER1_PARAMS)
    with pytest.raises(ParameterError, match="'n_prompts'.*'many'.*allowed"):
        params.validate(sink.CHAPTER1_PARAMS, {**good, "n_prompts": "many"})
    with pytest.raises(ParameterError, match="'map_heads' is missing"):
        params.validate(sink.CHAPTER1_PARAMS, {k: v for k, v in good.items() if k != "map_heads"})


def test_dependent_checks_see_earlier_parameters():
    schema = {"lo": params.integer(0), "hi": params.Dependent(lambda n, v, p: params.check_int(n, v, p["lo"]))}
    assert params.validate(schema, {"lo": 2, "hi": 3}) == {"lo": 2, "hi": 3}
    with pytest.raises(ParameterError, match="'hi'"):
        params.validate(schema, {"lo": 2, "hi": 1})
    base = {k: 1 for k in CHAPTER3_PARAMS}
    with pytest.raises(ParameterError, match="sensitivity_rel"):
        params.validate(CHAPTER3_PARAMS, {**base, "profile": "quick", "models": ["x"], "rel_changes": [0.1],
                                          "sensitivity_rel": 0.2, "device": "cpu", "scale_min": 1.0, "rel_min": 0.1,
                                          "rel_max": 0.5, "sweep_rel": 0.1, "remark_rel": 0.1, "n_sweep_scales": 3,
                                          "remark_heads": 2, "max_tokens": 8})


def test_chapter_schemas_share_their_parts():
    from sinklib.causal import suites as causal

    for schema in (pairs.CHAPTER4_PARAMS, merge.CHAPTER6_PARAMS, causal.CHAPTER8_PARAMS):
        assert set(evals.COUNT_PARAMS) <= set(schema) and {"models", "device", "profile"} <= set(schema)
    p = {"eval_instructions": 1, "eval_math": 2, "eval_knowledge": 3, "eval_perplexity": 4}
    assert evals.counts(p) == {"instructions": 1, "math": 2, "knowledge": 3, "perplexity": 4}
    with pytest.raises(PanelError, match="panel_csv"):
        panel.CHAPTER5_PARAMS["panel_csv"]("panel_csv", "/no/such/file.csv")
    with pytest.raises(ParameterError, match="image_size"):
        pairs.pair_params("m", image_size=16)  # one range for image_size: vl's (a multiple of 3 in [24, 512])


def test_tiny_panel_rows_of_chapter_7_are_what_chapter_5_reads_as_its_second_panel(tmp_path):
    from sinklib.tiny.panel import TASKS, results_entry

    assert panel.TINY_STRICT_TASK in TASKS
    rows = pd.DataFrame([pairs.panel_row(f"tiny-{q}-{i}", S=float(i), qk_norm=q,
                                         changes={"format strict": -5.0 * i, "knowledge acc": 1.0})
                         for i, q in enumerate(("none", "per_head", "layerwise", "none"))])
    rows["setting"] = "pilot"
    (tmp_path / "07_controlled_panel.json").write_text(json.dumps({"results": results_entry(rows)}))
    (tmp_path / "04_vl_adaptation.json").write_text(json.dumps({"results": {"panel_rows": [
        pairs.panel_row("m", S=1.0, qk_norm="none", changes={"instructions strict": -3.0})]}}))
    tiny = panel.collect_panel_rows(tmp_path, panel="tiny")
    assert len(tiny) == 4 and panel.TINY_STRICT_TASK in panel.task_columns(tiny)
    assert list(panel.collect_panel_rows(tmp_path)["llm"]) == ["m"]  # the two panels are never mixed
    summary = panel.panel_summary(tiny, n_boot=99, n_perm=99)
    assert "format strict" in panel.measured_statistic(summary, "rho", tasks=(panel.TINY_STRICT_TASK,))
    text = panel.architecture_statistic(summary, panel.TINY_STRICT_TASK)
    assert text.startswith("n/a") or "within-variant permutation" in text
    assert panel.architecture_statistic(None).startswith("n/a")
    with pytest.raises(PanelError, match="allowed: pairs, tiny"):
        panel.collect_panel_rows(tmp_path, panel="vl")


def test_chapter_7_summarises_with_chapter_5s_resampling_sizes():
    """Chapter 7 prints the controlled panel's statistics before chapter 5 does; both must print the same
    numbers, so chapter 7 uses chapter 5's full-profile resampling sizes."""
    from sinklib.book import runner as book
    from sinklib.tiny.panel import STAT_KW

    full = book.load_profile("05_panel_correlations", "full")
    assert {k: full[k] for k in STAT_KW} == STAT_KW
