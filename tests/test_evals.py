"""Tests of sinklib.evals: graders, intervals, items, the LM plumbing on tiny random models, and the
real-IFEval source up to the network boundary. Fast (no embedded model) except the one slow test."""
from __future__ import annotations

import math
import sys
import types

import pytest
import torch

from sinklib import evals
from sinklib.errors import ModelNotAvailable, ParameterError
from sinklib.evals import grading, items, lm

# ---------------------------------------------------------------------------------------------
# fixtures: a character-level HF tokenizer that fits the tiny models' 128-token vocabulary

CHARS = [chr(c) for c in range(32, 127)] + ["\n"]
CHAT_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<assistant>{% endif %}")


def char_tokenizer(chat: bool = False):
    from tokenizers import Tokenizer, decoders, models, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({c: i + 4 for i, c in enumerate(CHARS)})
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tk.decoder = decoders.Fuse()
    tk.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                  unk_token="<unk>")
    if chat:
        tok.chat_template = CHAT_TEMPLATE
    return tok


@pytest.fixture(scope="module")
def tok():
    return char_tokenizer()


@pytest.fixture(scope="module")
def tiny_llama():
    from sinklib.core.models import tiny_model

    return tiny_model("llama", seed=0).model


@pytest.fixture(scope="module")
def tiny_gemma():
    from sinklib.core.models import tiny_model

    # soft-capping on, so the body + head path must apply it like the model's own forward
    return tiny_model("gemma3", seed=1, final_logit_softcapping=0.5).model


def test_char_tokenizer_roundtrip(tok):
    ids = tok("Hi there\nA:", add_special_tokens=True)["input_ids"]
    assert ids[0] == 1 and len(ids) == 1 + len("Hi there\nA:")
    assert tok.decode(ids, skip_special_tokens=True) == "Hi there\nA:"


# ---------------------------------------------------------------------------------------------
# GSM8K-CoT-style strict vs lenient parsers

@pytest.mark.parametrize("response, strict, lenient", [
    ("Tom has 5 + 7 = 12 apples. The answer is 12.", True, True),          # format and number right
    ("Tom has 5 + 7 = 12 apples. The answer is twelve.", False, True),     # number in words
    ("5 + 7 = 12, so Tom has 12 apples.", False, True),                    # right number, no format
    ("The answer is 12", False, True),                                     # missing the final period
    ("So the result is **12**.", False, True),
    ("5 + 7 = 13. The answer is 13.", False, False),                       # wrong number
    ("The answer is 12. Then Tom eats 3, so 9 are left.", True, False),    # strict takes the first
    ("I am not sure.", False, False),                                      # no number at all
])
def test_math_strict_vs_lenient(response, strict, lenient):
    g = evals.grade_math(response, 12)
    assert (g["strict"], g["lenient"]) == (strict, lenient)


def test_math_parsers_normalise_commas_and_dollars():
    assert evals.parse_answer_strict("The answer is 1,200.") == 1200
    assert evals.parse_answer_lenient("It costs $1,200 in total") == 1200
    assert evals.parse_answer_lenient("down to -3 degrees") == -3
    assert evals.parse_answer_strict("the answer is 3.") is None  # case matters, as in lm-eval
    assert evals.grade_math("The answer is 7.0.", 7)["strict"]


# ---------------------------------------------------------------------------------------------
# IFEval's own checkers, wired offline

def _item(ids, kwargs, prompt="Write something."):
    return {"key": 0, "prompt": prompt, "instruction_id_list": ids, "kwargs": kwargs}


@pytest.mark.parametrize("iid, kwargs, good, bad", [
    ("change_case:english_lowercase", {}, "the cat sat on the warm mat and slept all afternoon in the sun.",
     "The cat sat on the warm mat and slept all afternoon in the sun."),
    ("change_case:english_capital", {}, "THE CAT SAT ON THE WARM MAT AND SLEPT ALL AFTERNOON.",
     "THE CAT SAT ON THE WARM MAT and slept all afternoon."),
    ("punctuation:no_comma", {}, "Bread milk and eggs.", "Bread, milk and eggs."),
    ("startend:end_checker", {"end_phrase": "Any other questions?"}, "Rainbows are light. Any other questions?",
     "Any other questions? Rainbows are light."),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "* one\n* two", "* one\n* two\n* three"),
    ("detectable_format:json_format", {}, '```json\n{"name": "Tom"}\n```', "name: Tom"),
    ("detectable_format:title", {}, "<<Moon>>\nThe moon is bright.", "Moon\nThe moon is bright."),
    ("length_constraints:number_words", {"num_words": 5, "relation": "less than"}, "Four words are here.",
     "These are clearly more than five words."),
    ("keywords:existence", {"keywords": ["river", "stone"]}, "A stone in the river.", "A stone in the lake."),
    ("keywords:forbidden_words", {"forbidden_words": ["hot"]}, "A warm day.", "A hot day."),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Hello.\nP.S. See you soon.", "Hello."),
    ("startend:quotation", {}, '"Elephants can swim."', "Elephants can swim."),
    ("combination:repeat_prompt", {"prompt_to_repeat": "Write a line."}, "Write a line. Here it is.",
     "Here it is: a line."),
])
def test_ifeval_checkers_pass_and_fail(iid, kwargs, good, bad):
    assert evals.grade_instructions(_item([iid], [kwargs]), good)["strict"] is True
    g = evals.grade_instructions(_item([iid], [kwargs]), bad)
    assert g["strict"] is False and g["strict_list"] == [False]


def test_ifeval_loose_forgives_a_preamble_line():
    resp = "Sure! Here is my answer:\nthe sea is calm and blue today."
    g = evals.grade_instructions(_item(["change_case:english_lowercase"], [{}]), resp)
    assert g["strict"] is False and g["lenient"] is True


def test_ifeval_prompt_level_needs_all_instructions():
    it = _item(["change_case:english_lowercase", "punctuation:no_comma"], [{}, {}])
    g = evals.grade_instructions(it, "the sea is calm, blue and quiet today.")
    assert g["strict_list"] == [True, False] and g["strict"] is False


def test_ifeval_loaded_without_lm_eval_tasks_package():
    mods = grading.ifeval_modules()
    assert set(mods) == {"instructions_util", "instructions", "instructions_registry", "utils"}
    assert "lm_eval.tasks" not in sys.modules          # lm_eval/tasks/__init__.py never ran
    assert "lm_eval.tasks.ifeval" not in sys.modules   # the temporary stub is gone
    import langdetect
    assert langdetect.DetectorFactory.seed == 0
    assert not set(grading.NEEDS_PUNKT) - set(evals.grading.instruction_ids())


def test_unknown_instruction_id_is_a_clear_error():
    with pytest.raises(ParameterError, match="not in lm-eval's IFEval registry"):
        evals.grade_instructions(_item(["format:nonsense"], [{}]), "x")


# ---------------------------------------------------------------------------------------------
# intervals

@pytest.mark.parametrize("k, n, lo, hi", [(0, 10, 0.0, 0.2775), (5, 10, 0.2366, 0.7634), (10, 10, 0.7225, 1.0),
                                          (81, 263, 0.2553, 0.3662)])
def test_wilson_interval_known_values(k, n, lo, hi):
    a, b = evals.wilson_interval(k, n)
    assert a == pytest.approx(lo, abs=1e-4) and b == pytest.approx(hi, abs=1e-4)


def test_wilson_interval_holds_the_point_exactly():
    for n in range(1, 80):
        assert evals.wilson_interval(0, n)[0] == 0.0 and evals.wilson_interval(n, n)[1] == 1.0
        for k in range(n + 1):
            lo, hi = evals.wilson_interval(k, n)
            assert lo <= k / n <= hi


def test_wilson_interval_rejects_bad_counts():
    with pytest.raises(ParameterError, match="'n'"):
        evals.wilson_interval(0, 0)
    with pytest.raises(ParameterError, match="'k'"):
        evals.wilson_interval(11, 10)


def test_bootstrap_ppl_interval():
    nll, nt = [20.0, 30.0, 25.0, 40.0], [10, 10, 10, 10]
    lo, hi = evals.bootstrap_ppl_interval(nll, nt, seed=0)
    point = math.exp(sum(nll) / sum(nt))
    assert lo < point < hi and lo >= math.exp(2.0) - 1e-9 and hi <= math.exp(4.0) + 1e-9
    assert evals.bootstrap_ppl_interval([10.0] * 5, [5] * 5) == pytest.approx((math.exp(2), math.exp(2)))


# ---------------------------------------------------------------------------------------------
# items

def test_data_files_parse_and_are_sound():
    inst = items.load_instruction_items()
    assert 55 <= len(inst) <= 80
    used = {i for r in inst for i in r["instruction_id_list"]}
    assert not used & set(grading.NEEDS_PUNKT) and len(used) >= 15
    for s in items.load_instruction_fewshot():  # worked examples must obey their own instructions
        assert evals.grade_instructions(s, s["response"])["strict"], s["prompt"]
    for s in items.load_math_fewshot():
        g = evals.grade_math(s["solution"], s["answer"])
        assert g["strict"] and g["lenient"], s["question"]
    know = items.load_knowledge_items()
    assert len(know) >= 90 and {r["category"] for r in know} == {"capitals", "science", "common_sense", "yes_no"}
    mc4 = [r["answer"] for r in know if len(r["choices"]) == 4]
    assert {mc4.count(k) for k in range(4)} <= set(range(len(mc4) // 4 - 2, len(mc4) // 4 + 3))  # balanced
    assert len(items.load_heldout()) >= 10


def _solve(question: str) -> int:
    """An independent solver of the generator's six templates (reads the numbers and the verbs)."""
    import re

    n = [int(x) for x in re.findall(r"\d+", question)]
    if "gets" in question and "more" in question:
        return n[0] + n[1]
    if "gives" in question and "to a friend" in question:
        return n[0] - n[1]
    if "finds" in question:
        return n[0] + n[1] - n[2]
    if "shared equally" in question:
        assert n[0] % n[1] == 0, question
        return n[0] // n[1]
    if "A box holds" in question or "notebook costs" in question:
        return n[0] * n[1]
    raise AssertionError(f"unknown template: {question}")


def test_math_file_is_the_seeded_generator_output():
    rows = items.load_math_items()
    assert len(rows) >= 300 and rows == items.generate_math_items(len(rows), seed=0)
    assert len({r["question"] for r in rows}) == len(rows)
    for r in rows:  # every answer verified by a second, independent computation
        assert _solve(r["question"]) == r["answer"], r
    a, b = items.generate_math_items(12, seed=3), items.generate_math_items(12, seed=4)
    assert a == items.generate_math_items(12, seed=3) and a != b
    for r in items.generate_math_items(60, seed=1):
        assert r["answer"] >= 0
    with pytest.raises(ParameterError, match="templates"):
        items.generate_math_items(3, templates=("add", "calculus"))


def test_sample_is_seeded_and_ordered():
    rows = list(range(50))
    s = items.sample(rows, 10, seed=1)
    assert s == sorted(s) and s == items.sample(rows, 10, seed=1) and s != items.sample(rows, 10, seed=2)
    assert items.sample(rows, 99, seed=0) == rows


def test_falsy_kwargs_are_rejected():
    bad = [_item(["detectable_format:number_bullet_lists"], [{"num_bullets": 0}])]
    with pytest.raises(ParameterError, match="falsy"):
        items.validate_instruction_items(bad)


# ---------------------------------------------------------------------------------------------
# the LM plumbing on tiny random models

def _naive_logprob(model, ctx, cont):
    ids = torch.tensor([list(ctx) + list(cont)])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
    return float(sum(logp[len(ctx) - 1 + j, t] for j, t in enumerate(cont)))


@pytest.mark.parametrize("which", ["tiny_llama", "tiny_gemma"])
def test_continuation_logprobs_match_naive(which, tok, request):
    model = request.getfixturevalue(which)
    pairs = [lm.split_continuation(tok, "Question: capital of France?\nAnswer:", " " + c) for c in
             ("Paris", "Lyon", "a much longer wrong answer")]
    pairs.append(lm.split_continuation(tok, "Q: 2+2?\nA:", " 4"))
    got = lm.continuation_logprobs(model, pairs, pad=0, batch_size=3)  # mixed lengths, left padding
    for (ctx, cont), (lp, n) in zip(pairs, got):
        assert n == len(cont)
        assert lp == pytest.approx(_naive_logprob(model, ctx, cont), abs=2e-4)


@pytest.mark.parametrize("which", ["tiny_llama", "tiny_gemma"])
def test_document_nll_matches_naive(which, tok, request):
    model = request.getfixturevalue(which)
    docs = [[1] + lm.encode(tok, t, False) for t in ("A short line.", "A somewhat longer line of text here.")]
    got = lm.document_nll(model, docs, pad=0, batch_size=2)
    for d, (nll, n) in zip(docs, got):
        assert n == len(d) - 1
        assert -nll == pytest.approx(_naive_logprob(model, d[:1], d[1:]), abs=2e-4)
    # windows: a document longer than max_length is scored in pieces, every token once
    (nll_w, n_w), = lm.document_nll(model, docs[1:], pad=0, max_length=8)
    assert n_w == len(docs[1]) - 1


def test_split_continuation_moves_trailing_space(tok):
    ctx, cont = lm.split_continuation(tok, "Answer: ", "Paris")
    assert tok.decode(cont) == " Paris" and tok.decode(ctx, skip_special_tokens=True) == "Answer:"


@pytest.mark.parametrize("which", ["tiny_llama", "tiny_gemma"])
def test_batched_generation_equals_one_by_one(which, tok, request):
    model = request.getfixturevalue(which)
    prompts = [lm.encode(tok, t, True) for t in ("Hello", "A much longer prompt than the first", "Mid prompt")]
    together = lm.generate(model, tok, prompts, max_new_tokens=6, batch_size=3)
    alone = [lm.generate(model, tok, [p], max_new_tokens=6, batch_size=1)[0] for p in prompts]
    assert together == alone
    assert all(len(tok(t, add_special_tokens=False)["input_ids"]) <= 6 for t in together)


def test_generation_stops_at_stop_string(tiny_llama, tok):
    p = [lm.encode(tok, "Hello", True)]
    free = lm.generate(tiny_llama, tok, p, max_new_tokens=12)[0]
    assert len(free) >= 4, "the random model should emit a few characters"
    stop = free[2:4]
    cut = lm.generate(tiny_llama, tok, p, max_new_tokens=12, stop=[stop])[0]
    assert cut == free[:free.index(stop)]


def test_knowledge_picks_highest_loglik(monkeypatch, tok, tiny_llama):
    rows = items.load_knowledge_items()[:5]
    monkeypatch.setitem(evals.SUITES["knowledge"], "load", lambda: rows)
    # fake likelihoods: the last choice of item 0, the answer of items 1-4 (choice lengths differ,
    # so acc_norm divides by bytes and may disagree)
    def fake(model, pairs, pad, batch_size=16, max_length=2048):
        out, k = [], 0
        for i, r in enumerate(rows):
            best = len(r["choices"]) - 1 if i == 0 else r["answer"]
            out += [(-1.0 if j == best else -5.0 - j, 1) for j in range(len(r["choices"]))]
            k += len(r["choices"])
        assert k == len(pairs)
        return out
    monkeypatch.setattr(evals, "continuation_logprobs", fake)
    res = evals.run_suite(tiny_llama, tok, "knowledge")
    assert [p["pred"] for p in res.per_item] == [len(rows[0]["choices"]) - 1] + [r["answer"] for r in rows[1:]]
    want = 100 * (4 + (rows[0]["answer"] == len(rows[0]["choices"]) - 1)) / 5
    assert res.scores["acc"] == pytest.approx(want)
    assert res.ci["acc"][0] < res.scores["acc"] <= res.ci["acc"][1]


def test_knowledge_on_tiny_model_is_argmax_of_its_logliks(tiny_llama, tok):
    res = evals.run_suite(tiny_llama, tok, "knowledge", n_items=6, seed=0)
    assert res.n == 6 and res.settings["prompt_style"] == "plain"
    for p in res.per_item:
        assert p["pred"] == max(range(len(p["loglik"])), key=p["loglik"].__getitem__)
        assert p["acc"] == (p["pred"] == p["answer"])


def test_knowledge_chat_style_scores_in_the_template(tiny_llama):
    tokc = char_tokenizer(chat=True)
    plain = evals.run_suite(tiny_llama, tokc, "knowledge", n_items=3)            # auto -> plain for likelihoods
    chat = evals.run_suite(tiny_llama, tokc, "knowledge", n_items=3, prompt_style="chat")
    assert (plain.settings["prompt_style"], chat.settings["prompt_style"]) == ("plain", "chat")
    assert [p["key"] for p in plain.per_item] == [p["key"] for p in chat.per_item]
    assert all(a["loglik"] != b["loglik"] for a, b in zip(plain.per_item, chat.per_item))


def test_all_suites_run_on_a_tiny_model(tiny_gemma):
    tok = char_tokenizer(chat=True)
    res = evals.run_suites(tiny_gemma, tok, n_items={"instructions": 2, "math": 2, "knowledge": 2, "perplexity": 2},
                           max_new_tokens=4, batch_size=2)
    assert set(res) == {"instructions", "math", "knowledge", "perplexity"}
    assert res["instructions"].settings["prompt_style"] == "chat"
    for r in res.values():
        for k, v in r.scores.items():
            lo, hi = r.ci[k]
            assert lo <= v <= hi and r.n == 2 and r.seconds > 0
    assert res["perplexity"].scores["ppl"] > 1
    rows = evals.results_table(res)
    assert {"suite", "metric", "score", "lo", "hi", "n"} <= set(rows[0])


def test_plain_style_prompts_are_few_shot(tok):
    ids, stop = evals.instruction_prompt(tok, "Say hi.", "plain", items.load_instruction_fewshot()[:2])
    text = tok.decode(ids, skip_special_tokens=True)
    assert text.count("### Instruction:") == 3 and text.endswith("### Response:\n") and stop
    ids, stop = evals.math_prompt(tok, "What is 2+2?", "plain", items.load_math_fewshot()[:3])
    text = tok.decode(ids, skip_special_tokens=True)
    assert text.count("The answer is") == 3 and text.endswith("Q: What is 2+2?\nA:")


# ---------------------------------------------------------------------------------------------
# parameters and errors

def test_parameter_errors(tiny_llama, tok):
    with pytest.raises(ParameterError, match="'suite'"):
        evals.run_suite(tiny_llama, tok, "mmlu")
    with pytest.raises(ParameterError, match="'prompt_style'.*no chat template"):
        evals.run_suite(tiny_llama, tok, "math", prompt_style="chat")
    with pytest.raises(ParameterError, match="'prompt_style'"):
        evals.run_suite(tiny_llama, tok, "math", prompt_style="fancy")
    with pytest.raises(ParameterError, match="'source'.*instructions"):
        evals.run_suite(tiny_llama, tok, "math", source="ifeval")
    with pytest.raises(ParameterError, match="'tokenizer'"):
        evals.run_suite(tiny_llama, None, "math")
    with pytest.raises(ParameterError, match="'n_items'"):
        evals.run_suite(tiny_llama, tok, "math", n_items=0)
    with pytest.raises(ParameterError, match="'n_shots'"):
        evals.run_suite(tiny_llama, tok, "math", n_shots=7, n_items=1)
    with pytest.raises(ParameterError, match="'n_items'.*unknown suite"):
        evals.run_suites(tiny_llama, tok, n_items={"mathh": 2})


# ---------------------------------------------------------------------------------------------
# the real IFEval (Colab path), tested up to the network boundary

def test_ifeval_source_without_datasets(monkeypatch, tiny_llama, tok):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    monkeypatch.setattr(grading, "ensure_punkt", lambda: False)
    with pytest.raises(ModelNotAvailable, match="pip install datasets"):
        evals.run_suite(tiny_llama, tok, "instructions", source="ifeval")


def test_ifeval_source_offline(monkeypatch, tiny_llama, tok):
    calls = []

    def load_dataset(path, *a, **kw):
        calls.append((path, kw))
        raise ConnectionError("Couldn't reach 'google/IFEval' on the Hub (LocalEntryNotFoundError)")
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    monkeypatch.setattr(grading, "ensure_punkt", lambda: False)
    with pytest.raises(ModelNotAvailable, match="needs network access.*source='local'"):
        evals.run_suite(tiny_llama, tok, "instructions", source="ifeval")
    assert calls == [("google/IFEval", {"split": "train"})]


def test_ifeval_source_online_rows_are_graded(monkeypatch, tiny_llama, tok):
    rows = [  # the shape of google/IFEval rows: every kwargs key present, unused ones None
        {"key": 1000, "prompt": "Write a haiku. Do not use any commas.", "instruction_id_list": ["punctuation:no_comma"],
         "kwargs": [{"num_highlights": None, "relation": None, "num_words": None, "end_phrase": None}]},
        {"key": 1001, "prompt": "Write a line ending with 'Bye.'", "instruction_id_list": ["startend:end_checker"],
         "kwargs": [{"num_highlights": None, "relation": None, "num_words": None, "end_phrase": "Bye."}]},
    ]
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=lambda *a, **k: rows))
    monkeypatch.setattr(grading, "ensure_punkt", lambda: True)
    res = evals.run_suite(tiny_llama, tok, "instructions", source="ifeval", max_new_tokens=5, prompt_style="plain")
    assert res.n == 2 and res.settings["source"] == "ifeval"
    assert [p["key"] for p in res.per_item] == [1000, 1001]
    for p in res.per_item:  # the recorded verdict is the checker's verdict on the recorded response
        assert p["strict"] == evals.grade_instructions(rows[[1000, 1001].index(p["key"])], p["response"])["strict"]


# ---------------------------------------------------------------------------------------------
# one real embedded model (slow)

@pytest.mark.slow
def test_smollm2_math_few_items():
    from sinklib.core.models import load_model

    try:
        loaded = load_model("smollm2-135m")
    except ModelNotAvailable as e:
        pytest.skip(str(e))
    res = evals.run_suite(loaded, None, "math", n_items=4, batch_size=4)
    assert res.settings["prompt_style"] == "chat" and res.n == 4
    assert any("The answer is" in p["response"] for p in res.per_item)


def test_paired_intervals_resample_items_together():
    import numpy as np

    from sinklib.errors import ParameterError
    from sinklib.evals.grading import paired_ci, paired_ppl_ci

    a = [1, 0, 1, 1, 0, 1, 0, 1]
    assert paired_ci(a, a) == (0.0, 0.0)  # a paired interval of no change has no width
    lo, hi = paired_ci(a, [1] * 8)
    assert 0 < lo <= hi <= 100 and lo <= 37.5 <= hi  # the mean change is 3/8 = 37.5 points
    nll, tok = [10.0, 12.0, 9.0], [5, 6, 4]
    assert paired_ppl_ci(nll, nll, tok) == (0.0, 0.0)
    lo, hi = paired_ppl_ci(nll, [x + 1 for x in nll], tok)
    assert 0 < lo <= hi and np.isfinite(hi)
    with pytest.raises(ParameterError, match="paired_ppl_ci"):
        paired_ppl_ci(nll, nll[:2], tok)


@pytest.mark.parametrize("arch, window", [("llama", None), ("gemma3", 8), ("gemma3", 64)])
def test_generation_equals_the_transformers_reference(arch, window, tok):
    """sinklib.evals.decode (shared prefix run once, ended rows leave the batch) gives the answers of
    transformers' generate, with prompts longer than Gemma-3's sliding window (8 here) and stop strings."""
    from sinklib.core.models import tiny_model
    from sinklib.evals import decode

    kw = {"sliding_window": window, "final_logit_softcapping": 0.5} if window else {}
    model = tiny_model(arch, seed=2, **kw).model
    shots = "Q: one\nA: two\n\nQ: three\nA: four\n\n"
    texts = [shots + f"Q: {q}\nA:" for q in ("x", "a longer question here", "mid one", "why", "z z z z")]
    prompts = [lm.encode(tok, t, True) for t in texts]
    assert decode.common_prefix(prompts) == len(lm.encode(tok, shots + "Q: ", True))
    # a prefix longer than a sliding window is not shared (window 8); within it, it is (window 64)
    assert decode.shared_length(model, prompts) == (0 if window == 8 else decode.common_prefix(prompts))
    free = lm.hf_generate(model, tok, prompts, max_new_tokens=10, batch_size=5)
    stop = next(f[1:3] for f in free if len(f) >= 3)
    for st in ((), (stop,)):
        want = lm.hf_generate(model, tok, prompts, max_new_tokens=10, batch_size=5, stop=st)
        for bs in (2, 5):
            for share in (True, False):
                assert lm.generate(model, tok, prompts, 10, bs, st, share_prefix=share) == want, (bs, share, st)


def test_common_prefix_leaves_every_row_a_token():
    from sinklib.evals.decode import balanced_width, common_prefix

    assert [balanced_width(n, 32) for n in (72, 300, 16, 33, 0)] == [24, 30, 16, 17, 32]

    assert common_prefix([[1, 2, 3], [1, 2, 3]]) == 2
    assert common_prefix([[1, 2, 3, 4], [1, 2, 5]]) == 2
    assert common_prefix([[7], [1, 2]]) == 0 and common_prefix([]) == 0
