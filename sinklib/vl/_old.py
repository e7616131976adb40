"""A miniature LLaVA-style vision-language adaptation of a causal LM, and its two controls.

The pieces, in the order the book uses them:

- **Data** (`make_scenes`, `make_items`, `describe`): deterministic synthetic scenes of 1-4
  coloured shapes (circle, square, triangle; red, green, blue, yellow) on a 3 x 3 grid,
  rendered with numpy to `image_size x image_size` RGB pixels, with one-word visual
  question-answer pairs (count, colour, exists, where) and a text description of the same
  scene (for the text-only control).
- **Vision encoder** (`make_encoder`): a small convolutional net with *frozen random* weights
  drawn from a seeded generator. It is **not pretrained**: no pretrained vision encoder is
  available offline. Its patch features keep colour, shape and position (a fixed random
  position embedding stands in for CLIP's learned one), which `encoder_probe_accuracy` checks.
- **Projector** (`make_projector`): the trainable LLaVA-1.5 MLP (Linear-GELU-Linear) that turns
  each of the `n_visual_tokens` image features into an embedding of the LM's hidden size.
  Sequence layout (VL): ``[BOS if the tokenizer adds one] "Scene:" <visual tokens> "\\nQuestion: q\\nAnswer:" " a" <eos>``.
  Text-only: the visual tokens are replaced by ``" " + describe(scene)``.
- **Training** (`train_vl`): stage 1 trains the projector only (every LM weight frozen), stage 2
  trains every LM parameter (at `lr_lm`) and the projector. AdamW, a short linear warm-up, then a
  constant (default) or cosine learning rate, gradient clipping, seeded. The loss is the mean
  cross-entropy over the answer tokens only (the one-word answer and the end-of-sequence token);
  hidden states are sliced at those positions before the LM head.
- **Controls**: `train_text_only` (the same items, in the same order, with the same number of
  LM steps, optimiser and schedule as stage 2, the scene given as text; both report their token
  budget) and `random_direction_like` (a norm-matched random weight change).
- **Evaluation** (`vqa_accuracy`): greedy decoding of the short answer (default) or scoring the
  closed set of answer options; `majority_baseline` is the blind baseline.
- **Checkpoints** (`save_checkpoint`, `load_checkpoint`, `checkpoint_key`): safetensors in the
  cache folder, never in git.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import math
import os
import re
import shutil
import time
import zlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .errors import ParameterError, SinkbookError
from .params import check_choice, check_float, check_int

# ---------------------------------------------------------------------------------------
# the synthetic scenes

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
SCHEDULES = ("constant", "cosine")
# The training recipe of the book's full profile (chapter 4), the one place it is defined: the
# defaults of train_vl / train_text_only and of sinklib.pairs.pair_params. On 2 CPU cores it takes
# SmolLM2-135M from 23 % to 63 % held-out VQA accuracy (majority answer: 38 %).
RECIPE = {"stage1_steps": 200, "stage2_steps": 60, "batch_size": 32, "lr_projector": 1e-2, "lr_lm": 5e-5,
          "lr_projector_stage2": 5e-5, "schedule": "constant"}
VQA_EVAL_SEED_OFFSET = 10_000  # held-out VQA items of a run with seed s use eval_items(seed=s + this)
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


def _check_image_size(image_size: Any) -> int:
    image_size = check_int("image_size", image_size, 24, 512)
    if image_size % GRID:
        raise ParameterError(f"parameter 'image_size' got {image_size}; allowed: a multiple of {GRID} in [24, 512]")
    return image_size


def render(shapes: Sequence[Shape], image_size: int = 48, rng: np.random.Generator | None = None) -> np.ndarray:
    """Draw shapes on a dark background -> uint8 `[S, S, 3]`.

    Each shape is centred in its cell (cell = S/3 pixels) with a small jitter of position and
    size drawn from `rng` (none when `rng` is None). Circle: disc; square: axis-aligned square;
    triangle: upward isosceles triangle.
    """
    image_size = _check_image_size(image_size)
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
    image_size = _check_image_size(image_size)
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


def _make_question(scene: Scene, qtype: str, rng: np.random.Generator) -> QAItem:
    shapes = scene.shapes
    if qtype == "count":
        return QAItem(scene, qtype, "How many shapes are there?", str(len(shapes)))
    if qtype == "colour":
        kinds = Counter(s.kind for s in shapes)
        unique = [k for k in SHAPES if kinds.get(k) == 1]
        kind = unique[int(rng.integers(len(unique)))]
        colour = next(s.colour for s in shapes if s.kind == kind)
        return QAItem(scene, qtype, f"What colour is the {kind}?", colour)
    if qtype == "exists":
        present = {(s.colour, s.kind) for s in shapes}
        if rng.random() < 0.5:
            pool = sorted(present)
            answer = "yes"
        else:
            pool = [(c, k) for c in COLOURS for k in SHAPES if (c, k) not in present]
            answer = "no"
        colour, kind = pool[int(rng.integers(len(pool)))]
        return QAItem(scene, qtype, f"Is there a {colour} {kind}?", answer)
    if qtype == "where":
        colours = Counter(s.colour for s in shapes)
        unique = [c for c in COLOURS if colours.get(c) == 1]
        colour = unique[int(rng.integers(len(unique)))]
        col = next(s.col for s in shapes if s.colour == colour)
        return QAItem(scene, qtype, f"Where is the {colour} shape?", COLUMNS[col])
    raise ParameterError(f"parameter 'qtypes' has {qtype!r}; allowed: {', '.join(QUESTION_TYPES)}")


def _check_qtypes(qtypes: Sequence[str]) -> tuple[str, ...]:
    if isinstance(qtypes, str):
        qtypes = [q.strip() for q in qtypes.split(",") if q.strip()]
    qtypes = tuple(qtypes)
    if not qtypes:
        raise ParameterError(f"parameter 'qtypes' is empty; allowed: a non-empty subset of {', '.join(QUESTION_TYPES)}")
    for q in qtypes:
        check_choice("qtypes", q, QUESTION_TYPES)
    return qtypes


def make_items(scenes: Sequence[Scene], seed: int = 0, per_scene: int = 1,
               qtypes: Sequence[str] = QUESTION_TYPES) -> list[QAItem]:
    """Question-answer items for scenes, deterministic for a given seed.

    For each scene, `per_scene` distinct question types are drawn uniformly from those in
    `qtypes` that the scene allows ('colour' needs a shape kind that occurs once, 'where' a
    colour that occurs once; 'count' and 'exists' always apply). 'exists' is yes/no 50:50.
    """
    seed = check_int("seed", seed, 0)
    per_scene = check_int("per_scene", per_scene, 1, len(QUESTION_TYPES))
    qtypes = _check_qtypes(qtypes)
    rng = np.random.default_rng(seed)
    items = []
    for sc in scenes:
        valid = [q for q in _valid_qtypes(sc) if q in qtypes]
        if not valid:  # only when qtypes excludes both count and exists
            continue
        chosen = rng.choice(len(valid), size=min(per_scene, len(valid)), replace=False)
        items.extend(_make_question(sc, valid[int(i)], rng) for i in chosen)
    return items


def _stream_seed(seed: int, tag: str, step: int) -> int:
    return int.from_bytes(hashlib.sha256(f"sinkbook-vl:{seed}:{tag}:{step}".encode()).digest()[:4], "little")


def batch_items(step: int, batch_size: int, seed: int = 0, tag: str = "lm", image_size: int = 48,
                qtypes: Sequence[str] = QUESTION_TYPES, max_shapes: int = 4) -> list[QAItem]:
    """The training batch of one step: `batch_size` fresh scenes, one question each.

    Deterministic in (seed, tag, step). Stage 2 of `train_vl` and `train_text_only` both use
    tag 'lm', so the two see the same items in the same order; stage 1 uses tag 'projector'.
    """
    return _draw_items(batch_size, _stream_seed(seed, tag, step), image_size, _check_qtypes(qtypes), max_shapes)


def _draw_items(n: int, s: int, image_size: int, qtypes: tuple[str, ...], max_shapes: int = 4) -> list[QAItem]:
    """n items, one per scene; scenes that allow none of `qtypes` are skipped and more are drawn."""
    items: list[QAItem] = []
    attempt = 0
    while len(items) < n:
        sub = s if attempt == 0 else _stream_seed(s, "more", attempt)
        scenes = make_scenes(n - len(items), seed=sub, image_size=image_size, max_shapes=max_shapes)
        items.extend(make_items(scenes, seed=sub, qtypes=qtypes))
        attempt += 1
        if attempt > 1000:
            raise ParameterError(f"parameter 'qtypes' {qtypes} allows almost no scene; include 'count' or 'exists'")
    return items[:n]


def eval_items(n: int, seed: int = 0, image_size: int = 48, qtypes: Sequence[str] = QUESTION_TYPES,
               max_shapes: int = 4) -> list[QAItem]:
    """`n` held-out items (tag 'eval': a seed stream that training never uses)."""
    n = check_int("n", n, 1)
    return _draw_items(n, _stream_seed(seed, "eval", 0), _check_image_size(image_size), _check_qtypes(qtypes),
                       check_int("max_shapes", max_shapes, 1, GRID * GRID))


def majority_baseline(train_items: Sequence[QAItem], test_items: Sequence[QAItem]) -> float:
    """Accuracy on `test_items` of answering, blind, the most frequent training answer of each question type."""
    if not test_items:
        raise ParameterError("parameter 'test_items' is empty; allowed: at least one item")
    best = {}
    for q in QUESTION_TYPES:
        c = Counter(it.answer for it in train_items if it.qtype == q)
        best[q] = max(sorted(c), key=lambda a: c[a]) if c else ANSWERS[q][0]
    return float(np.mean([best[it.qtype] == it.answer for it in test_items]))


# ---------------------------------------------------------------------------------------
# frozen random vision encoder and trainable projector

def images_to_tensor(images: Sequence[np.ndarray] | np.ndarray) -> torch.Tensor:
    """uint8 images `[B, S, S, 3]` -> float `[B, 3, S, S]` in [-1, 1]."""
    arr = np.stack(list(images)) if not isinstance(images, np.ndarray) else images
    if arr.ndim != 4 or arr.shape[-1] != 3:
        raise ParameterError(f"images must be [B, S, S, 3] uint8, got shape {arr.shape}")
    return torch.from_numpy(arr.astype(np.float32) / 127.5 - 1.0).permute(0, 3, 1, 2).contiguous()


class FrozenVisionEncoder(nn.Module):
    """Frozen random conv net: images `[B, 3, S, S]` -> patch features `[B, P, dim]`.

    conv 4x4/4 (3 -> channels) -> GELU -> conv (patch/4)/(patch/4) (channels -> dim) -> + fixed
    random position embedding -> GELU -> adaptive average pool to sqrt(P) x sqrt(P) -> LayerNorm
    without affine. Every weight is drawn from `torch.Generator().manual_seed(seed)`, so the
    encoder is the same on every machine with the same torch; nothing is trained.
    """

    def __init__(self, image_size: int = 48, patch_size: int = 16, dim: int = 256, channels: int = 64,
                 n_visual_tokens: int = 9, seed: int = 0):
        super().__init__()
        image_size = _check_image_size(image_size)
        patch_size = check_int("patch_size", patch_size, 4, image_size)
        if patch_size % 4 or image_size % patch_size:
            raise ParameterError(f"parameter 'patch_size' got {patch_size}; allowed: a multiple of 4 that divides "
                                 f"image_size={image_size}")
        grid = image_size // patch_size
        n_visual_tokens = check_int("n_visual_tokens", n_visual_tokens, 1, grid * grid)
        side = math.isqrt(n_visual_tokens)
        if side * side != n_visual_tokens:
            raise ParameterError(f"parameter 'n_visual_tokens' got {n_visual_tokens}; allowed: a perfect square "
                                 f"<= {grid * grid} (the patch grid is {grid} x {grid})")
        self.config = {"image_size": image_size, "patch_size": patch_size, "dim": check_int("dim", dim, 1),
                       "channels": check_int("channels", channels, 1), "n_visual_tokens": n_visual_tokens,
                       "seed": check_int("seed", seed, 0)}
        g = torch.Generator().manual_seed(seed)
        k2 = patch_size // 4
        self.conv1 = nn.Conv2d(3, channels, 4, stride=4)
        self.conv2 = nn.Conv2d(channels, dim, k2, stride=k2)
        with torch.no_grad():
            for conv in (self.conv1, self.conv2):
                fan_in = conv.weight[0].numel()
                conv.weight.copy_(torch.randn(conv.weight.shape, generator=g) * math.sqrt(2.0 / fan_in))
                conv.bias.copy_(torch.randn(conv.bias.shape, generator=g) * 0.1)
        self.register_buffer("pos", torch.randn(1, dim, grid, grid, generator=g) * 0.5)
        self.side = side
        self.requires_grad_(False)
        self.eval()

    @property
    def n_visual_tokens(self) -> int:
        return self.config["n_visual_tokens"]

    @property
    def dim(self) -> int:
        return self.config["dim"]

    def train(self, mode: bool = True) -> FrozenVisionEncoder:  # frozen: always eval
        return super().train(False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """images float `[B, 3, S, S]` in [-1, 1] -> features `[B, P, dim]`."""
        h = nn.functional.gelu(self.conv1(images))
        h = nn.functional.gelu(self.conv2(h) + self.pos)
        if h.shape[-1] != self.side:
            h = nn.functional.adaptive_avg_pool2d(h, self.side)
        h = h.flatten(2).transpose(1, 2)  # [B, P, dim]
        return nn.functional.layer_norm(h, (h.shape[-1],))

    def encode_scenes(self, scenes: Sequence[Scene]) -> torch.Tensor:
        """scenes -> features `[B, P, dim]` on the encoder's device."""
        x = images_to_tensor([s.image for s in scenes]).to(self.pos.device)
        with torch.no_grad():
            return self(x)


def make_encoder(image_size: int = 48, patch_size: int = 16, dim: int = 256, channels: int = 64,
                 n_visual_tokens: int = 9, seed: int = 0) -> FrozenVisionEncoder:
    """The frozen, NOT pretrained, random vision encoder (see `FrozenVisionEncoder`)."""
    return FrozenVisionEncoder(image_size=image_size, patch_size=patch_size, dim=dim, channels=channels,
                               n_visual_tokens=n_visual_tokens, seed=seed)


def encoder_probe_accuracy(encoder: FrozenVisionEncoder, n_train: int = 400, n_test: int = 200,
                           seed: int = 0) -> dict[str, float]:
    """How much the frozen features tell: a ridge-regression linear probe from each visual token's
    feature `[dim]` to its grid cell's colour (or empty) and kind (or empty), on held-out scenes.

    Needs one visual token per grid cell (n_visual_tokens == 9). Returns held-out accuracies and
    the majority-class accuracies for comparison.
    """
    if encoder.n_visual_tokens != GRID * GRID:
        raise ParameterError(f"encoder_probe_accuracy needs n_visual_tokens == {GRID * GRID}, got "
                             f"{encoder.n_visual_tokens}")
    scenes = make_scenes(n_train + n_test, seed=seed, image_size=encoder.config["image_size"])
    feats = encoder.encode_scenes(scenes).reshape(-1, encoder.dim).double()  # [N*9, dim]
    out = {}
    for name, labels in (("colour", ("empty",) + tuple(COLOURS)), ("kind", ("empty",) + SHAPES)):
        y = np.zeros((len(scenes), GRID * GRID), dtype=np.int64)
        for i, sc in enumerate(scenes):
            for s in sc.shapes:
                y[i, s.row * GRID + s.col] = labels.index(s.colour if name == "colour" else s.kind)
        y = torch.from_numpy(y.reshape(-1))
        ntr = n_train * GRID * GRID
        x = torch.cat([feats, torch.ones(len(feats), 1, dtype=feats.dtype)], 1)
        onehot = nn.functional.one_hot(y[:ntr], len(labels)).double()
        w = torch.linalg.solve(x[:ntr].T @ x[:ntr] + 1e-2 * torch.eye(x.shape[1], dtype=x.dtype), x[:ntr].T @ onehot)
        pred = (x[ntr:] @ w).argmax(1)
        out[f"{name}_accuracy"] = float((pred == y[ntr:]).double().mean())
        out[f"{name}_majority"] = float((y[ntr:] == torch.bincount(y[:ntr]).argmax()).double().mean())
    return out


class Projector(nn.Module):
    """LLaVA-1.5 projector: features `[B, P, in_dim]` -> Linear -> GELU -> Linear -> `[B, P, hidden_size]`."""

    def __init__(self, in_dim: int, hidden_size: int):
        super().__init__()
        self.config = {"in_dim": int(in_dim), "hidden_size": int(hidden_size)}
        self.fc1 = nn.Linear(in_dim, hidden_size)
        self.fc2 = nn.Linear(hidden_size, hidden_size)

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        return self.fc2(nn.functional.gelu(self.fc1(feats)))


def _model_device_dtype(model: nn.Module) -> tuple[torch.device, torch.dtype]:
    p = next(model.parameters())
    return p.device, p.dtype


def embedding_rms(model: nn.Module, n_tokens: int = 4096) -> float:
    """RMS of the LM's input embeddings (as the embedding module returns them, scale included)."""
    emb = model.get_input_embeddings()
    dev, _ = _model_device_dtype(model)
    with torch.no_grad():
        e = emb(torch.arange(min(n_tokens, emb.weight.shape[0]), device=dev))
    return float(e.float().pow(2).mean().sqrt())


def make_projector(encoder: FrozenVisionEncoder, model: nn.Module, seed: int = 0, n_calibration: int = 64) -> Projector:
    """A seeded projector from `encoder.dim` to the LM's hidden size.

    Its output layer is rescaled once at creation so that the visual tokens start with the same
    RMS as the LM's text embeddings (measured on `n_calibration` fixed scenes).
    """
    seed = check_int("seed", seed, 0)
    dev, dt = _model_device_dtype(model)
    hidden = model.get_input_embeddings().weight.shape[1]
    g = torch.Generator().manual_seed(seed)
    proj = Projector(encoder.dim, hidden)
    with torch.no_grad():
        for lin in (proj.fc1, proj.fc2):
            bound = 1.0 / math.sqrt(lin.in_features)
            lin.weight.copy_((torch.rand(lin.weight.shape, generator=g) * 2 - 1) * bound)
            lin.bias.copy_((torch.rand(lin.bias.shape, generator=g) * 2 - 1) * bound)
        feats = encoder.encode_scenes(make_scenes(n_calibration, seed=10_000 + seed,
                                                  image_size=encoder.config["image_size"]))
        out_rms = float(proj(feats.cpu().float()).pow(2).mean().sqrt())
        scale = embedding_rms(model) / max(out_rms, 1e-12)
        proj.fc2.weight.mul_(scale)
        proj.fc2.bias.mul_(scale)
    return proj.to(device=dev, dtype=dt)


# ---------------------------------------------------------------------------------------
# sequences, batches and the answer-only loss

PROMPT_PREFIX = "Scene:"


def _special_prefix(tokenizer) -> list[int]:
    """The special tokens the tokenizer puts in front of a text by default (BOS, or nothing)."""
    with_sp = list(tokenizer.encode("a", add_special_tokens=True))
    without = list(tokenizer.encode("a", add_special_tokens=False))
    k = len(with_sp) - len(without)
    return with_sp[:k] if k > 0 and with_sp[k:] == without else []


def _eos_id(tokenizer) -> int:
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        raise ParameterError("the tokenizer has no eos_token_id; answers end with the end-of-sequence token, "
                             "so use a tokenizer that defines one")
    return int(eos)


def _segments(tokenizer, item: QAItem, mode: str, n_visual: int, answer: str | list[int] | None) -> dict:
    """Token ids of one example: prefix, scene (None = visual slots), prompt, answer (+eos)."""
    enc = lambda s: list(tokenizer.encode(s, add_special_tokens=False))  # noqa: E731
    prefix = _special_prefix(tokenizer) + enc(PROMPT_PREFIX)
    scene = None if mode == "vl" else enc(" " + describe(item.scene))
    prompt = enc(f"\nQuestion: {item.question}\nAnswer:")
    if answer is None:
        ans = enc(" " + item.answer) + [_eos_id(tokenizer)]
    elif isinstance(answer, str):
        ans = enc(" " + answer) + [_eos_id(tokenizer)]
    else:
        ans = list(answer)
    return {"prefix": prefix, "scene": scene, "prompt": prompt, "answer": ans, "n_visual": n_visual if mode == "vl" else 0}


@dataclass
class Batch:
    """A right-padded batch. `inputs_embeds` `[B, T, H]`; `attention_mask`, `position_ids` `[B, T]`;
    the N supervised tokens: `targets` `[N]`, predicted from hidden states at (`src_b`, `src_t`) `[N]`;
    `example` `[N]` the example each target belongs to; `lengths` `[B]` real positions."""

    inputs_embeds: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    targets: torch.Tensor
    src_b: torch.Tensor
    src_t: torch.Tensor
    example: torch.Tensor
    lengths: torch.Tensor
    n_visual: int
    n_text: int


def build_batch(model: nn.Module, tokenizer, items: Sequence[QAItem], *, mode: str = "vl",
                encoder: FrozenVisionEncoder | None = None, projector: Projector | None = None,
                answers: Sequence[str | list[int] | None] | None = None) -> Batch:
    """Embed a batch of items (mode 'vl': visual tokens from encoder+projector; 'text': description).

    `answers[i]` overrides item i's answer: a string (tokenised, + eos, supervised), a list of
    token ids (taken as is, supervised), or None (the item's own answer).
    """
    check_choice("mode", mode, ("vl", "text"))
    if not items:
        raise ParameterError("parameter 'items' is empty; allowed: at least one item")
    dev, dt = _model_device_dtype(model)
    n_vis = 0
    if mode == "vl":
        if encoder is None or projector is None:
            raise ParameterError("mode 'vl' needs both 'encoder' and 'projector'")
        n_vis = encoder.n_visual_tokens
    answers = [None] * len(items) if answers is None else list(answers)
    segs = [_segments(tokenizer, it, mode, n_vis, a) for it, a in zip(items, answers)]
    B = len(items)
    lens = [len(s["prefix"]) + (s["n_visual"] if s["scene"] is None else len(s["scene"])) + len(s["prompt"])
            + len(s["answer"]) for s in segs]
    T = max(lens)
    pad = getattr(tokenizer, "pad_token_id", None)
    pad = _eos_id(tokenizer) if pad is None else int(pad)
    ids = torch.full((B, T), pad, dtype=torch.long)
    is_vis = torch.zeros(B, T, dtype=torch.bool)
    mask = torch.zeros(B, T, dtype=torch.long)
    tb, tt, tgt, ex = [], [], [], []
    for i, s in enumerate(segs):
        pos = 0
        for part in ("prefix", "scene", "prompt", "answer"):
            if part == "scene" and s["scene"] is None:
                is_vis[i, pos:pos + s["n_visual"]] = True
                pos += s["n_visual"]
                continue
            seq = s[part]
            ids[i, pos:pos + len(seq)] = torch.tensor(seq, dtype=torch.long)
            if part == "answer":
                for j in range(len(seq)):
                    tb.append(i); tt.append(pos + j - 1); tgt.append(seq[j]); ex.append(i)  # noqa: E702
            pos += len(seq)
        mask[i, :pos] = 1
    ids, is_vis, mask = ids.to(dev), is_vis.to(dev), mask.to(dev)
    emb = model.get_input_embeddings()(ids)
    if mode == "vl":
        feats = encoder.encode_scenes([it.scene for it in items]).to(device=dev, dtype=dt)
        vis = projector(feats)  # [B, P, H]
        emb = emb.masked_scatter(is_vis.unsqueeze(-1).expand_as(emb), vis)
    position_ids = (mask.cumsum(1) - 1).clamp(min=0)
    n_text = int(mask.sum()) - B * n_vis
    return Batch(emb, mask, position_ids, torch.tensor(tgt, dtype=torch.long, device=dev),
                 torch.tensor(tb, dtype=torch.long, device=dev), torch.tensor(tt, dtype=torch.long, device=dev),
                 torch.tensor(ex, dtype=torch.long, device=dev), torch.tensor(lens, device=dev), n_vis, n_text)


def _decoder(model: nn.Module) -> nn.Module:
    dec = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
    if dec is None:
        raise ParameterError(f"model {type(model).__name__} exposes no decoder (get_decoder() / .model); "
                             "use a Hugging Face causal LM")
    return dec


def hidden_states(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Final (normed) hidden states `[B, T, H]` of the decoder, no LM head."""
    out = _decoder(model)(inputs_embeds=batch.inputs_embeds, attention_mask=batch.attention_mask,
                          position_ids=batch.position_ids, use_cache=False)
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]


def _head(model: nn.Module, h: torch.Tensor) -> torch.Tensor:
    """LM head on selected hidden states `[N, H]` -> logits `[N, V]` (final soft-capping applied)."""
    logits = model.get_output_embeddings()(h).float()
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def answer_logits(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Logits `[N, V]` at the supervised positions only (hidden states sliced before the LM head)."""
    h = hidden_states(model, batch)
    return _head(model, h[batch.src_b, batch.src_t])


def answer_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Mean cross-entropy over the answer tokens (answer word pieces + eos) of the batch; a scalar."""
    return nn.functional.cross_entropy(answer_logits(model, batch), batch.targets)


# ---------------------------------------------------------------------------------------
# training

@dataclass
class VLResult:
    """What a training run returns. `history`: one row per optimiser step (stage, step, loss,
    grad_norm before clipping, lr of the first parameter group: the projector's in stage 1, the
    LM's in stage 2 and in the text-only run, seconds); `callbacks`: what the callback returned;
    `budget`: the token budget (see `train_vl`). For the text-only control `projector` and
    `encoder` are None and kind is 'text_only'."""

    model: nn.Module
    projector: Projector | None
    encoder: FrozenVisionEncoder | None
    history: list[dict]
    budget: dict
    params: dict
    seconds: dict
    kind: str = "vl"
    callbacks: list[dict] = field(default_factory=list)


def _lr_lambda(steps: int, warmup_frac: float, schedule: str) -> Callable[[int], float]:
    warm = max(1, int(round(warmup_frac * steps))) if warmup_frac > 0 else 0

    def f(i: int) -> float:  # i = number of optimiser steps taken so far
        if i < warm:
            return (i + 1) / warm
        if schedule == "constant":
            return 1.0
        span = max(1, steps - warm)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (i - warm) / span)))
    return f


def _empty_budget() -> dict:
    return {"steps": 0, "examples": 0, "answer_tokens": 0, "input_positions": 0, "visual_positions": 0,
            "text_positions": 0, "padded_positions": 0}


def _add_budget(b: dict, batch: Batch) -> None:
    B, T = batch.attention_mask.shape
    b["steps"] += 1
    b["examples"] += B
    b["answer_tokens"] += int(batch.targets.numel())
    b["input_positions"] += int(batch.attention_mask.sum())
    b["visual_positions"] += B * batch.n_visual
    b["text_positions"] += batch.n_text
    b["padded_positions"] += B * T


def _call_callback(callback, step: int, model, stage: str, projector, encoder, store: list) -> None:
    if callback is None:
        return
    names = set(inspect.signature(callback).parameters)
    kw = {k: v for k, v in (("stage", stage), ("projector", projector), ("encoder", encoder)) if k in names}
    was = model.training
    model.eval()
    try:
        value = callback(step, model, **kw)
    finally:
        model.train(was)
    if value is not None:
        store.append({"step": step, "stage": stage, "value": value})


@dataclass
class _Setup:
    """The checked settings both training functions share."""

    batch_size: int
    seed: int
    image_size: int
    qtypes: tuple[str, ...]
    max_shapes: int
    schedule: str
    warmup_frac: float
    weight_decay: float
    max_grad_norm: float
    callback: Callable | None
    callback_every: int
    progress: bool

    def as_params(self) -> dict:
        return {"batch_size": self.batch_size, "seed": self.seed, "image_size": self.image_size,
                "qtypes": list(self.qtypes), "max_shapes": self.max_shapes, "schedule": self.schedule,
                "warmup_frac": self.warmup_frac, "weight_decay": self.weight_decay,
                "max_grad_norm": self.max_grad_norm, "optimizer": "AdamW(betas=(0.9, 0.999), eps=1e-8)"}


def _setup(batch_size, seed, image_size, qtypes, max_shapes, schedule, warmup_frac, weight_decay, max_grad_norm,
           callback, callback_every, progress) -> _Setup:
    if callback is not None and not callable(callback):
        raise ParameterError(f"parameter 'callback' got {callback!r}; allowed: None or a function (step, model)")
    return _Setup(check_int("batch_size", batch_size, 1), check_int("seed", seed, 0), _check_image_size(image_size),
                  _check_qtypes(qtypes), check_int("max_shapes", max_shapes, 1, GRID * GRID),
                  check_choice("schedule", schedule, SCHEDULES), check_float("warmup_frac", warmup_frac, 0.0, 1.0),
                  check_float("weight_decay", weight_decay, 0.0), check_float("max_grad_norm", max_grad_norm, 0.0),
                  callback, check_int("callback_every", callback_every, 0), bool(progress))


def _run_stage(model, tokenizer, su: _Setup, *, stage: str, tag: str, mode: str, steps: int,
               param_groups: list[dict], encoder, projector, history: list, budget: dict, step_offset: int,
               callbacks: list) -> float:
    """One training stage: `steps` AdamW steps on the item stream `tag`; returns seconds."""
    from tqdm.auto import tqdm

    trainable = [p for g in param_groups for p in g["params"]]
    opt = torch.optim.AdamW(param_groups, betas=(0.9, 0.999), eps=1e-8, weight_decay=su.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(steps, su.warmup_frac, su.schedule))
    t0 = time.perf_counter()
    bar = tqdm(range(steps), desc=stage, disable=not su.progress, leave=True)
    for i in bar:
        items = batch_items(i, su.batch_size, seed=su.seed, tag=tag, image_size=su.image_size, qtypes=su.qtypes,
                            max_shapes=su.max_shapes)
        ts = time.perf_counter()
        batch = build_batch(model, tokenizer, items, mode=mode, encoder=encoder, projector=projector)
        loss = answer_loss(model, batch)
        if not torch.isfinite(loss):
            raise SinkbookError(f"{stage}: loss is {loss.item()} at step {i + 1}; lower the learning rate")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = float(torch.nn.utils.clip_grad_norm_(trainable, su.max_grad_norm))
        lrs = [g["lr"] for g in opt.param_groups]
        opt.step()
        sched.step()
        _add_budget(budget, batch)
        step = step_offset + i + 1
        history.append({"stage": stage, "step": step, "loss": loss.item(), "grad_norm": gnorm, "lr": lrs[0],
                        "seconds": time.perf_counter() - ts})
        bar.set_postfix(loss=f"{loss.item():.3f}")
        if su.callback is not None and ((su.callback_every and step % su.callback_every == 0) or i == steps - 1):
            _call_callback(su.callback, step, model, stage, projector, encoder, callbacks)
    bar.close()
    return time.perf_counter() - t0


def train_vl(model: nn.Module, tokenizer, *, stage1_steps: int = RECIPE["stage1_steps"],
             stage2_steps: int = RECIPE["stage2_steps"], batch_size: int = RECIPE["batch_size"],
             lr_projector: float = RECIPE["lr_projector"], lr_lm: float = RECIPE["lr_lm"],
             lr_projector_stage2: float | None = RECIPE["lr_projector_stage2"], seed: int = 0, image_size: int = 48,
             qtypes: Sequence[str] = QUESTION_TYPES, max_shapes: int = 4, schedule: str = RECIPE["schedule"],
             warmup_frac: float = 0.05, weight_decay: float = 0.0,
             max_grad_norm: float = 1.0, encoder: FrozenVisionEncoder | None = None,
             projector: Projector | None = None, encoder_kwargs: Mapping[str, Any] | None = None,
             callback: Callable | None = None, callback_every: int = 0, progress: bool = True) -> VLResult:
    """Two-stage LLaVA-style adaptation; trains `model` IN PLACE (snapshot it first with
    `clone_state_dict` if you need the base) and leaves it in eval mode.

    Stage 1 ('VL stage 1 (projector)'): only the projector, every LM weight frozen, AdamW at
    `lr_projector`, on the item stream tagged 'projector'. Stage 2 ('VL stage 2 (projector + LM)'):
    every LM parameter at `lr_lm` plus the projector at `lr_projector_stage2` (None: the same
    `lr_projector` as stage 1; the default, like LLaVA-1.5, uses the LM's rate for both), on the stream tagged 'lm'. A fresh AdamW per stage, linear
    warm-up over `warmup_frac` of the stage's steps, then `schedule` ('constant' or 'cosine' to 0);
    gradient norm clipped at `max_grad_norm`. Loss: mean cross-entropy over answer tokens only.
    Scenes hold 1..`max_shapes` shapes; questions are drawn from `qtypes`.

    `callback(step, model)` (it may also take keyword arguments `stage`, `projector`, `encoder`)
    runs with the model in eval mode at step 0, every `callback_every` steps (global count over
    both stages; 0 = only at the end of each stage); non-None returns go to `result.callbacks`.
    `result.budget` = {'stage1': {...}, 'stage2': {...}} with steps, examples, answer_tokens,
    input_positions (real positions), visual_positions, text_positions, padded_positions.
    """
    su = _setup(batch_size, seed, image_size, qtypes, max_shapes, schedule, warmup_frac, weight_decay,
                max_grad_norm, callback, callback_every, progress)
    stage1_steps = check_int("stage1_steps", stage1_steps, 0)
    stage2_steps = check_int("stage2_steps", stage2_steps, 0)
    lr_projector = check_float("lr_projector", lr_projector, 0.0, 1.0)
    lr_lm = check_float("lr_lm", lr_lm, 0.0, 1.0)
    lr_p2 = lr_projector if lr_projector_stage2 is None else check_float("lr_projector_stage2", lr_projector_stage2,
                                                                          0.0, 1.0)
    torch.manual_seed(su.seed)
    if encoder is None:
        encoder = make_encoder(image_size=su.image_size, seed=su.seed, **dict(encoder_kwargs or {}))
    elif encoder_kwargs:
        raise ParameterError("give either 'encoder' or 'encoder_kwargs', not both")
    if encoder.config["image_size"] != su.image_size:
        raise ParameterError(f"parameter 'image_size' is {su.image_size} but the encoder expects "
                             f"{encoder.config['image_size']}")
    dev, _ = _model_device_dtype(model)
    encoder.to(dev)
    if projector is None:
        projector = make_projector(encoder, model, seed=su.seed)
    params = {"kind": "vl", "stage1_steps": stage1_steps, "stage2_steps": stage2_steps, "lr_projector": lr_projector,
              "lr_lm": lr_lm, "lr_projector_stage2": lr_p2, **su.as_params(), "encoder": dict(encoder.config)}
    history: list[dict] = []
    callbacks: list[dict] = []
    budget = {"stage1": _empty_budget(), "stage2": _empty_budget()}
    seconds = {}
    lm_params = list(model.parameters())
    req = [p.requires_grad for p in lm_params]
    common = dict(encoder=encoder, projector=projector, history=history, callbacks=callbacks)
    try:
        model.train()
        projector.train()
        _call_callback(su.callback, 0, model, "start", projector, encoder, callbacks)
        for p in lm_params:
            p.requires_grad_(False)
        seconds["stage1"] = _run_stage(
            model, tokenizer, su, stage="VL stage 1 (projector)", tag="projector", mode="vl", steps=stage1_steps,
            param_groups=[{"params": list(projector.parameters()), "lr": lr_projector}],
            budget=budget["stage1"], step_offset=0, **common)
        for p in lm_params:
            p.requires_grad_(True)
        seconds["stage2"] = _run_stage(
            model, tokenizer, su, stage="VL stage 2 (projector + LM)", tag="lm", mode="vl", steps=stage2_steps,
            param_groups=[{"params": lm_params, "lr": lr_lm}, {"params": list(projector.parameters()), "lr": lr_p2}],
            budget=budget["stage2"], step_offset=stage1_steps, **common)
    finally:
        for p, r in zip(lm_params, req):
            p.requires_grad_(r)
        model.eval()
        projector.eval()
    return VLResult(model=model, projector=projector, encoder=encoder, history=history, budget=budget,
                    params=params, seconds=seconds, kind="vl", callbacks=callbacks)


def train_text_only(model: nn.Module, tokenizer, *, steps: int = RECIPE["stage2_steps"],
                    batch_size: int = RECIPE["batch_size"], lr: float = RECIPE["lr_lm"], seed: int = 0,
                    image_size: int = 48, qtypes: Sequence[str] = QUESTION_TYPES, max_shapes: int = 4,
                    schedule: str = RECIPE["schedule"], warmup_frac: float = 0.05, weight_decay: float = 0.0,
                    max_grad_norm: float = 1.0, callback: Callable | None = None, callback_every: int = 0,
                    progress: bool = True) -> VLResult:
    """The matched text-only control; trains `model` IN PLACE and leaves it in eval mode.

    Pass the same values as to `train_vl` (steps = stage2_steps, lr = lr_lm): it then runs
    stage 2 exactly, the same items in the same order with the same answers, the same AdamW,
    schedule and clipping on every LM parameter, except that each scene is given as its text
    description instead of visual tokens (and there is no projector). The supervised answer
    tokens are therefore identical; `result.budget['stage2']` reports steps, examples,
    answer_tokens and positions so the two budgets can be compared.
    """
    su = _setup(batch_size, seed, image_size, qtypes, max_shapes, schedule, warmup_frac, weight_decay,
                max_grad_norm, callback, callback_every, progress)
    steps = check_int("steps", steps, 0)
    lr = check_float("lr", lr, 0.0, 1.0)
    torch.manual_seed(su.seed)
    params = {"kind": "text_only", "steps": steps, "lr": lr, **su.as_params()}
    history: list[dict] = []
    callbacks: list[dict] = []
    budget = {"stage1": _empty_budget(), "stage2": _empty_budget()}
    lm_params = list(model.parameters())
    req = [p.requires_grad for p in lm_params]
    try:
        model.train()
        _call_callback(su.callback, 0, model, "start", None, None, callbacks)
        for p in lm_params:
            p.requires_grad_(True)
        sec = _run_stage(model, tokenizer, su, stage="text-only (LM)", tag="lm", mode="text", steps=steps,
                         param_groups=[{"params": lm_params, "lr": lr}], encoder=None, projector=None,
                         history=history, budget=budget["stage2"], step_offset=0, callbacks=callbacks)
    finally:
        for p, r in zip(lm_params, req):
            p.requires_grad_(r)
        model.eval()
    return VLResult(model=model, projector=None, encoder=None, history=history, budget=budget, params=params,
                    seconds={"stage2": sec}, kind="text_only", callbacks=callbacks)


# ---------------------------------------------------------------------------------------
# evaluation

_WORD = re.compile(r"[a-z0-9]+")


def _first_word(text: str) -> str:
    m = _WORD.search(text.lower())
    return m.group(0) if m else ""


def _mode_of(encoder, projector) -> str:
    if (encoder is None) != (projector is None):
        raise ParameterError("give both 'encoder' and 'projector' (visual questions) or neither (the scene as text)")
    return "text" if encoder is None else "vl"


def _as_items(scenes_or_items: Sequence, seed: int, qtypes) -> list[QAItem]:
    items = list(scenes_or_items)
    if not items:
        raise ParameterError("parameter 'scenes_or_items' is empty; allowed: scenes or QA items")
    if all(isinstance(x, Scene) for x in items):
        return make_items(items, seed=seed, qtypes=qtypes)
    if all(isinstance(x, QAItem) for x in items):
        return items
    raise ParameterError("parameter 'scenes_or_items' must hold only Scene or only QAItem objects")


def _prompt_length(tokenizer, item: QAItem, mode: str, n_visual: int) -> int:
    sg = _segments(tokenizer, item, mode, n_visual, [])
    return len(sg["prefix"]) + (sg["n_visual"] if sg["scene"] is None else len(sg["scene"])) + len(sg["prompt"])


def _greedy_equal_length(model, tokenizer, chunk: list[QAItem], mode: str, encoder, projector,
                         max_new_tokens: int, eos: int) -> list[list[int]]:
    """Greedy decoding with the KV cache for prompts of equal length (so no padding at all)."""
    b = build_batch(model, tokenizer, chunk, mode=mode, encoder=encoder, projector=projector,
                    answers=[[] for _ in chunk])
    if int(b.attention_mask.sum()) != b.attention_mask.numel():
        raise AssertionError("internal: prompts of one greedy batch must have equal lengths")
    dec, emb = _decoder(model), model.get_input_embeddings()
    T = b.inputs_embeds.shape[1]
    out = dec(inputs_embeds=b.inputs_embeds, position_ids=b.position_ids, use_cache=True)
    gen: list[list[int]] = [[] for _ in chunk]
    done = [False] * len(chunk)
    for k in range(max_new_tokens):
        nxt = _head(model, out.last_hidden_state[:, -1]).argmax(-1)  # [B]
        for i, t in enumerate(nxt.tolist()):
            if not done[i]:
                if t == eos:
                    done[i] = True
                else:
                    gen[i].append(int(t))
        if all(done) or k == max_new_tokens - 1:
            break
        pos = torch.full((len(chunk), 1), T + k, dtype=torch.long, device=nxt.device)
        out = dec(inputs_embeds=emb(nxt[:, None]), position_ids=pos, past_key_values=out.past_key_values,
                  use_cache=True)
    return gen


@torch.no_grad()
def vqa_predict(model: nn.Module, tokenizer, encoder: FrozenVisionEncoder | None, projector: Projector | None,
                items: Sequence[QAItem], *, method: str = "greedy", batch_size: int = 32, max_new_tokens: int = 4,
                raw: bool = False, progress: bool = False) -> list[str]:
    """Predicted one-word answers (`raw=True`, greedy only: the whole decoded text instead).

    'greedy' (default): greedy decoding with the KV cache (items grouped by prompt length, so
    no padding), up to `max_new_tokens` or eos; the answer is the first alphanumeric word of the
    decoded text, lower-cased. 'options': the option of the question type's closed answer set
    (`ANSWERS`) with the highest summed log-probability of its answer tokens + eos (the tokens
    the training loss covers); costs one sequence per option. encoder = projector = None: the
    scene is given as text (the text-only control's input).
    """
    from tqdm.auto import tqdm

    method = check_choice("method", method, ("greedy", "options"))
    batch_size = check_int("batch_size", batch_size, 1)
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, 1, 64)
    mode = _mode_of(encoder, projector)
    if raw and method != "greedy":
        raise ParameterError("parameter 'raw' is True but method is 'options'; raw text needs method='greedy'")
    items = list(items)
    was = model.training
    model.eval()
    eos = _eos_id(tokenizer)
    preds: list[str | None] = [None] * len(items)
    try:
        if method == "options":
            for s in tqdm(range(0, len(items), batch_size), desc="VQA (options)", disable=not progress):
                chunk = items[s:s + batch_size]
                flat = [(it, o) for it in chunk for o in ANSWERS[it.qtype]]
                b = build_batch(model, tokenizer, [f[0] for f in flat], mode=mode, encoder=encoder,
                                projector=projector, answers=[f[1] for f in flat])
                lp = torch.log_softmax(answer_logits(model, b), -1).gather(1, b.targets[:, None])[:, 0]
                score = torch.zeros(len(flat), dtype=lp.dtype, device=lp.device).index_add_(0, b.example, lp)
                k = 0
                for j, it in enumerate(chunk):
                    o = ANSWERS[it.qtype]
                    preds[s + j] = o[int(score[k:k + len(o)].argmax())]
                    k += len(o)
        else:
            n_vis = encoder.n_visual_tokens if mode == "vl" else 0
            groups: dict[int, list[int]] = {}
            for i, it in enumerate(items):
                groups.setdefault(_prompt_length(tokenizer, it, mode, n_vis), []).append(i)
            chunks = [idx[s:s + batch_size] for _, idx in sorted(groups.items()) for s in range(0, len(idx), batch_size)]
            for idx in tqdm(chunks, desc="VQA (greedy)", disable=not progress):
                gen = _greedy_equal_length(model, tokenizer, [items[i] for i in idx], mode, encoder, projector,
                                           max_new_tokens, eos)
                for i, g in zip(idx, gen):
                    text = tokenizer.decode(g)
                    preds[i] = text if raw else _first_word(text)
    finally:
        model.train(was)
    return preds  # type: ignore[return-value]


def vqa_accuracy(model: nn.Module, tokenizer, encoder: FrozenVisionEncoder | None, projector: Projector | None,
                 scenes_or_items: Sequence, *, method: str = "greedy", batch_size: int = 32, max_new_tokens: int = 4,
                 seed: int = 0, qtypes: Sequence[str] = QUESTION_TYPES, by_type: bool = False,
                 progress: bool = False) -> tuple[float, int] | tuple[float, int, dict[str, tuple[float, int]]]:
    """Exact-match accuracy of `vqa_predict` -> (accuracy, n) [, {qtype: (accuracy, n)} if by_type].

    Scenes are turned into one item each with `make_items(scenes, seed, qtypes=qtypes)`.
    """
    items = _as_items(scenes_or_items, seed, _check_qtypes(qtypes))
    preds = vqa_predict(model, tokenizer, encoder, projector, items, method=method, batch_size=batch_size,
                        max_new_tokens=max_new_tokens, progress=progress)
    ok = [p == it.answer for p, it in zip(preds, items)]
    acc = (float(np.mean(ok)), len(ok))
    if not by_type:
        return acc
    per = {}
    for q in QUESTION_TYPES:
        sel = [o for o, it in zip(ok, items) if it.qtype == q]
        if sel:
            per[q] = (float(np.mean(sel)), len(sel))
    return acc[0], acc[1], per


# ---------------------------------------------------------------------------------------
# weight deltas and the norm-matched random control

def clone_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """A detached copy of the model's state dict (tied weights stay tied: one copy, two keys)."""
    seen: dict[int, torch.Tensor] = {}
    out = {}
    for k, v in model.state_dict().items():
        key = (v.data_ptr(), v.shape, v.stride()) if v.numel() else None
        if key is not None and key in seen:
            out[k] = seen[key]
        else:
            out[k] = v.detach().clone()
            if key is not None:
                seen[key] = out[k]
    return out


def _check_pair(base_sd: Mapping[str, torch.Tensor], other_sd: Mapping[str, torch.Tensor], name: str) -> None:
    if set(base_sd) != set(other_sd):
        miss = sorted(set(base_sd) ^ set(other_sd))[:5]
        raise ParameterError(f"parameter '{name}' has different keys from 'base_sd' (e.g. {miss}); "
                             "use state dicts of the same architecture")
    for k in base_sd:
        if base_sd[k].shape != other_sd[k].shape:
            raise ParameterError(f"parameter '{name}': shape of {k!r} is {tuple(other_sd[k].shape)}, base has "
                                 f"{tuple(base_sd[k].shape)}")


def delta_norms(base_sd: Mapping[str, torch.Tensor], sd: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """Frobenius (L2 for 1-D) norm of `sd[k] - base_sd[k]` for every floating-point tensor."""
    _check_pair(base_sd, sd, "sd")
    return {k: float(torch.linalg.vector_norm((sd[k].double() - base_sd[k].double())))
            for k in base_sd if base_sd[k].is_floating_point()}


def delta_cosines(base_sd: Mapping[str, torch.Tensor], sd_a: Mapping[str, torch.Tensor],
                  sd_b: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """Cosine between the deltas `sd_a - base` and `sd_b - base`, per tensor (nan where one is 0)."""
    _check_pair(base_sd, sd_a, "sd_a")
    _check_pair(base_sd, sd_b, "sd_b")
    out = {}
    for k in base_sd:
        if not base_sd[k].is_floating_point():
            continue
        da = (sd_a[k].double() - base_sd[k].double()).flatten()
        db = (sd_b[k].double() - base_sd[k].double()).flatten()
        na, nb = torch.linalg.vector_norm(da), torch.linalg.vector_norm(db)
        out[k] = float(da @ db / (na * nb)) if na > 0 and nb > 0 else float("nan")
    return out


def random_direction_like(base_sd: Mapping[str, torch.Tensor], adapted_sd: Mapping[str, torch.Tensor], seed: int = 0,
                          *, one_d: str = "match") -> dict[str, torch.Tensor]:
    """The norm-matched random weight change: `base + r_k` for every tensor k, where `r_k` is a
    Gaussian random direction rescaled so that ||r_k||_F = ||adapted_k - base_k||_F.

    Every floating-point tensor with >= 2 dimensions (weight matrices, embeddings, LM head) gets
    this treatment. 1-D tensors (RMSNorm/LayerNorm gains, QK-norm gains, biases) follow `one_d`:
    'match' (default: the same norm-matched random change, as an L2-norm-matched vector),
    'keep' (left at the base value), or 'copy' (given the VL change itself). Non-float tensors are
    copied from the base. Tied tensors (keys whose base and adapted values are equal) get the same
    random change. The direction of key k comes from a generator seeded by (seed, crc32(k)), so it
    does not depend on the order of keys. Returns new tensors in the base dtype.
    """
    seed = check_int("seed", seed, 0)
    one_d = check_choice("one_d", one_d, ("match", "keep", "copy"))
    _check_pair(base_sd, adapted_sd, "adapted_sd")
    out: dict[str, torch.Tensor] = {}
    done: list[tuple[str, torch.Tensor, torch.Tensor]] = []  # (key, base, adapted) already drawn
    for k in base_sd:
        b, a = base_sd[k], adapted_sd[k]
        if not b.is_floating_point():
            out[k] = b.clone()
            continue
        tied = next((kk for kk, bb, aa in done if bb.shape == b.shape
                     and (bb.data_ptr() == b.data_ptr() or (torch.equal(bb.flatten()[:16], b.flatten()[:16])
                                                            and torch.equal(bb, b)))
                     and (aa.data_ptr() == a.data_ptr() or torch.equal(aa, a))), None)
        if tied is not None:
            out[k] = out[tied]
            continue
        done.append((k, b, a))
        if b.dim() < 2 and one_d == "keep":
            out[k] = b.clone()
            continue
        if b.dim() < 2 and one_d == "copy":
            out[k] = a.clone()
            continue
        target = torch.linalg.vector_norm(a.double() - b.double())
        g = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(k.encode())) % (2**63))
        r = torch.randn(b.shape, generator=g, dtype=torch.float32).to(b.device)
        scale = float(target / torch.linalg.vector_norm(r, dtype=torch.float64)) if target > 0 else 0.0
        out[k] = (b.double() + r.double() * scale).to(b.dtype)
    return out


# ---------------------------------------------------------------------------------------
# checkpoints

def checkpoint_key(params: Mapping[str, Any]) -> str:
    """A 16-hex-digit hash of the parameters (canonical JSON, sorted keys): the same params, the same key."""
    try:
        text = json.dumps(params, sort_keys=True, separators=(",", ":"), default=str)
    except TypeError as e:
        raise ParameterError(f"parameter 'params' cannot be hashed as JSON: {e}") from None
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def checkpoint_dir(key: str, root: str | Path | None = None) -> Path:
    """`<root or cache_dir()>/vl/<key>` (not created)."""
    if root is None:
        from .models import cache_dir
        root = cache_dir()
    return Path(root) / "vl" / key


def checkpoint_exists(path: str | Path) -> bool:
    """True when `path` holds a complete checkpoint (written by `save_checkpoint`)."""
    p = Path(path) / "meta.json"
    if not p.exists():
        return False
    try:
        return bool(json.loads(p.read_text()).get("complete"))
    except json.JSONDecodeError:
        return False


def _tensor_sha(module: nn.Module) -> str:
    h = hashlib.sha256()
    for k, v in sorted(module.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def save_checkpoint(path: str | Path, model: nn.Module, projector: Projector | None = None,
                    encoder: FrozenVisionEncoder | None = None, meta: Mapping[str, Any] | None = None) -> Path:
    """Write `model.safetensors` (the LM), `projector.safetensors` (if any) and `meta.json` to `path`.

    The encoder is not stored: its config (seed included) and a hash of its weights go into
    meta.json, and `load_checkpoint` rebuilds it and checks the hash. Written to a temporary
    folder and renamed, so an interrupted save never looks complete.
    """
    from safetensors.torch import save_file, save_model

    path = Path(path)
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_model(model, str(tmp / "model.safetensors"))
    info: dict[str, Any] = {"complete": True, "meta": dict(meta or {}),
                            "model_class": type(model).__name__,
                            "model_type": getattr(model.config, "model_type", None),
                            "n_parameters": sum(p.numel() for p in model.parameters())}
    if projector is not None:
        save_file({k: v.detach().cpu().contiguous() for k, v in projector.state_dict().items()},
                  str(tmp / "projector.safetensors"))
        info["projector"] = dict(projector.config)
    if encoder is not None:
        info["encoder"] = dict(encoder.config)
        info["encoder_sha256"] = _tensor_sha(encoder)
    (tmp / "meta.json").write_text(json.dumps(info, indent=1, default=str))
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)
    return path


@dataclass
class Checkpoint:
    """What `load_checkpoint` returns."""

    model: nn.Module
    projector: Projector | None
    encoder: FrozenVisionEncoder | None
    meta: dict


def load_checkpoint(path: str | Path, model: nn.Module) -> Checkpoint:
    """Load a checkpoint into `model` (same architecture, loaded in place) and rebuild projector and encoder."""
    from safetensors.torch import load_file, load_model

    path = Path(path)
    if not checkpoint_exists(path):
        raise SinkbookError(f"no complete checkpoint in {path}; run the training (or save_checkpoint) first")
    info = json.loads((path / "meta.json").read_text())
    if info.get("model_class") != type(model).__name__:
        raise ParameterError(f"parameter 'model' is a {type(model).__name__} but the checkpoint in {path} holds a "
                             f"{info.get('model_class')}; load the base model it was trained from")
    dev, dt = _model_device_dtype(model)
    try:
        load_model(model, str(path / "model.safetensors"), strict=True, device=str(dev))
    except RuntimeError as e:
        raise ParameterError(f"the checkpoint in {path} does not fit parameter 'model': {str(e)[:300]}") from None
    projector = encoder = None
    if "projector" in info:
        projector = Projector(**info["projector"])
        projector.load_state_dict(load_file(str(path / "projector.safetensors")))
        projector = projector.to(device=dev, dtype=dt).eval()
    if "encoder" in info:
        encoder = make_encoder(**info["encoder"]).to(dev)
        if _tensor_sha(encoder) != info["encoder_sha256"]:
            raise SinkbookError(f"the rebuilt vision encoder differs from the one saved in {path} (weights hash "
                                "mismatch; a different torch version draws different random numbers); retrain")
    model.eval()
    return Checkpoint(model=model, projector=projector, encoder=encoder, meta=info.get("meta", {}))
