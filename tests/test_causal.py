"""Chapter 8's causal-test helpers: per-item outcomes, paired changes, dose plans, cached evaluation under an
intervention; the exact McNemar test."""
import math

import numpy as np
import pytest
import torch

from sinklib.causal import suites as causal
from sinklib.core import intervene
from sinklib import evals
from sinklib.errors import ParameterError
from sinklib.evals.grading import mcnemar_exact
from sinklib.core.models import tiny_model


def test_mcnemar_exact_known_values():
    assert mcnemar_exact([1] * 5, [0] * 5) == {"b": 5, "c": 0, "p": pytest.approx(2 / 32)}
    assert mcnemar_exact([1, 0, 1, 0], [0, 1, 1, 0])["p"] == 1.0
    assert mcnemar_exact([1, 1], [1, 1]) == {"b": 0, "c": 0, "p": 1.0}
    r = mcnemar_exact([0] * 10 + [1] * 5, [1] * 10 + [1] * 5)  # 10 discordant, all one way
    assert r["c"] == 10 and r["p"] == pytest.approx(2 * 0.5 ** 10)
    with pytest.raises(ParameterError, match="equally long"):
        mcnemar_exact([1], [1, 0])


def _fake(scores: dict[str, list[bool]], nll=(2.0, 3.0), ntok=(2, 3)):
    per_i = [{"strict": s, "lenient": l} for s, l in zip(scores["is"], scores["il"])]
    per_k = [{"acc": a, "acc_norm": a} for a in scores["k"]]
    per_p = [{"nll": a, "n_tokens": n} for a, n in zip(nll, ntok)]
    mk = lambda suite, per: evals.SuiteResult(suite, len(per), {}, {}, per, 0.0)  # noqa: E731
    return {"instructions": mk("instructions", per_i), "knowledge": mk("knowledge", per_k),
            "perplexity": mk("perplexity", per_p)}


def test_outcomes_and_paired_changes():
    base = {"outcomes": causal.outcomes(_fake({"is": [1, 1, 0, 1], "il": [1, 1, 1, 1], "k": [1, 0, 1, 1]}))}
    other = {"outcomes": causal.outcomes(_fake({"is": [0, 0, 0, 1], "il": [1, 1, 1, 1], "k": [1, 0, 1, 1]},
                                               nll=(4.0, 3.0)))}
    assert base["outcomes"]["instructions strict"] == [True, True, False, True]
    assert set(base["outcomes"]) == {"instructions strict", "instructions lenient", "knowledge acc", "perplexity"}
    rows = {r["metric"]: r for r in causal.paired_changes(base, other)}
    s = rows["instructions strict"]
    assert s["base"] == 75 and s["other"] == 25 and s["change"] == -50 and s["lo"] <= -50 <= s["hi"]
    assert s["p"] == pytest.approx(0.5)  # 2 discordant, both one way: 2 * 0.25
    assert rows["knowledge acc"]["change"] == 0 and rows["knowledge acc"]["p"] == 1.0
    p = rows["perplexity ppl"]
    assert p["base"] == pytest.approx(math.exp(1.0)) and p["other"] == pytest.approx(math.exp(7 / 5))
    assert p["lo"] <= p["change"] <= p["hi"] and math.isnan(p["p"])
    short = {"outcomes": {"knowledge acc": [True]}}
    with pytest.raises(ParameterError, match="knowledge acc"):
        causal.paired_changes(base, short)


def test_dose_plans():
    mass = np.array([[0.1, 0.9], [0.8, 0.3], [0.5, 0.95]])
    rows = causal.dose_plans(mass, [1, 2], [0.0, 0.5, 1.0], seed=3)
    assert [(r["dose"], r["control"]) for r in rows] == [(0.0, "none"), (0.5, "sink"), (0.5, "random"),
                                                         (0.5, "matched"), (1.0, "sink"), (1.0, "random"),
                                                         (1.0, "matched")]
    half = {r["control"]: r for r in rows if r["dose"] == 0.5}
    assert half["sink"]["heads"] == {1: [0], 2: [1]} and half["sink"]["k"] == 2
    assert half["matched"]["heads"] == half["sink"]["heads"] and half["matched"]["mode"] == "remove_matched"
    assert sum(map(len, half["random"]["heads"].values())) == 2
    assert causal.dose_plans(mass, [2], [0.5])[0]["control"] == "none"  # a 'none' row is always there
    with pytest.raises(ParameterError, match="controls"):
        causal.dose_plans(mass, [1], [0.5], controls=("zero",))


def test_evaluate_runs_the_suites_inside_the_intervention_and_caches(monkeypatch, tmp_path):
    monkeypatch.setenv("SINKBOOK_CACHE", str(tmp_path))
    lm = tiny_model("llama", seed=0)
    seen = []

    def fake_run_suites(model, tok, suites, n_items, seed, batch_size):
        seen.append(model.config._attn_implementation)
        ids = torch.randint(3, 128, (2, 9), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            model(input_ids=ids, attention_mask=torch.ones_like(ids))
        return _fake({"is": [1, 0], "il": [1, 1], "k": [1, 1]})

    monkeypatch.setattr(evals, "run_suites", fake_run_suites)
    kw = dict(eval_n={"instructions": 2, "knowledge": 2, "perplexity": 2}, seed=0, eval_batch_size=2)
    base = causal.evaluate(lm, None, **kw)
    abl = causal.evaluate(lm, {3: [0, 1, 2, 3]}, **kw)
    assert seen == ["sdpa", intervene.INTERVENE_NAME] and lm.model.config._attn_implementation == "sdpa"
    assert base["mean_mass_taken"] == 0.0 and base["n_heads"] == 0
    assert 0 < abl["mean_mass_taken"] <= 1 and abl["n_heads"] == 4
    matched = causal.evaluate(lm, {3: [0, 1, 2, 3]}, mode="remove_matched", **kw)
    assert 0 < matched["mean_mass_taken"] <= abl["mean_mass_taken"] + 1e-9  # at most the sink's mass
    again = causal.evaluate(lm, {3: [0, 1, 2, 3]}, **kw)
    assert again == abl and len(seen) == 3  # cached: no fourth run


@pytest.mark.slow
def test_ablating_sink_heads_of_smollm2_end_to_end(smollm2, monkeypatch, tmp_path):
    """The real suites run inside the intervention (generation with the KV cache, likelihoods, perplexity):
    the most sink-heavy heads of the last layers lose much of their attention mass, and perplexity rises."""
    from sinklib.core import sink
    from sinklib.core.data import load_prompts

    monkeypatch.setenv("SINKBOOK_CACHE", str(tmp_path))
    res = sink.sink_strength(smollm2.model, load_prompts(4, seed=0), tokenizer=smollm2.tokenizer, last_k_layers=4,
                             all_layers=True, max_tokens=32)
    L = res.mass.shape[0]
    heads = intervene.heads_by_sink_mass(res.mass, list(range(L - 4, L)), 0.5)
    kw = dict(eval_n={"math": 2, "knowledge": 6, "perplexity": 2}, seed=0, eval_batch_size=4)
    base = causal.evaluate(smollm2, None, **kw)
    abl = causal.evaluate(smollm2, heads, **kw)
    assert abl["n_heads"] == sum(map(len, heads.values())) > 0
    assert abl["mean_mass_taken"] > 0.1
    rows = {r["metric"]: r for r in causal.paired_changes(base, abl)}
    assert set(rows) == {"math strict", "math lenient", "knowledge acc", "perplexity ppl"}
    assert rows["perplexity ppl"]["change"] > 0
    assert smollm2.model.config._attn_implementation == "sdpa"


class _Tok:
    bos_token_id, eos_token_id, pad_token_id = 1, 2, 0

    def __call__(self, text, add_special_tokens=True):
        ids = [1] * add_special_tokens + [10 + ord(c) % 50 for c in text]
        return {"input_ids": ids}

    def decode(self, ids, **kw):
        return "decoded"


def test_first_token_replaces_or_drops_the_bos():
    t = _Tok()
    plain = t("ab")["input_ids"]
    none = causal.FirstToken(t, None)
    assert none("ab")["input_ids"] == plain[1:] and none.bos_token_id is None
    assert none("ab", add_special_tokens=False)["input_ids"] == plain[1:]
    other = causal.FirstToken(t, 7)
    assert other("ab")["input_ids"] == [7] + plain[1:] and other.bos_token_id == 7
    assert other.decode([1, 2]) == "decoded" and other.eos_token_id == 2 and other.pad_token_id == 0
    assert causal.FirstToken(t, 1)("ab")["input_ids"] == plain  # BOS as the first token: unchanged
    # without special tokens (the perplexity suite's documents) no first token is added ...
    assert other("ab", add_special_tokens=False)["input_ids"] == plain[1:]
    # ... unless the text itself began with BOS (a chat template), which the first token replaces
    t2 = _Tok()
    t2.__class__ = type("_TokBOS", (_Tok,), {"__call__": lambda self, text, add_special_tokens=True:
                                              {"input_ids": [1, 10, 11]}})
    assert causal.FirstToken(t2, 7)("x", add_special_tokens=False)["input_ids"] == [7, 10, 11]
    with pytest.raises(ParameterError, match="one string"):
        none(["a", "b"])


@pytest.mark.slow
def test_gemma3_without_bos_loses_its_sink(gemma3):
    """Chapter 1's finding through the wrapper: Gemma-3's sink is tied to BOS."""
    from sinklib.core import sink
    from sinklib.core.data import load_prompts

    prompts = load_prompts(4, seed=0)
    kw = dict(last_k_layers=6, max_tokens=32)
    with_bos = sink.sink_strength(gemma3.model, prompts, tokenizer=gemma3.tokenizer, **kw)
    no_bos = sink.sink_strength(gemma3.model, prompts, tokenizer=causal.FirstToken(gemma3.tokenizer, None), **kw)
    written = gemma3.tokenizer("<bos>Hello", add_special_tokens=False)["input_ids"]  # as a chat template writes it
    ids = causal.FirstToken(gemma3.tokenizer, None)("<bos>Hello", add_special_tokens=False)["input_ids"]
    assert written[0] == gemma3.tokenizer.bos_token_id and ids == written[1:]
    assert no_bos.S < with_bos.S - 1.0


def test_order_verdict_rules():
    import pandas as pd

    def t(rows):
        return pd.DataFrame([{"control": "sink", "dose": d, "metric": m, "lo": lo, "hi": hi} for d, m, lo, hi in rows])

    fall, flat = (-20, -5), (-10, 4)
    v = causal.order_verdict(t([(0.25, "math strict", *fall), (0.25, "knowledge acc", *flat),
                                (0.5, "knowledge acc", *fall), (0.5, "instructions strict", *flat)]))
    assert v == {"format_dose": 0.25, "knowledge_dose": 0.5, "untested_doses": [],
                 "verdict": "strict math falls first (dose 0.25, knowledge from 0.5)"}
    v = causal.order_verdict(t([(0.5, "math strict", *flat), (0.5, "knowledge acc", *fall)]))
    assert v["verdict"] == "knowledge falls (from dose 0.5), format does not"
    v = causal.order_verdict(t([(1.0, "math lenient", *fall), (1.0, "knowledge acc", *flat)]))
    assert v["verdict"] == "neither falls outside the noise at any dose"  # lenient is not a format metric
    v = causal.order_verdict(t([(1.0, "math strict", *fall), (1.0, "knowledge acc", *fall)]))
    assert v["verdict"] == "strict math and knowledge fall together (dose 1)"
    v = causal.order_verdict(t([(0.5, "math strict", *fall), (0.5, "instructions strict", *fall),
                                (0.25, "math lenient", *fall), (1.0, "knowledge acc", *fall)]))
    assert v["verdict"] == ("strict instruction format and strict math fall first (dose 0.5, knowledge from 1); "
                            "lenient math falls too (from dose 0.25, before its strict grading)")
    v = causal.order_verdict(t([(0.5, "format strict", *fall), (0.5, "format lenient", *fall)]))
    assert v["verdict"] == "strict format falls (from dose 0.5), knowledge does not; lenient format falls too (from dose 0.5)"
    v = causal.order_verdict(t([(0.3, "math strict", *fall), (0.5, "instructions strict", *flat),
                                (0.7, "instructions strict", *fall)]))   # a later strict fall is named too
    assert v["verdict"] == ("strict math falls (from dose 0.3), knowledge does not; strict instruction format falls "
                            "later (from dose 0.7)")
    assert causal.falls({"metric": "perplexity ppl", "lo": 0.5, "hi": 3}) and not causal.falls(
        {"metric": "math strict", "lo": -3, "hi": 0.0})


def test_dose_response_pairs_every_plan_with_the_unablated_model(monkeypatch, tmp_path):
    monkeypatch.setenv("SINKBOOK_CACHE", str(tmp_path))
    lm = tiny_model("llama", seed=0)
    calls = []

    def fake_run_suites(model, tok, suites, n_items, seed, batch_size):
        calls.append(model.config._attn_implementation)
        ablated = model.config._attn_implementation == intervene.INTERVENE_NAME
        return _fake({"is": [1, 1, 0, 1], "il": [1, 1, 1, 1], "k": [0, 1, 1, 1] if ablated else [1, 1, 1, 1]})

    monkeypatch.setattr(evals, "run_suites", fake_run_suites)
    plans = causal.dose_plans(np.random.default_rng(0).random((4, 4)), [2, 3], [0.0, 0.5])
    table, res = causal.dose_response(lm, plans, eval_n={"instructions": 4, "knowledge": 4, "perplexity": 2})
    assert len(calls) == 4 and set(res) == {(0.0, "none"), (0.5, "sink"), (0.5, "random"), (0.5, "matched")}
    assert set(table.control) == {"sink", "random", "matched"} and (table.k == 4).all()
    k = table[(table.metric == "knowledge acc") & (table.control == "sink")].iloc[0]
    assert k.change == -25 and k.p == 1.0
    with pytest.raises(ParameterError, match="first_token"):
        causal.evaluate(lm, None, eval_n={"knowledge": 1}, first_token="bos")


def test_dose_panel_draws_one_line_per_control():
    import matplotlib

    matplotlib.use("Agg")
    import pandas as pd

    from sinklib import plots

    t = pd.DataFrame([{"control": c, "dose": d, "metric": "math strict", "change": -d * 10, "lo": -d * 20, "hi": 1.0}
                      for c in ("sink", "random", "matched") for d in (0.25, 0.5)])
    fig, axes = plots.subplots(1, 1)
    plots.dose_panel(axes[0], t, "math strict")
    assert len(axes[0].containers) == 3 and axes[0].get_ylabel().endswith("(points)")


@pytest.mark.parametrize("draft,schema", [("08_causal_tests", "sinklib.causal:CHAPTER8_PARAMS"),
                                          ("07_controlled_panel", "sinklib.tiny.panel:CHAPTER7_PARAMS")])
def test_chapter_parameters_are_the_schema(draft, schema):
    """A chapter (or draft) declares exactly the parameters its schema checks, with valid defaults."""
    import importlib
    import json
    from pathlib import Path

    from sinklib.core.params import validate

    mod, name = schema.split(":")
    schema = getattr(importlib.import_module(mod), name)
    nb = json.loads((Path(__file__).resolve().parent.parent / f"notebooks/{draft}.ipynb").read_text())
    cell = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(cell) == 1
    ns: dict = {}
    exec("".join(cell[0]["source"]), ns)
    ns = {k: v for k, v in ns.items() if not k.startswith("__")}
    assert set(ns) == set(schema)
    assert validate(schema, ns) == ns


def test_tiny_lm_dose_response_runs_the_tiny_suites_under_the_intervention(monkeypatch, tmp_path):
    """Chapter 7's tiny LMs go through the same dose-response code: their own suites, paired changes,
    an order verdict on 'format strict' against knowledge."""
    from sinklib.tiny.train import train_tiny

    monkeypatch.setenv("SINKBOOK_CACHE", str(tmp_path))
    run = train_tiny("per_head", size=dict(d_model=32, n_layers=2, n_heads=2, ffn=64, context=64),
                     tokenizer={"vocab_size": 300, "n_docs": 800}, steps=4, batch_size=4, seq_len=48, n_docs=300,
                     checkpoints=[0, 4], sink={"n_prompts": 2, "max_tokens": 32})
    lm = causal.TinyLM.of(run, "tiny per_head", max_new_tokens=3)
    mass = np.asarray(run.log["checkpoints"][-1]["mass"])
    plans = causal.dose_plans(mass, [0, 1], [0.0, 1.0], seed=0)
    eval_n = {"format": 6, "knowledge": 4, "perplexity": 2}
    table, results = causal.dose_response(lm, plans, eval_n=eval_n, seed=0, eval_batch_size=4)
    assert set(table.metric) == {"format strict", "format lenient", "knowledge acc", "perplexity ppl"}
    assert set(table.control) == {"sink", "random", "matched"} and (table.k == 4).all()
    sink_row = results[(1.0, "sink")]
    assert sink_row["n_heads"] == 4 and 0 < sink_row["mean_mass_taken"] <= 1
    assert len(results[(0.0, "none")]["outcomes"]["format strict"]) == 6
    assert causal.order_verdict(table, "sink")["verdict"]
    with pytest.raises(ParameterError, match="eval_n of a tiny model"):
        causal.evaluate(lm, None, eval_n={"instructions": 2})


def test_dose_plans_add_random_draws_below_dose_one_with_their_own_seeds():
    import numpy as np

    mass = np.random.default_rng(0).random((4, 6))
    one = causal.dose_plans(mass, [2, 3], [0.0, 0.5, 1.0], seed=3)
    three = causal.dose_plans(mass, [2, 3], [0.0, 0.5, 1.0], seed=3, random_draws=3)
    extra = [p for p in three if p["control"].startswith("random ")]
    assert [(p["dose"], p["control"]) for p in extra] == [(0.5, "random 2"), (0.5, "random 3")]
    assert [p for p in three if p not in extra] == one                    # the first draw is unchanged
    first = next(p for p in one if (p["dose"], p["control"]) == (0.5, "random"))
    assert all(p["k"] == first["k"] and p["heads"] != first["heads"] for p in extra)
    assert not [p for p in causal.dose_plans(mass, [2, 3], [0.5], controls=["sink"], random_draws=3)
                if p["control"].startswith("random")]
    assert [causal.random_draw(c) for c in ("random", "random 2", "sink", "matched")] == [1, 2, 0, 0]
    with pytest.raises(ParameterError, match="random_draws"):
        causal.dose_plans(mass, [2, 3], [0.5], random_draws=0)


def test_random_sets_say_how_many_sink_heads_they_share():
    import numpy as np

    from sinklib import causal

    mass = np.arange(16, dtype=float).reshape(2, 8)
    plans = causal.dose_plans(mass, [0, 1], [0.5, 1.0], seed=0, controls=("sink", "random"), random_draws=2)
    rows = causal.shared_with_sink(plans)
    assert [(r["dose"], r["control"]) for r in rows] == [(0.5, "random"), (0.5, "random 2")]   # dose 1: none
    sink = {(l, h) for l, hs in next(p for p in plans if p["control"] == "sink" and p["dose"] == 0.5)["heads"].items()
            for h in hs}
    for r in rows:
        plan = next(p for p in plans if p["control"] == r["control"] and p["dose"] == 0.5)
        assert r["shared"] == len(sink & {(l, h) for l, hs in plan["heads"].items() for h in hs}) and r["k"] == 8
    text = causal.shared_sentence({"m": rows})
    assert text.startswith("m: ") and "of 8 at dose 0.5" in text
    assert causal.shared_sentence({"m": []}) == "no random set below dose 1 in this run"
