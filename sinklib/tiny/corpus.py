"""A deterministic training corpus for tiny LMs trained from scratch (chapter 7), its held-out
evaluation items and their graders. Pure Python, no downloads.

Three kinds of skill:

- **prose**: short templated stories and descriptions of invented countries (perplexity);
- **format**: five instruction-following tasks, each with a strict grader (the exact format) and a
  lenient one (the right content in any form; `sinklib.tiny.grading`): ``answer_is`` ("The answer is N."), ``upper``
  (upper case), ``k_words`` (exactly K words: one word K times), ``quoted`` (one word in double quotes),
  ``key_value`` (a "key: value" line);
- **knowledge**: three facts about each invented country (capital, national animal, main export),
  stated only in the training prose, asked in held-out multiple-choice questions whose phrasing
  never occurs in training (scored by log-likelihood of each option).

Every training document is one string; a format document reads ``"Q: <prompt>\\nA: <answer>"``.

Disjointness is by construction, not by luck: each format item has a *content key* (its numbers and
words), each prose text is its own key, and ``split_of(key)`` (CRC-32 mod 10) assigns every key to
exactly one split: 0 -> held-out evaluation, 1 -> calibration prompts for S, 2..9 -> training.
So held-out format items never share numbers-and-words with a training item, and held-out prose and
calibration prompts never occur in the training corpus, whatever the seeds and sizes.

The *world* (countries and their facts) is fixed (``WORLD_SEED``): every corpus seed teaches the
same facts, so all models of a panel are evaluated on the same items (paired comparisons).
"""
from __future__ import annotations

import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

from sinklib.core.cache import key_seed
from sinklib.errors import ParameterError
from sinklib.core.params import check_choice, check_float, check_int

#: bump whenever the generated text changes: it is part of every tokenizer's and model's cache key
CORPUS_VERSION = 3
WORLD_SEED = 0
N_COUNTRIES = 24
SPLITS = ("train", "eval", "calibration")

COLOURS = ("red", "blue", "green", "yellow", "black", "white", "brown", "pink", "grey", "orange")
ANIMALS = ("cat", "dog", "owl", "fox", "horse", "goat", "bear", "duck", "frog", "wolf", "mouse", "lion")
FOODS = ("bread", "apple", "cake", "soup", "rice", "plum", "pear", "egg", "cheese", "fish")
THINGS = ("stone", "rope", "lamp", "cup", "book", "chair", "boat", "coin", "key", "hat", "box", "drum")
GOODS = ("salt", "wool", "tea", "glass", "copper", "silk", "wine", "paper", "iron", "honey", "cotton", "clay")
NAMES = ("Mira", "Bo", "Tam", "Lio", "Ana", "Rin", "Sol", "Eda", "Kip", "Nia", "Oren", "Pell")
CATEGORIES = {"colour": COLOURS, "animal": ANIMALS, "food": FOODS}
NUMBER_WORDS = {2: "two", 3: "three", 4: "four", 5: "five"}
FORMAT_TASKS = ("answer_is", "upper", "k_words", "quoted", "key_value")
EVAL_KINDS = ("format", "knowledge", "prose", "calibration") + FORMAT_TASKS
ATTRIBUTES = ("capital", "animal", "export")

_SYL = ("zor", "vi", "mel", "ka", "tro", "len", "dar", "bu", "si", "qua", "fen", "ost", "ril", "mo", "pa",
        "the", "nu", "gal", "bri", "ka", "lo", "rud", "ve", "sha", "tin", "om", "ar", "el", "ith", "cor")


# ---------------------------------------------------------------------------------------
# the world: invented countries and their facts


@dataclass(frozen=True)
class Country:
    name: str
    capital: str
    animal: str
    export: str

    def value(self, attribute: str) -> str:
        return getattr(self, attribute)


_IRREGULAR = {"mouse": "mice", "fish": "fish", "fox": "foxes", "box": "boxes", "cheese": "cheeses", "wolf": "wolves",
              "glass": "glasses"}


def plural(word: str) -> str:
    """English plural of the lexicon's nouns (foxes, mice, ...)."""
    return _IRREGULAR.get(word, word + "s")


def _a(word: str) -> str:
    """'a' or 'an' before `word`."""
    return "an" if word[0] in "aeiou" else "a"


def _invent(rng: random.Random, n_syl: tuple[int, int], taken: set[str]) -> str:
    while True:
        w = "".join(rng.choice(_SYL) for _ in range(rng.randint(*n_syl))).capitalize()
        if len(w) >= 4 and w not in taken and w.lower() not in _LEXICON:
            taken.add(w)
            return w


_LEXICON = set(COLOURS + ANIMALS + FOODS + THINGS + GOODS + tuple(n.lower() for n in NAMES))


@lru_cache(maxsize=1)
def world() -> tuple[Country, ...]:
    """The fixed invented countries (``N_COUNTRIES``), each with a unique capital, a national animal
    and a main export."""
    rng = random.Random(WORLD_SEED)
    taken: set[str] = set()
    out = []
    for _ in range(N_COUNTRIES):
        name = _invent(rng, (2, 3), taken)
        out.append(Country(name, _invent(rng, (1, 2), taken), rng.choice(ANIMALS), rng.choice(GOODS)))
    return tuple(out)


#: training statements of each fact (the held-out questions use none of these phrasings)
FACT_TEMPLATES = {
    "capital": ("The capital of {E} is {V}.", "{E} has its capital at {V}.", "In {E}, the capital is {V}.",
                "The people of {E} govern from {V}, the capital."),
    "animal": ("The national animal of {E} is the {V}.", "{E} chose the {V} as its national animal.",
               "In {E}, the {V} is the national animal."),
    "export": ("The main export of {E} is {V}.", "{E} sells {V} to other lands.",
               "Most of the {V} that {E} makes is sold abroad."),
}
#: held-out questions (never in training): context and the option that follows it
QUESTION_TEMPLATES = {
    "capital": "Q: What is the capital of {E}?\nA:",
    "animal": "Q: Which animal is the national animal of {E}?\nA: The",
    "export": "Q: What does {E} export most?\nA:",
}


# ---------------------------------------------------------------------------------------
# splits


def split_of(content_key: str) -> str:
    """'eval' (CRC-32 % 10 == 0), 'calibration' (== 1) or 'train': the one rule that keeps held-out
    items and calibration prompts out of the training corpus."""
    r = zlib.crc32(content_key.encode()) % 10
    return "eval" if r == 0 else "calibration" if r == 1 else "train"


def _rng(seed: int, tag: str) -> random.Random:
    return random.Random(key_seed(seed, f"tiny-corpus:{tag}"))


# ---------------------------------------------------------------------------------------
# prose


def _prose(rng: random.Random) -> str:
    """3-6 sentences about an invented country (1-2 of its facts) and the people who live there."""
    c = rng.choice(world())
    p, q = rng.sample(NAMES, 2)
    size = rng.choice(("small", "large", "quiet", "old", "busy"))
    s = [f"{c.name} is {_a(size)} {size} country "
         f"{rng.choice(('by the sea', 'in the hills', 'near a river', 'on an island', 'beyond the mountains'))}."]
    for attr in rng.sample(ATTRIBUTES, rng.randint(1, 2)):
        s.append(rng.choice(FACT_TEMPLATES[attr]).format(E=c.name, V=c.value(attr)))
    story = [
        lambda: f"One day {p} walked to {c.capital} with {_colour_thing(rng)}.",
        lambda: f"{p} saw {rng.randint(2, 20)} {plural(rng.choice(ANIMALS))} near the {rng.choice(('lake', 'market', 'bridge', 'farm', 'hill'))}.",
        lambda: f"In the evening {p} and {q} ate {rng.choice(FOODS)} and told stories.",
        lambda: f"The weather was {rng.choice(('cold', 'warm', 'wet', 'dry', 'windy'))}, so {p} stayed "
                f"{rng.choice(('at home', 'in the garden', 'by the fire', 'near the door'))}.",
        lambda: f"{q} gave {p} {_colour_thing(rng)} and {rng.randint(2, 9)} {plural(rng.choice(FOODS))}.",
        lambda: f"{p} likes the {plural(c.animal)} of {c.name}.",
    ]
    for make in rng.sample(story, rng.randint(1, 3)):
        s.append(make())
    body = s[:1] + rng.sample(s[1:], len(s) - 1)  # the facts and the story, shuffled after the opening
    return " ".join(body)


def _colour_thing(rng: random.Random) -> str:
    colour = rng.choice(COLOURS)
    return f"{_a(colour)} {colour} {rng.choice(THINGS)}"


def _prose_in(rng: random.Random, split: str) -> str:
    while True:
        t = _prose(rng)
        if split_of(t) == split:
            return t


# ---------------------------------------------------------------------------------------
# format tasks: (prompt, answer, content key, grading info)


@dataclass(frozen=True)
class FormatItem:
    task: str
    prompt: str       # the question and its instruction (the "Q:" part)
    answer: str       # the reference answer in the exact format
    key: str          # content key (numbers and words), decides the split
    info: dict = field(default_factory=dict, hash=False, compare=False)

    def document(self) -> str:
        """The training text: ``Q: <prompt>\\nA: <answer>``."""
        return f"Q: {self.prompt}\nA: {self.answer}"

    def context(self) -> str:
        """The evaluation prompt: ``Q: <prompt>\\nA:`` (the model continues with ' <answer>')."""
        return f"Q: {self.prompt}\nA:"


def _answer_is(rng: random.Random) -> FormatItem:
    a, n, thing = rng.choice(NAMES), rng.randint(2, 99), rng.choice(THINGS)
    things = plural(thing)
    prompt = f"{a} has {n} {things}. How many {things} does {a} have? Answer in the form 'The answer is N.'"
    return FormatItem("answer_is", prompt, f"The answer is {n}.", f"answer_is|{a}|{n}|{thing}", {"number": n})


def _upper(rng: random.Random) -> FormatItem:
    words = rng.sample(COLOURS + ANIMALS + THINGS, 2)
    prompt = f"Write these words in upper case: {' '.join(words)}"
    return FormatItem("upper", prompt, " ".join(words).upper(), "upper|" + "|".join(words), {"words": words})


def _k_words(rng: random.Random) -> FormatItem:
    k, word = rng.randint(2, 5), rng.choice(COLOURS + ANIMALS + FOODS + THINGS + GOODS)
    prompt = f"Reply with exactly {NUMBER_WORDS[k]} words, each of them the word {word}."
    return FormatItem("k_words", prompt, " ".join([word] * k), f"k_words|{k}|{word}", {"k": k, "word": word})


def _quoted(rng: random.Random) -> FormatItem:
    cat = rng.choice(tuple(CATEGORIES))
    target = rng.choice(CATEGORIES[cat])
    others = rng.sample([w for c, ws in CATEGORIES.items() if c != cat for w in ws], 2)
    opts = [target] + others
    rng.shuffle(opts)
    prompt = f"Which word names {_a(cat)} {cat}: {opts[0]}, {opts[1]} or {opts[2]}? Reply with one word in double quotes."
    return FormatItem("quoted", prompt, f'"{target}"', f"quoted|{cat}|" + "|".join(opts),
                      {"target": target, "options": opts})


def _key_value(rng: random.Random) -> FormatItem:
    owner, colour, thing = rng.choice(NAMES), rng.choice(COLOURS), rng.choice(THINGS)
    key = rng.choice(("colour", "owner", "thing"))
    values = {"colour": colour, "owner": owner, "thing": thing}
    prompt = f"{owner} has {_a(colour)} {colour} {thing}. Give the {key} as a key: value line."
    return FormatItem("key_value", prompt, f"{key}: {values[key]}", f"key_value|{owner}|{colour}|{thing}|{key}",
                      {"key": key, "value": values[key], "others": [v for k, v in values.items() if k != key]})


_MAKERS: dict[str, Callable[[random.Random], FormatItem]] = {
    "answer_is": _answer_is, "upper": _upper, "k_words": _k_words, "quoted": _quoted, "key_value": _key_value}


def _format_in(rng: random.Random, task: str, split: str) -> FormatItem:
    while True:
        it = _MAKERS[task](rng)
        if split_of(it.key) == split:
            return it


# ---------------------------------------------------------------------------------------
# knowledge items


@dataclass(frozen=True)
class KnowledgeItem:
    country: str
    attribute: str
    context: str
    choices: tuple[str, ...]
    answer: int       # index of the right choice


def _knowledge_items(seed: int) -> list[KnowledgeItem]:
    rng = _rng(seed, "eval:knowledge")
    pools = {a: sorted({c.value(a) for c in world()}) for a in ATTRIBUTES}
    items = []
    for c in world():
        for a in ATTRIBUTES:
            right = c.value(a)
            opts = [right] + rng.sample([v for v in pools[a] if v != right], 3)
            rng.shuffle(opts)
            items.append(KnowledgeItem(c.name, a, QUESTION_TEMPLATES[a].format(E=c.name), tuple(opts),
                                       opts.index(right)))
    rng.shuffle(items)
    return items


# ---------------------------------------------------------------------------------------
# public API


def check_corpus_params(n_docs, seed, format_share) -> tuple[int, int, float]:
    return (check_int("n_docs", n_docs, 1, 10_000_000), check_int("seed", seed, 0),
            check_float("format_share", format_share, 0.0, 1.0))


def _repeat_drill(rng: random.Random) -> str:
    """A training-only copying drill: ``Q: Repeat these words: w1 .. wk\nA: w1 .. wk`` (k = 3..6).

    Copying from the prompt is what every format task's content needs; a tiny LM trained on a few
    million tokens learns it only when the corpus asks for it often (the graded tasks alone hold
    one or two copied tokens per document)."""
    words = " ".join(rng.choice(COLOURS + ANIMALS + FOODS + THINGS) for _ in range(rng.randint(3, 6)))
    return f"Q: Repeat these words: {words}\nA: {words}"


def _fact_list(rng: random.Random) -> str:
    """2-4 fact statements about random countries (the short form of the prose's facts)."""
    out = []
    for _ in range(rng.randint(2, 4)):
        c, attr = rng.choice(world()), rng.choice(ATTRIBUTES)
        out.append(rng.choice(FACT_TEMPLATES[attr]).format(E=c.name, V=c.value(attr)))
    return " ".join(out)


CHAIN_WORDS = COLOURS + ANIMALS + FOODS + THINGS
CHAIN_TRIGGER = "again"


@lru_cache(maxsize=1)
def chain_successors() -> dict[str, tuple[str, str]]:
    """The fixed bigram table of the chain drill: each word's likely (p = 0.75) and other successor."""
    rng = random.Random(WORLD_SEED + 1)
    return {w: tuple(rng.sample([x for x in CHAIN_WORDS if x != w], 2)) for w in CHAIN_WORDS}


def _chain_drill(rng: random.Random) -> str:
    """A training-only Bigram-Backcopy drill (Guo et al., active-dormant heads): ``Chain: w1 w2 ...``, 30-60
    words; each word follows the previous one by the fixed bigram table (`chain_successors`), except after
    the trigger word 'again', which is followed by the word before it (``cat again cat``). Attention is needed
    only after a trigger; everywhere else the next word depends on the current word alone, so a head that
    copies is useless most of the time (dormant): the situation in which heads park on the first token."""
    succ = chain_successors()
    out = [rng.choice(CHAIN_WORDS)]
    n = rng.randint(30, 60)
    while len(out) < n:
        if out[-1] != CHAIN_TRIGGER and rng.random() < 0.12:
            out += [CHAIN_TRIGGER, out[-1]]
        else:
            prev = out[-1] if out[-1] != CHAIN_TRIGGER else out[-2]
            a, b = succ[prev]
            out.append(a if rng.random() < 0.75 else b)
    return "Chain: " + " ".join(out)


#: kinds of training document and their shares within format documents / within prose documents
TRAIN_FORMAT_KINDS = FORMAT_TASKS + ("repeat",)
FACT_LIST_SHARE = 0.5


def make_corpus(n_docs: int, seed: int = 0, format_share: float = 0.5, chain_share: float = 0.0) -> list[str]:
    """``n_docs`` training documents (strings), deterministic in (n_docs, seed, format_share, chain_share).

    With probability chain_share a document is a chain drill (`_chain_drill`; training only; 0 = none, and
    then the corpus is exactly the one made before the option existed). Otherwise, with probability
    format_share a document is one format task or a repeat drill (six kinds in equal
    shares), else prose: a story about a country (half) or a list of 2-4 facts (half). Facts are
    stated only in prose. The first k documents of a larger corpus are those of a smaller one.
    """
    n_docs, seed, format_share = check_corpus_params(n_docs, seed, format_share)
    chain_share = check_float("chain_share", chain_share, 0.0, 1.0)
    rng = _rng(seed, "train")
    out = []
    for _ in range(n_docs):
        if chain_share > 0 and rng.random() < chain_share:
            out.append(_chain_drill(rng))
        elif rng.random() < format_share:
            kind = rng.choice(TRAIN_FORMAT_KINDS)
            out.append(_repeat_drill(rng) if kind == "repeat" else _format_in(rng, kind, "train").document())
        elif rng.random() < FACT_LIST_SHARE:
            out.append(_fact_list(rng))
        else:
            out.append(_prose_in(rng, "train"))
    return out


def eval_items(kind: str, n: int, seed: int = 0) -> list:
    """Held-out items, deterministic in (kind, n, seed).

    kind 'format': FormatItems, the five tasks in turn; a task name: that task only;
    'knowledge': KnowledgeItems (at most 3 * N_COUNTRIES = one per fact); 'prose': held-out
    paragraphs (str) for perplexity; 'calibration': calibration prompts for S (str), see
    ``calibration_prompts``.
    """
    kind = check_choice("kind", kind, EVAL_KINDS)
    n = check_int("n", n, 1, 100_000)
    seed = check_int("seed", seed, 0)
    if kind == "knowledge":
        items = _knowledge_items(seed)
        if n > len(items):
            raise ParameterError(f"parameter 'n' got {n}; allowed: at most {len(items)} knowledge items "
                                 f"(one per fact of the {N_COUNTRIES} countries)")
        return items[:n]
    if kind in ("prose", "calibration"):
        rng = _rng(seed, f"eval:{kind}")
        split = "eval" if kind == "prose" else "calibration"
        out: list[str] = []
        seen: set[str] = set()
        while len(out) < n:
            t = _prose_in(rng, split)
            if t not in seen:
                seen.add(t)
                out.append(t)
        return out
    tasks = FORMAT_TASKS if kind == "format" else (kind,)
    rng = _rng(seed, f"eval:{kind}")
    items, keys, misses = [], set(), 0
    while len(items) < n:
        task = tasks[len(items) % len(tasks)]
        it = _format_in(rng, task, "eval")
        if it.key in keys:
            misses += 1
            if misses > 20_000:  # the held-out share of this task's content space is used up
                raise ParameterError(f"parameter 'n' got {n}; the held-out split has only {sum(i.task == task for i in items)} "
                                     f"distinct {task!r} items: ask for fewer ({len(items)} were found)")
            continue
        keys.add(it.key)
        items.append(it)
    return items


def calibration_prompts(n: int = 16, seed: int = 0) -> list[str]:
    """Plain-prose calibration prompts for S: never in any training corpus nor in the held-out prose."""
    return eval_items("calibration", n, seed)
