"""Chapter 8's mass-matched control, matched in the evaluation's own measurement.

`sinklib.causal.matched.match_plans` searches the control's knob x on the suites' inputs (without the tokens the
model then generates, with no padding), and the evaluation measures the removed mass again on everything it runs
(prompts, generated tokens, padded batches). The two measurements differ: in the session-48 run the control
matched within 0.025 on the inputs and then removed 0.067-0.090 more mass than the sink heads in every
evaluation below dose 1, so by the chapter's rule it was not tested there.

This module closes the loop. After the dose-response is evaluated, each matched dose outside the tolerance gets
a corrected search target on the inputs: the sink condition's mass in the evaluation minus the control's gap
between the evaluation and the inputs at its last knob,

    target' = sink_eval - (matched_eval(x) - matched_inputs(x)),

the knob is searched again for target' (`search_to`), and the control is evaluated again; at most `ROUNDS`
rounds. Only the evaluation's measurement decides (`matched.flag`, the tolerance written before the run): a dose
still outside it after the last round is not tested, as before. Each round's search and evaluation is cached, so
the rounds cost one evaluation of the matched control per dose that needs one. `history` keeps every round for
the page.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sinklib.causal import matched
from sinklib.causal.suites import dose_response
from sinklib.core.cache import cached_json, key as cache_key
from sinklib.core.params import check_float, check_int
from sinklib.errors import ParameterError

#: corrected searches after the first evaluation, at most (each costs one evaluation per dose that needs it)
ROUNDS = 2


#: the corrected search's bisection steps and its precision (a share of the tolerance); both in its cache key
SEARCH_STEPS, SEARCH_PRECISION = 10, 0.25


def search_to(model, seqs: Sequence[Sequence[int]], mass, layers: Sequence[int], top: Mapping[int, Sequence[int]],
              target: float, *, tolerance: float = matched.TOLERANCE, steps: int = SEARCH_STEPS,
              pad_id: int = 0) -> dict:
    """The matched control's knob x whose removed mass on `seqs` (`matched.removed_mass`, in units of the sink
    heads' k) is nearest `target`, searched as `matched.match_control` does (whole added heads, then bisection,
    the last head partial), to within a quarter of `tolerance`. -> {'heads', 'take', 'extra', 'x', 'target',
    'achieved'}."""
    target = check_float("target", target, 0.0)
    k = sum(len(v) for v in top.values())
    extras = matched.candidate_heads(mass, layers, top)

    def f(x: float) -> float:
        h, t = matched.knob_plan(top, extras, x)
        return matched.removed_mass(model, seqs, h, k, mode="remove_matched", take=t, pad_id=pad_id)

    x = matched._search(f, target, len(extras), 2 * SEARCH_PRECISION * tolerance, steps)  # stops within it
    heads, take = matched.knob_plan(top, extras, x)
    return {"heads": heads, "take": take, "extra": sum(map(len, heads.values())) - k, "x": x, "target": target,
            "achieved": f(x)}


def eval_masses(table) -> dict[float, dict[str, float]]:
    """{dose: {control: removed mass}} as the evaluation measured it (`dose_response`'s table of one model)."""
    out: dict[float, dict[str, float]] = {}
    for r in table.drop_duplicates(["dose", "control"]).itertuples():
        out.setdefault(float(r.dose), {})[r.control] = float(r.mass_removed)
    return out


def corrected_targets(plans: Sequence[Mapping], table, tolerance: float = matched.TOLERANCE) -> dict[float, float]:
    """{dose: corrected search target} for each matched row of `plans` whose evaluation is outside `tolerance` of
    the sink condition's (see the module's docstring); the target is never below 0."""
    ev = eval_masses(table)
    out = {}
    for p in plans:
        d = float(p["dose"])
        if p["control"] != "matched" or "match" not in p or "sink" not in ev.get(d, {}) or "matched" not in ev[d]:
            continue
        sink, got = ev[d]["sink"], ev[d]["matched"]
        if abs(got - sink) > tolerance:
            out[d] = max(0.0, sink - (got - float(p["match"]["achieved"])))
    return out


def rematch_plans(lm: Any, plans: Sequence[Mapping], targets: Mapping[float, float], mass, layers: Sequence[int],
                  seqs: Sequence[Sequence[int]], *, tolerance: float = matched.TOLERANCE, round_: int = 1) -> list[dict]:
    """`plans` with each matched row whose dose is in `targets` searched again for its target (`search_to`, cached
    under `causal/`); 'match' gains 'round' and keeps the first search's target as 'target_first'."""
    seqs = [[int(t) for t in s] for s in seqs]
    pad = getattr(lm.tokenizer, "pad_token_id", None) or 0
    out = []
    for p in plans:
        p = dict(p)
        d = float(p["dose"])
        if p["control"] == "matched" and d in targets:
            top = {int(l): list(hs) for l, hs in p["top"].items()} if "top" in p else None
            if top is None:
                raise ParameterError("rematch_plans needs the plans from `match_in_evaluation` (each matched row keeps "
                                 "its sink heads as 'top')")
            key = {"kind": "matched control, corrected", "model": lm.name, "weights": lm.weights_sha256,
                   "version": matched.MATCH_VERSION, "heads": {str(l): sorted(h) for l, h in sorted(top.items())},
                   "seqs": cache_key({"seqs": seqs}), "layers": list(layers), "target": round(float(targets[d]), 6),
                   "mass": np.round(np.asarray(mass, dtype=float), 6).tolist(), "tolerance": float(tolerance),
                   "steps": SEARCH_STEPS, "precision": SEARCH_PRECISION}

            def compute(top=top, target=targets[d]) -> dict:
                r = search_to(lm.model, seqs, mass, layers, top, target, tolerance=tolerance, pad_id=pad)
                return {**r, "heads": {str(l): h for l, h in r["heads"].items()},
                        "take": {str(l): {str(h): s for h, s in t.items()} for l, t in r["take"].items()}}

            r = cached_json(key, compute, folder="causal")
            p["heads"] = {int(l): list(h) for l, h in r["heads"].items()}
            p["take"] = {int(l): {int(h): float(s) for h, s in t.items()} for l, t in r["take"].items()}
            first = p["match"].get("target_first", p["match"]["target"])
            p["match"] = {**{k: r[k] for k in ("extra", "x", "target", "achieved")}, "target_first": first,
                          "round": round_}
        out.append(p)
    return out


def match_in_evaluation(lm: Any, plans: Sequence[Mapping], mass, layers: Sequence[int],
                        seqs: Sequence[Sequence[int]], *, eval_n: Mapping[str, int], seed: int = 0,
                        eval_batch_size: int = 8, tolerance: float = matched.TOLERANCE, rounds: int = ROUNDS,
                        log=None) -> tuple[Any, dict, list[dict]]:
    """`causal.dose_plans` rows matched on `seqs` (`matched.match_plans`), evaluated (`dose_response`), and each
    matched dose outside the tolerance searched again and re-evaluated, at most `rounds` times.
    -> (the final dose-response table, its results, history: one row per matched dose and round {model, dose,
    round, x, extra heads, target on the inputs, removed on the inputs, removed in evaluation, sink in
    evaluation, difference, within})."""
    rounds = check_int("rounds", rounds, 0, 10)
    tops = {float(p["dose"]): p["heads"] for p in plans if p["control"] == "matched"}
    plans = [{**p, "top": tops[float(p["dose"])]} if p["control"] == "matched" else dict(p)
             for p in _each(lm.name, plans, lambda one: matched.match_plans(lm, None, one, mass, layers,
                                                                            tolerance=tolerance, seqs=seqs),
                            set(tops))]
    history: list[dict] = []
    for r in range(rounds + 1):
        table, results = dose_response(lm, plans, eval_n=eval_n, seed=seed, eval_batch_size=eval_batch_size,
                                       log=log, tolerance=tolerance)
        history += _history(lm.name, plans, table, tolerance, r)
        targets = corrected_targets(plans, table, tolerance) if r < rounds else {}
        if not targets:
            break
        if log:
            log(f"{lm.name}: matched control outside the tolerance at dose(s) {sorted(targets)}; round {r + 1}")
        plans = _each(lm.name, plans, lambda one: rematch_plans(lm, one, targets, mass, layers, seqs,
                                                                tolerance=tolerance, round_=r + 1), set(targets))
    return table, results, history


def _each(name: str, plans: Sequence[Mapping], step, doses: set[float]) -> list[dict]:
    """`step` applied to one plan at a time, the searches of the matched rows at `doses` reported on the progress
    side channel (`sinklib.core.progress`: each search takes minutes and writes nothing else)."""
    from sinklib.core import progress

    searched = [p["control"] == "matched" and float(p["dose"]) in doses for p in plans]
    n, done, out = sum(searched), 0, []
    for p, searching in zip(plans, searched):
        if searching:
            progress.report(f"{name}: matching the control's mass", done, n)
            done += 1
        out += step([p])
    return out


def _history(model: str, plans: Sequence[Mapping], table, tolerance: float, round_: int) -> list[dict]:
    ev = eval_masses(table)
    rows = []
    for p in plans:
        d = float(p["dose"])
        if p["control"] != "matched" or "match" not in p or p["match"].get("round", 0) != round_:
            continue
        got, sink = ev.get(d, {}).get("matched", float("nan")), ev.get(d, {}).get("sink", float("nan"))
        rows.append({"model": model, "dose": d, "round": round_, "x": round(float(p["match"]["x"]), 4),
                     "extra heads": int(p["match"]["extra"]), "target on the inputs": float(p["match"]["target"]),
                     "removed on the inputs": float(p["match"]["achieved"]), "removed in evaluation": got,
                     "sink in evaluation": sink, "difference": got - sink, "within": bool(abs(got - sink) <= tolerance)})
    return rows


#: the rounds table's columns as a page shows them (short enough for the 688 px text column); the mass the search
#: reached on the inputs is left out (`input_gap` says how close to its target it came; the evaluation's mass decides)
ROUND_COLUMNS = {"extra heads": "added", "target on the inputs": "target (inputs)",
                 "removed in evaluation": "removed (eval.)", "sink in evaluation": "sink (eval.)",
                 "difference": "diff."}
ROUND_HIDDEN = ("removed on the inputs",)


def rounds_display(rounds: Sequence[Mapping]):
    """`match_in_evaluation`'s rounds as a page shows them: one row per (model, dose, round), to 3 decimals, with
    the short column names of `ROUND_COLUMNS`, without `ROUND_HIDDEN`, 'within' as yes / no."""
    import pandas as pd

    shown = pd.DataFrame(rounds).set_index(["model", "dose", "round"]).round(3)
    if "within" in shown:
        shown["within"] = ["yes" if w else "no" for w in shown["within"]]
    return shown.drop(columns=[c for c in ROUND_HIDDEN if c in shown.columns]).rename(columns=ROUND_COLUMNS)


def input_gap(rounds: Sequence[Mapping]) -> float:
    """The largest |target - removed| on the suites' inputs over `rounds` (how close each search came to its
    target; NaN without rounds)."""
    gaps = [abs(float(r["target on the inputs"]) - float(r["removed on the inputs"])) for r in rounds]
    return max(gaps) if gaps else float("nan")
