"""Training the miniature VLM (two LLaVA-style stages) and its matched text-only control, both
through the one training loop `sinklib.core.train.run`.

Stage 1 trains the projector only (every LM weight frozen); stage 2 trains every LM parameter
(at `lr_lm`) and the projector, or with `lm_method='lora'` low-rank adapters on the LM's linear layers instead
of its weights, merged into them after training (`sinklib.vl.lora`; the text-only control likewise). AdamW, a
short linear warm-up, then a constant (default) or cosine learning rate, gradient clipping, seeded. The loss is
the mean cross-entropy over the answer tokens only (the one-word answer and the end-of-sequence token).
"""
from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from sinklib.core import train
from sinklib.core.anatomy import device_dtype
from sinklib.errors import ParameterError
from sinklib.core.params import check_choice, check_float, check_int
from sinklib.vl import lora
from sinklib.vl.model import (Batch, FrozenVisionEncoder, Projector, answer_loss, build_batch, make_encoder,
    make_projector)
from sinklib.vl.scenes import (ANSWER_STYLES, GRID, QUESTION_TYPES, batch_items, check_image_size, check_phrasing,
    check_qtypes, sentence_answer)

SCHEDULES = train.SCHEDULES
# The training recipe of the book's full profile (chapter 4), the one place it is defined: the
# defaults of train_vl / train_text_only and of sinklib.adapt.pairs.pair_params.
RECIPE = {"stage1_steps": 200, "stage2_steps": 60, "batch_size": 32, "lr_projector": 1e-2, "lr_lm": 5e-5,
          "lr_projector_stage2": 5e-5, "schedule": "constant"}
#: per-model stage-2 rates where chapter 4's stage-2 sweep found the shared one too high: Gemma-3 at 5e-5 ends
#: near the majority answer with knowledge and perplexity damage, at 1e-5 it learns the task and keeps its knowledge
MODEL_RATES: dict[str, dict[str, float]] = {"gemma3-270m": {"lr_lm": 1e-5, "lr_projector_stage2": 1e-5}}
#: the value of a chapter parameter that stands for "this model's recipe value" (`recipe_for`)
FROM_RECIPE = "recipe"


def recipe_for(model: str) -> dict:
    """The recipe of one model: `RECIPE` with that model's `MODEL_RATES` (other models, hub ids included, get
    `RECIPE` as it is)."""
    return {**RECIPE, **MODEL_RATES.get(model, {})}


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
    #: with LoRA: the adapters' final values (`lora.adapter_tensors`, merged into `model` already); else None
    adapters: dict | None = None


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
        with lora.plain_view(model):  # during LoRA training: the merged weights under the original module names
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
    phrasing: str = "question"

    def as_params(self) -> dict:
        """The settings as a result's parameters; 'phrasing' only when it is not the default 'question' (so the
        parameters of every run in the default phrasing are unchanged)."""
        out = {"batch_size": self.batch_size, "seed": self.seed, "image_size": self.image_size,
               "qtypes": list(self.qtypes), "max_shapes": self.max_shapes, "schedule": self.schedule,
               "warmup_frac": self.warmup_frac, "weight_decay": self.weight_decay,
               "max_grad_norm": self.max_grad_norm, "optimizer": train.OPTIMIZER}
        if self.phrasing != "question":
            out["phrasing"] = self.phrasing
        return out


def _setup(batch_size, seed, image_size, qtypes, max_shapes, schedule, warmup_frac, weight_decay, max_grad_norm,
           callback, callback_every, progress, phrasing="question") -> _Setup:
    if callback is not None and not callable(callback):
        raise ParameterError(f"parameter 'callback' got {callback!r}; allowed: None or a function (step, model)")
    return _Setup(check_int("batch_size", batch_size, 1), check_int("seed", seed, 0), check_image_size(image_size),
                  check_qtypes(qtypes), check_int("max_shapes", max_shapes, 1, GRID * GRID),
                  check_choice("schedule", schedule, SCHEDULES), check_float("warmup_frac", warmup_frac, 0.0, 1.0),
                  check_float("weight_decay", weight_decay, 0.0), check_float("max_grad_norm", max_grad_norm, 0.0),
                  callback, check_int("callback_every", callback_every, 0), bool(progress), check_phrasing(phrasing))


def _run_stage(model, tokenizer, su: _Setup, *, stage: str, tag: str, mode: str, steps: int,
               param_groups: list[dict], encoder, projector, history: list, budget: dict, step_offset: int,
               callbacks: list, answer_fn: Callable | None = None) -> float:
    """One training stage: `steps` AdamW steps on the item stream `tag`; returns seconds."""
    def batches(i: int) -> list:
        return batch_items(i, su.batch_size, seed=su.seed, tag=tag, image_size=su.image_size, qtypes=su.qtypes,
                           max_shapes=su.max_shapes, phrasing=su.phrasing)

    def loss_fn(items: list) -> tuple[torch.Tensor, Batch]:
        answers = [answer_fn(it) for it in items] if answer_fn is not None else None
        batch = build_batch(model, tokenizer, items, mode=mode, encoder=encoder, projector=projector, answers=answers)
        return answer_loss(model, batch), batch

    def after_step(s: train.StepInfo) -> None:
        _add_budget(budget, s.aux)
        step = step_offset + s.i + 1
        history.append({"stage": stage, "step": step, "loss": s.loss, "grad_norm": s.grad_norm, "lr": s.lrs[0],
                        "seconds": s.seconds})
        if su.callback is not None and ((su.callback_every and step % su.callback_every == 0) or s.i == steps - 1):
            _call_callback(su.callback, step, model, stage, projector, encoder, callbacks)

    return train.run(param_groups, steps, batches, loss_fn, weight_decay=su.weight_decay, warmup_frac=su.warmup_frac,
                     schedule=su.schedule, max_grad_norm=su.max_grad_norm, desc=stage, progress=su.progress,
                     after_step=after_step)


@train.fixed_threads()  # the encoder and projector are made under it too (#30)
def train_vl(model: nn.Module, tokenizer, *, stage1_steps: int = RECIPE["stage1_steps"],
             stage2_steps: int = RECIPE["stage2_steps"], batch_size: int = RECIPE["batch_size"],
             lr_projector: float = RECIPE["lr_projector"], lr_lm: float = RECIPE["lr_lm"],
             lr_projector_stage2: float | None = RECIPE["lr_projector_stage2"], seed: int = 0, image_size: int = 48,
             qtypes: Sequence[str] = QUESTION_TYPES, max_shapes: int = 4, schedule: str = RECIPE["schedule"],
             warmup_frac: float = 0.05, weight_decay: float = 0.0,
             max_grad_norm: float = 1.0, encoder: FrozenVisionEncoder | None = None,
             projector: Projector | None = None, encoder_kwargs: Mapping[str, Any] | None = None,
             callback: Callable | None = None, callback_every: int = 0, progress: bool = True,
             lm_method: str = "full", lora_rank: int | None = None, lora_alpha: float | None = None,
             lora_targets: Sequence[str] | None = None, phrasing: str = "question") -> VLResult:
    """Two-stage LLaVA-style adaptation; trains `model` IN PLACE (snapshot it first with
    `clone_state_dict` if you need the base) and leaves it in eval mode.

    Stage 1 ('VL stage 1 (projector)'): only the projector, every LM weight frozen, AdamW at
    `lr_projector`, on the item stream tagged 'projector'. Stage 2 ('VL stage 2 (projector + LM)'):
    every LM parameter at `lr_lm` plus the projector at `lr_projector_stage2` (None: the same
    `lr_projector` as stage 1; the default, like LLaVA-1.5, uses the LM's rate for both), on the stream tagged 'lm'. A fresh AdamW per stage, linear
    warm-up over `warmup_frac` of the stage's steps, then `schedule` ('constant' or 'cosine' to 0);
    gradient norm clipped at `max_grad_norm`. Loss: mean cross-entropy over answer tokens only.
    Scenes hold 1..`max_shapes` shapes; questions are drawn from `qtypes` and written in `phrasing` (one of
    `scenes.PHRASINGS`: 'question', the default, or 'field', labelled fields that share no template with any
    evaluation suite; `result.params` holds 'phrasing' only when it is not 'question').

    `callback(step, model)` (it may also take keyword arguments `stage`, `projector`, `encoder`)
    runs with the model in eval mode at step 0, every `callback_every` steps (global count over
    both stages; 0 = only at the end of each stage); non-None returns go to `result.callbacks`.
    `result.budget` = {'stage1': {...}, 'stage2': {...}} with steps, examples, answer_tokens,
    input_positions (real positions), visual_positions, text_positions, padded_positions.

    `lm_method='lora'` trains, in stage 2, LoRA adapters (`lora_rank`, `lora_alpha`, on the linear layers named
    `lora_targets`; defaults in `sinklib.vl.lora`) at `lr_lm` instead of the LM's weights, and merges them into
    the weights at the end of stage 2; `result.params` then holds the four LoRA keys (with 'full' it has none).
    """
    method = lora.check_lm_method(lm_method, lora_rank, lora_alpha, lora_targets)
    su = _setup(batch_size, seed, image_size, qtypes, max_shapes, schedule, warmup_frac, weight_decay,
                max_grad_norm, callback, callback_every, progress, phrasing)
    stage1_steps = check_int("stage1_steps", stage1_steps, 0)
    stage2_steps = check_int("stage2_steps", stage2_steps, 0)
    lr_projector = check_float("lr_projector", lr_projector, 0.0, 1.0)
    lr_lm = check_float("lr_lm", lr_lm, 0.0, 1.0)
    lr_p2 = lr_projector if lr_projector_stage2 is None else check_float("lr_projector_stage2", lr_projector_stage2,
                                                                          0.0, 1.0)
    torch.manual_seed(su.seed)
    lora.adapter_parameters(model, method)  # a target that matches no layer fails here, before any training
    encoder, projector = _vl_modules(model, su, encoder, projector, encoder_kwargs)
    params = {"kind": "vl", "stage1_steps": stage1_steps, "stage2_steps": stage2_steps, "lr_projector": lr_projector,
              "lr_lm": lr_lm, "lr_projector_stage2": lr_p2, **su.as_params(), "encoder": dict(encoder.config),
              **method.params()}
    history: list[dict] = []
    callbacks: list[dict] = []
    budget = {"stage1": _empty_budget(), "stage2": _empty_budget()}
    keep: dict = {}
    seconds = _vl_stages(model, tokenizer, su, stage1_steps, stage2_steps, lr_projector, lr_lm, lr_p2,
                         encoder, projector, history, callbacks, budget, method, keep)
    return VLResult(model=model, projector=projector, encoder=encoder, history=history, budget=budget,
                    params=params, seconds=seconds, kind="vl", callbacks=callbacks, adapters=keep or None)


def _vl_modules(model, su: _Setup, encoder, projector, encoder_kwargs) -> tuple[FrozenVisionEncoder, Projector]:
    """The vision encoder (made, seeded, when not given; moved to the model's device) and the projector
    (made when not given) of `train_vl`, checked against the settings."""
    if encoder is None:
        encoder = make_encoder(image_size=su.image_size, seed=su.seed, **dict(encoder_kwargs or {}))
    elif encoder_kwargs:
        raise ParameterError("give either 'encoder' or 'encoder_kwargs', not both")
    if encoder.config["image_size"] != su.image_size:
        raise ParameterError(f"parameter 'image_size' is {su.image_size} but the encoder expects "
                             f"{encoder.config['image_size']}")
    dev, _ = device_dtype(model)
    encoder.to(dev)
    if projector is None:
        projector = make_projector(encoder, model, seed=su.seed)
    return encoder, projector


def _vl_stages(model, tokenizer, su: _Setup, stage1_steps: int, stage2_steps: int, lr_projector: float,
               lr_lm: float, lr_p2: float, encoder, projector, history: list, callbacks: list,
               budget: dict, method: lora.LMMethod, keep: dict | None = None) -> dict:
    """The two stages of `train_vl` (the LM frozen in stage 1, its requires_grad flags restored after; with LoRA
    the LM's own weights stay frozen in stage 2 and the adapters are merged after it); returns the seconds per
    stage and leaves the model and the projector in eval mode."""
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
        with lora.adapted(model, method, seed=su.seed, keep=keep) as trained:  # 'full': every LM parameter
            for p in trained:
                p.requires_grad_(True)
            seconds["stage2"] = _run_stage(
                model, tokenizer, su, stage="VL stage 2 (projector + LM)", tag="lm", mode="vl", steps=stage2_steps,
                param_groups=[{"params": trained, "lr": lr_lm}, {"params": list(projector.parameters()), "lr": lr_p2}],
                budget=budget["stage2"], step_offset=stage1_steps, **common)
    finally:
        for p, r in zip(lm_params, req):
            p.requires_grad_(r)
        model.eval()
        projector.eval()
    return seconds


@train.fixed_threads()  # the encoder and projector are made under it too (#30)
def train_text_only(model: nn.Module, tokenizer, *, steps: int = RECIPE["stage2_steps"],
                    batch_size: int = RECIPE["batch_size"], lr: float = RECIPE["lr_lm"], seed: int = 0,
                    image_size: int = 48, qtypes: Sequence[str] = QUESTION_TYPES, max_shapes: int = 4,
                    schedule: str = RECIPE["schedule"], warmup_frac: float = 0.05, weight_decay: float = 0.0,
                    max_grad_norm: float = 1.0, callback: Callable | None = None, callback_every: int = 0,
                    progress: bool = True, answer_style: str = "word", lm_method: str = "full",
                    lora_rank: int | None = None, lora_alpha: float | None = None,
                    lora_targets: Sequence[str] | None = None, phrasing: str = "question") -> VLResult:
    """The matched text-only control; trains `model` IN PLACE and leaves it in eval mode.

    Pass the same values as to `train_vl` (steps = stage2_steps, lr = lr_lm, the same `phrasing`): it then
    runs stage 2 exactly, the same items (questions in the same words) in the same order with the same answers,
    the same AdamW, schedule and clipping on every LM parameter, except that each scene is given as its text
    description instead of visual tokens (and there is no projector). The supervised answer
    tokens are therefore identical; `result.budget['stage2']` reports steps, examples,
    answer_tokens and positions so the two budgets can be compared.

    answer_style 'sentence' is the format-preserving control: the same items, but every answer written as a
    full sentence with the same content (`scenes.sentence_answer`), so the fine-tune teaches the content
    without the one-word answer format (its answer-token budget is then larger; the budget says by how much).

    `lm_method='lora'` (with `lora_rank`, `lora_alpha`, `lora_targets`) trains LoRA adapters instead of the LM's
    weights, as stage 2 of `train_vl` does with the same options and seed (the same initial adapters).
    """
    method = lora.check_lm_method(lm_method, lora_rank, lora_alpha, lora_targets)
    lora.adapter_parameters(model, method)  # a target that matches no layer fails here
    su = _setup(batch_size, seed, image_size, qtypes, max_shapes, schedule, warmup_frac, weight_decay,
                max_grad_norm, callback, callback_every, progress, phrasing)
    steps = check_int("steps", steps, 0)
    lr = check_float("lr", lr, 0.0, 1.0)
    answer_style = check_choice("answer_style", answer_style, ANSWER_STYLES)
    torch.manual_seed(su.seed)
    params = {"kind": "text_only", "steps": steps, "lr": lr, **su.as_params()}
    if answer_style != "word":  # the one-word control keeps its parameters (and its cache keys)
        params["answer_style"] = answer_style
    params.update(method.params())  # nothing for 'full' (its keys unchanged)
    history: list[dict] = []
    callbacks: list[dict] = []
    budget = {"stage1": _empty_budget(), "stage2": _empty_budget()}
    lm_params = list(model.parameters())
    req = [p.requires_grad for p in lm_params]
    keep: dict = {}
    try:
        model.train()
        _call_callback(su.callback, 0, model, "start", None, None, callbacks)
        for p in lm_params:
            p.requires_grad_(method.name == "full")
        with lora.adapted(model, method, seed=su.seed, keep=keep) as trained:  # 'full': every LM parameter
            for p in trained:
                p.requires_grad_(True)
            sec = _run_stage(model, tokenizer, su, stage="text-only (LM)", tag="lm", mode="text", steps=steps,
                             param_groups=[{"params": trained, "lr": lr}], encoder=None, projector=None,
                             history=history, budget=budget["stage2"], step_offset=0, callbacks=callbacks,
                             answer_fn=sentence_answer if answer_style == "sentence" else None)
    finally:
        for p, r in zip(lm_params, req):
            p.requires_grad_(r)
        model.eval()
    return VLResult(model=model, projector=None, encoder=None, history=history, budget=budget, params=params,
                    seconds={"stage2": sec}, kind="text_only", callbacks=callbacks, adapters=keep or None)
