"""The powered instruction suite (#29): IFEval-style verifiable prompts generated deterministically from
writing tasks, the instruction ids of lm-eval's IFEval registry and their kwargs.

``data/evals/instructions_powered.jsonl`` is ``generate_instruction_items()``: the 72 hand-written items of
``instructions.jsonl`` first (same keys, same rows), then generated items. Each generated prompt is a task
(``TASKS``, or a yes/no question for ``detectable_format:constrained_response``) followed by one or two
instruction sentences. The sentence is the checker's own ``build_description(**kwargs)`` (the registry's text)
except for three ids whose registry text prints a Python list or an unquoted phrase; those use the phrasing
of the hand-written items (``_PHRASES``). The ids are the ones the 72 items use: none needs nltk's punkt_tab.
"""
from __future__ import annotations

import json
import random
from collections.abc import Callable

from sinklib.errors import ParameterError

#: writing tasks: (request, a word of its topic, used by the keyword instructions)
TASKS: tuple[tuple[str, str], ...] = (
    ("Write a short paragraph about the moon.", "moon"), ("Describe a busy market on a Saturday morning.", "market"),
    ("Explain why bees are important for farmers.", "bees"), ("Write a short note thanking a neighbour for help.", "help"),
    ("Give advice to someone starting to learn the guitar.", "guitar"), ("Describe your ideal weekend.", "weekend"),
    ("Write a short story about a robot that learns to paint.", "robot"), ("Explain how a rainbow forms.", "rainbow"),
    ("Write a product description for a reusable water bottle.", "bottle"), ("Describe a walk through a forest in autumn.", "forest"),
    ("Explain why people keep diaries.", "diary"), ("Write a short speech to welcome new students to a school.", "school"),
    ("Describe how to make a cup of hot chocolate.", "chocolate"), ("Write a short review of a fictional restaurant.", "restaurant"),
    ("Explain what a library is to a child.", "library"), ("Write a short poem about the wind.", "wind"),
    ("Describe the job of a firefighter.", "firefighter"), ("Give tips for keeping a houseplant alive.", "plant"),
    ("Write a short message to a friend who is moving to another city.", "city"), ("Explain why the sky looks blue.", "sky"),
    ("Describe a train journey through the mountains.", "train"), ("Write a short story about a lost key.", "key"),
    ("Explain how to prepare for a job interview.", "interview"), ("Describe a day at the beach.", "beach"),
    ("Write an announcement for a town's summer festival.", "festival"), ("Explain why sleep matters for students.", "sleep"),
    ("Describe the sounds of a city at night.", "night"), ("Write a short story about a snowman that comes to life.", "snowman"),
    ("Give advice on how to save money each month.", "money"), ("Explain how a bicycle brake works.", "brake"),
    ("Write a short letter to a future self.", "future"), ("Describe a favourite childhood game.", "game"),
    ("Explain why people plant trees in cities.", "trees"), ("Write a short biography of an imaginary inventor.", "inventor"),
    ("Describe how to wash a car.", "car"), ("Write a short story about a cat who wants to fly.", "cat"),
    ("Explain what a volcano is.", "volcano"), ("Give tips for a first day at a new job.", "job"),
    ("Describe a thunderstorm seen from a window.", "storm"), ("Write a short advertisement for a bakery.", "bakery"),
    ("Explain how to look after a pet rabbit.", "rabbit"), ("Describe the view from the top of a hill.", "hill"),
    ("Write a short story about two friends who find a map.", "map"), ("Explain why recycling paper helps.", "paper"),
    ("Describe what you would pack for a camping trip.", "camping"), ("Write a short thank-you note to a teacher.", "teacher"),
    ("Explain how clouds are made.", "clouds"), ("Describe a visit to a museum.", "museum"),
    ("Write a short story about a lighthouse keeper.", "lighthouse"), ("Give advice for running a first race.", "race"),
    ("Explain what a calendar is for.", "calendar"), ("Describe a garden in spring.", "garden"),
    ("Write a short invitation to a birthday party.", "party"), ("Explain why people learn other languages.", "languages"),
    ("Describe how to bake bread at home.", "bread"), ("Write a short story about a dragon who is afraid of the dark.", "dragon"),
    ("Explain how a compass works.", "compass"), ("Describe a quiet morning in a small village.", "village"),
    ("Write a short guide to planning a picnic.", "picnic"), ("Explain why exercise is good for the heart.", "heart"),
)

#: yes/no questions for detectable_format:constrained_response (none opens with "Is": chapter 4's training data
#: answers "Is there ...?" with a bare yes/no, a collision `sinklib.evals.collide` reports)
QUESTIONS: tuple[str, ...] = (
    "Does water boil at 100 degrees Celsius at sea level?", "Can penguins fly?", "Should people drink water every day?", "Does the moon orbit the earth?",
    "Should children learn to swim?", "Should chess count as a sport?", "Do plants need sunlight to grow?", "Do most people prefer summer to winter?",
    "Can a computer feel happy?", "Does reading before bed help people sleep?", "Are tomatoes a fruit?", "Should people apologise for being late?",
    "Do fish sleep?", "Does music help people study?", "Should cities have more bicycle lanes?", "Do bees make honey?",
    "Can cats see in the dark?", "Should people swim during a thunderstorm?", "Are books better than films?",
    "Can people drink sea water safely?",
)

_END_PHRASES = ("Have a nice day.", "That is all.", "Thank you for reading.", "Is there anything else I can help with?",
                "Let me know if you have additional questions.")
_GENERIC = ("simple", "careful", "morning", "friend", "example", "light", "small", "quiet", "bright", "together")
_FORBIDDEN = ("very", "really", "good", "nice", "thing", "great", "important", "beautiful")

#: kwargs of each instruction id, drawn from the seeded generator and the task's topic word
_KWARGS: dict[str, Callable[[random.Random, str, str], dict]] = {
    "change_case:english_lowercase": lambda r, t, w: {},
    "change_case:english_capital": lambda r, t, w: {},
    "punctuation:no_comma": lambda r, t, w: {},
    "startend:end_checker": lambda r, t, w: {"end_phrase": r.choice(_END_PHRASES)},
    "length_constraints:number_words": lambda r, t, w: (
        {"num_words": r.choice((30, 40, 50, 60, 80)), "relation": "at least"} if r.random() < 0.5
        else {"num_words": r.choice((40, 60, 80, 100)), "relation": "less than"}),
    "detectable_format:number_bullet_lists": lambda r, t, w: {"num_bullets": r.randint(2, 6)},
    "detectable_format:json_format": lambda r, t, w: {},
    "detectable_format:title": lambda r, t, w: {},
    "startend:quotation": lambda r, t, w: {},
    "detectable_content:postscript": lambda r, t, w: {"postscript_marker": r.choice(("P.S.", "P.P.S"))},
    "keywords:existence": lambda r, t, w: {"keywords": [w, r.choice(_GENERIC)]},
    "keywords:forbidden_words": lambda r, t, w: {"forbidden_words": sorted(r.sample(_FORBIDDEN, 2))},
    "detectable_format:number_highlighted_sections": lambda r, t, w: {"num_highlights": r.randint(1, 3)},
    "detectable_format:multiple_sections": lambda r, t, w: {"section_spliter": r.choice(("SECTION", "Section", "PART")),
                                                            "num_sections": r.randint(2, 4)},
    "detectable_format:constrained_response": lambda r, t, w: {},
    "detectable_content:number_placeholders": lambda r, t, w: {"num_placeholders": r.randint(1, 3)},
    "length_constraints:number_paragraphs": lambda r, t, w: {"num_paragraphs": r.randint(2, 4)},
    "combination:repeat_prompt": lambda r, t, w: {"prompt_to_repeat": t},
    "keywords:frequency": lambda r, t, w: {"keyword": w, "frequency": r.randint(2, 3), "relation": "at least"},
    "combination:two_responses": lambda r, t, w: {},
}

#: ids whose registry description reads badly (a Python list, an unquoted phrase): the hand-written items' phrasing
_PHRASES: dict[str, Callable[[dict], str]] = {
    "keywords:existence": lambda k: f"Include the keywords {k['keywords'][0]} and {k['keywords'][1]} in the response.",
    "keywords:forbidden_words": lambda k: (f"Do not include the keywords {k['forbidden_words'][0]} and "
                                           f"{k['forbidden_words'][1]} in the response."),
    "startend:end_checker": lambda k: (f'Finish your response with this exact phrase "{k["end_phrase"]}". '
                                       "No other words should follow this phrase."),
}

#: two instructions that can both be followed in one response (the second sentence follows the first)
PAIRS: tuple[tuple[str, str], ...] = (
    ("change_case:english_lowercase", "punctuation:no_comma"), ("detectable_format:title", "startend:end_checker"),
    ("detectable_format:number_bullet_lists", "change_case:english_lowercase"),
    ("length_constraints:number_words", "punctuation:no_comma"), ("detectable_format:json_format", "keywords:forbidden_words"),
    ("change_case:english_capital", "punctuation:no_comma"), ("detectable_format:title", "keywords:existence"),
    ("length_constraints:number_paragraphs", "keywords:frequency"),
    ("detectable_format:number_highlighted_sections", "keywords:forbidden_words"),
    ("detectable_content:postscript", "change_case:english_lowercase"),
)

#: the single instructions, in the order the generator cycles through them
SINGLES: tuple[str, ...] = tuple(_KWARGS)

#: the size of the committed file (the 72 hand-written items included)
POWERED_N = 360


def describe(iid: str, kwargs: dict) -> str:
    """The instruction sentence of `iid` with `kwargs` (the registry's ``build_description`` or `_PHRASES`)."""
    from sinklib.evals.grading import ifeval_modules

    registry = ifeval_modules()["instructions_registry"].INSTRUCTION_DICT
    checker = registry[iid](iid)
    text = checker.build_description(**kwargs)  # every kwarg given: no random draw inside lm-eval
    return _PHRASES[iid](kwargs) if iid in _PHRASES else text


def _item(r: random.Random, ids: tuple[str, ...]) -> dict:
    """One generated item (no key) for the instruction ids `ids`."""
    if "detectable_format:constrained_response" in ids:
        task, word = r.choice(QUESTIONS), ""
    else:
        task, word = r.choice(TASKS)
    kwargs = [_KWARGS[i](r, task, word) for i in ids]
    prompt = " ".join([task] + [describe(i, k) for i, k in zip(ids, kwargs)])
    return {"prompt": prompt, "instruction_id_list": list(ids), "kwargs": kwargs}


def generate_instruction_items(n: int = POWERED_N, seed: int = 0, base: list[dict] | None = None) -> list[dict]:
    """`n` verifiable-instruction items: the hand-written items (`base`, default ``instructions.jsonl``) first with
    their keys, then generated ones (keys continue), cycling over `SINGLES` and `PAIRS`, tasks drawn by a
    seeded generator, no prompt twice. Deterministic: the same (n, seed, base) always gives the same items."""
    from sinklib.evals.items import load_instruction_items

    base = load_instruction_items() if base is None else base
    if n < len(base):
        raise ParameterError(f"parameter 'n' is {n}: the suite keeps all {len(base)} hand-written items; "
                             f"use n >= {len(base)}")
    plan = [(s,) for s in SINGLES] + list(PAIRS)
    r = random.Random(seed)
    rows, seen = [dict(b) for b in base], {b["prompt"] for b in base}
    tries = 0
    while len(rows) < n:
        ids = plan[(len(rows) - len(base)) % len(plan)]
        row = _item(r, ids)
        tries += 1
        if tries > 50 * n:
            raise ParameterError(f"could not draw {n} distinct prompts from {len(TASKS)} tasks; use a smaller 'n'")
        if row["prompt"] in seen:
            continue
        seen.add(row["prompt"])
        rows.append({"key": len(rows), **row})
    return rows


def to_jsonl(rows: list[dict]) -> str:
    """The file text of `rows`: one JSON object a line, as the item files are written."""
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
