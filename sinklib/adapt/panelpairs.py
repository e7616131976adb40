"""Chapter 11's pairs for the chapters that act on a VL loss (chapter 6's merges, chapter 8's head-wise repair).

Chapter 4's pairs lost no strict format outside the paired noise, so the remedies of chapters 6 and 8 had nothing
to recover there. Chapter 11's four-model panel has pairs that did. This module says which (`lost_format`: one
rule, over chapter 11's results), rebuilds each pair's parameters at every training seed chapter 11 ran
(`params_of`, from its parameters, frozen recipe and chosen rates), and loads a pair's base and VL states as a
`pairs.Pair` (`load`) whose base and VL evaluations are chapter 11's own (`evaluate` reads them from the cache
under chapter 11's keys and settings), so a remedy is compared with the very evaluations chapter 11 reported.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sinklib.adapt.panelrows import condition_name
from sinklib.adapt.primary import PRIMARY
from sinklib.errors import ParameterError

#: the parameter value that picks chapter 11's pairs by `lost_format`
LOST = "lost"
#: the pooled change of chapter 11's pair rows that the rule reads: VL minus base of the primary metric
LOSS_KEY = f"VL: {PRIMARY}"


def check_panel_models(name: str, value: Any) -> str | list[str]:
    """A chapter parameter naming chapter 11's pairs: 'lost' (`lost_format`) or a non-empty list of model names
    (checked against chapter 11's models when its results are read, `choose`)."""
    from sinklib.core.params import check_list, check_str

    if isinstance(value, str):
        if value != LOST:
            raise ParameterError(f"parameter '{name}' got {value!r}; allowed: {LOST!r} (chapter 11's pairs that lost "
                                 "strict instruction format) or a list of chapter 11's model names")
        return value
    return check_list(name, value, check_str)


def lost_format(doc11: Mapping[str, Any]) -> list[str]:
    """The models of chapter 11's pairs whose precondition held (the task learned, knowledge kept) and whose VL
    change of the strict instruction pass rate, pooled over the seeds it ran, lies below zero outside its paired
    95 % interval; in the chapter's order."""
    out = []
    for r in doc11["results"]["pairs"]:
        change = r.get(LOSS_KEY)
        if r.get("precondition") and change is not None and change[2] < 0:
            out.append(r["model"])
    return out


def choose(doc11: Mapping[str, Any], want: str | Sequence[str], exclude: Sequence[str] = ()) -> list[str]:
    """The pairs a chapter acts on: `lost_format` for 'lost', else the models listed (each one of chapter 11's);
    without the models in `exclude` (a cost a chapter states)."""
    have = list(doc11["parameters"]["models"])
    if isinstance(want, str):
        if want != LOST:
            raise ParameterError(f"parameter 'panel_models' got {want!r}; allowed: {LOST!r} (chapter 11's pairs "
                                 f"that lost strict instruction format) or a list of chapter 11's models {have}")
        names = lost_format(doc11)
    else:
        bad = [w for w in want if w not in have]
        if bad:
            raise ParameterError(f"parameter 'panel_models' names {bad}, which chapter 11 did not run; its models: "
                                 f"{have}")
        names = [m for m in have if m in want]
    bad = [e for e in exclude if e not in have]
    if bad:
        raise ParameterError(f"parameter 'panel_exclude' names {bad}, which chapter 11 did not run; its models: "
                             f"{have}")
    return [m for m in names if m not in exclude]


def precondition_failed(doc11: Mapping[str, Any], name: str) -> str:
    """'' when chapter 11's pair `name` passed its precondition (the visual task learned, knowledge kept), else
    why it is not tested (a pair named by hand may not have)."""
    row = next((r for r in doc11["results"]["pairs"] if r["model"] == name), None)
    if row is not None and row.get("precondition"):
        return ""
    return ("precondition failed: chapter 11's pair did not pass its precondition (visual task learned, knowledge "
            "kept)" if row is not None else "precondition failed: chapter 11 has no evaluated pair for this model")


def chosen_sentence(doc11: Mapping[str, Any], want: str | Sequence[str], exclude: Sequence[str] = ()) -> str:
    """Which of chapter 11's pairs `choose` picks, in words, each with its pooled VL change of the strict
    instruction pass rate and its number of seeds, and those `exclude` leaves out."""
    from sinklib.core.numbers import interval

    rows = {r["model"]: r for r in doc11["results"]["pairs"]}

    def said(m: str) -> str:
        c = rows.get(m, {}).get(LOSS_KEY)
        return m if c is None else f"{m} ({interval(*c)} points over {rows[m].get('seeds', 1)} seed(s))"

    picked = choose(doc11, want)
    rule = "the pairs whose strict instruction format fell outside the noise" if isinstance(want, str) else \
        "the pairs named by `panel_models`"
    run = [m for m in picked if m not in exclude]
    out = f"{rule}: {'; '.join(said(m) for m in picked) if picked else 'none'}"
    left = [m for m in picked if m in exclude]
    if left:
        out += f"; left out here by `panel_exclude`: {', '.join(left)}"
    return out + ("" if run else "; so this run acts on no pair")


def seeds_run(doc11: Mapping[str, Any]) -> list[int]:
    """The training seeds whose VL models chapter 11 evaluated: the first only in its interim look
    (`primary_only`), else all of them."""
    seeds = list(doc11["parameters"]["seeds"])
    return seeds[:1] if doc11["results"].get("interim") else seeds


def condition(kind: str, seed: int, doc11: Mapping[str, Any]) -> str:
    """A condition's name at a training seed, as the pooled changes read them ('vl', 'vl seed 1', 'merge:star
    seed 1'): the first seed carries no suffix (`panelrows.condition_name`)."""
    return condition_name(kind, seed, doc11["parameters"]["seeds"][0])


def params_of(doc11: Mapping[str, Any], name: str, seed: int, weights: str) -> dict:
    """The pair parameters of chapter 11's model `name` at training `seed`: its frozen recipe at the rate chapter
    11 chose for the model (`results.rates`, under the rate walk) or its rule's rate (`fourpanel.model_rate`, under
    any other `lr_rule`); `weights` is the loaded model's weights hash."""
    from sinklib.adapt.fourpanel import panel_params

    p, res = doc11["parameters"], doc11["results"]
    rule = res.get("lr_rule", "frozen")
    if name not in p["models"] or (rule == "precondition-chosen" and res.get("rates", {}).get(name) is None):
        raise ParameterError(f"chapter 11's results hold no rate for {name!r} (it did not run, or no rate of its grid "
                             f"passed); its rates: {res.get('rates', {})}")
    return panel_params(name, weights, res["recipe"], seed, image_size=p["image_size"],
                        stage1_steps=p["stage1_steps"], batch_size=p["batch_size"], lr_projector=p["lr_projector"],
                        schedule=p["schedule"], lr_rule=rule, lr=res.get("rates", {}).get(name))


def low_memory(doc11: Mapping[str, Any], name: str) -> bool:
    """Whether chapter 11 ran `name` in its low-memory mode (base weights read back from disk)."""
    return name in doc11["parameters"].get("low_memory_models", [])


def load(lm: Any, doc11: Mapping[str, Any], seed: int) -> Any:
    """Chapter 11's pair of `lm` at training `seed` as a `pairs.Pair` with the states 'base' and 'vl' (each made when
    first read; the VL snapshot rebuilt from its LoRA record, or trained, when the cache lacks it) and the VL
    model's projector and encoder. In the low-memory mode the states are read from disk on every read."""
    from sinklib import vl
    from sinklib.adapt import fourpanel
    from sinklib.adapt.pairs import Pair
    from sinklib.core import cache

    pp = params_of(doc11, lm.name, seed, lm.weights_sha256)
    low = low_memory(doc11, lm.name)
    base = fourpanel.base_source(lm, pp, low_memory=low)
    d = fourpanel.vl_snapshot(lm, pp, base, low_memory=low)
    ck = vl.load_checkpoint(d, lm.model, weights=False)
    states = fourpanel._pair(pp, base, streamed=low, vl=lambda: cache.load_state(d, lm.model))
    return Pair(params=pp, states=states, projector=ck.projector, encoder=ck.encoder)


def _call(lm: Any, doc11: Mapping[str, Any], seed: int, cond: str,
          key_extra: Mapping[str, Any] | None) -> tuple[dict, str, dict]:
    """(parameters, condition name, keyword arguments) under which chapter 11 keys the evaluation of `cond`
    ('base': its first seed's pair without the LoRA keys, at the frozen rate; 'vl': the snapshot at the last
    stage-2 step; anything else: that name with `key_extra`), as `fourpanel.run_base` / `run_condition` and
    `pairs.evaluate_condition` compute them."""
    from sinklib.adapt import dose
    from sinklib.adapt.fourpanel import base_key

    kw = eval_kwargs(lm, doc11)
    if cond == "base":
        first = params_of(doc11, lm.name, doc11["parameters"]["seeds"][0], lm.weights_sha256)
        return base_key(first, doc11["results"]["recipe"]["lr_lm"]), "base", {**kw, "vqa_n": 0}
    pp = params_of(doc11, lm.name, seed, lm.weights_sha256)
    if cond == "vl":
        return pp, dose.snapshot_name("vl", pp["stage2_steps"]), kw
    return pp, cond, {**kw, "key_extra": dict(key_extra) if key_extra else None}


def cached(lm: Any, doc11: Mapping[str, Any], seed: int, cond: str,
           key_extra: Mapping[str, Any] | None = None) -> dict | None:
    """The evaluation `evaluate` would return for `cond` at `seed` when it is cached, else None; reads no weights (so
    a rerun whose evaluations are all cached loads no pair)."""
    from sinklib.adapt.pairs import cached_evaluation

    params, name, kw = _call(lm, doc11, seed, cond, key_extra)
    return cached_evaluation(params, name, **kw)


def eval_kwargs(lm: Any, doc11: Mapping[str, Any]) -> dict:
    """Chapter 11's evaluation settings for `lm` (its suites and sizes, item seed, prompts of S, VQA items, batch)."""
    from sinklib.adapt import fourpanel
    from sinklib.core.data import load_prompts

    p = doc11["parameters"]
    return fourpanel._eval_kwargs(lm, p, load_prompts(p["n_prompts"], seed=0))


def evaluate(lm: Any, pair: Any, doc11: Mapping[str, Any], cond: str, *,
             key_extra: Mapping[str, Any] | None = None) -> dict:
    """One condition of a chapter-11 pair evaluated with chapter 11's settings: 'base' and 'vl' are chapter 11's own
    evaluations (`fourpanel.run_base`, `run_condition`: read from the cache, or computed under chapter 11's keys
    when missing), any other state of `pair.states` is evaluated under `key_extra` (VQA with the VL projector)."""
    from sinklib.adapt import fourpanel
    from sinklib.adapt.pairs import evaluate_condition

    kw = eval_kwargs(lm, doc11)
    low = low_memory(doc11, lm.name)
    base = lambda: pair.states["base"]  # noqa: E731 (the pair's own, made once or read from disk)
    if cond == "base":  # chapter 11 evaluated its base model once, under its first seed's pair
        first = params_of(doc11, lm.name, doc11["parameters"]["seeds"][0], lm.weights_sha256)
        return fourpanel.run_base(lm, first, base, low_memory=low, key_rate=doc11["results"]["recipe"]["lr_lm"], **kw)
    if cond == "vl":
        return fourpanel.run_condition(lm, pair.params, "vl", base, low_memory=low, **kw)
    return evaluate_condition(lm, pair, cond, key_extra=key_extra, **kw)
