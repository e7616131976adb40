"""Chapter 6's merges on chapter 11's pairs that lost strict instruction format (`sinklib.adapt.panelpairs`).

Chapter 4's pairs lost nothing outside the noise, so the paper's "no merging setting recovers the VL loss" could not
be tested on them. Here every merge method of chapter 6 is applied to each chosen pair of chapter 11 at every
training seed chapter 11 ran, evaluated with chapter 11's suites and settings (its base and VL evaluations are
chapter 11's own, read from the cache); `sinklib.claims.ch6panel` judges them by chapter 6's rule on the panel's
metric, the strict instruction pass rate, with every change pooled over the seeds (`evals.pooling.pooled`).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sinklib.adapt.primary import PRIMARY

#: the metric the verdicts read: chapter 11's primary one (the paper's IFEval counterpart)
METRICS = (PRIMARY,)


def run(doc11: Mapping[str, Any], names: Sequence[str], methods: Sequence[str], *, device: str = "auto",
        seed: int = 0, log: Callable[[str], None] | None = None) -> dict:
    """Each merge of `methods` of each pair of `names` at each seed chapter 11 ran, evaluated (cached; `seed` draws
    DARE's masks and joins each merge's key). A seed whose evaluations are all cached loads no pair; otherwise the
    pair is loaded once and each merge is made only when its evaluation is missing, then dropped (one merged state
    in memory at a time). -> {'rows': condition rows (model, seed, condition with its seed suffix, scores),
    'outcomes': {model: {condition (`panelpairs.condition`): packed per-item outcomes}}, 'seconds': {model/seed/
    method: merge seconds}, 'same_as_vl': {model: {method: why}} (`same_as_vl`)}."""
    import time

    from sinklib.adapt import panelpairs
    from sinklib.adapt.scores import condition_row
    from sinklib.core.models import load_model
    from sinklib.evals.paired import pack

    rows, outcomes, seconds, same = [], {}, {}, {}
    for name in names:
        lm = load_model(name, device=device)
        first = panelpairs.params_of(doc11, name, doc11["parameters"]["seeds"][0], lm.weights_sha256)
        same[name] = {m: why for m in methods for why in [same_as_vl(m, lm.model, first)] if why}
        for s in panelpairs.seeds_run(doc11):
            conds = [c for c in ["base", "vl", *(f"merge:{m}" for m in methods)]
                     if not (c == "base" and "base" in outcomes.get(name, {}))]  # one base model for every seed
            extra = {c: _key_extra(c, seed) for c in conds}
            evs = {c: panelpairs.cached(lm, doc11, s, c, extra[c]) for c in conds}
            pair = None
            for c in conds:
                t0 = time.perf_counter()
                if evs[c] is None:
                    pair = pair or panelpairs.load(lm, doc11, s)
                    method = c[len("merge:"):] if c.startswith("merge:") else None
                    if method:
                        pair.states.defer(c, _merger(pair, method, seed, seconds, f"{name}/{s}/{method}"))
                    evs[c] = panelpairs.evaluate(lm, pair, doc11, c, key_extra=extra[c])
                    if method:
                        del pair.states[c]
                named = panelpairs.condition(c, s, doc11)
                outcomes.setdefault(name, {})[named] = pack(evs[c]["outcomes"])
                rows.append({**condition_row(name, named, evs[c]), "seed": s})
                if log:
                    log(f"{name} seed {s} {c}: {time.perf_counter() - t0:.0f} s")
            del pair
        del lm
    return {"rows": rows, "outcomes": outcomes, "seconds": seconds, "same_as_vl": same}


def _merger(pair: Any, method: str, seed: int, seconds: dict, label: str) -> Callable[[], dict]:
    """A maker of the merged state (read by the evaluation only when it is not cached), timed into `seconds`."""
    def make() -> dict:
        import time

        from sinklib.controls.merge import merge

        t0 = time.perf_counter()
        out = merge(pair.states["base"], pair.states["vl"], method, seed=seed)
        seconds[label] = time.perf_counter() - t0
        return out
    return make


def _key_extra(cond: str, seed: int) -> dict | None:
    """What joins a merge's evaluation key: its method's settings and the mask seed (base and VL: nothing)."""
    from sinklib.controls.merge import evaluation_extra

    if not cond.startswith("merge:"):
        return None
    return {**evaluation_extra(cond[len("merge:"):]), "merge_seed": seed}


def same_as_vl(method: str, model: Any, params: Mapping[str, Any]) -> str:
    """Why `method` leaves a LoRA pair's VL weights as they are ('' when it changes them): TSV keeps the top
    ceil(rank_fraction x min(m, n)) singular directions of each changed matrix, and a rank-r LoRA change has at
    most r, so where every adapted matrix keeps r or more the merge is the VL model up to rounding."""
    import math

    import torch

    from sinklib.controls.merge import METHODS

    if method != "tsv" or params.get("lm_method") != "lora":
        return ""
    rank, frac = int(params["lora_rank"]), float(METHODS["tsv"].defaults["rank_fraction"])
    targets = set(params["lora_targets"])
    kept = [max(1, math.ceil(frac * min(mod.weight.shape) - 1e-9)) for n, mod in model.named_modules()
            if isinstance(mod, torch.nn.Linear) and n.rsplit(".", 1)[-1] in targets]
    if not kept or min(kept) < rank:
        return ""
    return (f"TSV keeps at least {min(kept)} singular directions of each matrix LoRA changed, whose change has rank "
            f"{rank} at most, so this merge is the VL model up to rounding (nothing to test)")
