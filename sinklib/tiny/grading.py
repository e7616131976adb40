"""Strict and lenient graders of the tiny corpus's format tasks (`sinklib.tiny.corpus.FORMAT_TASKS`).

strict: exactly the requested format with the right content; lenient: the right content in any form.
The gap between the two is the part of a score that is format, not content. A strict pass is always
a lenient pass. Leading and trailing whitespace is ignored (the model answers after "A:" with a space).
"""
from __future__ import annotations

import re

from sinklib.errors import ParameterError
from sinklib.tiny.corpus import FormatItem

_WORD = re.compile(r"[A-Za-z]+")
_INT = re.compile(r"-?\d+")


def _words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def grade(item: FormatItem, response: str) -> dict:
    """{'strict': bool, 'lenient': bool} for one response (leading/trailing whitespace ignored).

    strict: exactly the requested format with the right content. lenient: the right content in any
    form. A strict pass is always a lenient pass.
    """
    r = response.strip()
    t, info = item.task, item.info
    if t == "answer_is":
        m = re.fullmatch(r"The answer is (\d+)\.", r)
        strict = bool(m) and int(m.group(1)) == info["number"]
        nums = _INT.findall(r)
        lenient = bool(nums) and int(nums[-1]) == info["number"]
    elif t == "upper":
        strict = r == " ".join(info["words"]).upper()
        lenient = _words(r) == list(info["words"])
    elif t == "k_words":
        strict = r == " ".join([info["word"]] * info["k"])
        ws = _words(r)
        lenient = bool(ws) and all(w == info["word"] for w in ws)
    elif t == "quoted":
        strict = r == f'"{info["target"]}"'
        ws = set(_words(r))
        lenient = info["target"] in ws and not ws & (set(info["options"]) - {info["target"]})
    elif t == "key_value":
        strict = r == f"{info['key']}: {info['value']}"
        ws = set(_words(r))
        lenient = info["value"].lower() in ws and not ws & {o.lower() for o in info["others"]}
    else:  # pragma: no cover (items are built here)
        raise ParameterError(f"unknown format task {t!r}")
    return {"strict": bool(strict), "lenient": bool(lenient or strict)}
