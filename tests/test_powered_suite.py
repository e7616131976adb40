"""#29: the powered instruction suite: generated deterministically, the 72 hand-written items kept (same keys,
same rows), ids and prompts unique, every item graded by lm-eval's strict and loose IFEval checkers (a response
written to follow it passes both; one that ignores it fails strictly), the committed file equal to the
generator's output, and the selection by item count that leaves every existing evaluation's key alone."""
from __future__ import annotations

import json
import random

import pytest

from sinklib import evals
from sinklib.errors import ParameterError
from sinklib.evals import grading, items, powered

SENTENCES = ("The river runs under an old stone bridge near the town.",
             "People walk there in the morning and talk about the weather.",
             "Children play beside the water while their parents read books.",
             "In the evening the lights of the houses shine on the river.")


def _words(n: int) -> str:
    """About `n` words of plain English (no commas), whole sentences."""
    out, i = [], 0
    while len(" ".join(out).split()) < n:
        out.append(SENTENCES[i % len(SENTENCES)])
        i += 1
    return " ".join(out)


def _body(kw: dict) -> str:
    """The text part of a response that follows the content and length instructions in `kw` (id -> kwargs)."""
    n = 30
    if "length_constraints:number_words" in kw:
        k = kw["length_constraints:number_words"]
        n = k["num_words"] + 10 if k["relation"] == "at least" else 12
    text = _words(n) if n > 12 else "The river runs under an old stone bridge."
    if "keywords:existence" in kw:
        text += " " + " ".join(f"The word {w} is here." for w in kw["keywords:existence"]["keywords"])
    if "keywords:frequency" in kw:
        k = kw["keywords:frequency"]
        text += " " + " ".join(f"We talk about {k['keyword']} again." for _ in range(k["frequency"]))
    if "detectable_content:number_placeholders" in kw:
        text += " " + " ".join(f"Write [name{i}] here." for i in range(kw["detectable_content:number_placeholders"]
                                                                        ["num_placeholders"]))
    if "detectable_format:number_highlighted_sections" in kw:
        text += " " + " ".join(f"*part {i}*" for i in range(kw["detectable_format:number_highlighted_sections"]
                                                             ["num_highlights"]))
    return text


def _structure(kw: dict, text: str) -> str:
    if "detectable_format:number_bullet_lists" in kw:
        text = "\n".join(f"* {s}" for s in SENTENCES[:1] * kw["detectable_format:number_bullet_lists"]["num_bullets"])
    if "length_constraints:number_paragraphs" in kw:
        text = "\n\n***\n\n".join([text] * kw["length_constraints:number_paragraphs"]["num_paragraphs"])
    if "detectable_format:multiple_sections" in kw:
        k = kw["detectable_format:multiple_sections"]
        text = "\n".join(f"{k['section_spliter']} {i + 1}\n{text}" for i in range(k["num_sections"]))
    if "detectable_format:title" in kw:
        text = "<<a quiet river>>\n" + text
    if "detectable_format:json_format" in kw:
        text = json.dumps({"answer": text})
    if "combination:two_responses" in kw:
        text = text + "\n******\n" + SENTENCES[1]
    return text


def reference_response(item: dict) -> str:
    """A response written to follow every instruction of `item` (the test's own construction)."""
    kw = dict(zip(item["instruction_id_list"], item["kwargs"]))
    if "detectable_format:constrained_response" in kw:
        return "My answer is yes."
    text = _structure(kw, _body(kw))
    if "detectable_content:postscript" in kw:
        text += f"\n\n{kw['detectable_content:postscript']['postscript_marker']} See you soon."
    if "startend:end_checker" in kw:
        text += " " + kw["startend:end_checker"]["end_phrase"]
    if "startend:quotation" in kw:
        text = f'"{text}"'
    if "combination:repeat_prompt" in kw:
        text = kw["combination:repeat_prompt"]["prompt_to_repeat"] + "\n" + text
    if "change_case:english_lowercase" in kw:
        text = text.lower()
    if "change_case:english_capital" in kw:
        text = text.upper()
    return text


@pytest.fixture(scope="module")
def suite():
    return powered.generate_instruction_items()


def test_generator_is_deterministic_and_the_committed_file_matches(suite):
    random.seed(12345)  # lm-eval's builders draw from the global generator only when a kwarg is missing
    assert powered.generate_instruction_items() == suite
    assert powered.to_jsonl(suite) == items.FILES["instructions_powered"].read_text(encoding="utf-8"), (
        "data/evals/instructions_powered.jsonl differs from the generator: rewrite it with "
        "powered.to_jsonl(powered.generate_instruction_items())")
    assert powered.generate_instruction_items(seed=1) != suite


def test_the_72_are_kept_and_ids_are_unique(suite):
    core = items.load_instruction_items()
    assert len(suite) == powered.POWERED_N >= 300 and suite[:len(core)] == core
    assert [r["key"] for r in suite] == list(range(len(suite)))
    assert len({r["prompt"] for r in suite}) == len(suite)
    items.validate_instruction_items(suite)  # known ids, no punkt_tab ids, no falsy kwargs
    used = {i for r in suite[len(core):] for i in r["instruction_id_list"]}
    assert used == set(powered.SINGLES) and not used & set(grading.NEEDS_PUNKT)
    with pytest.raises(ParameterError, match="keeps all 72 hand-written items"):
        powered.generate_instruction_items(n=50)


def test_every_item_is_graded_by_the_checkers_with_its_own_kwargs(suite):
    """Each generated instruction's checker, built with the item's kwargs, describes a sentence of the prompt and
    reports exactly those kwargs; a response that follows the item passes strictly and loosely, and a bare reply
    fails strictly unless the item only forbids words or asks for fewer words."""
    registry = grading.ifeval_modules()["instructions_registry"].INSTRUCTION_DICT
    for r in suite[72:]:
        for iid, kw in zip(r["instruction_id_list"], r["kwargs"]):
            checker = registry[iid](iid)
            checker.build_description(**kw)
            args = checker.get_instruction_args() or {}
            assert {k: sorted(v) if isinstance(v, list) else v for k, v in args.items()} == {
                k: sorted(v) if isinstance(v, list) else v for k, v in kw.items()}, (r["key"], iid)
            assert powered.describe(iid, kw) in r["prompt"]
        good = evals.grade_instructions(r, reference_response(r))
        assert good["strict"] and good["lenient"], (r["key"], r["instruction_id_list"], reference_response(r))
        bare = evals.grade_instructions(r, "Sure, here it is")
        vacuous = all(i == "keywords:forbidden_words" or kw.get("relation") == "less than"
                      for i, kw in zip(r["instruction_id_list"], r["kwargs"]))  # a short reply follows these
        assert bare["strict"] == vacuous and len(bare["lenient_list"]) == len(r["instruction_id_list"]), r["key"]


def test_more_items_than_the_72_select_the_powered_suite_and_keep_old_keys():
    core = items.load_instruction_items()
    assert items.load_instruction_suite(None) == core and items.load_instruction_suite(72) == core
    assert len(items.load_instruction_suite(73)) == powered.POWERED_N
    assert items.instructions_uses_powered(300) and not items.instructions_uses_powered(72)
    # the key of an evaluation on <= 72 items does not read the powered file; more items do
    assert items.fingerprint({"instructions": 72, "math": 5}) == items.fingerprint(["instructions", "math"])
    assert items.fingerprint({"instructions": 300}) != items.fingerprint({"instructions": 72})
    assert evals.SUITES["instructions"]["load"] is items.load_instruction_suite


def test_the_powered_suite_detects_a_seven_point_fall():
    """The issue's target: a 7-point fall of strict instruction following detected with 80 % power by the paired
    McNemar test at the book's background churn (flip 0.05), which the 72 items miss by far."""
    from sinklib.evals.power import min_detectable_drop

    for p_base in (0.26, 0.39):  # the two base models' strict rates on the 72 items (chapter 4)
        assert min_detectable_drop(powered.POWERED_N, p_base, flip=0.05) <= 7.0
        assert min_detectable_drop(72, p_base, flip=0.05) > 7.0


def test_the_powered_suite_is_powered_at_the_churn_chapter_4_measured(monkeypatch):
    """Background churn measured, not assumed: the share of the 72 items that VL turned from fail to pass (chapter
    4's saved outcomes, every model and seed) is the flip rate; at their mean the powered suite still detects the
    paper's smallest VL loss in a backbone without QK-norm (7.9 IFEval points, reported) with 80 % power, items
    taken as independent. #29's 7 points held at the churn of chapter 4's earlier run (6.7 %); at its session-47
    run's (7.6 %) the suite detects 7.5 points, and by instruction type less (chapter 11, section 11.4)."""
    import numpy as np

    from sinklib.evals.paired import unpack
    from sinklib.evals.power import min_detectable_drop
    from sinklib.book import load_results
    from sinklib.core.resources import checkout_root

    if checkout_root() is None:
        pytest.skip("reads the committed results of chapter 4 (a checkout of sinkbook)")
    monkeypatch.setenv("SINKBOOK_RESULTS", str(checkout_root() / "data" / "results"))  # not the tests' tmp folder
    outcomes = load_results("04_vl_adaptation", "outcomes")
    gained, rates = [], []
    for conds in outcomes.values():
        base = np.array(unpack(conds["base"])["instructions strict"], bool)
        rates.append(base.mean())
        for name in (c for c in conds if c == "vl" or c.startswith("vl seed")):
            after = np.array(unpack(conds[name])["instructions strict"], bool)
            gained.append(float(np.mean(~base & after)))
    assert len(gained) >= 4 and 0 < np.mean(gained) < 0.2
    from sinklib import paper_value

    target = abs(paper_value("ifeval_none_max"))
    for p_base in rates:
        assert min_detectable_drop(powered.POWERED_N, float(p_base), flip=round(float(np.mean(gained)), 3)) <= target
