"""Chapter 4's VL adaptation applied to a trained tiny LM (chapter 7), and its matched text-only control.

    run = train_tiny(variant, ...)                        # a base model (cached)
    res = adapt(run)                                       # VL + text-only, trained or loaded; evaluated; cached
    res["panel_row"]                                      # the row in the panel schema (variant = QK-norm type)

The adaptation is chapter 4's, unchanged: ``sinklib.adapt.pairs.build_pair`` (same synthetic scenes, the same
frozen random vision encoder, the LLaVA-1.5 projector, stage 1 = projector only, stage 2 = projector + every
LM weight; the text-only control = stage 2 with each scene as its text description). Its checkpoints are
cached by ``pairs.pair_params`` whose ``model`` is the tiny run's name and ``weights`` the SHA-256 of its
weights, exactly as for chapter 4's models. Only the stage-2 learning rates differ from ``vl.RECIPE`` by
default (``ADAPT_DEFAULTS``, the same for every tiny model): 1e-3, a tenth of the tiny models' peak
pretraining rate. Measured on the pilot model 'e7' (8 heads, chain drills, 600 steps): at 2e-4 (1/50, the
ratio of chapter 4's 5e-5 to a 135M model's pretraining rate) the 60 VL steps changed nothing measurable
(S -2.343 -> -2.343, strict +2 [-11, +15] points); at 1e-3 strict fell by 26 [-37, -15] points under VL and
by 30 under the text-only control.

Caveat, measured: with chapter 4's recipe the tiny VL models do NOT learn the visual task: held-out VQA
33.0 % (60 stage-2 steps) and 34.5 % (300 steps) against 38.0 % for the blind majority answer (200 items).
`vqa_summary` reports this ('learned': the Wilson interval lies above the majority baseline), so a chapter
can state it instead of assuming it.

Every condition (base, vl, text_only; 'random' on request) is evaluated on the tiny suites
(``sinklib.tiny.evaluate``: format strict / lenient, knowledge, perplexity), S and the sink mass map on the
calibration prompts (``sinklib.tiny.train.measure``, the same S as along training), and VQA for 'vl'
against the blind majority answer. The changes from base carry two 95 % intervals: chapter 4's (Wilson per
score, MOVER for the difference: ``sinklib.stats.verdicts``; conservative) and a paired bootstrap over the shared
items (``paired_ci``).
"""
from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from sinklib.core import cache
from sinklib.adapt import pairs
from sinklib.stats import schema as panel_schema
from sinklib import vl
from sinklib.errors import ParameterError
from sinklib.evals.grading import paired_ci, paired_ppl_ci
from sinklib.core.models import Loaded
from sinklib.core.params import check_choice, check_int
from sinklib.stats.verdicts import Est, diff, wilson_pct
from sinklib.tiny.corpus import CORPUS_VERSION
from sinklib.tiny.evaluate import EVAL_DEFAULTS, evaluate, summary
from sinklib.tiny.train import TinyRun, measure

_VERSION = 1
#: chapter 4's recipe (vl.RECIPE) with the LM's stage-2 rates scaled to a tiny model (see module doc)
#: phrasing: the VL questions' phrasing (`vl.PHRASINGS`); the default 'question' adds no key to the pair parameters
ADAPT_DEFAULTS = {**vl.RECIPE, "lr_lm": 1e-3, "lr_projector_stage2": 1e-3, "seed": 0, "image_size": 48,
                  "phrasing": "question"}
#: vqa_max_new_tokens: the tiny byte-level BPE spells some answers ('middle') in more than chapter 4's 4 tokens
ADAPT_EVAL_DEFAULTS = {**EVAL_DEFAULTS, "vqa_n": 200, "vqa_max_new_tokens": 10}
#: the metrics whose changes go to the panel: (suite, score key, panel metric name 'suite metric')
PANEL_METRICS: tuple[tuple[str, str, str], ...] = (("format", "strict", "format strict"),
                                                   ("format", "lenient", "format lenient"),
                                                   ("knowledge", "acc", "knowledge acc"),
                                                   ("perplexity", "ppl", "perplexity ppl"))
#: the strict-format column of a tiny panel (the headline task of chapter 7's test)
TINY_STRICT_TASK = panel_schema.TINY_STRICT_TASK
ADAPT_CONDITIONS = ("base", "vl", "text_only", "random")


def model_name(run: TinyRun) -> str:
    """The name of a tiny run in pairs and panels: ``tiny-<variant>-<key[:8]>``."""
    return f"tiny-{run.params['variant']}-{run.key[:8]}"


def tiny_loaded(run: TinyRun) -> Loaded:
    """A tiny run as a `sinklib.core.models.Loaded` (what chapter 4's pair code takes)."""
    return Loaded(model=run.model, tokenizer=run.tokenizer, name=model_name(run), device=torch.device("cpu"),
                  dtype=torch.float32, source="tiny", weights_sha256=cache.tensor_sha(run.model), load_seconds=0.0,
                  info={"train_key": run.key, "variant": run.params["variant"]})


def adapt_params(lm: Loaded, **recipe) -> dict:
    """`pairs.pair_params` of a tiny model (ParameterError names a wrong or unknown recipe key)."""
    bad = set(recipe) - set(ADAPT_DEFAULTS)
    if bad:
        raise ParameterError(f"unknown adaptation parameter(s) {sorted(bad)}; allowed: {', '.join(ADAPT_DEFAULTS)}")
    r = {**ADAPT_DEFAULTS, **recipe}
    return pairs.pair_params(lm.name, weights=lm.weights_sha256, **r)


def _eval_params(eval_kwargs: Mapping | None) -> dict:
    ev = {**ADAPT_EVAL_DEFAULTS, **dict(eval_kwargs or {})}
    bad = set(ev) - set(ADAPT_EVAL_DEFAULTS)
    if bad:
        raise ParameterError(f"unknown evaluation parameter(s) {sorted(bad)}; allowed: {', '.join(ADAPT_EVAL_DEFAULTS)}")
    ev["vqa_n"] = check_int("vqa_n", ev["vqa_n"], 0, 100_000)
    ev["vqa_max_new_tokens"] = check_int("vqa_max_new_tokens", ev["vqa_max_new_tokens"], 1, 64)
    return ev


def evaluate_condition(lm: Loaded, pair: pairs.Pair, condition: str, *, eval_kwargs: Mapping | None = None,
                       sink_params: Mapping, refresh: bool = False) -> dict:
    """Tiny suites, S (+ mass map, sink-token norms) and, for 'vl', VQA of one condition; cached by its
    parameters. Per-item outcomes are kept (for paired intervals). `lm.model` ends holding the base weights."""
    condition = check_choice("condition", condition, ADAPT_CONDITIONS)
    ev = _eval_params(eval_kwargs)
    key = {"kind": "tiny_adapt_eval", "version": _VERSION, "corpus_version": CORPUS_VERSION, "pair": dict(pair.params),
           "condition": condition, "eval": ev, "sink": dict(sink_params)}

    def compute() -> dict:
        t0 = time.perf_counter()
        model = pair.load_into(lm.model, condition)
        try:
            res = evaluate(model, lm.tokenizer, **{k: v for k, v in ev.items() if not k.startswith("vqa_")})
            m = measure(model, lm.tokenizer, dict(sink_params))
            vqa = None
            if ev["vqa_n"] and condition in ("vl", "random") and pair.projector is not None:
                acc, n = vl.vqa_accuracy(model, lm.tokenizer, pair.encoder, pair.projector,
                                         vl.heldout_items(ev["vqa_n"], pair.params["seed"], pair.params["image_size"],
                                                          pairs.phrasing_of(pair.params)),
                                         max_new_tokens=ev["vqa_max_new_tokens"])
                vqa = [acc, n]
        finally:
            pair.load_into(lm.model, "base")
        items = {"format": {m_: [bool(p[m_]) for p in res["format"].per_item] for m_ in ("strict", "lenient")},
                 "knowledge": {"acc": [bool(p["acc"]) for p in res["knowledge"].per_item]},
                 "perplexity": {"nll": [p["nll"] for p in res["perplexity"].per_item],
                                "n_tokens": [p["n_tokens"] for p in res["perplexity"].per_item]}}
        return {"summary": summary(res), "scores": {k: r.scores for k, r in res.items()},
                "ci": {k: {m_: list(v) for m_, v in r.ci.items()} for k, r in res.items()},
                "n": {k: r.n for k, r in res.items()}, "items": items, "S": m["S"], "mass": m["mass"],
                "sink_norm": m["sink_norm"], "vqa": vqa, "seconds": round(time.perf_counter() - t0, 2)}

    return cache.cached_json(key, compute, folder="tiny/adapt_evals", refresh=refresh)


# ---------------------------------------------------------------------------------------
# changes with intervals


def change(base_ev: dict, other_ev: dict, suite: str, metric: str, seed: int = 0) -> dict:
    """The change other - base of one metric: value, chapter 4's MOVER interval (lo, hi) and the paired
    bootstrap interval (paired_lo, paired_hi)."""
    if suite == "perplexity":
        b = Est(base_ev["scores"][suite][metric], *base_ev["ci"][suite][metric])
        o = Est(other_ev["scores"][suite][metric], *other_ev["ci"][suite][metric])
        bi, oi = base_ev["items"]["perplexity"], other_ev["items"]["perplexity"]
        plo, phi = paired_ppl_ci(bi["nll"], oi["nll"], bi["n_tokens"], seed=seed)
    else:
        n = base_ev["n"][suite]
        b = wilson_pct(base_ev["scores"][suite][metric], n)
        o = wilson_pct(other_ev["scores"][suite][metric], other_ev["n"][suite])
        plo, phi = paired_ci(base_ev["items"][suite][metric], other_ev["items"][suite][metric], seed=seed)
    d = diff(o, b)
    return {"change": d.v, "lo": d.lo, "hi": d.hi, "paired_lo": plo, "paired_hi": phi}


def vqa_summary(ev: dict, pair_params: Mapping) -> dict:
    """VQA accuracy (%) with its Wilson interval against the blind majority answer on the same items
    (chapter 4's rule, `vl.against_majority`)."""
    acc, n = ev["vqa"]
    return vl.against_majority(acc, int(n), pair_params["seed"], pair_params["image_size"])


# ---------------------------------------------------------------------------------------
# the whole adaptation of one tiny model


def adapt(run: TinyRun, *, recipe: Mapping | None = None, eval_kwargs: Mapping | None = None,
          conditions: Sequence[str] = ("base", "vl", "text_only"), progress: bool = False,
          refresh: bool = False) -> dict:
    """VL adaptation and text-only control of one tiny run (trained or loaded), every condition evaluated.

    Returns {'name', 'variant', 'pair_params', 'evals' {condition: evaluate_condition(...)}, 'S' {condition: S},
    'changes' {condition: {metric: change(...)}}, 'vqa' (vqa_summary of 'vl'), 'panel_row', 'trained_now',
    'seconds' (training seconds per condition and stage)}. `run.model` ends holding the base weights.
    """
    conditions = [check_choice("condition", c, ADAPT_CONDITIONS) for c in conditions]
    if "base" not in conditions or "vl" not in conditions:
        raise ParameterError(f"parameter 'conditions' got {list(conditions)}; it must hold 'base' and 'vl'")
    lm = tiny_loaded(run)
    pp = adapt_params(lm, **dict(recipe or {}))
    pair = pairs.build_pair(lm, pp, progress=progress, retrain=refresh)
    evs = {c: evaluate_condition(lm, pair, c, eval_kwargs=eval_kwargs, sink_params=run.params["sink"], refresh=refresh)
           for c in conditions}
    changes = {c: {name: change(evs["base"], evs[c], s, m, seed=pp["seed"]) for s, m, name in PANEL_METRICS}
               for c in conditions if c != "base"}
    vqa = vqa_summary(evs["vl"], pp) if evs["vl"]["vqa"] else None
    row = pairs.panel_row(lm.name, evs["base"]["S"], run.params["variant"],
                          {name: changes["vl"][name]["change"] for _, _, name in PANEL_METRICS})
    row.update({"source": "measured: sinklib.tiny.adapt (chapter 7)", "variant": run.params["variant"],
                "train_key": run.key, "S_vl": evs["vl"]["S"],
                "vqa": vqa["vqa"] if vqa else math.nan, "vqa_majority": vqa["majority"] if vqa else math.nan})
    if "text_only" in changes:
        row.update({f"text_only_{name.replace(' ', '_')}": changes["text_only"][name]["change"]
                    for _, _, name in PANEL_METRICS})
    return {"name": lm.name, "variant": run.params["variant"], "pair_params": pp, "evals": evs,
            "S": {c: e["S"] for c, e in evs.items()}, "changes": changes, "vqa": vqa, "panel_row": row,
            "trained_now": pair.trained_now,
            "seconds": {c: pair.logs[c]["seconds"] for c in ("vl", "text_only")}}


def change_table(result: dict, digits: int = 1):
    """One adaptation's changes as a frame: condition, metric, change, MOVER interval, paired interval."""
    import pandas as pd

    rows = [{"condition": c, "metric": m, **{k: round(v, digits) for k, v in d.items()}}
            for c, ms in result["changes"].items() for m, d in ms.items()]
    return pd.DataFrame(rows)
