"""#29: the 'field' phrasing of the VL questions shares no template with any evaluation suite, by construction; the
default 'question' phrasing is today's text, byte for byte, so every cached training and result stays valid."""
from __future__ import annotations

import re

import pytest

from sinklib import vl
from sinklib.adapt import pairs, sweep
from sinklib.core import cache
from sinklib.core.models import tiny_model
from sinklib.errors import ParameterError
from sinklib.evals import collide
from sinklib.vl import collisions, scenes
from tests.test_vl import TOK

#: every question each phrasing can write (every slot value), for the check by construction
SLOTS = {"count": [""], "colour": list(vl.SHAPES), "exists": [f"{c} {k}" for c in vl.COLOURS for k in vl.SHAPES],
         "where": list(vl.COLOURS)}


def _all_questions(phrasing: str) -> list[str]:
    return [vl.QUESTION_TEMPLATES[phrasing][q].format(s) for q, slots in SLOTS.items() for s in slots]


@pytest.fixture(scope="module")
def suites():
    return {which: collide.local_suite_items(which) for which in ("powered", "core")}


def test_field_phrasing_shares_no_template_with_any_suite(suites):
    train = {collide.template(q) for q in _all_questions("field")}
    assert train == {"shape ...", "colour ...", "presence ...", "column ..."}
    for evals in suites.values():
        assert not train & {collide.template(e.text) for e in evals}
    from sinklib.tiny import corpus  # the tiny models' format suite (chapter 7) asks "How many ...?" too

    tiny = {collide.template(it.prompt) for it in corpus.eval_items("format", 100, seed=0)}
    assert not train & tiny
    assert "how many ...?" in tiny and "how many ...?" in {collide.template(q) for q in _all_questions("question")}


def test_no_control_collides_under_the_field_phrasing(suites):
    for which in ("powered", "core"):
        found = collisions.control_collisions(instructions=which, phrasing="field", steps=10)
        assert set(found) == set(collisions.CONTROLS)
        for control, rows in found.items():
            assert not [r for r in rows if r["verdict"] == "collision"], control
            assert rows == [], control  # not even a shared template scored without a format
            assert collide.sentence(rows) == "no training template collides with an evaluation item's strict format"
    pairs_ = collisions.control_pairs("text_only_sentence", steps=10, phrasing="field")
    assert {q.split()[0] for q, _ in pairs_} == {"Shape", "Colour", "Presence", "Column"}
    assert all(not q.endswith("?") and a.endswith(".") for q, a in pairs_)


def test_default_phrasing_is_todays_text():
    got = [(it.qtype, it.question, it.answer) for it in vl.batch_items(0, 6, seed=0, tag="lm")]
    assert got == [("count", "How many shapes are there?", "1"), ("count", "How many shapes are there?", "3"),
                   ("count", "How many shapes are there?", "3"), ("colour", "What colour is the square?", "blue"),
                   ("count", "How many shapes are there?", "1"), ("exists", "Is there a green square?", "yes")]
    got = [(it.qtype, it.question, it.answer) for it in vl.eval_items(5, seed=1)]
    assert got == [("where", "Where is the blue shape?", "middle"), ("count", "How many shapes are there?", "1"),
                   ("where", "Where is the blue shape?", "left"), ("exists", "Is there a blue square?", "no"),
                   ("exists", "Is there a green square?", "no")]
    assert [it.question for it in vl.eval_items(50, seed=4)] == \
        [it.question for it in vl.eval_items(50, seed=4, phrasing="question")]


def test_phrasings_differ_only_in_the_question_text():
    q, f = vl.heldout_items(300, seed=2), vl.heldout_items(300, seed=2, phrasing="field")
    assert [it.qtype for it in q] == [it.qtype for it in f] and [it.answer for it in q] == [it.answer for it in f]
    assert [vl.describe(it.scene) for it in q] == [vl.describe(it.scene) for it in f]
    assert all((a.scene.image == b.scene.image).all() for a, b in zip(q[:20], f[:20]))
    assert {it.question for it in f}.isdisjoint({it.question for it in q})
    assert vl.tracking_items(5, 0, phrasing="field")[0].question in _all_questions("field")
    tr = vl.batch_items(3, 16, seed=1, tag="lm", phrasing="field")
    assert [it.answer for it in tr] == [it.answer for it in vl.batch_items(3, 16, seed=1, tag="lm")]


def _from_sentence(qtype: str, s: str) -> tuple[str, str]:
    """(slot, answer) read back from a sentence of `sentence_answer`."""
    if qtype == "count":
        return "", "1" if s == "There is one shape." else re.fullmatch(r"There are (\d) shapes\.", s).group(1)
    if qtype == "colour":
        return re.fullmatch(r"The (\w+) is (\w+)\.", s).groups()
    if qtype == "exists":
        m = re.fullmatch(r"(Yes), there is a (\w+ \w+)\.|(No), there is no (\w+ \w+)\.", s)
        return (m.group(2), "yes") if m.group(1) else (m.group(4), "no")
    return re.fullmatch(r"The (\w+) shape is in the (\w+) column\.", s).groups()


@pytest.mark.parametrize("phrasing", vl.PHRASINGS)
def test_sentence_answers_round_trip_in_both_phrasings(phrasing):
    items = vl.eval_items(300, seed=5, phrasing=phrasing)
    assert {it.qtype for it in items} == set(vl.QUESTION_TYPES)
    for it in items:
        slot, answer = _from_sentence(it.qtype, vl.sentence_answer(it))
        assert answer == it.answer and it.question == vl.QUESTION_TEMPLATES[phrasing][it.qtype].format(slot)
    same = vl.eval_items(300, seed=5, phrasing="question")  # the same sentences in either phrasing
    assert [vl.sentence_answer(a) for a in items] == [vl.sentence_answer(b) for b in same]
    for qtype, slots in SLOTS.items():  # every slot value, both answers where there are two
        for s in slots:
            for a in vl.ANSWERS[qtype]:
                it = vl.QAItem(items[0].scene, qtype, vl.QUESTION_TEMPLATES[phrasing][qtype].format(s), a)
                assert _from_sentence(qtype, vl.sentence_answer(it)) == (s, a)
    with pytest.raises(ParameterError, match="does not follow the template"):
        vl.sentence_answer(vl.QAItem(items[0].scene, "colour", "Colour of the square?", "red"))


def test_a_bad_phrasing_names_the_allowed_values():
    for call in (lambda: vl.check_phrasing("prose"), lambda: vl.make_items(vl.make_scenes(2), phrasing="prose"),
                 lambda: vl.batch_items(0, 2, phrasing="prose"), lambda: vl.eval_items(2, phrasing="prose"),
                 lambda: vl.heldout_items(2, phrasing="prose"), lambda: pairs.pair_params("m", phrasing="prose"),
                 lambda: collisions.control_pairs("vl", steps=1, phrasing="prose"),
                 lambda: vl.train_vl(None, TOK, stage1_steps=0, stage2_steps=0, progress=False, phrasing="prose")):
        with pytest.raises(ParameterError, match=r"phrasing.*'question', 'field'"):
            call()


def test_pair_params_add_the_key_only_for_the_field_phrasing():
    today = {"model": "smollm2-135m", "weights": "0123abcd", "seed": 0, "image_size": 48, "stage1_steps": 200,
             "stage2_steps": 60, "batch_size": 32, "lr_projector": 0.01, "lr_lm": 5e-05, "lr_projector_stage2": 5e-05,
             "schedule": "constant"}
    assert pairs.pair_params("smollm2-135m", weights="0123abcd", phrasing="question") == today
    assert pairs.pair_params("smollm2-135m", weights="0123abcd") == today
    field = pairs.pair_params("smollm2-135m", weights="0123abcd", phrasing="field")
    assert field == {**today, "phrasing": "field"}
    assert (pairs.phrasing_of(today), pairs.phrasing_of(field)) == ("question", "field")
    assert cache.key(field) != cache.key(today)
    nb = {**vl.RECIPE, "seed": 0, "image_size": 48}
    assert pairs.pair_params_of("smollm2-135m", nb, weights="0123abcd") == today
    assert pairs.pair_params_of("smollm2-135m", {**nb, "phrasing": "field"}, weights="0123abcd") == field
    # the sweep's stage-1 checkpoint: unchanged for today's pairs, its own for the field phrasing
    old = cache.checkpoint_dir(cache.key({**{k: today[k] for k in sweep.STAGE1_KEYS}, "kind": "vl stage 1"}))
    assert sweep.stage1_dir(today) == old != sweep.stage1_dir(field)
    assert sweep._common(field, False)["phrasing"] == "field" and sweep._common(today, False)["phrasing"] == "question"


def test_both_trainings_use_the_phrasing(monkeypatch):
    from sinklib.vl import train as vl_train

    seen: list[str] = []

    def spy(*args, **kwargs):
        items = scenes.batch_items(*args, **kwargs)
        seen.extend(it.question for it in items)
        return items

    monkeypatch.setattr(vl_train, "batch_items", spy)
    r = vl.train_vl(tiny_model("llama", seed=0).model, TOK, stage1_steps=1, stage2_steps=1, batch_size=2,
                    progress=False, phrasing="field")
    t = vl.train_text_only(tiny_model("llama", seed=0).model, TOK, steps=1, batch_size=2, progress=False,
                           phrasing="field", answer_style="sentence")
    assert r.params["phrasing"] == t.params["phrasing"] == "field"
    assert len(seen) == 6 and set(seen) <= set(_all_questions("field"))
    seen.clear()
    d = vl.train_text_only(tiny_model("llama", seed=0).model, TOK, steps=1, batch_size=2, progress=False)
    assert "phrasing" not in d.params and set(seen) <= set(_all_questions("question"))


def test_a_pair_trains_every_condition_in_its_phrasing(tmp_path, monkeypatch):
    monkeypatch.setenv("SINKBOOK_CACHE", str(tmp_path))
    calls: dict[str, str] = {}
    for name in ("train_vl", "train_text_only"):
        real = getattr(vl, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            calls[_name] = kwargs["phrasing"]
            return _real(*args, **kwargs)

        monkeypatch.setattr(vl, name, spy)
    lm = tiny_model("llama", seed=0)
    lm.tokenizer = TOK
    p = pairs.pair_params("tiny-llama", seed=1, stage1_steps=1, stage2_steps=1, batch_size=2, weights="random",
                          phrasing="field")
    b = pairs.build_pair(lm, p, progress=False)
    assert calls == {"train_vl": "field", "train_text_only": "field"}
    assert b.logs["vl"]["params"]["phrasing"] == b.logs["text_only"]["params"]["phrasing"] == "field"
