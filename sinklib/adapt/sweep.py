"""The VL recipe sweep: stage 1 trained once, then stage 2 at each of several learning rates from that same
projector, each point judged by whether the model learned the visual task (held-out VQA against the blind
majority answer) and by how much broad damage it did (knowledge accuracy and perplexity, paired against the
base model on the same items).

Stage 2 of `vl.train_vl` draws its batches from its own item stream with a stage-local step count, and the
projector's initial weights and the encoder come from the seed, so a sweep point at the recipe's own rates is the
recipe's VL model (`point_matches` measures how close). Everything is cached: the stage-1 checkpoint by the
parameters stage 1 depends on (`stage1_dir`), each point's checkpoint by the pair parameters with its rates
(`point_dir`), each evaluation by its key with `KEY_EXTRA`, so no cached evaluation of chapter 4's pairs is
touched.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from sinklib.core import cache
from sinklib import vl
from sinklib.errors import ParameterError
from sinklib.core.params import check_float

#: the pair parameters stage 1 depends on (not the stage-2 rates or length)
STAGE1_KEYS = ("model", "weights", "seed", "image_size", "stage1_steps", "batch_size", "lr_projector", "schedule")
#: joins every sweep evaluation's cache key, so that it never stands for a condition of chapter 4's pairs
KEY_EXTRA = {"sweep": "stage 2 from the cached stage-1 projector"}
#: the suites a sweep point is judged by besides VQA: knowledge and perplexity show broad damage cheaply
SUITES = ("knowledge", "perplexity")


def stage1_dir(params: Mapping[str, Any]) -> Path:
    """Checkpoint folder of the projector after stage 1 (the LM unchanged) for the pair `params` (a pair in the
    'field' phrasing adds its 'phrasing': stage 1 trains on its questions too; the default adds nothing)."""
    keys = STAGE1_KEYS + (("phrasing",) if "phrasing" in params else ())
    return cache.checkpoint_dir(cache.key({**{k: params[k] for k in keys}, "kind": "vl stage 1"}))


def point_params(params: Mapping[str, Any], lr_lm: float, lr_projector_stage2: float | None = None) -> dict:
    """The pair parameters of one sweep point: `params` with the stage-2 LM rate `lr_lm` and the projector's
    stage-2 rate (None: the same as `lr_lm`, the recipe's LLaVA-1.5 rule)."""
    lr_lm = check_float("lr_lm", lr_lm, 0.0, 1.0)
    p2 = lr_lm if lr_projector_stage2 is None else check_float("lr_projector_stage2", lr_projector_stage2, 0.0, 1.0)
    return {**params, "lr_lm": lr_lm, "lr_projector_stage2": p2}


def point_dir(params: Mapping[str, Any]) -> Path:
    """Checkpoint folder of one sweep point (`point_params`): the LM after stage 2 and its projector."""
    return cache.checkpoint_dir(cache.key({**params, "kind": "vl", **KEY_EXTRA}))


def _common(params: Mapping[str, Any], progress: bool) -> dict:
    return dict(batch_size=params["batch_size"], seed=params["seed"], image_size=params["image_size"],
                schedule=params.get("schedule", "constant"), progress=progress,
                phrasing=params.get("phrasing", "question"))


def train_stage1(lm: Any, params: Mapping[str, Any], *, progress: bool = False) -> Path:
    """Train (or find in the cache) stage 1 of the pair `params` from `lm.model`'s base weights; the LM is frozen
    in stage 1, so only the projector changes, and the checkpoint holds the projector without the LM's (base)
    weights. Returns the checkpoint folder. Used by the sweep's points and by every VL training of
    `dose.train_series` (so the panel's rate walk trains stage 1 once per model and seed)."""
    d = stage1_dir(params)
    if cache.checkpoint_exists(d):
        return d
    res = vl.train_vl(lm.model, lm.tokenizer, stage1_steps=params["stage1_steps"], stage2_steps=0,
                      lr_projector=params["lr_projector"], lr_lm=0.0, lr_projector_stage2=0.0,
                      **_common(params, progress))
    cache.save_checkpoint(d, lm.model, res.projector, res.encoder, weights=False,
                          meta={"kind": "vl stage 1", "seconds": res.seconds, "history": res.history})
    return d


def train_point(lm: Any, params: Mapping[str, Any], *, progress: bool = False) -> Path:
    """Stage 2 of one sweep point (`point_params`) from the cached stage-1 projector, on `lm.model`'s base
    weights (cached; a point carried without its weights is retrained when they are first read). `lm.model` ends
    holding the base weights again."""
    d = point_dir(params)
    if cache.checkpoint_exists(d):
        if not cache.weights_present(d):
            base = vl.clone_state_dict(lm.model)
            cache.defer_weights(d, lambda: (lm.model.load_state_dict(base, strict=True),
                                            _train_point(lm, params, d, progress)))
        return d
    _train_point(lm, params, d, progress)
    return d


def _train_point(lm: Any, params: Mapping[str, Any], d: Path, progress: bool) -> None:
    base = vl.clone_state_dict(lm.model)
    try:  # stage 1 trains the projector only: the LM's weights are the base ones the model holds
        ck = vl.load_checkpoint(train_stage1(lm, params, progress=progress), lm.model, weights=False)
        res = vl.train_vl(lm.model, lm.tokenizer, stage1_steps=0, stage2_steps=params["stage2_steps"],
                          lr_projector=params["lr_projector"], lr_lm=params["lr_lm"],
                          lr_projector_stage2=params["lr_projector_stage2"], encoder=ck.encoder,
                          projector=ck.projector, **_common(params, progress), **vl.lm_method_of(params).params())
        if cache.checkpoint_exists(d):
            cache.fill_weights(d, lm.model)
        else:
            cache.save_checkpoint(d, lm.model, res.projector, res.encoder,
                                  meta={"kind": "vl sweep point", "seconds": res.seconds, "history": res.history,
                                        "params": dict(params)})
    finally:
        lm.model.load_state_dict(base, strict=True)
        lm.model.eval()


def point_matches(lm: Any, params: Mapping[str, Any], vl_state: Mapping[str, Any] | Callable[[], Mapping[str, Any]],
                  vl_path: str | Path | None = None) -> float:
    """Largest absolute weight difference between a trained sweep point and a VL state of the same recipe (0.0:
    the sweep reproduced it); `vl_state` may be a function that returns it, and with `vl_path` (its checkpoint)
    the result is cached (`cache.state_gap`). `lm.model` is not changed."""
    return cache.state_gap(point_dir(params), lm.model, vl_state, vl_path)


def point_name(lr_lm: float) -> str:
    """The condition name of a sweep point: 'lr_lm 5e-05'."""
    return f"lr_lm {check_float('lr_lm', lr_lm, 0.0, 1.0):g}"


def run(lm: Any, params: Mapping[str, Any], lrs: Sequence[float], *, eval_n: Mapping[str, int], seed: int,
        prompts: list[str], sink_kwargs: Mapping[str, Any], vqa_n: int, eval_batch_size: int = 8,
        progress: bool = False) -> dict[str, dict]:
    """Train and evaluate every sweep point of one model: {'base': evaluation, point_name(lr): evaluation} with
    the suites of `SUITES` (sizes from `eval_n`), S and, for the points, held-out VQA; cached. The base is
    evaluated under the sweep's key too (the same items)."""
    from sinklib.adapt.pairs import LazyStates, Pair, evaluate_condition

    if not lrs:
        raise ParameterError("parameter 'lrs' is empty; give the stage-2 learning rates to sweep, e.g. [1e-5, 5e-5]")
    n = {s: int(eval_n[s]) for s in SUITES if s in eval_n}
    kw = dict(eval_n=n, seed=seed, prompts=prompts, sink_kwargs=sink_kwargs, eval_batch_size=eval_batch_size,
              key_extra=KEY_EXTRA)
    base = vl.clone_state_dict(lm.model)
    out = {"base": evaluate_condition(lm, Pair(params=dict(params), states={"base": base}, projector=None,
                                               encoder=None), "base", **kw)}
    for lr in lrs:
        pp = point_params(params, lr)
        d = train_point(lm, pp, progress=progress)
        ck = vl.load_checkpoint(d, lm.model, weights=False)  # the weights are read only if not evaluated yet
        states = LazyStates({"base": base})
        states.defer("vl", lambda d=d: cache.load_state(d, lm.model))
        one = Pair(params=pp, states=states, projector=ck.projector, encoder=ck.encoder)
        out[point_name(lr)] = evaluate_condition(lm, one, "vl", vqa_n=vqa_n, **kw)
    return out


def table(results: Mapping[str, Mapping[str, dict]], *, seed: int, image_size: int,
          recipe: Mapping[str, float] | None = None) -> pd.DataFrame:
    """One row per model and sweep point: VQA with its Wilson interval against the majority baseline ('learned':
    the interval lies above it), the paired knowledge and perplexity changes from base with their intervals, S,
    and 'recipe' (the point is the model's recipe rate in `recipe` {model: lr_lm}). results: {model: `run`}."""
    from sinklib.evals import paired

    rows = []
    for m, res in results.items():
        b = res["base"]
        for name, ev in res.items():
            if name == "base":
                continue
            lr = float(name.split(" ", 1)[1])
            row = {"model": m, "lr_lm": lr, "recipe": bool(recipe and abs(recipe.get(m, -1) - lr) < 1e-15)}
            row.update({f"VQA {k}" if k != "learned" else "learned": v
                        for k, v in vl.against_majority(*ev["vqa"], seed, image_size).items()})
            for r in paired.paired_changes(b, ev, seed=seed):
                if r["metric"] in ("knowledge acc", "perplexity ppl"):
                    short = r["metric"].split(" ")[0]
                    row.update({f"{short} change": r["change"], f"{short} lo": r["lo"], f"{short} hi": r["hi"]})
            row["S"] = ev["S"]
            rows.append(row)
    return pd.DataFrame(rows).sort_values(["model", "lr_lm"], kind="stable").reset_index(drop=True)


def learned_at(learned: Sequence[float], swept: Sequence[float]) -> str:
    """'learned the task at 2 of the 3 rates swept (1e-05, 5e-05; not at 0.0001)': which stage-2 rates taught the
    visual task, in words ('at all 3 rates swept (...)' or 'at the only rate swept (...)'); `learned` is not empty."""
    ok, rest = [f"{x:g}" for x in learned], [f"{x:g}" for x in swept if x not in set(learned)]
    n = len(list(swept))
    if n == 1:
        return f"learned the task at the only rate swept ({ok[0]})"
    if not rest:
        return f"learned the task at all {n} rates swept ({', '.join(ok)})"
    return (f"learned the task at {len(ok)} of the {n} rates swept ({', '.join(ok)}; not at "
            f"{', '.join(rest[:-1]) + (' or ' if len(rest) > 1 else '') + rest[-1]})")


def sentence(t: pd.DataFrame) -> str:
    """Per model: the rates whose VL model learned the task, and among those the one with the smallest knowledge
    loss (its VQA and paired knowledge change)."""
    from sinklib.adapt.pairs import interval_cell

    parts = []
    for m, g in t.groupby("model", sort=False):
        ok = g[g.learned]
        if ok.empty:
            parts.append(f"{m}: no swept rate learned the task (VQA interval above the majority answer)")
            continue
        best = ok.loc[ok["knowledge change"].idxmax()]
        text = (f"{m}: {learned_at(list(ok.lr_lm), list(g.lr_lm))}; the least knowledge lost at {best.lr_lm:g} "
                f"(VQA {best['VQA vqa']:.1f} % vs majority {best['VQA majority']:.1f} %, knowledge "
                f"{interval_cell(best['knowledge change'], best['knowledge lo'], best['knowledge hi'])} pt)")
        edge = ("smallest" if best.lr_lm == g.lr_lm.min() else "largest" if best.lr_lm == g.lr_lm.max() else "")
        if edge and len(g) > 1:
            text += (f", the {edge} rate swept (the edge of the grid), so a "
                     f"{'smaller' if edge == 'smallest' else 'larger'} rate, not tried, might lose less")
        rec = g[g.recipe]
        if len(rec) and not bool(rec.iloc[0].recipe and rec.iloc[0].lr_lm == best.lr_lm):
            r = rec.iloc[0]
            text += (f", where the recipe's rate {r.lr_lm:g} reaches VQA {r['VQA vqa']:.1f} % with knowledge "
                     f"{interval_cell(r['knowledge change'], r['knowledge lo'], r['knowledge hi'])} pt and perplexity "
                     f"{r['perplexity change']:+.2f}")
        parts.append(text)
    return "; ".join(parts)


def display(t: pd.DataFrame):
    """`table` as chapter 4 shows it: per model and stage-2 rate, VQA [Wilson 95 %] against the majority answer,
    whether the task was learned, the paired knowledge and perplexity changes [95 %] and S; the recipe's rate
    marked."""
    from sinklib.adapt.pairs import interval_cell
    from sinklib.plots import Table

    rows = [{"model": r.model, "stage-2 lr": f"{r.lr_lm:g}" + (" (recipe)" if r.recipe else ""),
             "VQA % [95 %]": f"{r['VQA vqa']:.1f} [{r['VQA vqa_lo']:.1f}, {r['VQA vqa_hi']:.1f}]",
             "majority %": round(r["VQA majority"], 1), "learned": "yes" if r.learned else "no",
             "knowledge change (pt)": interval_cell(r["knowledge change"], r["knowledge lo"], r["knowledge hi"]),
             "perplexity change": f"{r['perplexity change']:+.2f} [{r['perplexity lo']:+.2f}, {r['perplexity hi']:+.2f}]",
             "S": round(r.S, 3)} for _, r in t.iterrows()]
    return Table(pd.DataFrame(rows).set_index(["model", "stage-2 lr"]),
                 "Stage-2 learning-rate sweep from one cached stage-1 projector: held-out VQA with its Wilson 95 % "
                 "interval against the blind majority answer ('learned': the interval lies above it), and the "
                 "paired changes from the base model [95 % bootstrap] of knowledge accuracy and perplexity.")


def chapter(lm_by: Mapping[str, Any], built: Mapping[str, Any], lrs: Sequence[float], *, seed: int, image_size: int,
            progress: bool = False, **evaluate_kwargs: Any) -> tuple[pd.DataFrame, dict[str, float]]:
    """Chapter 4's sweep for every model of `lm_by` from its pair's parameters (`built[model].params`): (`table`
    with the recipe's rate marked, {model: `point_matches` of the point at the recipe's rates against the pair's VL
    model}, the latter only where the sweep holds that point). `evaluate_kwargs` go to `run`, with
    `last_k_layers` and `max_tokens` in place of `sink_kwargs` (`pairs.per_model_kwargs`)."""
    from sinklib.adapt.pairs import condition_dir, per_model_kwargs

    res, gaps = {}, {}
    for name, lm in lm_by.items():
        b = built[name]
        res[name] = run(lm, b.params, lrs, seed=seed, progress=progress, **per_model_kwargs(lm, evaluate_kwargs))
        own = point_params(b.params, b.params["lr_lm"])
        if own == dict(b.params) and any(abs(float(lr) - own["lr_lm"]) < 1e-15 for lr in lrs):
            gaps[name] = point_matches(lm, own, lambda b=b: b.states["vl"], condition_dir(b.params, "vl"))
    return table(res, seed=seed, image_size=image_size, recipe={n: built[n].params["lr_lm"] for n in lm_by}), gaps
