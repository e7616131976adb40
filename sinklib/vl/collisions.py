"""Chapter 4's controls against the evaluation suites: the collision check by construction (#29,
`sinklib.evals.collide`) on the question-answer pairs each control trains on, in either phrasing of the questions
(`sinklib.vl.scenes.PHRASINGS`: 'question' shares templates with the math and instruction suites, 'field' with
none)."""
from __future__ import annotations

from sinklib.core.params import check_choice, check_int
from sinklib.evals import collide
from sinklib.vl.scenes import batch_items, check_phrasing, sentence_answer

#: the training data of each control: VL and the text-only control train on the same questions and one-word
#: answers (tag 'lm' of stage 2); the sentence-answer control writes each answer as a sentence
CONTROLS = ("vl", "text_only", "text_only_sentence")


def control_pairs(control: str, steps: int = 25, batch_size: int = 8, seed: int = 0,
                  phrasing: str = "question") -> list[tuple[str, str]]:
    """(question, answer as trained) of the first `steps` stage-2 batches of `control` (one of `CONTROLS`), the
    questions written in `phrasing`."""
    check_choice("control", control, CONTROLS)
    steps, batch_size = check_int("steps", steps, 1), check_int("batch_size", batch_size, 1)
    phrasing = check_phrasing(phrasing)
    items = [it for s in range(steps) for it in batch_items(s, batch_size, seed=seed, tag="lm", phrasing=phrasing)]
    if control == "text_only_sentence":
        return [(it.question, sentence_answer(it)) for it in items]
    return [(it.question, it.answer) for it in items]


def control_collisions(controls: tuple[str, ...] = CONTROLS, instructions: str = "powered",
                       phrasing: str = "question", **pair_kwargs) -> dict[str, list[dict]]:
    """{control: `collide.find_collisions` rows} for the local suites (`collide.local_suite_items`), the controls'
    questions written in `phrasing` (`pair_kwargs`: steps, batch_size, seed of `control_pairs`)."""
    evals = collide.local_suite_items(instructions)
    return {c: collide.find_collisions(control_pairs(c, phrasing=phrasing, **pair_kwargs), evals) for c in controls}
