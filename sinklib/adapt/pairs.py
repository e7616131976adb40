"""Adapted pairs: a base LLM and what VL adaptation (and its two controls) made of it.

Chapter 4 builds the pairs, chapters 5 and 6 reuse them. Every condition is trained once and cached by a key of
its parameters (``sinklib.core.cache.key``), so a rerun loads instead of training, chapter 6 finds chapter 4's
checkpoints without rerunning chapter 4, and a machine that has only their carried logs retrains one when read.

This module is the contract between chapter 4 and the chapters that read it: the parameters of a
pair (`pair_params`), its evaluated conditions (`evaluate_condition`, `evaluation_key`), the
score changes (`score_deltas`), the strict-format mean (`strict_mean`), the panel rows chapter 5
reads (`panel_row`, its strict column `sinklib.stats.schema.STRICT_TASK`) and chapter 4's results as chapter 6 reads them
(`chapter4_pairs`). The score changes, the strict-format mean and the panel rows live in `sinklib.adapt.scores`, the
display tables of chapters 4 and 6 in `sinklib.adapt.display`; both are re-exported here.

Conditions of one pair:
    base        the base LLM as loaded
    vl          two-stage LLaVA-style adaptation (projector, then projector + LM)
    text_only   the matched text-only fine-tune (same steps, optimiser, answers; scene as text)
    random      base + a norm-matched random change (per tensor, same norm as the VL change)
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from sinklib.core import cache
from sinklib import vl
from sinklib.core.anatomy import clamp_last_k
from sinklib.errors import ParameterError, ResultsMissing
from sinklib.core.models import MODEL_PARAMS, Loaded
from sinklib.evals import COUNT_PARAMS
from sinklib.core.params import (COMMON, Dependent, boolean, check_choice, check_float, check_int, check_list,
    choice, integer, list_of, number, optional, text)
from sinklib.core.sink import prompt_count
from sinklib.adapt.display import (CONDITION_LABELS, SCORE_LABELS, SCORE_LEGEND, budget_table,  # noqa: F401
    by_model_table, condition_tables, findings, interval_cell, merge_verdict_table, metric_grid, paired_display)
from sinklib.adapt.scores import (MAIN_METRICS, STRICT_METRICS, condition_row, panel_row, panel_rows,  # noqa: F401
    paired_table, score_deltas, score_table, seed_summary, strict_mean)

CONDITIONS = ("base", "vl", "text_only", "random")
#: conditions a pair can add on request (`build_pair(extra=...)`): the format-preserving text-only control
#: (the same items with every answer written as a full sentence, `vl.sentence_answer`)
EXTRA_CONDITIONS = ("text_sentence",)
TRAINED = ("vl", "text_only") + EXTRA_CONDITIONS


def pair_params(model: str, *, seed: int = 0, image_size: int = 48, stage1_steps: int = vl.RECIPE["stage1_steps"],
                stage2_steps: int = vl.RECIPE["stage2_steps"], batch_size: int = vl.RECIPE["batch_size"],
                lr_projector: float = vl.RECIPE["lr_projector"], lr_lm: float = vl.RECIPE["lr_lm"],
                lr_projector_stage2: float | None = vl.RECIPE["lr_projector_stage2"],
                schedule: str = vl.RECIPE["schedule"], weights: str = "", lm_method: str = "full",
                lora_rank: int | None = None, lora_alpha: float | None = None,
                lora_targets: Sequence[str] | None = None, phrasing: str = "question") -> dict:
    """The parameters that identify an adapted pair (validated); `weights` is the base weights hash.

    Defaults: `sinklib.vl.RECIPE`. `lr_projector_stage2=None` keeps `lr_projector` in stage 2; the
    key always holds the resolved rate. `lm_method='lora'` (`sinklib.vl.lora`) adds the four `vl.LORA_KEYS` with
    their resolved values; the default 'full' adds none, so full fine-tunes keep their cache keys.
    `phrasing` (`vl.PHRASINGS`) writes the questions of every trained condition and of the held-out VQA items;
    'field' (no template shared with any evaluation suite, #29) adds the key 'phrasing', the default 'question'
    adds none, so existing pairs keep their cache keys.
    """
    lr_projector = check_float("lr_projector", lr_projector, 0.0, 1.0)
    method = vl.check_lm_method(lm_method, lora_rank, lora_alpha, lora_targets)
    phrasing = vl.check_phrasing(phrasing)
    return {
        "model": model, "weights": weights,
        "seed": check_int("seed", seed, 0),
        "image_size": vl.check_image_size(image_size),
        "stage1_steps": check_int("stage1_steps", stage1_steps, 0, 10**6),
        "stage2_steps": check_int("stage2_steps", stage2_steps, 1, 10**6),
        "batch_size": check_int("batch_size", batch_size, 1, 4096),
        "lr_projector": lr_projector,
        "lr_lm": check_float("lr_lm", lr_lm, 0.0, 1.0),
        "lr_projector_stage2": lr_projector if lr_projector_stage2 is None
        else check_float("lr_projector_stage2", lr_projector_stage2, 0.0, 1.0),
        "schedule": check_choice("schedule", schedule, vl.SCHEDULES),
        **method.params(),
        **({} if phrasing == "question" else {"phrasing": phrasing}),
    }


def phrasing_of(params: Mapping[str, Any]) -> str:
    """The question phrasing of a pair's parameters ('question' when they hold none: every pair made before #29)."""
    return vl.check_phrasing(params.get("phrasing", "question"))


def condition_dir(params: Mapping[str, Any], kind: str) -> Path:
    """Checkpoint folder of one trained condition (`TRAINED`: 'vl', 'text_only', 'text_sentence')."""
    if kind not in TRAINED:
        raise ParameterError(f"parameter 'kind' got {kind!r}; allowed: {', '.join(map(repr, TRAINED))}")
    return cache.checkpoint_dir(cache.key({**params, "kind": kind}))


class LazyStates(MutableMapping):
    """Condition -> LM state dict, where a condition may be given as a zero-argument function that makes its state
    dict on first use (read from a cached checkpoint, or drawn): a rerun whose evaluations are all cached never
    reads the weights. A dict in every other way; `ready(condition)` says whether a state is made already."""

    def __init__(self, made: Mapping[str, dict] | None = None, **_: Any) -> None:
        self._data: dict[str, Any] = dict(made or {})

    def defer(self, condition: str, make: Callable[[], dict]) -> None:
        """Make the state of `condition` by `make()` when it is first read."""
        self._data[condition] = _Deferred(make)

    def ready(self, condition: str) -> bool:
        return not isinstance(self._data[condition], _Deferred)

    def __getitem__(self, condition: str) -> dict:
        v = self._data[condition]
        if isinstance(v, _Deferred):
            v = self._data[condition] = v.make()
        return v

    def __contains__(self, condition: object) -> bool:  # Mapping's would read the state
        return condition in self._data

    def __setitem__(self, condition: str, state: dict) -> None:
        self._data[condition] = state

    def __delitem__(self, condition: str) -> None:
        del self._data[condition]

    def __iter__(self):
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"LazyStates({', '.join(c + ('' if self.ready(c) else ' (not read yet)') for c in self._data)})"


@dataclass(frozen=True)
class _Deferred:
    make: Callable[[], dict]


@dataclass
class Pair:
    """State dicts of every condition of one base model, plus the VL projector/encoder and training logs."""

    params: dict
    states: MutableMapping[str, dict[str, torch.Tensor]]  # condition -> LM state dict (a dict or LazyStates)
    projector: Any
    encoder: Any
    logs: dict[str, dict] = field(default_factory=dict)   # condition -> meta (history, callbacks, budget, seconds)
    trained_now: dict[str, bool] = field(default_factory=dict)

    def load_into(self, model: torch.nn.Module, condition: str) -> torch.nn.Module:
        """Put one condition's weights into `model` (same architecture), in place; eval mode."""
        if condition not in self.states:
            raise ParameterError(f"parameter 'condition' got {condition!r}; allowed: {', '.join(self.states)}")
        model.load_state_dict(self.states[condition], strict=True)
        return model.eval()


def _meta_of(res: vl.VLResult) -> dict:
    return {"history": res.history, "callbacks": res.callbacks, "budget": res.budget, "seconds": res.seconds,
            "params": res.params}


def _train_condition(lm: Loaded, params: Mapping[str, Any], kind: str, common: Mapping[str, Any]) -> vl.VLResult:
    """Train one condition of the pair in `lm.model` (which holds the base weights) with the pair's recipe
    (text_sentence: the format-preserving control, one-word answers written as sentences)."""
    if kind == "vl":
        return vl.train_vl(lm.model, lm.tokenizer, stage1_steps=params["stage1_steps"],
                           stage2_steps=params["stage2_steps"], lr_projector=params["lr_projector"],
                           lr_lm=params["lr_lm"], lr_projector_stage2=params.get("lr_projector_stage2"), **common)
    return vl.train_text_only(lm.model, lm.tokenizer, steps=params["stage2_steps"], lr=params["lr_lm"],
                              answer_style="sentence" if kind == "text_sentence" else "word", **common)


def _refill(lm: Loaded, params: Mapping[str, Any], kind: str, common: Mapping[str, Any], base_sd: Mapping[str, Any],
            path: Path) -> None:
    """Retrain a checkpoint carried without its weights (`cache.defer_weights`) from the base and write them."""
    lm.model.load_state_dict(base_sd, strict=True)
    try:
        _train_condition(lm, params, kind, common)
        cache.fill_weights(path, lm.model)
    finally:
        lm.model.load_state_dict(base_sd, strict=True)
        lm.model.eval()


def build_pair(lm: Loaded, params: Mapping[str, Any], *, callback: Callable | None = None, callback_every: int = 0,
               progress: bool = True, retrain: bool = False, extra: Sequence[str] = ()) -> Pair:
    """Train (or load from the cache) the VL and text-only conditions of `lm`, and draw the random control.
    A checkpoint carried without its weights is trained again only if its weights are read (`cache.defer_weights`).

    `lm.model` ends holding the base weights again. `callback(step, model, ...)` is passed to the
    trainings (for S along training); cached conditions keep the callbacks of the run that made them.
    `extra`: conditions of `EXTRA_CONDITIONS` to train (or load) as well.
    """
    extra = tuple(check_choice("extra[]", e, EXTRA_CONDITIONS) for e in extra)
    model = lm.model
    params = dict(params)
    base_sd = vl.clone_state_dict(model)
    states = LazyStates({"base": base_sd})
    logs: dict[str, dict] = {}
    trained: dict[str, bool] = {}
    projector = encoder = None
    common = dict(batch_size=params["batch_size"], seed=params["seed"], image_size=params["image_size"],
                  schedule=params.get("schedule", "constant"), callback=callback, callback_every=callback_every,
                  progress=progress, phrasing=phrasing_of(params), **vl.lm_method_of(params).params())

    for kind in ("vl", "text_only", *extra):
        path = condition_dir(params, kind)
        if cache.checkpoint_exists(path) and not retrain:  # its weights are read when first needed
            ck = vl.load_checkpoint(path, model, weights=False)
            logs[kind] = ck.meta
            if kind == "vl":
                projector, encoder = ck.projector, ck.encoder
            cache.defer_weights(path, lambda kind=kind, path=path: _refill(lm, params, kind, common, base_sd, path))
            states.defer(kind, lambda path=path: cache.load_state(path, model))
            trained[kind] = False
            continue
        model.load_state_dict(base_sd, strict=True)
        res = _train_condition(lm, params, kind, common)
        if kind == "vl":
            projector, encoder = res.projector, res.encoder
        logs[kind] = _meta_of(res)
        cache.save_checkpoint(path, model, projector if kind == "vl" else None, encoder if kind == "vl" else None,
                              meta=logs[kind])
        trained[kind] = True
        states[kind] = vl.clone_state_dict(model)

    states.defer("random", lambda: vl.random_direction_like(base_sd, states["vl"], seed=params["seed"]))
    model.load_state_dict(base_sd, strict=True)
    model.eval()
    return Pair(params=params, states=states, projector=projector, encoder=encoder, logs=logs, trained_now=trained)


def _stamps(params: Mapping[str, Any], condition: str) -> dict | None:
    """The checkpoint stamps a condition's weights derive from (None: a condition with no cached checkpoint)."""
    kinds = {"random": ("vl",)}.get(condition, (condition,))
    if any(k not in TRAINED or not cache.checkpoint_exists(condition_dir(params, k)) for k in kinds):
        return None
    return {k: cache.checkpoint_stamp(condition_dir(params, k)) for k in kinds}


def relative_change(pair: Pair, condition: str, *, whole: bool = False) -> list[dict]:
    """`vl.relative_change_by_group` of one condition against the pair's base: rows {group, tensors, parameters,
    relative change, largest tensor}. Cached under the stamps of the checkpoints it comes from (the random control:
    the VL checkpoint and the pair's seed), so a rerun reads no weights; conditions without a checkpoint are
    computed each time."""
    if condition not in pair.states or condition == "base":
        raise ParameterError(f"parameter 'condition' got {condition!r}; allowed: "
                             f"{', '.join(c for c in pair.states if c != 'base')}")

    def compute() -> dict:
        return {"rows": vl.relative_change_by_group(pair.states["base"], pair.states[condition], whole=whole)}

    stamps = _stamps(pair.params, condition)
    if stamps is None:
        return compute()["rows"]
    return cache.cached_json({"what": "relative change", "pair": dict(pair.params), "condition": condition,
                              "whole": bool(whole), "checkpoints": stamps}, compute)["rows"]


def weight_change(built: Mapping[str, Pair], conditions: Sequence[str] = ("vl", "text_only", "random")) -> pd.DataFrame:
    """Chapter 4's weight-change rows: per model, condition and tensor group, `relative_change` (columns model,
    condition, group, tensors, parameters, relative change, largest tensor)."""
    return pd.DataFrame([{"model": n, "condition": c, **r} for n, b in built.items() for c in conditions
                         for r in relative_change(b, c)])


def runtime_rows(model: str, logs: Mapping[str, Mapping[str, Any]], suffix: str = "") -> list[dict]:
    """Chapter 4's run-time rows of one pair's training logs (`Pair.logs`): per condition (its name + `suffix`)
    and stage, the steps, the stage's seconds (along-training measurements included) and the median seconds of
    one optimiser step."""
    rows = []
    for cond, log in logs.items():
        h = pd.DataFrame(log["history"])
        for stage, sec in log["seconds"].items():
            hs = h[h.stage.str.contains("stage 1" if stage == "stage1" else "stage 2|text", regex=True)] if len(h) else h
            rows.append({"model": model, "condition": cond + suffix, "stage": stage, "steps": len(hs),
                         "seconds": round(sec), "median s/step": round(float(hs.seconds.median()), 2)
                         if len(hs) else np.nan})
    return rows


def load_pair(lm: Loaded, params: Mapping[str, Any]) -> Pair:
    """The pair chapter 4 built, from the cache; a clear error names the notebook that builds it."""
    for kind in ("vl", "text_only"):
        if not cache.checkpoint_exists(condition_dir(params, kind)):
            raise ResultsMissing(
                f"no cached {kind!r} checkpoint for {params['model']} with these parameters "
                f"({condition_dir(params, kind)}): run notebooks/04_vl_adaptation.ipynb first with the same "
                "profile, e.g. `python -m sinklib.book run --profile full --only 04`")
    return build_pair(lm, params, progress=False)


# ---------------------------------------------------------------------------------------
# cached evaluations (a rerun of a chapter skips finished work)

EVAL_VERSION = 2  # part of every evaluation key: bump it only to invalidate every cached evaluation (2: per-item outcomes)


def sink_settings(model: torch.nn.Module, last_k_layers: int, max_tokens: int) -> dict:
    """The Sink Strength settings of an evaluation (K clamped to the model's depth)."""
    return {"max_tokens": max_tokens, "last_k_layers": clamp_last_k(last_k_layers, model)}


def per_model_kwargs(lm: Loaded, chapter_kwargs: Mapping[str, Any]) -> dict:
    """`evaluate_condition` keyword arguments for one model from a chapter's: `last_k_layers` and `max_tokens`
    replaced by that model's `sink_kwargs` (`sink_settings`, K clamped to its depth); the rest kept."""
    for k in ("last_k_layers", "max_tokens"):
        if k not in chapter_kwargs:
            raise ParameterError(f"missing keyword {k!r}: the chapter's Sink Strength settings set each model's sink_kwargs")
    kw = {k: v for k, v in chapter_kwargs.items() if k not in ("last_k_layers", "max_tokens")}
    return {**kw, "sink_kwargs": sink_settings(lm.model, chapter_kwargs["last_k_layers"], chapter_kwargs["max_tokens"])}


def evaluation_key(pair_params: Mapping[str, Any], condition: str, *, eval_n: Mapping[str, int], seed: int,
                   prompts: list[str], sink_kwargs: Mapping[str, Any], vqa_n: int, eval_batch_size: int,
                   key_extra: Mapping[str, Any] | None = None) -> dict:
    """The parameters that identify one evaluated condition (hashed by `sinklib.core.cache.key`)."""
    from sinklib.evals.items import fingerprint

    key = {"pair": dict(pair_params), "condition": condition, "eval_n": dict(eval_n), "seed": seed,
           "prompts": prompts, "sink": dict(sink_kwargs), "vqa_n": vqa_n, "eval_batch_size": eval_batch_size,
           "items": fingerprint(dict(eval_n)), "version": EVAL_VERSION}
    if key_extra:
        key["extra"] = dict(key_extra)
    return key


def condition_key(pair_params: Mapping[str, Any], condition: str, *, eval_n: Mapping[str, int], seed: int = 0,
                  prompts: list[str], sink_kwargs: Mapping[str, Any], vqa_n: int = 0, eval_batch_size: int = 8,
                  key_extra: Mapping[str, Any] | None = None, **_: Any) -> dict:
    """The cache key of `evaluate_condition` with its defaults (other keywords, such as `refresh`, ignored)."""
    eval_n = {k: check_int(f"eval_n[{k}]", v, 0, 10**6) for k, v in dict(eval_n).items()}
    return evaluation_key(pair_params, condition, eval_n=eval_n, seed=seed, prompts=prompts, sink_kwargs=sink_kwargs,
                          vqa_n=vqa_n, eval_batch_size=eval_batch_size, key_extra=key_extra)


def cached_evaluation(pair_params: Mapping[str, Any], condition: str, **evaluate_kwargs: Any) -> dict | None:
    """What `evaluate_condition` returns for these arguments when it is cached, else None; reads no weights (so a
    rerun on a machine whose cache holds the evaluations, carried by `sinklib.book.carry`, need not retrain)."""
    import json

    if evaluate_kwargs.get("refresh") or not {"eval_n", "prompts", "sink_kwargs"} <= evaluate_kwargs.keys():
        return None  # refreshed, or not a complete evaluate_condition call (it will say what is missing)
    path = cache.root() / "evals" / f"{cache.key(condition_key(pair_params, condition, **evaluate_kwargs))}.json"
    return json.loads(path.read_text()) if path.exists() else None


def evaluate_condition(lm: Loaded, pair: Pair, condition: str, *, eval_n: Mapping[str, int], seed: int = 0,
                       prompts: list[str], sink_kwargs: Mapping[str, Any], vqa_n: int = 0,
                       eval_batch_size: int = 8, refresh: bool = False, key_extra: Mapping[str, Any] | None = None,
                       note: Mapping[str, Any] | None = None) -> dict:
    """Text suites, Sink Strength and (for 'vl') VQA accuracy of one condition; cached by its parameters.

    Returns {"scores": [rows of evals.results_table], "outcomes": per-item outcomes (`evals.paired.outcomes`),
    "S": float, "mass": [L][H], "vqa": (acc, n) | None, "seconds", "machine": `cache.machine()` (absent from
    evaluations cached before session 41)}.
    `lm.model` is left holding the base weights. `key_extra` joins the cache key (for example the
    parameters of a merge that made the condition); `note` is stored with a result computed now, outside the key
    (for example how the weights evaluated were made on this machine).
    """
    from sinklib import evals
    from sinklib.core import sink
    from sinklib.evals.paired import outcomes

    eval_n = {k: check_int(f"eval_n[{k}]", v, 0, 10**6) for k, v in dict(eval_n).items()}
    key = condition_key(pair.params, condition, eval_n=eval_n, seed=seed, prompts=prompts, sink_kwargs=sink_kwargs,
                        vqa_n=vqa_n, eval_batch_size=eval_batch_size, key_extra=key_extra)

    def compute() -> dict:
        model = pair.load_into(lm.model, condition)
        try:
            suites = tuple(k for k, v in eval_n.items() if v > 0)
            res = evals.run_suites(model, lm.tokenizer, suites=suites, n_items=eval_n, seed=seed,
                                   batch_size=eval_batch_size) if suites else {}
            s = sink.sink_strength(model, prompts, tokenizer=lm.tokenizer, all_layers=True, **sink_kwargs)
            vqa = None
            if vqa_n and not condition.startswith("text") and pair.projector is not None:
                acc, n = vl.vqa_accuracy(model, lm.tokenizer, pair.encoder, pair.projector,
                                         vl.heldout_items(vqa_n, seed, pair.params["image_size"],
                                                          phrasing_of(pair.params)))
                vqa = [acc, n]
            return {"scores": evals.results_table(res), "outcomes": outcomes(res), "S": s.S, "mass": s.mass.tolist(), "vqa": vqa,
                    "seconds": {k: r.seconds for k, r in res.items()}, "machine": cache.machine(),
                    **({"note": dict(note)} if note else {})}
        finally:
            pair.load_into(lm.model, "base")

    return cache.cached_json(key, compute, refresh=refresh)


# ---------------------------------------------------------------------------------------
# chapter 4's pairs as it saves them and as later chapters read them

def pair_records(built: Mapping[str, Pair]) -> dict:
    """What chapter 4 saves of its pairs: training seconds per condition, the checkpoint folders (relative to
    the cache folder, never a machine path) and each pair's parameters."""
    root = cache.root()
    return {"train_seconds": {n: {c: log["seconds"] for c, log in b.logs.items()} for n, b in built.items()},
            "checkpoints": {n: {c: condition_dir(b.params, c).relative_to(root).as_posix() for c in b.logs}
                            for n, b in built.items()},
            "pair_params": {n: b.params for n, b in built.items()},
            "retrained": cache.filled_here()}


def retrained_sentence(filled: Sequence[Mapping[str, Any]] | None = None) -> str:
    """`cache.filled_here()` (default: this run's: checkpoints carried without weights and retrained here) in words."""
    filled = cache.filled_here() if filled is None else filled
    if not filled:
        return "every checkpoint this run read was trained on the machine that ran it"
    same = sum(bool(r["bit_identical"]) for r in filled)
    return (f"{len(filled)} checkpoint(s) had been trained on another machine and were retrained here from their "
            f"carried training logs when their weights were needed; {same} of {len(filled)} came out bit-identical to "
            "the first training" + ("" if same == len(filled) else " (the others differ in rounding; results cached "
                                    "before, under the same training log, are the first training's)"))


def chapter4_pairs(models: Sequence[str]) -> tuple[dict, dict, dict]:
    """Chapter 4's results as later chapters read them: (pair_params by model, chapter 4's
    parameters, provenance). ParameterError names a model chapter 4 did not adapt."""
    from sinklib.book.runner import load_results

    ch4 = load_results("04_vl_adaptation")
    pp = ch4["results"]["pair_params"]
    missing = [m for m in models if m not in pp]
    if missing:
        raise ParameterError(f"parameter 'models' names {missing}, but chapter 4 built pairs only for "
                             f"{sorted(pp)}: rerun notebooks/04_vl_adaptation.ipynb with those models")
    return pp, ch4["parameters"], ch4["provenance"]


# ---------------------------------------------------------------------------------------
# the parameters of chapter 4 (the recipe's ranges are those of pair_params)

def or_recipe(check: Callable[[str, Any], Any]) -> Callable[[str, Any], Any]:
    """`vl.FROM_RECIPE` ('recipe': each model's value from `vl.recipe_for`), or a value that passes `check`."""
    return lambda name, value: value if value == vl.FROM_RECIPE else check(name, value)


def models_subset(allow_none: bool = True, min_len: int = 1) -> Dependent:
    """A list of model names, each one of the notebook's `models` (None too where `allow_none`: every model): a
    misspelt name is an error, never a condition silently skipped."""
    def check(name: str, value: Any, checked: dict) -> list[str] | None:
        if value is None and allow_none:
            return None
        out = check_list(name, value, item_check=text(), min_len=min_len)
        unknown = [m for m in out if m not in checked["models"]]
        if unknown:
            raise ParameterError(f"parameter {name!r} names {unknown}, which are not in 'models' "
                                 f"({checked['models']}); use names from 'models'")
        return out
    return Dependent(check)


CHAPTER4_PARAMS = {
    **MODEL_PARAMS, "seed": integer(0), "image_size": lambda _, v: vl.check_image_size(v),
    "stage1_steps": integer(0, 10**6),
    "stage2_steps": integer(1, 10**6), "batch_size": integer(1, 4096), "lr_projector": number(0.0, 1.0),
    "lr_lm": or_recipe(number(0.0, 1.0)), "lr_projector_stage2": or_recipe(optional(number(0.0, 1.0))), "schedule": choice(vl.SCHEDULES),
    "callback_every": integer(0, 10**6), "n_prompts": prompt_count, "last_k_layers": integer(1, 1000),
    "max_tokens": integer(8, 8192), "track_prompts": prompt_count, "vqa_n": integer(1, 100_000),
    **COUNT_PARAMS, "eval_batch_size": integer(1, 1024), "show_progress": boolean(),
    "format_models": models_subset(min_len=0), "random_scales": list_of(number(0.01, 1000.0), min_len=0),
    "random_models": models_subset(),
    "dose_steps": list_of(integer(1, 10**6), min_len=0), "dose_models": models_subset(),
    "extra_seeds": list_of(integer(0, 10**9), min_len=0), "seed_models": models_subset(),
    "sweep_models": models_subset(allow_none=False, min_len=0), "sweep_lrs": list_of(number(1e-9, 1.0), min_len=0),
    **COMMON}


def pair_params_of(name: str, params: Mapping[str, Any], weights: str) -> dict:
    """`pair_params` of one model from a notebook's validated parameters (chapter 4's recipe keys)."""
    keys = ("seed", "image_size", "stage1_steps", "stage2_steps", "batch_size", "lr_projector", "lr_lm",
            "lr_projector_stage2", "schedule")
    own = vl.recipe_for(name)  # a parameter set to vl.FROM_RECIPE takes the model's recipe value
    recipe = {k: own[k] if params[k] == vl.FROM_RECIPE else params[k] for k in keys}
    method = {k: params[k] for k in vl.LORA_KEYS if k in params}  # a chapter without LoRA parameters: 'full'
    if "phrasing" in params:  # a chapter without the parameter: 'question'
        method["phrasing"] = params["phrasing"]
    return pair_params(name, weights=weights, **recipe, **method)
