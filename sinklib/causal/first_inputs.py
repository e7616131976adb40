"""What a first-token condition of chapter 8 changes in the inputs themselves (section 8.4).

`FirstToken` drops a leading BOS id wherever the tokenizer or its chat template writes one, so what 'none' and
'eos' change depends on the model: Gemma-3's tokenizer puts BOS before every prompt; SmolLM2's adds none to a
plain prompt, but its chat template opens with `<|im_start|>`, the very id its tokenizer reports as BOS, so the
chat-formatted suites change and the plain knowledge prompts do not. The page says which inputs changed by
counting them (`input_changes`), not by describing the tokenizers."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sinklib.causal.suites import first_token_tokenizer
from sinklib.evals.inputs import suite_inputs


def input_changes(tokenizer: Any, first_token: str, eval_n: Mapping[str, int], *, seed: int = 0) -> dict[str, tuple[int, int]]:
    """{suite: (inputs that differ, inputs)} between the tokenizer as it is and under `first_token` ('none', 'eos':
    `first_token_tokenizer`), over the token sequences each suite of `eval_n` starts from
    (`sinklib.evals.inputs.suite_inputs`: a knowledge item gives one sequence per answer choice)."""
    other = first_token_tokenizer(tokenizer, first_token)
    out = {}
    for suite, n in eval_n.items():
        if not n:
            continue
        a = suite_inputs(tokenizer, suite, int(n), seed=seed)
        b = suite_inputs(other, suite, int(n), seed=seed)
        out[suite] = (sum(x != y for x, y in zip(a, b)) + abs(len(a) - len(b)), max(len(a), len(b)))
    return out


def sentence(changes: Mapping[str, Mapping[str, Mapping[str, tuple[int, int]]]]) -> str:
    """{model: {first token: `input_changes`}} in words: per model and condition, how many inputs of each suite
    changed."""
    parts = []
    if not any(changes.values()):
        return "no first-token condition besides the model's own was run"
    for model, by in changes.items():
        for ft, suites in by.items():
            cells = ", ".join(f"{s} {c} of {n}" + (" (one input per answer choice)" if s == "knowledge" else "")
                              for s, (c, n) in suites.items())
            parts.append(f"{model}, first token '{ft}': {cells} inputs differ from the model as tokenised")
    return "; ".join(parts)


def unchanged(rows, changes: Mapping[str, Mapping[str, Mapping[str, tuple[int, int]]]]) -> list[bool]:
    """Per row of section 8.4's table (columns model, 'first token', metric): True where the condition left every
    input of the row's suite as it was (`input_changes` counted none), so its zero change is no measurement."""
    def same(model: str, ft: str, metric: str) -> bool:
        c = changes.get(model, {}).get(ft, {}).get(str(metric).split()[0])
        return c is not None and c[0] == 0

    return [same(m, ft, mt) for m, ft, mt in zip(rows["model"], rows["first token"], rows["metric"])]
