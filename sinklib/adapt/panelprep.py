"""Fill chapter 11's cache job by job: ``python -m sinklib.adapt.panelprep --profile full [--primary-only]``.

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


def subset(p: dict, *, models: list[str] | None = None, seeds: list[int] | None = None) -> dict:
    """The chapter's parameters with only `models` and `seeds` (None: all), in the chapter's order; a name or seed
    the chapter does not have is a clear error (a job outside the chapter's design would fill the cache for
    nothing)."""
    from sinklib.errors import ParameterError

    out = dict(p)
    for key, want in (("models", models), ("seeds", seeds)):
        if want is None:
            continue
        bad = [w for w in want if w not in p[key]]
        if bad:
            raise ParameterError(f"panelprep: --{key} {bad} is not among chapter 11's {key} {p[key]}")
        out[key] = [x for x in p[key] if x in want]
    return out


def main(argv: list[str] | None = None) -> int:
    from sinklib.adapt import fourpanel
    from sinklib.book.results import load_results

    ap = argparse.ArgumentParser(description="fill chapter 11's cache job by job (the primary test's jobs first)")
    ap.add_argument("--profile", default="full")
    ap.add_argument("--primary-only", action="store_true", help="only base and VL at the first seed of each model")
    ap.add_argument("--models", nargs="+", help="only these of the chapter's models (to fit a job into what is left "
                    "of a session: the 1.5B model's VL job alone takes about 2.5-3 h)")
    ap.add_argument("--seeds", nargs="+", type=int, help="only these of the chapter's training seeds")
    ap.add_argument("--lr-rule", choices=fourpanel.LR_RULES, help="another design's rates (for example "
                    "'common-rate', the sensitivity analysis); default: the chapter's lr_rule")
    args = ap.parse_args(argv)
    from sinklib.book.carry import import_committed

    import_committed()   # what earlier machines finished (the checkout's carried/)
    p = subset(chapter_params(args.profile), models=args.models, seeds=args.seeds)
    if args.lr_rule:
        p["lr_rule"] = args.lr_rule
    recipe = fourpanel.recipe_of(load_results("10_calibration"), p["lr_lm"], p["stage2_steps"])
    print(f"chapter 11 ({args.profile}, {p['lr_rule']}): models {', '.join(p['models'])}, seeds {p['seeds']}, "
          f"recipe {recipe}",
          flush=True)
    fourpanel.run_panel(p, recipe, primary_only=args.primary_only or p["primary_only"],
                        log=lambda m: print(m, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
