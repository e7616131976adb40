"""Fill chapter 11's cache job by job: ``python -m sinklib.adapt.panelprep --profile full [--primary-only |
--all-jobs] [--models ...] [--seeds ...] [--kinds ...] [--stage1-only]``.

The four-model panel takes about 7 hours for its primary test and about 23 for everything on the 2-core machine
(DEVELOPING.md), longer than a working session. This command runs `fourpanel.run_panel` with the chapter's own
parameters (the notebook's parameters cell under the profile, and chapter 10's frozen recipe from its results),
so every training and evaluation lands in the cache under the keys the chapter uses; a job that was stopped is
started again, a finished one is read. Run it with nothing else on the cores (DEVELOPING.md: the shared-cores
pitfall), then carry the finished evaluations to the next machine with ``python -m sinklib.book.carry export``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

CHAPTER = "11_four_panel"


def chapter_params(profile: str = "full", root: Path | None = None) -> dict:
    """Chapter 11's parameters on `profile` (the notebook's parameters cell, the profile's values over it),
    checked by `fourpanel.CHAPTER11_PARAMS`."""
    from sinklib.adapt.fourpanel import CHAPTER11_PARAMS
    from sinklib.book.prep import notebook_params

    return notebook_params(CHAPTER, profile, CHAPTER11_PARAMS, root)


def subset(p: dict, *, models: list[str] | None = None) -> dict:
    """The chapter's parameters with only `models` (None: all), in the chapter's order; a name the chapter does
    not have is a clear error (a job outside the chapter's design would fill the cache for nothing)."""
    out = dict(p)
    if models is not None:
        _check("models", models, p["models"])
        out["models"] = [x for x in p["models"] if x in models]
    return out


def job_filter(p: dict, *, seeds: list[int] | None = None, kinds: list[str] | None = None):
    """Which of the chapter's jobs (model, seed, kind) to run: those at `seeds` and of `kinds` (None: all; a kind
    is 'vl', 'text_only' or 'random'); None when both are None. The seeds and kinds are checked against the
    chapter's. It filters jobs, not the chapter's parameters, so each model's VL job at the chapter's first seed
    (its rate walk, cached once run) still comes first, and the random control stays at the first seed."""
    if seeds is None and kinds is None:
        return None
    if seeds is not None:
        _check("seeds", seeds, p["seeds"])
    if kinds is not None:
        _check("kinds", kinds, [*p["kinds"], *(["random"] if p.get("random_scales") else [])])
    return lambda job: (seeds is None or job[1] in seeds) and (kinds is None or job[2] in kinds)


def run_stage1(p: dict, recipe: dict, *, only=None, load=None, log=print) -> list:
    """Stage 1 (the projector, the LM frozen; `sweep.train_stage1`) of every pair that a kept job trains a VL
    snapshot for (its 'vl' and 'random' jobs), trained and cached, and nothing else: a job longer than a session
    (the 1.5B model's VL job, about 3.3 h) is split here, its stage-1 record carried to the next machine
    (``carry export DIR --folders vl --max-mb 12``). Stage 1 does not depend on the stage-2 rates, so the recipe's
    rate keys it; a low-memory model trains under gradient checkpointing, as in its full job. -> the folders."""
    import time

    from sinklib.adapt import fourpanel, sweep
    from sinklib.core.models import load_model

    load = load or (lambda name: load_model(name, device=p["device"]))
    todo = [j for j in fourpanel.jobs(p["models"], p["seeds"], p["kinds"], list(p["models"]))
            if j[2] in ("vl", "random") and (only is None or only(j))]
    pairs = list(dict.fromkeys((name, seed) for name, seed, _ in todo))
    lm, out = None, []
    for name, seed in pairs:
        if lm is None or lm.name != name:
            lm = None  # one model in memory at a time
            lm = load(name)
        pp = fourpanel.params_at(lm, p, recipe, seed, recipe["lr_lm"])
        t0 = time.perf_counter()
        with fourpanel.checkpointing(lm.model, name in p["low_memory_models"]):
            out.append(sweep.train_stage1(lm, pp, progress=p["show_progress"]))
        log(f"stage 1: {name} seed {seed} cached ({time.perf_counter() - t0:.0f} s)")
    return out


def _check(key: str, want: list, have: list) -> None:
    from sinklib.errors import ParameterError

    bad = [w for w in want if w not in have]
    if bad:
        raise ParameterError(f"panelprep: --{key} {bad} is not among chapter 11's {key} {have}")


def main(argv: list[str] | None = None) -> int:
    from sinklib.adapt import fourpanel
    from sinklib.book.results import load_results

    ap = argparse.ArgumentParser(description="fill chapter 11's cache job by job (the primary test's jobs first)")
    ap.add_argument("--profile", default="full")
    look = ap.add_mutually_exclusive_group()
    look.add_argument("--primary-only", action="store_true", help="only base and VL at the first seed of each model")
    look.add_argument("--all-jobs", action="store_true", help="the controls and every seed too, although the "
                      "profile says primary_only (the confirmatory look's jobs, run before the chapter's profile "
                      "changes)")
    ap.add_argument("--models", nargs="+", help="only these of the chapter's models (to fit a job into what is left "
                    "of a session: the 1.5B model's VL job alone takes about 2.5-3 h)")
    ap.add_argument("--seeds", nargs="+", type=int, help="only the jobs at these of the chapter's training seeds "
                    "(each model's VL job at the first seed, its rate walk, runs first in any case: cached once run)")
    ap.add_argument("--kinds", nargs="+", help="only the jobs of these kinds: vl, text_only, random")
    ap.add_argument("--stage1-only", action="store_true", help="only stage 1 of the kept VL and random jobs "
                    "(the projector), cached to be carried (carry export DIR --folders vl --max-mb 12); the rest "
                    "of those jobs runs from it later, on any machine that imports it")
    ap.add_argument("--lr-rule", choices=fourpanel.LR_RULES, help="another design's rates (for example "
                    "'common-rate', the sensitivity analysis); default: the chapter's lr_rule")
    args = ap.parse_args(argv)
    from sinklib.book.carry import import_committed

    import_committed()   # what earlier machines finished (the checkout's carried/)
    from sinklib.errors import ParameterError

    try:
        p = subset(chapter_params(args.profile), models=args.models)
        only = job_filter(p, seeds=args.seeds, kinds=args.kinds)
    except ParameterError as e:
        ap.error(str(e))  # the usage and the message, no traceback
    if args.lr_rule:
        p["lr_rule"] = args.lr_rule
    recipe = fourpanel.recipe_of(load_results("10_calibration"), p["lr_lm"], p["stage2_steps"])
    print(f"chapter 11 ({args.profile}, {p['lr_rule']}): models {', '.join(p['models'])}, seeds {p['seeds']}, "
          f"recipe {recipe}",
          flush=True)
    if args.stage1_only:
        run_stage1(p, recipe, only=only)
        return 0
    primary = args.primary_only or (p["primary_only"] and not args.all_jobs)
    fourpanel.run_panel(p, recipe, primary_only=primary, only=only, log=lambda m: print(m, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
