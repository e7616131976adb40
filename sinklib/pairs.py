"""Adapted pairs: a base LLM and what VL adaptation (and its two controls) made of it.

Chapter 4 builds the pairs, chapters 5 and 6 reuse them. Every condition is trained once and
cached by a key of its parameters (``sinklib.vl.checkpoint_key``), so a rerun loads instead of
training, and chapter 6 finds chapter 4's checkpoints without rerunning chapter 4.

Conditions of one pair:
    base        the base LLM as loaded
    vl          two-stage LLaVA-style adaptation (projector, then projector + LM)
    text_only   the matched text-only fine-tune (same steps, optimiser, answers; scene as text)
    random      base + a norm-matched random change (per tensor, same norm as the VL change)
"""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from . import vl
from .errors import ParameterError, ResultsMissing
from .models import Loaded, cache_dir
from .params import check_choice, check_float, check_int

CONDITIONS = ("base", "vl", "text_only", "random")


def pair_params(model: str, *, seed: int = 0, image_size: int = 48, stage1_steps: int = vl.RECIPE["stage1_steps"],
                stage2_steps: int = vl.RECIPE["stage2_steps"], batch_size: int = vl.RECIPE["batch_size"],
                lr_projector: float = vl.RECIPE["lr_projector"], lr_lm: float = vl.RECIPE["lr_lm"],
                lr_projector_stage2: float | None = vl.RECIPE["lr_projector_stage2"],
                schedule: str = vl.RECIPE["schedule"], weights: str = "") -> dict:
    """The parameters that identify an adapted pair (validated); `weights` is the base weights hash.

    Defaults: `sinklib.vl.RECIPE`. `lr_projector_stage2=None` keeps `lr_projector` in stage 2; the
    key always holds the resolved rate.
    """
    lr_projector = check_float("lr_projector", lr_projector, 0.0, 1.0)
    return {
        "model": model, "weights": weights,
        "seed": check_int("seed", seed, 0),
        "image_size": check_int("image_size", image_size, 16, 512),
        "stage1_steps": check_int("stage1_steps", stage1_steps, 0, 10**6),
        "stage2_steps": check_int("stage2_steps", stage2_steps, 1, 10**6),
        "batch_size": check_int("batch_size", batch_size, 1, 4096),
        "lr_projector": lr_projector,
        "lr_lm": check_float("lr_lm", lr_lm, 0.0, 1.0),
        "lr_projector_stage2": lr_projector if lr_projector_stage2 is None
        else check_float("lr_projector_stage2", lr_projector_stage2, 0.0, 1.0),
        "schedule": check_choice("schedule", schedule, vl.SCHEDULES),
    }


def vqa_items(n: int, seed: int = 0, image_size: int = 48) -> list:
    """The held-out VQA questions every condition is scored on (chapters 4 and 6; never trained on)."""
    return vl.eval_items(n, seed=vl.VQA_EVAL_SEED_OFFSET + seed, image_size=image_size)


def condition_dir(params: Mapping[str, Any], kind: str) -> Path:
    """Checkpoint folder of one trained condition ('vl' or 'text_only')."""
    if kind not in ("vl", "text_only"):
        raise ParameterError(f"parameter 'kind' got {kind!r}; allowed: 'vl', 'text_only'")
    return vl.checkpoint_dir(vl.checkpoint_key({**params, "kind": kind}))


@dataclass
class Pair:
    """State dicts of every condition of one base model, plus the VL projector/encoder and training logs."""

    params: dict
    states: dict[str, dict[str, torch.Tensor]]            # condition -> LM state dict
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


def build_pair(lm: Loaded, params: Mapping[str, Any], *, callback: Callable | None = None, callback_every: int = 0,
               progress: bool = True, retrain: bool = False) -> Pair:
    """Train (or load from the cache) the VL and text-only conditions of `lm`, and draw the random control.

    `lm.model` ends holding the base weights again. `callback(step, model, ...)` is passed to the
    trainings (for S along training); cached conditions keep the callbacks of the run that made them.
    """
    model, tok = lm.model, lm.tokenizer
    params = dict(params)
    base_sd = vl.clone_state_dict(model)
    states: dict[str, dict] = {"base": base_sd}
    logs: dict[str, dict] = {}
    trained: dict[str, bool] = {}
    common = dict(batch_size=params["batch_size"], seed=params["seed"], image_size=params["image_size"],
                  schedule=params.get("schedule", "constant"), callback=callback, callback_every=callback_every, progress=progress)

    path = condition_dir(params, "vl")
    if vl.checkpoint_exists(path) and not retrain:
        ck = vl.load_checkpoint(path, model)
        projector, encoder, logs["vl"] = ck.projector, ck.encoder, ck.meta
        trained["vl"] = False
    else:
        res = vl.train_vl(model, tok, stage1_steps=params["stage1_steps"], stage2_steps=params["stage2_steps"],
                          lr_projector=params["lr_projector"], lr_lm=params["lr_lm"],
                          lr_projector_stage2=params.get("lr_projector_stage2"), **common)
        projector, encoder, logs["vl"] = res.projector, res.encoder, _meta_of(res)
        vl.save_checkpoint(path, model, projector, encoder, meta=logs["vl"])
        trained["vl"] = True
    states["vl"] = vl.clone_state_dict(model)

    model.load_state_dict(base_sd, strict=True)
    path = condition_dir(params, "text_only")
    if vl.checkpoint_exists(path) and not retrain:
        logs["text_only"] = vl.load_checkpoint(path, model).meta
        trained["text_only"] = False
    else:
        res = vl.train_text_only(model, tok, steps=params["stage2_steps"], lr=params["lr_lm"], **common)
        logs["text_only"] = _meta_of(res)
        vl.save_checkpoint(path, model, meta=logs["text_only"])
        trained["text_only"] = True
    states["text_only"] = vl.clone_state_dict(model)

    states["random"] = vl.random_direction_like(base_sd, states["vl"], seed=params["seed"])
    model.load_state_dict(base_sd, strict=True)
    model.eval()
    return Pair(params=params, states=states, projector=projector, encoder=encoder, logs=logs, trained_now=trained)


def load_pair(lm: Loaded, params: Mapping[str, Any]) -> Pair:
    """The pair chapter 4 built, from the cache; a clear error names the notebook that builds it."""
    for kind in ("vl", "text_only"):
        if not vl.checkpoint_exists(condition_dir(params, kind)):
            raise ResultsMissing(
                f"no cached {kind!r} checkpoint for {params['model']} with these parameters "
                f"({condition_dir(params, kind)}): run notebooks/04_vl_adaptation.ipynb first with the same "
                "profile, e.g. `python -m sinklib.book run --profile full --only 04`")
    return build_pair(lm, params, progress=False)


# ---------------------------------------------------------------------------------------
# cached evaluations (a rerun of a chapter skips finished work)


def cached_json(key_params: Mapping[str, Any], compute: Callable[[], dict], folder: str = "evals",
                refresh: bool = False) -> dict:
    """Return compute() and store it as JSON under cache_dir()/folder/<key>.json; reuse it next time."""
    key = vl.checkpoint_key(dict(key_params))
    path = cache_dir() / folder / f"{key}.json"
    if path.exists() and not refresh:
        return json.loads(path.read_text())
    value = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value, default=float))
    tmp.rename(path)
    return value


def evaluate_condition(lm: Loaded, pair: Pair, condition: str, *, eval_n: Mapping[str, int], seed: int = 0,
                       prompts: list[str], sink_kwargs: Mapping[str, Any], vqa_n: int = 0,
                       eval_batch_size: int = 8, refresh: bool = False, key_extra: Mapping[str, Any] | None = None) -> dict:
    """Text suites, Sink Strength and (for 'vl') VQA accuracy of one condition; cached by its parameters.

    Returns {"scores": [rows of evals.results_table], "S": float, "mass": [L][H], "vqa": (acc, n) | None}.
    `lm.model` is left holding the base weights. `key_extra` joins the cache key (for example the
    parameters of a merge that made the condition).
    """
    from . import evals, sink

    eval_n = {k: check_int(f"eval_n[{k}]", v, 0, 10**6) for k, v in dict(eval_n).items()}
    key = {"pair": pair.params, "condition": condition, "eval_n": eval_n, "seed": seed, "prompts": prompts,
           "sink": dict(sink_kwargs), "vqa_n": vqa_n, "eval_batch_size": eval_batch_size, "version": 1}
    if key_extra:
        key["extra"] = dict(key_extra)

    def compute() -> dict:
        model = pair.load_into(lm.model, condition)
        try:
            suites = tuple(k for k, v in eval_n.items() if v > 0)
            res = evals.run_suites(model, lm.tokenizer, suites=suites, n_items=eval_n, seed=seed,
                                   batch_size=eval_batch_size) if suites else {}
            s = sink.sink_strength(model, prompts, tokenizer=lm.tokenizer, all_layers=True, **sink_kwargs)
            vqa = None
            if vqa_n and condition != "text_only" and pair.projector is not None:
                acc, n = vl.vqa_accuracy(model, lm.tokenizer, pair.encoder, pair.projector,
                                         vqa_items(vqa_n, seed, pair.params["image_size"]))
                vqa = [acc, n]
            return {"scores": evals.results_table(res), "S": s.S, "mass": s.mass.tolist(), "vqa": vqa,
                    "seconds": {k: r.seconds for k, r in res.items()}}
        finally:
            pair.load_into(lm.model, "base")

    return cached_json(key, compute, refresh=refresh)
