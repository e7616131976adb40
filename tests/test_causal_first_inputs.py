"""Which inputs chapter 8's first-token conditions change (`sinklib.causal.first_inputs`), counted on the inputs."""
import pytest

from sinklib.causal import first_inputs

N = {"instructions": 6, "math": 5, "knowledge": 4, "perplexity": 3}


def test_smollm2s_none_changes_the_chat_formatted_inputs_only(smollm2):
    """SmolLM2's chat template opens with <|im_start|>, the id its tokenizer reports as BOS: 'none' drops it from
    the chat-formatted suites; the plain knowledge prompts carry no BOS and stay as they are."""
    tok = smollm2.tokenizer
    assert tok("<|im_start|>", add_special_tokens=False)["input_ids"] == [tok.bos_token_id]
    got = first_inputs.input_changes(tok, "none", N)
    assert got["instructions"] == (6, 6) and got["math"] == (5, 5) and got["perplexity"] == (3, 3)
    assert got["knowledge"][0] == 0 and got["knowledge"][1] >= 4   # one sequence per answer choice
    s = first_inputs.sentence({"smollm2-135m": {"none": got}})
    assert s.startswith("smollm2-135m, first token 'none': instructions 6 of 6, math 5 of 5, knowledge 0 of ")
    assert "(one input per answer choice)" in s
    assert first_inputs.input_changes(tok, "none", {"math": 0}) == {}
    assert first_inputs.sentence({"smollm2-135m": {}}) == "no first-token condition besides the model's own was run"


def test_gemma3s_none_changes_every_suite(gemma3):
    got = first_inputs.input_changes(gemma3.tokenizer, "none", N)
    assert all(c == n > 0 for c, n in got.values())


def test_an_unknown_condition_is_refused(smollm2):
    from sinklib.errors import ParameterError

    with pytest.raises(ParameterError, match="first_token"):
        first_inputs.input_changes(smollm2.tokenizer, "bos twice", N)


def test_rows_whose_suite_inputs_did_not_change_are_marked():
    import pandas as pd

    from sinklib.causal import first_inputs

    rows = pd.DataFrame({"model": ["m", "m", "m", "g"], "first token": ["none", "none", "eos", "none"],
                         "metric": ["knowledge acc", "math strict", "knowledge acc", "knowledge acc"]})
    changes = {"m": {"none": {"knowledge": (0, 358), "math": (100, 100)}, "eos": {"knowledge": (358, 358)}}}
    assert first_inputs.unchanged(rows, changes) == [True, False, False, False]   # g: not counted, not marked
