"""Chapter 11's second amendment (session 42): each model's stage-2 rate chosen by the preconditions alone.

The pre-registered design trained all four models at chapter 10's frozen LoRA rate; two of the first three were
destroyed by it (their VL models did not learn the image task and lost a third of their knowledge items). The
second amendment keeps the recipe and chooses each model's rate from a fixed descending grid (`rate_grid`: the
frozen rate, then each time times `STEP`, 1/5, the ratio of the two full fine-tune rates chapter 4 used) by walking
it from the top (`walk`): the first rate at which the model's VL model, at the first training seed, passes the
primary test's preconditions (`passes`: the image task learned and knowledge held, decided by
`sinklib.adapt.panelrows.pair_rows`, the rule every pair of the panel is judged by). The format outcome plays no part in
the choice; that does not make the choice neutral about the loss (a model that takes a larger rate may lose more
format), which the sensitivity analysis (`common_rate`: every model at the grid's second rate) checks.
A model may start lower in the grid (`grid_start`) where a walk from the top would repeat a failure already seen;
the chapter says which and why.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sinklib.core.params import check_int
from sinklib.errors import ParameterError
from sinklib.core.numbers import interval

#: how many rates the grid has (the frozen rate and two steps down)
GRID_POINTS = 3
#: the step down the grid, frozen in session 42 as the ratio of the two full fine-tune rates chapter 4 used
#: (Gemma-3's 1e-5 over SmolLM2's 5e-5), applied as multiply-then-divide, as `fourpanel.model_rate` scaled
#: Gemma-3's rate, so the grid's second rate is that float; literals, so that editing `vl.MODEL_RATES` cannot move it
STEP = (1e-5, 5e-5)
#: the grid index every model trains at in the sensitivity analysis (lr_rule 'common-rate', session 43)
COMMON_INDEX = 1


def rate_grid(recipe: Mapping[str, Any], n: int = GRID_POINTS) -> list[float]:
    """The descending grid of stage-2 rates: the recipe's frozen rate, then each previous rate times `STEP`
    (multiply by 1e-5, then divide by 5e-5), so the grid's second rate is the very float the first amendment gave
    Gemma-3."""
    n = check_int("n", n, 1, 10)
    out = [float(recipe["lr_lm"])]
    while len(out) < n:
        out.append(out[-1] * STEP[0] / STEP[1])
    return out


def common_rate(recipe: Mapping[str, Any]) -> float:
    """The sensitivity analysis's one rate for every model: the grid's second (`COMMON_INDEX`)."""
    return rate_grid(recipe)[COMMON_INDEX]


def check_grid_start(name: str, value: Any) -> dict:
    """`grid_start`: {model: index of the grid rate its walk starts at}; a clear error otherwise."""
    if not isinstance(value, Mapping):
        raise ParameterError(f"{name} must be a mapping of model names to grid indices (0 is the frozen rate), "
                             f"got {value!r}")
    return {str(m): check_int(f"{name}[{m!r}]", i, 0, GRID_POINTS - 1) for m, i in value.items()}


def passes(name: str, base: Mapping[str, Any], vl_eval: Mapping[str, Any], seed: int, image_size: int) -> bool:
    """Whether one model's VL evaluation at one seed passes the primary test's preconditions against its base
    evaluation: `sinklib.adapt.panelrows.pair_rows` on a panel of that one pair, so the walk and the panel's table
    apply the same rule."""
    from sinklib.adapt.panelrows import pair_rows

    rows = pair_rows({"base": {name: base}, "evals": {(name, seed, "vl"): vl_eval}}, seed, image_size)
    return bool(rows.precondition.iloc[0])


def walk(name: str, recipe: Mapping[str, Any], run_at: Callable[[float], tuple[dict, dict]], *, seed: int,
         image_size: int, start: int = 0) -> list[dict]:
    """Walk the grid for one model from index `start` down: `run_at(rate)` returns (base evaluation, VL evaluation)
    at that rate (cached or run); the walk stops at the first rate whose pair `passes`. -> one row per rate tried:
    {'model', 'rate', 'grid index', 'passes', 'base', 'vl'}; the last row passes, or none does (the grid ran out)."""
    grid = rate_grid(recipe)
    start = check_int("grid start", start, 0, len(grid) - 1)
    tried = []
    for i, rate in enumerate(grid[start:], start):
        base, ev = run_at(rate)
        ok = passes(name, base, ev, seed, image_size)
        tried.append({"model": name, "rate": rate, "grid index": i, "passes": ok, "base": base, "vl": ev})
        if ok:
            break
    return tried


def chosen(tried: list[dict]) -> float | None:
    """The rate a walk chose (its last row's, when that row passes), or None when no rate of the grid passed."""
    return tried[-1]["rate"] if tried and tried[-1]["passes"] else None


def walk_rows(walks: Mapping[str, list[dict]], seed: int, image_size: int) -> list[dict]:
    """The walks as table rows: model, rate, VQA against the majority, the knowledge change with its interval,
    the strict instruction change (shown, not used by the choice), whether the pair passes and whether it was
    chosen."""
    from sinklib.adapt.calibrate import rate
    from sinklib.adapt.primary import PRIMARY
    from sinklib.adapt.panelrows import pair_rows

    out = []
    for name, tried in walks.items():
        for t in tried:
            r = pair_rows({"base": {name: t["base"]}, "evals": {(name, seed, "vl"): t["vl"]}}, seed,
                          image_size).iloc[0]
            k, f = r["VL: knowledge acc"], r["VL: " + PRIMARY]
            out.append({"model": name, "rate": rate(t["rate"]), "VQA (%)": round(r.VQA, 1),
                        "majority (%)": round(r.majority, 1), "learned": "yes" if r.learned else "no",
                        "knowledge change (pt)": interval(k.v, k.lo, k.hi),
                        "passes": "yes" if t["passes"] else "no",
                        "chosen": "yes" if t is tried[-1] and t["passes"] else "",
                        "strict instructions change (pt, not used)": interval(f.v, f.lo, f.hi)})
    return out


__all__ = ["GRID_POINTS", "STEP", "COMMON_INDEX", "rate_grid", "common_rate", "check_grid_start", "passes", "walk", "chosen", "walk_rows"]
