"""sinklib.evals.inputs: the sequences the suites feed a model are, token for token, what their runners pass
to the generation and scoring functions (captured here instead of running a model)."""
from __future__ import annotations

import pytest

from sinklib import evals
from sinklib.errors import ParameterError
from sinklib.evals.inputs import inputs_of, suite_inputs
from tests.test_evals import char_tokenizer


class _Model:
    training = False

    def eval(self):
        return self


@pytest.fixture()
def captured(monkeypatch):
    """The inputs each runner hands on, per call: generation prompts, likelihood (context, continuation) pairs
    joined, perplexity documents."""
    seen: list[list[list[int]]] = []

    def generate(model, tok, prompts, max_new_tokens, batch_size, stop=()):
        seen.append([list(p) for p in prompts])
        return [""] * len(prompts)

    def logprobs(model, pairs, pad, batch_size=8):
        seen.append([list(c) + list(x) for c, x in pairs])
        return [(0.0, len(x)) for _, x in pairs]

    def nll(model, docs, pad, batch_size=8):
        seen.append([list(d) for d in docs])
        return [(1.0, max(1, len(d) - 1)) for d in docs]

    monkeypatch.setattr(evals, "generate", generate)
    monkeypatch.setattr(evals, "continuation_logprobs", logprobs)
    monkeypatch.setattr(evals, "document_nll", nll)
    return seen


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("suite,n", [("instructions", 5), ("instructions", 100), ("math", 6), ("knowledge", 4),
                                     ("perplexity", 3)])
def test_inputs_are_what_the_runner_feeds(captured, chat, suite, n):
    tok = char_tokenizer(chat=chat)
    evals.run_suite(_Model(), tok, suite, n_items=n, seed=3)
    assert len(captured) == 1 and captured[0]
    assert suite_inputs(tok, suite, n, seed=3) == captured[0]
    if suite in ("instructions", "math"):
        assert suite_inputs(tok, suite, n, seed=4) != captured[0]         # the sample follows the seed


def test_inputs_of_concatenates_the_suites_and_thins_evenly():
    tok = char_tokenizer()
    eval_n = {"instructions": 4, "math": 0, "knowledge": 3}
    full = inputs_of(tok, eval_n, seed=1)
    parts = [suite_inputs(tok, "instructions", 4, seed=1), suite_inputs(tok, "knowledge", 3, seed=1)]
    assert full == parts[0] + parts[1]                                    # a suite with 0 items is skipped
    thin = inputs_of(tok, eval_n, seed=1, per_suite=2)
    assert thin == [parts[0][0], parts[0][2], parts[1][0], parts[1][len(parts[1]) // 2]]
    assert inputs_of(tok, eval_n, seed=1, per_suite=100) == full


def test_bad_arguments_are_clear_errors():
    tok = char_tokenizer()
    with pytest.raises(ParameterError, match="suite"):
        suite_inputs(tok, "vqa")
    with pytest.raises(ParameterError, match="n_shots"):
        suite_inputs(tok, "math", 2, n_shots=99)
    with pytest.raises(ParameterError, match="per_suite"):
        inputs_of(tok, {"math": 2}, per_suite=0)
