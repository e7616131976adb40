"""A miniature LLaVA-style vision-language adaptation of a causal LM, and its two controls.

The modules, in the order the book uses them:

- `scenes`: deterministic synthetic scenes of 1-4 coloured shapes (circle, square, triangle; red,
  green, blue, yellow) on a 3 x 3 grid with one-word visual question-answer items (count, colour,
  exists, where), written as natural questions or as labelled fields (`PHRASINGS`: the 'field' phrasing shares
  no template with any evaluation suite, #29), and a text description of the same scene (for the text-only
  control).
- `model`: a small convolutional vision encoder with *frozen random* weights (NOT pretrained: no
  pretrained vision encoder is available offline; `encoder_probe_accuracy` checks that its patch
  features keep colour, shape and position), the trainable LLaVA-1.5 projector, and the embedded
  sequences with the answer-only loss.
- `train`: `train_vl` (stage 1: projector only; stage 2: every LM weight and the projector) and
  `train_text_only` (the same items, order, steps, optimiser and schedule as stage 2, the scene
  given as text), both through `sinklib.core.train.run`.
- `lora`: the `lm_method='lora'` option of both trainings: low-rank adapters on the LM's linear layers, merged
  into the weights after training (`check_lm_method`, `lm_method_of`, `LORA_KEYS`; memory rule of thumb).
- `evaluate`: VQA accuracy by greedy decoding or by scoring the closed answer set; the held-out
  item streams (`heldout_items`, `tracking_items`) and their seed offsets.
- `controls`: state-dict snapshots and the norm-matched random weight change.

Checkpoints of trained conditions live in `sinklib.core.cache`; the adapted pairs in `sinklib.adapt.pairs`.
Every public name of the submodules is importable from `sinklib.vl`.
"""
from __future__ import annotations

from sinklib.vl.controls import (clone_state_dict, random_direction_like, relative_change_by_group, scaled_change,
    tensor_group)
from sinklib.vl.evaluate import (MAJORITY_TRAIN_ITEMS, VQA_EVAL_SEED_OFFSET, VQA_TRACK_SEED_OFFSET,
    against_majority, heldout_items, tracking_items, vqa_accuracy, vqa_predict)
from sinklib.vl.lora import LM_METHODS, LORA_KEYS, LMMethod, check_lm_method, lm_method_of
from sinklib.vl.model import (PROMPT_PREFIX, load_checkpoint, Batch, FrozenVisionEncoder, Projector, answer_logits, answer_loss,
    build_batch, embedding_rms, encoder_probe_accuracy, hidden_states, images_to_tensor, make_encoder,
    make_projector)
from sinklib.vl.scenes import (ANSWERS, BACKGROUND, COLOURS, COLUMNS, GRID, IMAGE_SIZE, QUESTION_TYPES, ROWS,
    SHAPES, QAItem, Scene, Shape, batch_items, check_image_size, check_qtypes, describe, eval_items, make_items,
    make_scenes, majority_baseline, render, ANSWER_STYLES, sentence_answer, PHRASINGS, QUESTION_TEMPLATES,
    check_phrasing)
from sinklib.vl.train import (FROM_RECIPE, MODEL_RATES, RECIPE, SCHEDULES, VLResult, recipe_for, train_text_only,
    train_vl)

__all__ = [
    "clone_state_dict", "random_direction_like", "relative_change_by_group", "scaled_change", "tensor_group", "MAJORITY_TRAIN_ITEMS", "against_majority", "VQA_EVAL_SEED_OFFSET", "VQA_TRACK_SEED_OFFSET", "heldout_items",
    "tracking_items", "vqa_accuracy", "vqa_predict", "PROMPT_PREFIX", "Batch", "FrozenVisionEncoder", "Projector",
    "answer_logits", "answer_loss", "build_batch", "embedding_rms", "encoder_probe_accuracy", "hidden_states",
    "images_to_tensor", "make_encoder", "make_projector", "ANSWERS", "BACKGROUND", "COLOURS", "COLUMNS", "GRID",
    "IMAGE_SIZE", "QUESTION_TYPES", "ROWS", "SHAPES", "QAItem", "Scene", "Shape", "batch_items", "check_image_size",
    "check_qtypes", "describe", "eval_items", "make_items", "make_scenes", "majority_baseline", "render", "RECIPE",
    "SCHEDULES", "VLResult", "train_text_only", "train_vl", "FROM_RECIPE", "MODEL_RATES", "recipe_for", "ANSWER_STYLES", "sentence_answer",
    "LM_METHODS", "LORA_KEYS", "LMMethod", "check_lm_method", "lm_method_of", "PHRASINGS", "QUESTION_TEMPLATES",
    "check_phrasing",
]
