"""Chapter 11's four-model panel (#29): one adaptation recipe, frozen by chapter 10, applied to four real models.

The recipe is chapter 10's LoRA recipe (`frozen_recipe`: its rate and stage-2 length, LoRA rank, alpha and targets),
with the VL questions in the 'field' phrasing that shares no template with any evaluation suite (`vl.PHRASINGS`),
and the same for the text-only control. Every model is trained the same way, through LoRA adapters: the largest
model cannot be fine-tuned in full on the 2-core machine, and chapter 10 found that a LoRA dose and a full fine-tune
dose that both qualify differ in strength, so mixing the two methods would confound the method with the model.

Each condition is a stage-2 *series* of one length (`dose.train_series`, `dose.evaluate_series`: trained once,
saved at the last step, evaluated and cached under `dose.snapshot_name`), so the panel runs job by job
(`jobs`: the primary test's jobs first) and a rerun reads only cached evaluations. `low_memory=True` (the 1.5B
model) trains with gradient checkpointing (`checkpointing`: the same gradients, recomputed) and reads the base
weights back from a checkpoint of its own instead of holding a copy (`Streamed`).

The primary test (`primary_test`): across the four base models, Spearman's rho of base S against the VL change of
the strict instruction pass rate (the mean over training seeds), one-sided in the paper's direction (higher S, less
loss: rho > 0), exact over the n! orderings of the pairs that pass their preconditions: with four only a perfect
ordering reaches p < 0.05 (p = 1/24), with three none can (1/6).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from sinklib.adapt.pairs import LazyStates, Pair
from sinklib.adapt.primary import PRIMARY, primary_sentence, primary_test, primary_verdict  # noqa: F401 (re-exported)
from sinklib.core.params import check_choice, check_int
from sinklib.errors import ParameterError, ResultsMissing

#: the panel: three models without QK-norm and one with per-head QK-norm (Gemma-3)
MODELS = ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")
#: the trained conditions, in the order their jobs run after the primary test's
KINDS = ("vl", "text_only")
PHRASING = "field"
#: how each model's stage-2 rate follows from the frozen recipe: 'frozen' (the same rate for all four: the
#: pre-registered design) or 'recipe-scaled' (times the model's own full fine-tune rate over the calibration model's,
#: `vl.recipe_for`: the amendment written after Gemma-3's first job failed its preconditions, session 41) or
#: 'precondition-chosen' (the largest rate of a fixed grid at which the model passes the preconditions,
#: `sinklib.adapt.ratechoice`: the second amendment, written after Qwen-0.5B's first job failed them, session 42)
#: or 'common-rate' (every model at the grid's second rate, `ratechoice.common_rate`: the sensitivity analysis
#: written in session 43, before either Qwen model's result at that rate)
LR_RULES = ("frozen", "recipe-scaled", "precondition-chosen", "common-rate")


def frozen_recipe(doc10: Mapping[str, Any]) -> dict:
    """Chapter 10's frozen LoRA recipe from its results document: {'calibrated_on', 'lr_lm', 'stage2_steps',
    'lm_method', 'lora_rank', 'lora_alpha', 'lora_targets'}; a clear error when chapter 10 froze none."""
    r = doc10.get("results", doc10)
    method, recipes = r.get("lora_method"), {n: v for n, v in (r.get("lora_recipe") or {}).items() if v}
    if not method or not recipes:
        raise ResultsMissing("chapter 10 froze no LoRA recipe (its results have no qualifying LoRA point): run "
                             "notebooks/10_calibration.ipynb on the full profile first, or give the recipe by hand")
    if len(recipes) != 1:
        raise ParameterError(f"chapter 10 froze LoRA recipes for {sorted(recipes)}; the panel needs exactly one")
    (name, rec), = recipes.items()
    return {"calibrated_on": name, "lr_lm": float(rec["lr_lm"]), "stage2_steps": int(rec["stage2_steps"]), **method}


def model_rate(name: str, recipe: Mapping[str, Any], lr_rule: str = "frozen") -> float:
    """One model's stage-2 rate under `lr_rule` (`LR_RULES`): the frozen rate, or (recipe-scaled) the frozen rate
    times the model's full fine-tune rate over the calibration model's (`vl.recipe_for`; 1 without one), or
    (common-rate) the rate grid's second rate for every model."""
    from sinklib import vl

    rule = check_choice("lr_rule", lr_rule, LR_RULES)
    if rule == "precondition-chosen":
        raise ParameterError("under lr_rule 'precondition-chosen' a model's rate is chosen by running it "
                             "(sinklib.adapt.ratechoice.walk, in run_panel): give panel_params the rate (lr=)")
    if rule == "common-rate":
        from sinklib.adapt.ratechoice import common_rate

        return common_rate(recipe)
    ref = recipe.get("calibrated_on")
    if rule == "frozen" or not ref:
        return float(recipe["lr_lm"])
    own, cal = vl.recipe_for(name)["lr_lm"], vl.recipe_for(ref)["lr_lm"]
    return float(recipe["lr_lm"]) if own == cal else float(recipe["lr_lm"]) * own / cal  # unchanged: the same float


def panel_params(name: str, weights: str, recipe: Mapping[str, Any], seed: int, *, image_size: int,
                 stage1_steps: int, batch_size: int, lr_projector: float, schedule: str,
                 lr_rule: str = "frozen", lr: float | None = None) -> dict:
    """The pair parameters of one model and training seed under the frozen recipe, at the rate `lr` or (None) the
    model's rate under `lr_rule` (`model_rate`; the projector trains at the LM's stage-2 rate, LLaVA-1.5's rule, as in chapter 10), in
    the 'field' phrasing. A model whose rate the rule leaves unchanged has the same parameters under both rules."""
    from sinklib.adapt.pairs import pair_params

    lora = {k: recipe[k] for k in ("lm_method", "lora_rank", "lora_alpha", "lora_targets")}
    lr = model_rate(name, recipe, lr_rule) if lr is None else float(lr)
    return pair_params(name, weights=weights, seed=seed, image_size=image_size, stage1_steps=stage1_steps,
                       stage2_steps=recipe["stage2_steps"], batch_size=batch_size, lr_projector=lr_projector,
                       lr_lm=lr, lr_projector_stage2=lr, schedule=schedule, phrasing=PHRASING, **lora)


def jobs(models: Sequence[str], seeds: Sequence[int], kinds: Sequence[str] = KINDS,
         random_models: Sequence[str] = ()) -> list[tuple[str, int, str]]:
    """(model, seed, kind) in the order the panel runs them: VL at the first seed for every model (with the base
    evaluations: the primary test), then VL at the other seeds, then each further kind at every seed, then the
    random control ('random', `random_control`) at the first seed of each of `random_models`."""
    kinds = [check_choice("kinds[]", k, KINDS) for k in kinds]
    seeds = [check_int("seeds[]", s, 0) for s in seeds]
    if not models or not seeds or "vl" not in kinds:
        raise ParameterError("the panel needs at least one model, one seed and the 'vl' condition")
    out = [(m, seeds[0], "vl") for m in models]
    out += [(m, s, "vl") for s in seeds[1:] for m in models]
    out += [(m, s, k) for k in kinds if k != "vl" for s in seeds for m in models]
    return out + [(m, seeds[0], "random") for m in models if m in random_models]


@contextlib.contextmanager
def checkpointing(model: Any, on: bool = True) -> Iterator[None]:
    """Gradient checkpointing of a transformers model while the block runs (activations recomputed in the backward
    pass instead of stored: the same gradients, less memory, about a third more compute); off again after."""
    if not on:
        yield
        return
    new = hasattr(model, "activation_checkpointing_enable")  # transformers >= 5 (the old names warn there)
    kw = {"use_reentrant": False}
    if new:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kw)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)
    try:
        yield
    finally:
        model.activation_checkpointing_disable() if new else model.gradient_checkpointing_disable()


class Streamed(LazyStates):
    """`LazyStates` whose deferred states are made on every read and never kept: a model too large for two copies
    in memory reads its base weights back from disk each time it needs them."""

    def __getitem__(self, condition: str) -> dict:
        return self._data[condition].make() if not self.ready(condition) else self._data[condition]


def base_dir(params: Mapping[str, Any]):
    """The cache folder of the low-memory mode's checkpoint of a model's base weights (by the model and its weights)."""
    from sinklib.core import cache

    return cache.checkpoint_dir(cache.key({"kind": "base weights", "model": params["model"],
                                           "weights": params.get("weights", "")}))


def base_source(lm: Any, params: Mapping[str, Any], *, low_memory: bool = False) -> Callable[[], dict]:
    """A function that returns the base LM's state: a copy made now and kept, or (low_memory) a checkpoint of the
    base weights saved once in the cache under the model and its weights and read back on every call."""
    from sinklib import vl
    from sinklib.core import cache

    if not low_memory:
        kept = vl.clone_state_dict(lm.model)
        return lambda: kept
    d = base_dir(params)
    if not cache.weights_present(d):  # also when carried from another machine without its weights
        cache.save_checkpoint(d, lm.model, meta={"kind": "base weights", "model": params["model"]})
    return lambda: cache.load_state(d, lm.model)


def _pair(params: Mapping[str, Any], base: Callable[[], dict], *, streamed: bool, **more: Callable[[], dict]) -> LazyStates:
    states = Streamed() if streamed else LazyStates()
    for name, make in {"base": base, **more}.items():
        states.defer(name, make)
    return states


def run_condition(lm: Any, params: Mapping[str, Any], kind: str, base: Callable[[], dict], *,
                  low_memory: bool = False, progress: bool = False, **evaluate_kwargs: Any) -> dict:
    """One job: train `kind` ('vl' or 'text_only') with the pair's recipe unless its evaluation is cached
    (`dose.train_series`, one snapshot at the last stage-2 step), then evaluate that snapshot
    (`pairs.evaluate_condition` under `dose.snapshot_name`, VQA with its projector for 'vl'); with `low_memory`
    no state but the model's own is kept between reads. -> the evaluation."""
    from sinklib import vl
    from sinklib.adapt import adapters, dose
    from sinklib.adapt.pairs import cached_evaluation, evaluate_condition
    from sinklib.core import cache

    step = params["stage2_steps"]
    name, kw = dose.snapshot_name(kind, step), {**evaluate_kwargs, **({} if kind == "vl" else {"vqa_n": 0})}
    hit = cached_evaluation(params, name, **kw)
    if hit is not None:
        return hit
    with checkpointing(lm.model, low_memory):
        d = dose.train_series(lm, params, kind, [step], progress=progress, restore=base if low_memory else None)[step]
    ck = vl.load_checkpoint(d, lm.model, weights=False)
    states = _pair(params, base, streamed=low_memory, **{name: lambda: cache.load_state(d, lm.model)})
    pair = Pair(params=dict(params), states=states, projector=ck.projector if kind == "vl" else None,
                encoder=ck.encoder if kind == "vl" else None)
    made = adapters.made_here(d)  # a snapshot rebuilt from its LoRA record: the evaluation says so
    return evaluate_condition(lm, pair, name, **kw, note={"weights": made} if made else None)


def run_base(lm: Any, params: Mapping[str, Any], base: Callable[[], dict], *, low_memory: bool = False,
             key_rate: float | None = None, **evaluate_kwargs: Any) -> dict:
    """The base model's evaluation, keyed by the pair's parameters without the LoRA keys (`calibrate.base_params`,
    as chapter 10 pairs its LoRA series), VQA not measured. `key_rate` (the recipe's frozen rate) replaces the
    stage-2 rates in the key, so one cached evaluation serves every rate a model's walk tries (the base model does
    not depend on them: Gemma-3's evaluations keyed at 2e-3 and 4e-4 had the same per-item outcomes)."""
    from sinklib.adapt.pairs import evaluate_condition

    pair = Pair(params=base_key(params, key_rate), states=_pair(params, base, streamed=low_memory), projector=None,
                encoder=None)
    return evaluate_condition(lm, pair, "base", **{**evaluate_kwargs, "vqa_n": 0})


def base_key(params: Mapping[str, Any], key_rate: float | None = None) -> dict:
    """The parameters that key a base model's evaluation: the pair's without the LoRA keys
    (`calibrate.base_params`), its stage-2 rates replaced by `key_rate` where given (`run_base`)."""
    from sinklib.adapt.calibrate import base_params

    keyed = base_params(params)
    if key_rate is not None:
        keyed.update(lr_lm=float(key_rate), lr_projector_stage2=float(key_rate))
    return keyed


def vl_snapshot(lm: Any, params: Mapping[str, Any], base: Callable[[], dict], *, low_memory: bool = False):
    """The folder of the pair's VL snapshot (its last stage-2 step), made first when it is missing: rebuilt from its
    LoRA record when the cache holds one (carried from the machine that trained it, `sinklib.adapt.adapters`), else
    trained, in both cases from the base weights, which are loaded into the model first; the model ends holding
    them."""
    from sinklib.adapt import dose
    from sinklib.core import cache

    step = params["stage2_steps"]
    d = dose.snapshot_dir(params, "vl", step)
    if not cache.checkpoint_exists(d):
        lm.model.load_state_dict(base(), strict=True)
        dose.train_series(lm, params, "vl", [step], restore=base if low_memory else None)
    return d


def random_control(lm: Any, params: Mapping[str, Any], base: Callable[[], dict], scales: Sequence[float], *,
                   seqs: Sequence[Sequence[int]], **evaluate_kwargs: Any) -> dict:
    """The random control of one pair, on the functional yardstick: the norm-matched random direction of its VL
    snapshot (`vl.random_direction_like`, the pair's seed), its next-token KL from the base model at 1x and at each
    of `scales` times VL's norm beside VL's own (`yardstick.pair_kl` on the token lists `seqs`, cached), the size
    whose KL equals VL's (`yardstick.matched_size`, rounded to two digits) and the random control evaluated at that
    size (`isolate.evaluate_random_scaled`, cached; None when no size measured matches). Holds base, VL and random
    in memory besides the model: not for the low-memory models. -> {'kl', 'matched', 'size', 'evaluation'}."""
    from sinklib import vl
    from sinklib.adapt import isolate, yardstick
    from sinklib.core import cache

    states = LazyStates()
    states.defer("base", base)
    states.defer("vl", lambda: cache.load_state(vl_snapshot(lm, params, lambda: states["base"]), lm.model))
    states.defer("random", lambda: vl.random_direction_like(states["base"], states["vl"], seed=params["seed"]))
    pair = Pair(params=dict(params), states=states, projector=None, encoder=None)
    kls = yardstick.pair_kl(lm, pair, ["vl", "random"], scales, seqs=seqs)
    k = yardstick.matched_size(kls, scales)
    size = None if k is None else yardstick.round_size(k)
    ev = None if size is None else isolate.evaluate_random_scaled(lm, pair, [size], **{**evaluate_kwargs,
                                                                                          "vqa_n": 0})[size]
    return {"kl": kls, "matched": k, "size": size, "evaluation": ev}


def random_control_low(lm: Any, params: Mapping[str, Any], base: Callable[[], dict], scales: Sequence[float], *,
                       seqs: Sequence[Sequence[int]], **evaluate_kwargs: Any) -> dict:
    """`random_control` for a low-memory model: the random direction made inside the model (`sinklib.adapt.inplace`:
    the change norms read from the base and VL checkpoints, the direction added in place), the KLs against the
    base's log-probabilities computed once, all cached under their own keys ('in place'), and the evaluation at the
    KL-matched size with the state made in place. -> the same dict as `random_control`."""
    from sinklib.adapt import inplace, isolate, yardstick
    from sinklib.adapt.pairs import evaluate_condition
    from sinklib.core import cache

    model, norms = lm.model, {}

    def vl_dir():  # made only when a KL or the evaluation is not cached
        return vl_snapshot(lm, params, base, low_memory=True)

    def randomised(k: float) -> Callable[[], dict]:
        def make() -> dict:
            norms.update(norms or inplace.change_norms(base_dir(params), vl_dir()))
            model.load_state_dict(base(), strict=True)
            inplace.add_random(model, norms, params["seed"], k)
            return model.state_dict()
        return make

    sizes = {isolate.scaled_name(k): float(k) for k in [1.0, *scales]}
    makers = {"vl": lambda: model.load_state_dict(cache.load_state(vl_dir(), model), strict=True),
              **{n: randomised(k) for n, k in sizes.items()}}
    seq_key = cache.key({"s": [list(map(int, q)) for q in seqs]})
    keys = {n: {"kind": "next-token KL", "pair": dict(params), "condition": n, "seqs": seq_key,
                "version": yardstick.KL_VERSION, "method": "in place"} for n in makers}
    todo = {n: m for n, m in makers.items() if not (cache.root() / "evals" / f"{cache.key(keys[n])}.json").exists()}
    new = inplace.kl_in_place(model, seqs, todo, reference=lambda: model.load_state_dict(base(), strict=True)) if todo else {}
    kls = {n: cache.cached_json(keys[n], lambda n=n: new[n]) for n in makers}  # the base's log-probabilities once
    k = yardstick.matched_size(kls, scales)
    size = None if k is None else yardstick.round_size(k)
    ev = None
    if size is not None:
        name = isolate.scaled_name(size)
        states = Streamed()
        states.defer("base", base)
        states.defer(name, randomised(size))
        ev = evaluate_condition(lm, Pair(params=dict(params), states=states, projector=None, encoder=None), name,
                                **{**evaluate_kwargs, "vqa_n": 0, "key_extra": {"random": "in place"}})
    return {"kl": kls, "matched": k, "size": size, "evaluation": ev}


def run_panel(p: Mapping[str, Any], recipe: Mapping[str, Any], *, primary_only: bool = False,
              only: Callable[[tuple[str, int, str]], bool] | None = None, log=None) -> dict:
    """Every job of `jobs` in order (or only the primary test's; with `only`, the jobs it keeps and always each
    model's VL job at the first seed, which chooses its rate and is cached), each model's base evaluation before its first
    job, one model in memory at a time (`low_memory` for the models of p['low_memory_models'], whose random control
    is made in place: `random_control_low`). Evaluations use item seed 0 for every training seed, so all are paired
    on the same items. Under lr_rule 'precondition-chosen' a model's first VL job walks the rate grid
    (`ratechoice.walk`, from p['grid_start'][model] or the top), its other jobs run at the chosen rate, and a model
    for which no rate passes runs no other job. -> {'base': {model: evaluation}, 'evals': {(model, seed, kind):
    evaluation}, 'random': {model: `random_control`'s result}, 'params': {(model, seed): pair parameters},
    'seconds': {job: seconds}, 'qk_norm': {model: its QK-norm type}, 'walks': {model: `ratechoice.walk`'s rows}}."""
    import time

    from sinklib.core.data import load_prompts
    from sinklib.core.models import load_model
    from sinklib.evals.inputs import suite_inputs

    rule, randoms = p.get("lr_rule", "frozen"), list(p["models"]) if p["random_scales"] else []
    todo = jobs(p["models"], p["seeds"], p["kinds"], randoms)
    first = [j for j in todo if j[1] == p["seeds"][0] and j[2] == "vl"]
    todo = first if primary_only else [j for j in todo if j in first or only is None or only(j)]
    prompts = load_prompts(p["n_prompts"], seed=0)
    out: dict = {"base": {}, "evals": {}, "random": {}, "params": {}, "seconds": {}, "qk_norm": {}, "walks": {}}
    lm = base = None
    for i, (name, seed, kind) in enumerate(todo):
        low = name in p["low_memory_models"]
        if rule == "precondition-chosen" and name in out["walks"] and _chosen(out, name) is None:
            continue  # no rate of the grid passed: the model runs no other job
        if lm is None or lm.name != name:
            lm = base = None  # one model in memory at a time
            lm = load_model(name, device=p["device"])
        kw = _eval_kwargs(lm, p, prompts)
        out["qk_norm"][name] = lm.qk_norm
        t0 = time.perf_counter()
        if rule == "precondition-chosen" and name not in out["walks"]:
            base = base or base_source(lm, params_at(lm, p, recipe, seed, recipe["lr_lm"]), low_memory=low)
            pp = _walk(lm, p, recipe, seed, base, low, kw, out)
        else:
            pp = params_at(lm, p, recipe, seed, _chosen(out, name) if rule == "precondition-chosen" else None)
            base = base or base_source(lm, pp, low_memory=low)
            if name not in out["base"]:
                out["base"][name] = run_base(lm, pp, base, low_memory=low, key_rate=recipe["lr_lm"], **kw)
            if kind == "random":
                out["random"][name] = (random_control_low if low else random_control)(
                    lm, pp, base, p["random_scales"],
                    seqs=suite_inputs(lm.tokenizer, "perplexity", p["eval_perplexity"], seed=0), **kw)
            else:
                out["evals"][(name, seed, kind)] = run_condition(lm, pp, kind, base, low_memory=low,
                                                                 progress=p["show_progress"], **kw)
        out["seconds"][(name, seed, kind)] = time.perf_counter() - t0
        out["params"][(name, seed)] = pp
        if log:
            log(f"job {i + 1}/{len(todo)}: {name} seed {seed} {kind} at rate {pp['lr_lm']:.3g} "
                f"({out['seconds'][(name, seed, kind)]:.0f} s)")
    return out


#: the seed of every evaluation's item sample (the suites' items and their order; `evals.clustered` reads it too)
EVAL_SEED = 0


def _eval_kwargs(lm: Any, p: Mapping[str, Any], prompts: list[str]) -> dict:
    from sinklib.adapt.pairs import sink_settings
    from sinklib.evals import counts

    return dict(eval_n=counts(p), seed=EVAL_SEED, prompts=prompts, vqa_n=p["vqa_n"], eval_batch_size=p["eval_batch_size"],
                sink_kwargs=sink_settings(lm.model, p["last_k_layers"], p["max_tokens"]))


def params_at(lm: Any, p: Mapping[str, Any], recipe: Mapping[str, Any], seed: int, lr: float | None) -> dict:
    """The pair parameters of `lm` at training seed `seed` under chapter 11's parameters `p` and `recipe`, at the
    rate `lr` (None: the model's rate under p['lr_rule'])."""
    return panel_params(lm.name, lm.weights_sha256, recipe, seed, image_size=p["image_size"],
                        stage1_steps=p["stage1_steps"], batch_size=p["batch_size"], lr_projector=p["lr_projector"],
                        schedule=p["schedule"], lr_rule=p.get("lr_rule", "frozen"), lr=lr)


def _chosen(out: Mapping[str, Any], name: str) -> float | None:
    from sinklib.adapt import ratechoice

    return ratechoice.chosen(out["walks"][name])


def _walk(lm: Any, p: Mapping[str, Any], recipe: Mapping[str, Any], seed: int, base: Callable[[], dict],
          low: bool, kw: Mapping[str, Any], out: dict) -> dict:
    """One model's rate walk (`ratechoice.walk`): at each rate its VL job first (the training, which must finish
    within one session, before the base evaluation), then its base evaluation; the chosen (or last) rate's pair
    becomes the panel's. -> that rate's pair parameters."""
    from sinklib.adapt import ratechoice

    name, made = lm.name, {}

    def run_at(rate: float) -> tuple[dict, dict]:
        pp = made[rate] = params_at(lm, p, recipe, seed, rate)
        ev = run_condition(lm, pp, "vl", base, low_memory=low, progress=p["show_progress"], **kw)
        return run_base(lm, pp, base, low_memory=low, key_rate=recipe["lr_lm"], **kw), ev

    tried = ratechoice.walk(name, recipe, run_at, seed=seed, image_size=p["image_size"],
                            start=p.get("grid_start", {}).get(name, 0))
    out["walks"][name] = tried
    out["base"][name], out["evals"][(name, seed, "vl")] = tried[-1]["base"], tried[-1]["vl"]
    return made[tried[-1]["rate"]]


#: a chapter-11 parameter that takes chapter 10's frozen value
FROM_CHAPTER10 = "chapter10"


#: the LoRA recipe chapter 10 froze (full profile, calibrated on SmolLM2) before chapter 11's first job, and on which
#: every job of the book's panel ran: a later rerun of chapter 10 on the same model that chooses another point (its
#: choice rests on paired intervals that another CPU's rounding can move) does not change the panel's design
#: (`recipe_of` keeps this one and `recipe_drift` says what chapter 10 chose instead)
REGISTERED_RECIPE = {"calibrated_on": "smollm2-135m", "lr_lm": 0.002, "stage2_steps": 60, "lm_method": "lora",
                     "lora_rank": 16, "lora_alpha": 32.0,
                     "lora_targets": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}


def recipe_drift(doc10: Mapping[str, Any] | None) -> str:
    """'' when chapter 10's frozen recipe is the registered one (or chapter 10 calibrated another model: another
    design, whose recipe the chapter runs), else what chapter 10 now chooses beside what the panel ran."""
    try:
        now = frozen_recipe(doc10) if doc10 is not None else None
    except ResultsMissing:
        return ""
    if now is None or now["calibrated_on"] != REGISTERED_RECIPE["calibrated_on"] or now == REGISTERED_RECIPE:
        return ""
    diff = ", ".join(f"{k} {now[k]!r} (registered: {REGISTERED_RECIPE[k]!r})" for k in REGISTERED_RECIPE
                     if now.get(k) != REGISTERED_RECIPE[k])
    return (f"chapter 10's rerun now freezes another point for {now['calibrated_on']}: {diff}; the panel keeps the "
            f"registered recipe, on which all its jobs ran")


def recipe_of(doc10: Mapping[str, Any] | None, lr_lm: Any, stage2_steps: Any) -> dict:
    """The recipe the chapter runs: chapter 10's frozen LoRA recipe (`REGISTERED_RECIPE` where chapter 10, rerun on
    the same calibration model, now chooses another point: `recipe_drift`), with `lr_lm` or `stage2_steps` replaced
    where they are numbers (a profile's override, for example the quick profile's few steps; `FROM_CHAPTER10` keeps
    the frozen value). Without chapter 10's results both must be numbers, and the LoRA method is `vl.lora`'s
    default."""
    from sinklib import vl

    needs10 = FROM_CHAPTER10 in (lr_lm, stage2_steps)
    try:
        if doc10 is None:
            raise ResultsMissing("chapter 10's results are needed for its frozen recipe: run "
                                 "notebooks/10_calibration.ipynb first, or give lr_lm and stage2_steps as numbers")
        base = dict(REGISTERED_RECIPE) if recipe_drift(doc10) else frozen_recipe(doc10)
    except ResultsMissing:  # no results, or chapter 10 froze nothing (its quick profile): numbers stand alone
        if needs10:
            raise
        base = {"calibrated_on": None, **vl.check_lm_method("lora").params()}
    out = dict(base)
    if lr_lm != FROM_CHAPTER10:
        out["lr_lm"] = float(lr_lm)
    if stage2_steps != FROM_CHAPTER10:
        out["stage2_steps"] = int(stage2_steps)
    return out


def _params() -> dict:
    from sinklib import vl
    from sinklib.adapt.ratechoice import check_grid_start
    from sinklib.core.models import MODEL_PARAMS
    from sinklib.core.params import COMMON, boolean, choice, integer, list_of, number, text
    from sinklib.core.sink import prompt_count
    from sinklib.evals import COUNT_PARAMS

    def or_ch10(check):
        return lambda name, value: value if value == FROM_CHAPTER10 else check(name, value)

    return {**MODEL_PARAMS, "seeds": list_of(integer(0)), "kinds": list_of(choice(KINDS)),
            "low_memory_models": list_of(text(), min_len=0), "random_scales": list_of(number(0.01, 1000.0), min_len=0), "image_size": lambda _, v: vl.check_image_size(v),
            "stage1_steps": integer(0, 10**6), "batch_size": integer(1, 4096), "lr_projector": number(0.0, 1.0),
            "schedule": choice(vl.SCHEDULES), "lr_lm": or_ch10(number(1e-9, 1.0)), "lr_rule": choice(LR_RULES),
            "grid_start": check_grid_start, "primary_only": boolean(), "sensitivity": boolean(), "stopped_models": list_of(text(), min_len=0),
            "stage2_steps": or_ch10(integer(1, 10**6)), "n_prompts": prompt_count,
            "last_k_layers": integer(1, 1000), "max_tokens": integer(8, 8192), "vqa_n": integer(1, 100_000),
            **COUNT_PARAMS, "eval_batch_size": integer(1, 1024), "show_progress": boolean(), **COMMON}


#: chapter 11's parameters and their checks (`params.validate`)
CHAPTER11_PARAMS = _params()


__all__ = ["MODELS", "KINDS", "PRIMARY", "PHRASING", "LR_RULES", "model_rate", "frozen_recipe", "panel_params",
           "jobs", "checkpointing", "Streamed", "base_source", "run_condition", "run_base", "primary_test",
           "primary_verdict", "primary_sentence", "random_control", "random_control_low", "base_dir", "run_panel",
           "params_at", "FROM_CHAPTER10", "recipe_of", "CHAPTER11_PARAMS"]
