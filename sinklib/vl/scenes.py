"""The synthetic VQA task: scenes of 1-4 coloured shapes on a 3 x 3 grid, rendered with numpy to
`image_size x image_size` RGB pixels, one-word question-answer items (count, colour, exists, where),
a text description of each scene (the text-only control's input) and the seeded item streams
(training batches per step, held-out evaluation items).

Each question type can be written in one of two `PHRASINGS`:

- 'question' (the default, and every cached training and result so far): natural questions, "How many shapes
  are there?", "What colour is the square?", "Is there a red circle?", "Where is the red shape?".
- 'field': the same four questions as labelled fields without a question mark, "Shape count:", "Colour of the
  square:", "Presence of a red circle, yes or no:", "Column of the red shape:".

Why two (#29): the collision check by construction (`sinklib.evals.collide`, `sinklib.vl.collisions`) finds
that the natural questions share templates with the evaluation suites, "how many ...?" with every math item
(whose strict grader wants "The answer is N.", not the bare number the training teaches) and "is ...?" with
instruction items. The field phrasing opens every item with a word ('shape', 'colour', 'presence', 'column')
that opens no evaluation item, so no training template equals an evaluation template at all. Both phrasings
draw the same scenes and answers from the same seeds (only the question text differs), so the answers, their
one-word format, the blind majority baseline and the sentence answers (`sentence_answer`) are the same.
"""
from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sinklib.errors import ParameterError
from sinklib.core.params import check_choice, check_int

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (50, 90, 230),
    "yellow": (230, 200, 40),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
GRID = 3
COLUMNS: tuple[str, ...] = ("left", "middle", "right")
ROWS: tuple[str, ...] = ("top", "middle", "bottom")
BACKGROUND: tuple[int, int, int] = (20, 20, 20)
QUESTION_TYPES: tuple[str, ...] = ("count", "colour", "exists", "where")
IMAGE_SIZE = (24, 512)  # allowed image sizes: a multiple of GRID in this range
#: the closed answer set of each question type (what `method="options"` scores)
ANSWERS: dict[str, tuple[str, ...]] = {
    "count": ("1", "2", "3", "4"),
    "colour": tuple(COLOURS),
    "exists": ("yes", "no"),
    "where": COLUMNS,
}


@dataclass(frozen=True)
class Shape:
    """One shape of a scene: its kind, colour and grid cell (row, col in 0..2)."""

    kind: str
    colour: str
    row: int
    col: int


@dataclass(frozen=True, eq=False)
class Scene:
    """A rendered scene. `image` is uint8 `[S, S, 3]`; `shapes` sorted by (row, col)."""

    shapes: tuple[Shape, ...]
    image: np.ndarray


@dataclass(frozen=True, eq=False)
class QAItem:
    """One visual question with its one-word answer."""

    scene: Scene
    qtype: str
    question: str
    answer: str


def check_image_size(image_size: Any) -> int:
    """The image side in pixels: an integer in IMAGE_SIZE that is a multiple of GRID (ParameterError otherwise)."""
    lo, hi = IMAGE_SIZE
    image_size = check_int("image_size", image_size, lo, hi)
    if image_size % GRID:
        raise ParameterError(f"parameter 'image_size' got {image_size}; allowed: a multiple of {GRID} in [{lo}, {hi}]")
    return image_size


def render(shapes: Sequence[Shape], image_size: int = 48, rng: np.random.Generator | None = None) -> np.ndarray:
    """Draw shapes on a dark background -> uint8 `[S, S, 3]`.

    Each shape is centred in its cell (cell = S/3 pixels) with a small jitter of position and
    size drawn from `rng` (none when `rng` is None). Circle: disc; square: axis-aligned square;
    triangle: upward isosceles triangle.
    """
    image_size = check_image_size(image_size)
    cell = image_size / GRID
    img = np.empty((image_size, image_size, 3), dtype=np.uint8)
    img[:] = BACKGROUND
    yy, xx = np.mgrid[0:image_size, 0:image_size].astype(np.float64) + 0.5
    for s in shapes:
        if s.kind not in SHAPES or s.colour not in COLOURS or not (0 <= s.row < GRID and 0 <= s.col < GRID):
            raise ParameterError(f"invalid shape {s!r}; kinds {SHAPES}, colours {tuple(COLOURS)}, row/col in 0..{GRID - 1}")
        jx, jy, js = (rng.uniform(-1, 1, 3) if rng is not None else (0.0, 0.0, 0.0))
        cx = (s.col + 0.5) * cell + jx * cell / 10
        cy = (s.row + 0.5) * cell + jy * cell / 10
        r = cell * (0.34 + 0.04 * js)
        dx, dy = xx - cx, yy - cy
        if s.kind == "circle":
            mask = dx**2 + dy**2 <= r**2
        elif s.kind == "square":
            mask = (np.abs(dx) <= 0.8 * r) & (np.abs(dy) <= 0.8 * r)
        else:  # triangle, apex up: half-width grows from 0 at the top to r at the bottom
            mask = (dy >= -r) & (dy <= r) & (np.abs(dx) <= (dy + r) / 2)
        img[mask] = COLOURS[s.colour]
    return img


def make_scenes(n: int, seed: int = 0, image_size: int = 48, min_shapes: int = 1,
                max_shapes: int = 4) -> list[Scene]:
    """`n` random scenes, deterministic for a given seed.

    The number of shapes is uniform in [min_shapes, max_shapes]; cells are distinct; kind and
    colour are uniform and independent.
    """
    n = check_int("n", n, 0)
    seed = check_int("seed", seed, 0)
    image_size = check_image_size(image_size)
    max_shapes = check_int("max_shapes", max_shapes, 1, GRID * GRID)
    min_shapes = check_int("min_shapes", min_shapes, 1, max_shapes)
    rng = np.random.default_rng(seed)
    scenes = []
    for _ in range(n):
        k = int(rng.integers(min_shapes, max_shapes + 1))
        cells = sorted(rng.choice(GRID * GRID, size=k, replace=False).tolist())
        shapes = tuple(Shape(SHAPES[int(rng.integers(len(SHAPES)))], list(COLOURS)[int(rng.integers(len(COLOURS)))],
                             c // GRID, c % GRID) for c in cells)
        scenes.append(Scene(shapes=shapes, image=render(shapes, image_size, rng)))
    return scenes


def _place(s: Shape) -> str:
    if s.row == 1 and s.col == 1:
        return "centre"
    return f"{ROWS[s.row]} {COLUMNS[s.col]}"


def describe(scene: Scene) -> str:
    """The scene as text, e.g. 'a red circle at top left; a blue square at centre.'"""
    return "; ".join(f"a {s.colour} {s.kind} at {_place(s)}" for s in scene.shapes) + "."


def _valid_qtypes(scene: Scene) -> list[str]:
    kinds = Counter(s.kind for s in scene.shapes)
    colours = Counter(s.colour for s in scene.shapes)
    out = ["count"]
    if any(v == 1 for v in kinds.values()):
        out.append("colour")
    out.append("exists")
    if any(v == 1 for v in colours.values()):
        out.append("where")
    return out


#: how a question is written: natural questions (the default) or labelled fields without a question mark, which
#: share no template with any evaluation suite (#29; see the module docstring)
PHRASINGS: tuple[str, ...] = ("question", "field")
#: the text of each question type per phrasing; '{}' is the slot (a kind, 'colour kind', a colour)
QUESTION_TEMPLATES: dict[str, dict[str, str]] = {
    "question": {"count": "How many shapes are there?", "colour": "What colour is the {}?",
                 "exists": "Is there a {}?", "where": "Where is the {} shape?"},
    "field": {"count": "Shape count:", "colour": "Colour of the {}:",
              "exists": "Presence of a {}, yes or no:", "where": "Column of the {} shape:"},
}


def check_phrasing(phrasing: Any) -> str:
    """One of `PHRASINGS` (ParameterError naming them otherwise)."""
    return check_choice("phrasing", phrasing, PHRASINGS)


def _make_question(scene: Scene, qtype: str, rng: np.random.Generator, phrasing: str = "question") -> QAItem:
    """One item of type `qtype`; the draws from `rng` do not depend on `phrasing` (the same scene, slot and
    answer in either phrasing)."""
    shapes = scene.shapes
    tpl = QUESTION_TEMPLATES[check_phrasing(phrasing)]
    if qtype == "count":
        return QAItem(scene, qtype, tpl["count"], str(len(shapes)))
    if qtype == "colour":
        kinds = Counter(s.kind for s in shapes)
        unique = [k for k in SHAPES if kinds.get(k) == 1]
        kind = unique[int(rng.integers(len(unique)))]
        colour = next(s.colour for s in shapes if s.kind == kind)
        return QAItem(scene, qtype, tpl["colour"].format(kind), colour)
    if qtype == "exists":
        present = {(s.colour, s.kind) for s in shapes}
        if rng.random() < 0.5:
            pool = sorted(present)
            answer = "yes"
        else:
            pool = [(c, k) for c in COLOURS for k in SHAPES if (c, k) not in present]
            answer = "no"
        colour, kind = pool[int(rng.integers(len(pool)))]
        return QAItem(scene, qtype, tpl["exists"].format(f"{colour} {kind}"), answer)
    if qtype == "where":
        colours = Counter(s.colour for s in shapes)
        unique = [c for c in COLOURS if colours.get(c) == 1]
        colour = unique[int(rng.integers(len(unique)))]
        col = next(s.col for s in shapes if s.colour == colour)
        return QAItem(scene, qtype, tpl["where"].format(colour), COLUMNS[col])
    raise ParameterError(f"parameter 'qtypes' has {qtype!r}; allowed: {', '.join(QUESTION_TYPES)}")


#: how a training answer is written: the one-word answer the VL task scores, or a full sentence with the same
#: content (the format-preserving text-only control)
ANSWER_STYLES = ("word", "sentence")


def _slot(question: str, qtype: str) -> str:
    """The words in the slot of a question written by `_make_question` in either phrasing ('' for 'count'; an
    error, not a wrong sentence, when the question follows neither phrasing's template)."""
    for phrasing in PHRASINGS:
        tpl = QUESTION_TEMPLATES[phrasing][qtype]
        if "{}" not in tpl:
            if question == tpl:
                return ""
            continue
        head, tail = tpl.split("{}")
        if len(question) > len(head) + len(tail) and question.startswith(head) and question.endswith(tail):
            return question[len(head):len(question) - len(tail)]
    allowed = " or ".join(repr(QUESTION_TEMPLATES[p][qtype]) for p in PHRASINGS)
    raise ParameterError(f"sentence_answer: {question!r} does not follow the template {allowed}")


def sentence_answer(item: QAItem) -> str:
    """The item's answer as a full English sentence with the same content, e.g. 'There are 3 shapes.' for
    'How many shapes are there?' (or 'Shape count:') -> '3' (the format-preserving control trains on these);
    the same sentence in either of `PHRASINGS`."""
    if item.qtype not in QUESTION_TYPES:
        raise ParameterError(f"sentence_answer: unknown question type {item.qtype!r}")
    slot, a = _slot(item.question, item.qtype), item.answer
    if item.qtype == "count":
        return "There is one shape." if a == "1" else f"There are {a} shapes."
    if item.qtype == "colour":
        return f"The {slot} is {a}."
    if item.qtype == "exists":
        return f"Yes, there is a {slot}." if a == "yes" else f"No, there is no {slot}."
    return f"The {slot} shape is in the {a} column."


def check_qtypes(qtypes: Sequence[str]) -> tuple[str, ...]:
    if isinstance(qtypes, str):
        qtypes = [q.strip() for q in qtypes.split(",") if q.strip()]
    qtypes = tuple(qtypes)
    if not qtypes:
        raise ParameterError(f"parameter 'qtypes' is empty; allowed: a non-empty subset of {', '.join(QUESTION_TYPES)}")
    for q in qtypes:
        check_choice("qtypes", q, QUESTION_TYPES)
    return qtypes


def make_items(scenes: Sequence[Scene], seed: int = 0, per_scene: int = 1,
               qtypes: Sequence[str] = QUESTION_TYPES, phrasing: str = "question") -> list[QAItem]:
    """Question-answer items for scenes, deterministic for a given seed.

    For each scene, `per_scene` distinct question types are drawn uniformly from those in
    `qtypes` that the scene allows ('colour' needs a shape kind that occurs once, 'where' a
    colour that occurs once; 'count' and 'exists' always apply). 'exists' is yes/no 50:50.
    Questions are written in `phrasing` (one of `PHRASINGS`); the items differ only in that text.
    """
    seed = check_int("seed", seed, 0)
    per_scene = check_int("per_scene", per_scene, 1, len(QUESTION_TYPES))
    qtypes = check_qtypes(qtypes)
    phrasing = check_phrasing(phrasing)
    rng = np.random.default_rng(seed)
    items = []
    for sc in scenes:
        valid = [q for q in _valid_qtypes(sc) if q in qtypes]
        if not valid:  # only when qtypes excludes both count and exists
            continue
        chosen = rng.choice(len(valid), size=min(per_scene, len(valid)), replace=False)
        items.extend(_make_question(sc, valid[int(i)], rng, phrasing) for i in chosen)
    return items


def _stream_seed(seed: int, tag: str, step: int) -> int:
    return int.from_bytes(hashlib.sha256(f"sinkbook-vl:{seed}:{tag}:{step}".encode()).digest()[:4], "little")


def batch_items(step: int, batch_size: int, seed: int = 0, tag: str = "lm", image_size: int = 48,
                qtypes: Sequence[str] = QUESTION_TYPES, max_shapes: int = 4,
                phrasing: str = "question") -> list[QAItem]:
    """The training batch of one step: `batch_size` fresh scenes, one question each (in `phrasing`).

    Deterministic in (seed, tag, step). Stage 2 of `train_vl` and `train_text_only` both use
    tag 'lm', so the two see the same items in the same order; stage 1 uses tag 'projector'.
    """
    return _draw_items(batch_size, _stream_seed(seed, tag, step), image_size, check_qtypes(qtypes), max_shapes,
                       check_phrasing(phrasing))


def _draw_items(n: int, s: int, image_size: int, qtypes: tuple[str, ...], max_shapes: int = 4,
                phrasing: str = "question") -> list[QAItem]:
    """n items, one per scene, in `phrasing`; scenes that allow none of `qtypes` are skipped and more are drawn."""
    items: list[QAItem] = []
    attempt = 0
    while len(items) < n:
        sub = s if attempt == 0 else _stream_seed(s, "more", attempt)
        scenes = make_scenes(n - len(items), seed=sub, image_size=image_size, max_shapes=max_shapes)
        items.extend(make_items(scenes, seed=sub, qtypes=qtypes, phrasing=phrasing))
        attempt += 1
        if attempt > 1000:
            raise ParameterError(f"parameter 'qtypes' {qtypes} allows almost no scene; include 'count' or 'exists'")
    return items[:n]


def eval_items(n: int, seed: int = 0, image_size: int = 48, qtypes: Sequence[str] = QUESTION_TYPES,
               max_shapes: int = 4, phrasing: str = "question") -> list[QAItem]:
    """`n` held-out items (tag 'eval': a seed stream that training never uses), questions in `phrasing`."""
    n = check_int("n", n, 1)
    return _draw_items(n, _stream_seed(seed, "eval", 0), check_image_size(image_size), check_qtypes(qtypes),
                       check_int("max_shapes", max_shapes, 1, GRID * GRID), check_phrasing(phrasing))


def majority_baseline(train_items: Sequence[QAItem], test_items: Sequence[QAItem]) -> float:
    """Accuracy on `test_items` of answering, blind, the most frequent training answer of each question type."""
    if not test_items:
        raise ParameterError("parameter 'test_items' is empty; allowed: at least one item")
    best = {}
    for q in QUESTION_TYPES:
        c = Counter(it.answer for it in train_items if it.qtype == q)
        best[q] = max(sorted(c), key=lambda a: c[a]) if c else ANSWERS[q][0]
    return float(np.mean([best[it.qtype] == it.answer for it in test_items]))
