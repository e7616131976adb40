"""sinklib.adapt.readings: chapter 4's sentences whose direction follows the data, on made-up per-item outcomes
and tables where the answer is known."""
import numpy as np
import pandas as pd

from sinklib.adapt import readings as R
from sinklib.evals.paired import pack

N = 120


def _out(p_instr, p_math, p_len, p_know, seed):
    rng = np.random.default_rng(seed)
    return pack({"instructions strict": list(rng.random(N) < p_instr), "math strict": list(rng.random(N) < p_math),
                 "math lenient": list(rng.random(N) < p_len), "knowledge acc": list(rng.random(N) < p_know)})


def _doc(text_only_lenient=0.1):
    """Base passes about half of everything; VL keeps it; text-only loses strict math (and lenient math when
    `text_only_lenient` is low); two extra training seeds of each."""
    raw = {k: [i % 2 == 0 for i in range(N)] for k in ("instructions strict", "math strict", "math lenient",
                                                      "knowledge acc")}
    base = pack(raw)
    outs = {"base": base}
    for s in (0, 1, 2):
        tag = "" if s == 0 else f" seed {s}"
        outs["vl" + tag] = base
        outs["text_only" + tag] = pack({**raw, "instructions strict": [False] * N, "math strict": [False] * N,
                                        "math lenient": [v and (i % 4 != 0 if text_only_lenient < 0.5 else True)
                                                         for i, v in enumerate(raw["math lenient"])]})
    scores = [{"model": "m", "condition": c, "suite": k.split()[0], "metric": k.split()[1], "score": 50.0, "lo": 40.0,
               "hi": 60.0, "n": N} for c in ("base", "vl", "text_only")
              for k in ("instructions strict", "math strict", "math lenient", "knowledge acc")]
    return {"results": {"scores": scores, "outcomes": {"m": outs}}}


def test_seeds_label_counts_the_seeds():
    assert R.seeds_label(["a", "b"], ["a", "b"], [1, 2], 0) == "3 training seeds pooled"
    assert R.seeds_label(["a", "b"], ["a"], [1], 0) == "2 training seeds pooled for a; training seed 0 alone for b"
    assert R.seeds_label(["a"], ["a"], [], 3) == "training seed 3 alone"


def test_loss_source_and_text_only_reading_follow_the_intervals():
    doc = _doc()
    s = R.loss_source(doc, ["m"])
    assert s.startswith("VL lost no strict format outside the noise in any model, so this run has no VL loss")
    assert "3 training seeds pooled" in s and "the loss it does show is the text-only control's, in m (" in s
    t = R.text_only_reading(doc, ["m"])
    assert "strict math fell outside the noise" in t and "lenient math fell outside the noise" in t
    assert t.endswith("it takes format and some arithmetic")
    kept = R.text_only_reading(_doc(text_only_lenient=0.9), ["m"])
    assert "lenient math stayed within the noise" in kept and kept.endswith("the format, not the arithmetic")


def test_change_sentence_counts_the_seeds_outside_their_noise():
    seed_rows = pd.DataFrame([{"model": "m", "condition": "vl", "metric": "knowledge acc", "change": 5.0,
                               "lo": lo, "hi": lo + 6, "training seed": s} for s, lo in enumerate((1.0, 2.0, -1.0))])
    s = R.change_sentence(_doc(), seed_rows, ["m"], "vl", ("knowledge acc",))
    assert s.startswith("m: knowledge stayed within the noise (0.0 [") and "3 training seeds pooled" in s
    assert s.endswith("seeds outside their own noise: 2 of 3 above zero, 0 below)")


def test_format_outside_reads_each_condition():
    means = pd.DataFrame([{"model": "m", "condition": c} for c in ("vl", "text_only")])
    assert R.format_outside(_doc(), means) == {("m", "vl"): False, ("m", "text_only"): True}


def test_kl_ratio_sentence_says_which_control_moves_the_model_more():
    s = R.kl_ratio_sentence({"m": {"vl": {"kl": 0.01}, "text_only": {"kl": 0.05}}})
    assert s.startswith("m: text-only moves the next-token distribution 5.0 times as far as VL (0.050 against 0.010")
    assert "VL changing the model less" in s
    assert "about as much" in R.kl_ratio_sentence({"m": {"vl": {"kl": 0.01}, "text_only": {"kl": 0.012}}})
    assert R.kl_ratio_sentence({}) == "not measured in this run"


def test_runtime_note_names_only_the_slow_stages():
    rows = [{"model": "m", "condition": "vl", "stage": "stage2", "steps": 60, "seconds": 1900, "median s/step": 30.0},
            {"model": "m", "condition": "vl seed 1", "stage": "stage2", "steps": 60, "seconds": 180, "median s/step": 3.0},
            {"model": "m", "condition": "vl seed 2", "stage": "stage2", "steps": 60, "seconds": 900, "median s/step": 3.1},
            {"model": "m", "condition": "text_only", "stage": "stage2", "steps": 60, "seconds": 300, "median s/step": 5.0}]
    s = R.runtime_note(rows)
    assert s.startswith("m VL stage 2, training seed 0: 30.0 s per step against 3.0 on another seed; "
                        "m VL stage 2, training seed 2: 900 s in all against 180 on another seed.")
    assert "text-only" not in s
    assert R.runtime_note(rows[1:2] + rows[3:]).startswith("every stage took less than 2 times")


def _finding_inputs(s_vl=(0.06, 0.07, 0.065), random_change=1.0):
    sink_rows = pd.DataFrame([{"model": "m", "condition": c, "S change": x}
                              for c, x in zip(("vl", "vl seed 1", "vl seed 2"), s_vl)])
    power_rows = pd.DataFrame([{"suite": "m: instructions strict", "items": 72, "paired, flip 0.05": 18.0},
                               {"suite": "m: math strict", "items": 300, "paired, flip 0.05": 7.0}])
    curve = pd.DataFrame([{"model": "m", "scale": 8.8, "metric": "strict-format mean", "change": random_change,
                           "lo": -3.0, "hi": 5.0}])
    vl_strict = pd.DataFrame([{"model": "m", "change": 0.0, "lo": -5.5, "hi": 5.4}])
    return dict(sink_rows=sink_rows, power_rows=power_rows, kls={"m": {"vl": {"kl": 0.01}, "text_only": {"kl": 0.047}}},
                curve=curve, vl_strict=vl_strict, kl_sizes={"m": 8.8})


def test_plain_finding_follows_the_data():
    s = R.plain_finding(_doc(), ["m"], **_finding_inputs())
    assert s.startswith("In m (values in that order; points of the strict-format mean, 3 training seeds pooled, "
                        "95 % intervals), VL adaptation cost no detectable strict format (0.0 [")
    assert "Text-only fine-tuning on the same one-word answers cost a lot of strict format (-" in s
    assert "it also moved the model further than VL did (its next-token KL from the base model 4.7 times VL's in m" in s
    assert "S rose under VL over the training seeds (+0.065 [" in s and "where the paper's fell" in s
    assert "did what VL did in m (8.8x VL's norm: +1.0 points, inside VL's 0.0 [-5.5, +5.4]" in s
    assert s.endswith('The 72-item instruction suite can see only falls of 18.0 points or more (80 % power), so '
                      '"no detectable loss" is not "no loss".')
    other = R.plain_finding(_doc(), ["m"], **_finding_inputs(s_vl=(-0.06, -0.07, -0.065), random_change=-9.0))
    assert "S fell under VL over the training seeds (-0.065 [" in other and "as the paper's did" in other
    assert "lost more strict format than VL in m (8.8x VL's norm: -9.0 points, outside VL's" in other
    mixed = R.plain_finding(_doc(), ["m"], **_finding_inputs(s_vl=(0.1, -0.1, 0.02)))
    assert "S did not move outside the noise under VL over the training seeds" in mixed
    bare = R.plain_finding(_doc(), ["m"], sink_rows=_finding_inputs()["sink_rows"],
                           power_rows=_finding_inputs()["power_rows"])
    assert "KL" not in bare and "random control" not in bare  # no yardstick, no random sizes: those sentences drop


def test_training_line_gap_rates_and_sizes_in_words():
    logs = {"vl": {"seconds": {"stage1": 513.3, "stage2": 1930.04}}, "text_only": {"seconds": {"stage2": 306.7}}}
    assert R.training_line("m", {"vl": False, "text_only": False}, logs) == (
        "m: loaded from the cache: VL (stage 1 513 s, stage 2 1930 s); text-only (stage 2 307 s) (training times of "
        "the run that trained them)")
    assert R.training_line("m", {"vl": True, "text_only": False}, logs).startswith(
        "m: trained now: VL (stage 1 513 s, stage 2 1930 s). loaded from the cache: text-only")
    assert R.gap_sentence({"m VL": 0.0, "m text-only": 0.0}) == "identical, weight for weight, for m VL and m text-only"
    assert R.gap_sentence({"m VL": 3.2e-5}) == "largest absolute weight difference 3.2e-05 for m VL"
    assert R.gap_sentence({}) == "no rerun in this run"
    assert R.rates_sentence({"a": {"lr_lm": 5e-5, "lr_projector_stage2": 5e-5},
                             "b": {"lr_lm": 1e-5, "lr_projector_stage2": 1e-5}}) == \
        "5e-05 for a and 1e-05 for b (the language model and the projector alike)"
    assert R.rates_sentence({"a": {"lr_lm": 5e-5, "lr_projector_stage2": 1e-4}}) == "5e-05 (projector 0.0001) for a"
    assert R.sizes_who(["a"], ["a", "b"]) == "a alone ran them (b has the 1x random control only, in the tables above)"
    assert R.sizes_who(["a", "b"], ["a", "b"]) == "a and b ran them"
    assert R.qk_norm_words("none") == "no QK-norm" and R.qk_norm_words("per_head") == "per-head QK-norm"


def test_qk_norm_words_are_one_copy_said_two_ways():
    from sinklib.core import words

    assert R.qk_norm_words is words.qk_norm_words      # chapter 4's name is the one copy
    assert words.qk_norm_words("layerwise") == "layerwise QK-norm"
    assert words.qk_norm_words("some_kind") == "some-kind QK-norm"
    assert [words.qk_norm_words(k, with_=True) for k in ("none", "per_head")] == \
        ["without QK-norm", "with per-head QK-norm"]


def test_vl_s_changes_reads_one_condition_of_one_model_over_its_seeds():
    rows = pd.DataFrame({"model": ["a", "a", "a", "a", "b"],
                         "condition": ["vl", "vl seed 1", "text_only", "vl seed 2", "vl"],
                         "S change": [0.1, 0.2, -0.5, 0.3, 9.0]})
    xs, e = R.vl_s_changes(rows, "a")
    assert xs == [0.1, 0.2, 0.3]
    assert abs(e.v - 0.2) < 1e-12 and e.lo < 0.2 < e.hi
    xs, e = R.vl_s_changes(rows, "b")
    assert xs == [9.0] and e is None
    assert R.vl_s_changes(rows, "a", "text_only")[0] == [-0.5]
