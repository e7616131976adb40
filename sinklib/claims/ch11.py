"""Chapter 11's four-model panel as the chapter and the claims page show it: the pairs (`sinklib.adapt.panelrows`:
changes pooled over the training seeds, the precondition) as tables and sentences, and the primary test over the
pairs that pass (`sinklib.adapt.primary.primary_test`). The panel itself is run by
`sinklib.adapt.fourpanel.run_panel`."""
from __future__ import annotations

import math

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from sinklib.adapt.panelrows import METRICS, condition_name, outcomes_doc, pair_rows, records  # noqa: F401
from sinklib.adapt.primary import PRIMARY, primary_test
from sinklib.adapt.calibrate import rate as rate_text
from sinklib.claims.ch11controls import controls_lines, uncontrolled
from sinklib.core.numbers import interval

def display(rows: pd.DataFrame):
    """`pair_rows` as the chapter shows it: one column per model (so that the table fits the page), each change
    'v [lo, hi]' in points; a quantity no model has (a control not run yet) is left out."""
    from sinklib.plots import Table

    def cell(e) -> str:
        return "-" if e is None else interval(e.v, e.lo, e.hi)

    shown = pd.DataFrame({"model": rows.model, "S (base)": [f"{x:+.3f}" for x in rows.S], "seeds": rows.seeds,
                          "VQA %": [f"{v:.1f} (maj. {mj:.0f})" for v, mj in zip(rows.VQA, rows.majority)],
                          "learned": ["yes" if x else "no" for x in rows.learned],
                          **{c: [cell(e) for e in rows[c]] for c in rows.columns if ":" in c},
                          "in the primary test": ["yes" if x else "no: precondition failed" for x in rows.precondition]})
    shown = shown.loc[:, [c for c in shown.columns if not (shown[c] == "-").all()]]  # controls not run yet
    one = bool((rows.seeds == 1).all())
    how = ("the first training seed only (interim look), 95 % intervals resampling the items" if one else
           "pooled over the training seeds, 95 % intervals resampling the items and the seeds")
    return Table(shown.set_index("model").T, f"One column per model: changes from its base model (points), {how}; "
                                             "VQA against the blind majority answer (Wilson); rows of controls not "
                                             "run yet are left out")


def precondition_sentence(row: Mapping[str, Any]) -> str:
    """Why one pair of `pair_rows` is in or out of the primary test, with its numbers."""
    k = row["VL: knowledge acc"]
    task = (f"VQA {row['VQA']:.1f} % against the blind majority's {row['majority']:.1f} % "
            f"({'learned' if row['learned'] else 'not learned'} at every seed)" if row["learned"] else
            f"VQA {row['VQA']:.1f} % against the blind majority's {row['majority']:.1f} % (not learned)")
    know = "knowledge not measured" if k is None else (f"knowledge {interval(k.v, k.lo, k.hi)} points "
                                                        f"({'held' if not k.hi < 0 else 'fell'})")
    return f"{row['model']}: {task}; {know}"


def primary_of(rows: pd.DataFrame) -> dict:
    """`primary_test` over the models whose precondition holds (their VL change of the primary metric, pooled)."""
    ok = rows[rows.precondition]
    t = primary_test(dict(zip(ok.model, ok.S)), {m: e.v for m, e in zip(ok.model, ok["VL: " + PRIMARY])})
    return {**t, "of": len(rows)}



def random_rows(panel: Mapping[str, Any], first_seed: int, models: list[str]) -> pd.DataFrame:
    """One row per model of chapter 11's random control: VL's next-token KL from the base model, the size (times
    VL's norm) at which the random control matches it, and at that size the random control's paired change of the
    primary metric from base and from the VL model of the first seed ('not run in this run' where the model had no
    random job, 'no size measured matches VL' where none matched)."""
    from sinklib.evals.paired import paired_changes

    rows = []
    for m in models:
        r = panel.get("random", {}).get(m)
        row: dict = {"model": m, "VL KL (nats/position)": r["kl"]["vl"]["kl"] if r else float("nan"),
                     "KL-matched size": r["size"] if r else None}
        ev = r["evaluation"] if r else None
        vl_ev = panel["evals"].get((m, first_seed, "vl"))
        for label, ref in (("random minus base", panel["base"].get(m)), ("random minus VL", vl_ev)):
            ch = [c for c in paired_changes(ref, ev) if c["metric"] == PRIMARY] if ev and ref else []
            row[f"{label}: {PRIMARY}"] = (ch[0]["change"], ch[0]["lo"], ch[0]["hi"]) if ch else None
        row["note"] = ("not run in this run" if r is None else "no size measured matches VL" if ev is None else "")
        rows.append(row)
    return pd.DataFrame(rows)



def panel_rows(rows: pd.DataFrame, qk_norm: Mapping[str, str]) -> list[dict]:
    """Chapter 11's pairs as chapter 5 reads them (`adapt.scores.panel_row`, the schema of chapter 4's rows, saved under
    `PANEL_KEYS['lora']`, apart from chapter 4's full fine-tunes): base S, QK-norm type and each metric's VL change
    pooled over the training seeds, named as chapter 11's, for the pairs whose precondition holds."""
    from sinklib.adapt.scores import panel_row

    out = []
    for _, r in rows[rows.precondition].iterrows():
        row = panel_row(r.model, r.S, qk_norm[r.model], {m: r[f"VL: {m}"].v for m in METRICS if r[f"VL: {m}"] is not None})
        row.update({"pair": f"{r.model}+VL through LoRA (this book, ch. 11)",
                    "vlm": f"{r.model} adapted through LoRA by sinklib.vl", "source": "measured: notebook 11"})
        out.append(row)
    return out


def machines(panel: Mapping[str, Any]) -> dict:
    """Where the panel's evaluations ran (`cache.machine` as each evaluation recorded it) and which read weights
    rebuilt from a LoRA record or retrained from a carried log instead of trained on the same machine:
    {'evaluations', 'unrecorded', 'machines': {boot: cpu}, 'rebuilt': [job], 'not bit-identical': [job]}."""
    evs = {("base", m): ev for m, ev in panel["base"].items()}
    evs.update({tuple(job): ev for job, ev in panel["evals"].items()})
    evs.update({("random", m): r["evaluation"] for m, r in panel["random"].items() if r.get("evaluation")})
    tags = {job: ev.get("machine") for job, ev in evs.items()}
    made = {job: (ev.get("note") or {}).get("weights") for job, ev in evs.items()}
    return {"evaluations": len(evs), "unrecorded": sum(t is None for t in tags.values()),
            "machines": {t["boot"]: f"{t['cpu']}, {t['cores']} cores" for t in tags.values() if t},
            "rebuilt": [" ".join(map(str, j)) for j, w in made.items() if w],
            "not bit-identical": [" ".join(map(str, j)) for j, w in made.items() if w and not w["bit_identical"]]}


def machines_sentence(m: Mapping[str, Any]) -> str:
    """`machines` in words, for the chapter's note on where it ran."""
    kinds = sorted(set(m["machines"].values()))
    n, unrec = m["evaluations"], m["unrecorded"]
    if m["machines"]:
        one = len(m["machines"]) == 1
        out = (f"the {n - unrec} evaluations that recorded their machine ran on {len(m['machines'])} "
               f"machine{'' if one else 's'} ({'; '.join(kinds)})"
               + (f"; {unrec} were computed before sinkbook recorded the machine" if unrec else ""))
    else:
        out = f"the {n} evaluations do not record their machine (computed before sinkbook recorded it)"
    if m["rebuilt"]:
        bad = m["not bit-identical"]
        out += (f"; {len(m['rebuilt'])} read a snapshot trained on another machine and rebuilt or retrained here "
                f"({', '.join(m['rebuilt'])}), " + (f"{len(bad)} of them not bit-identical to the first training: "
                                                    f"{', '.join(bad)}" if bad else "every one bit-identical"))
    elif unrec:
        out += "; every evaluation that recorded its machine read weights trained on that machine"
    else:
        out += "; every evaluation read weights trained on the machine that evaluated them"
    return out


def _change_words(e) -> str:
    if e is None:
        return "not measured"
    where = ("a loss beyond the paired noise" if e.hi < 0 else "a gain beyond the paired noise" if e.lo > 0 else
             "within the paired noise")
    return f"{interval(e.v, e.lo, e.hi)} points ({where})"


def left_out_sentence(rows: pd.DataFrame) -> str:
    """The pairs of `pair_rows` left out by their precondition, each with why and its numbers ('none')."""
    return "; ".join(precondition_sentence(r) for _, r in rows[~rows.precondition].iterrows()) or "none"


_ANSWER = {"reproduced": "Yes: the higher a base model's S, the less strict instruction format its VL model lost",
           "contradicted": "The opposite of the paper: the higher a base model's S, the more strict instruction format "
                           "its VL model lost",
           "inconclusive": "The panel cannot say: the losses are not ordered by S more closely than chance "
                           "orderings often are",
           "not tested": "The panel could not ask it: too few pairs passed their preconditions"}


def findings(rows: pd.DataFrame, primary: Mapping[str, Any], rates: Mapping[str, float | None] | None = None, *,
             interim: bool = False, second_rate: float | None = None,
             sensitivity: tuple[pd.DataFrame, Mapping[str, Any]] | None = None,
             frozen: pd.DataFrame | None = None, by_type: str | None = None,
             typed: Mapping[str, Any] | None = None, orderings: str | None = None,
             rnd: pd.DataFrame | None = None) -> str:
    """What the panel found, in words with its numbers, for the end of the chapter: the answer to the chapter's
    question, the primary test's outcome by the book's rule (`fourpanel.primary_verdict`, labelled an interim look
    when `interim`), each pair in order of base S (its rate where the design chose one, its VL change of strict
    instructions, its knowledge change, in or out of the test), the outcome of predictions 2, 3 and 6 of section
    11.1 (6's rates against `second_rate`), prediction 1 at the frozen rate (`frozen`: the pre-registered design's
    rows) and at the chosen ones, the controls against predictions 4 and 5 (`ch11controls.controls_lines`; `rnd`:
    `random_rows`), and the sensitivity analysis
    (`sensitivity`: its pair rows and primary test) with prediction 7, and the intervals with the instruction
    types resampled (`by_type`: `sinklib.evals.clustered.sentence`; `typed`: {model: Est} of the same, which the
    count of losses leads with), and how firm the order by S is (`orderings`: `ordering_sentence`). Markdown, one
    bullet per finding."""
    from sinklib.adapt.fourpanel import primary_sentence, primary_verdict

    v = primary_verdict(primary)
    look = " (interim look: the first training seed only)" if interim else ""
    out = [f"- **Does a higher base S go with a smaller VL loss of strict instruction format?** {_ANSWER[v.outcome]}"
           f"{look}.", f"- The primary test: {primary_sentence(primary)}."]
    out += [_pair_line(r, rates) for _, r in rows.sort_values("S", ascending=False).iterrows()]
    tested = rows[rows.precondition]
    falls = [m for m, e in zip(tested.model, tested["VL: " + PRIMARY]) if e is not None and e.hi < 0]
    k, n = len(falls), len(tested)
    if not n:
        out.append("- No pair passed its preconditions, so predictions 2, 3 and 6 of section 11.1 cannot be judged.")
    else:
        named = f" ({', '.join(falls)})" if falls else ""
        p3 = ("could not be judged (the test did not run)" if v.outcome == "not tested" else
              f"is not judged: with {n} pairs no ordering can reach p < 0.05, so it could not fail"
              if primary["p_min"] > 0.05 else "held" if v.outcome == "inconclusive" else "failed")
        if v.outcome == "inconclusive" and second_rate is not None:
            p3 += " (in the main design it could end only inconclusive or contradicted, section 11.1)"
        out.append(f"- Against the predictions of section 11.1 (written for item-level intervals): fine-tuning in "
                   f"the VL recipe{_typed_count(typed, tested)} lowered strict format beyond the item-level paired "
                   f"noise in {k} of the {n} tested pairs{named}{uncontrolled(rows)}, so prediction 6's (at most "
                   f"two) {'held' if k <= 2 else 'failed'}; "
                   f"prediction 2 (at least three of four, least in the 1.5B model) was written for the frozen rate "
                   f"and cannot be judged as written; at the chosen rates it would have {'held' if k >= 3 else 'failed'}"
                   f"{_largest_loss(tested)}; prediction 3 (the primary test inconclusive) {p3}."
                   + _rates_line(rates, second_rate))
    out += _prediction1_line(frozen, rows) + controls_lines(rows, rnd)
    if orderings:
        out.append(f"- **How firm the order by S is** (a description: the rule reads S as measured): {orderings}.")
    if sensitivity is not None:
        out.append(_sensitivity_line(*sensitivity))
    if by_type:
        out.append(f"- **Items or instruction types** (a check added after the interim look; it changes no verdict): "
                   f"{by_type}.")
    return "\n".join(out)


def _typed_count(typed: Mapping[str, Any] | None, tested: pd.DataFrame) -> str:
    """How many tested pairs lost strict format beyond the noise with the instruction types resampled, first."""
    from sinklib.evals.clustered import has_interval

    es = [typed[m] for m in tested.model if has_interval((typed or {}).get(m))]
    return (f", with the instruction types resampled, lowered strict format beyond the noise in "
            f"{sum(e.hi < 0 for e in es)} of {len(es)} tested pairs; item by item it") if es else ""


def _largest_loss(tested: pd.DataFrame, model: str = "qwen2.5-coder-1.5b") -> str:
    """Where prediction 2's 'least in the 1.5B model' stands: the rank of `model`'s loss among the tested pairs."""
    ch = {m: e.v for m, e in zip(tested.model, tested["VL: " + PRIMARY]) if e is not None}
    if model not in ch:
        return ""
    rank = sorted(ch, key=ch.get).index(model) + 1
    return f" ({model}'s change is the {_ORDINAL.get(rank, f'{rank}th ')}largest loss of {len(ch)})"


_ORDINAL = {1: "", 2: "second ", 3: "third ", 4: "fourth "}


def _prediction1_line(frozen: pd.DataFrame | None, rows: pd.DataFrame) -> list[str]:
    """Prediction 1 (every model learns the task and keeps its knowledge) at the frozen rate (`frozen`: the
    pre-registered design's pair rows) and at the chosen rates."""
    if frozen is None or not len(frozen):
        return []
    bad = list(frozen.model[~frozen.precondition])
    ok = int(rows.precondition.sum())
    return [f"- Prediction 1 (every model learns the image task and keeps its knowledge) "
            f"{'failed' if bad else 'held'} at the frozen rate ({', '.join(bad) or 'every model passed'}"
            f"{' did not' if bad else ''}; the pre-registered design's jobs, section 11.1); at the rates this design "
            f"chose, {ok} of {len(rows)} pairs passed."]


def _pair_line(r, rates) -> str:
    rate = (rates or {}).get(r.model, "absent")
    at = "" if rate == "absent" else (" at no rate of the grid" if rate is None else f" at rate {rate_text(rate)}")
    return (f"- {r.model} (base S {r.S:+.3f}){at}: strict instructions {_change_words(r['VL: ' + PRIMARY])}, "
            f"knowledge {_change_words(r['VL: knowledge acc'])}; "
            + ("in the test" if r.precondition else f"left out ({precondition_sentence(r)})") + ".")


def _rates_line(rates, second_rate) -> str:
    """Prediction 6's rates: both Qwen models chosen at the grid's second rate."""
    qwen = {m: r for m, r in (rates or {}).items() if m.startswith("qwen2.5-coder")}
    if second_rate is None or not qwen:
        return ""
    ok = all(r is not None and math.isclose(r, second_rate) for r in qwen.values())
    said = ", ".join(f"{m} {'no rate' if r is None else rate_text(r)}" for m, r in qwen.items())
    return (f" The rates chosen ({said}) {'agree with' if ok else 'differ from'} prediction 6's "
            f"(both at {rate_text(second_rate)}).")


def _sensitivity_line(rows: pd.DataFrame, primary: Mapping[str, Any]) -> str:
    """The sensitivity analysis (every model at one rate) in words, with prediction 7 judged."""
    from sinklib.adapt.fourpanel import primary_sentence, primary_verdict

    v = primary_verdict(primary)
    first = rows.sort_values("S", ascending=False).iloc[0] if len(rows) else None
    e = None if first is None else first["VL: " + PRIMARY]
    held = (first is not None and bool(first.precondition) and e is not None and e.lo <= 0 <= e.hi
            and v.outcome == "inconclusive")
    pair = "" if first is None else (f" {first.model}, the highest-S model, at that rate: strict instructions "
                                     f"{_change_words(e)}, {'in' if first.precondition else 'left out of'} the test.")
    return (f"- **Sensitivity analysis** (every model at one rate): {primary_sentence(primary, bounds=False)}.{pair} "
            f"Prediction 7 (it passes, its format change within the noise, the test inconclusive) "
            f"{'held' if held else 'failed'}.")


__all__ = ["findings", "left_out_sentence", "machines", "machines_sentence", "precondition_sentence", "panel_rows", "random_rows", "METRICS", "condition_name", "outcomes_doc", "pair_rows", "display", "primary_of"]


def rows_of(pairs: list[dict]) -> pd.DataFrame:
    """Saved pair rows (the results' 'pairs': each change as [v, lo, hi]) back as `pair_rows` rows (changes as
    `Est`), for the claims page and the bottom line."""
    from sinklib.stats.verdicts import Est

    rows = pd.DataFrame(pairs)
    for c in [c for c in rows.columns if ":" in c]:
        rows[c] = [None if v is None else Est(*v) for v in rows[c]]
    return rows


#: the primary test's outcome, as the first words of a sentence that gives its numbers
_ORDER = {"reproduced": "Base S ordered the losses as the paper predicts",
          "contradicted": "Base S ordered the losses opposite to the paper's prediction",
          "inconclusive": "The panel cannot say whether base S orders the losses",
          "not tested": "Whether base S orders the losses could not be tested"}


def short_summary(rows: pd.DataFrame, primary: Mapping[str, Any], rates: Mapping[str, float | None], *,
                  interim: bool = False, sensitivity: tuple[pd.DataFrame, Mapping[str, Any], float] | None = None,
                  by_type: Mapping[str, Any] | None = None, minus: str = "-") -> str:
    """The panel in a few sentences, for the top of the chapter and the landing page: how many tested pairs lost
    strict instructions beyond the paired noise (with their changes and rates), the primary test, the highest-S
    model at the sensitivity analysis's common rate (`sensitivity`: its rows, primary test and rate) when the main
    design trained it at another, how many of the losses stay outside the noise when the instruction types are
    resampled instead of the items (`by_type`: {model: Est}, `sinklib.evals.clustered`), and whether this is the
    interim look. `minus`: the claims pages' '−'."""
    from sinklib.adapt.primary import primary_verdict
    from sinklib.core.numbers import signed
    from sinklib.evals.clustered import has_interval

    rate = rate_text
    iv = lambda e: interval(e.v, e.lo, e.hi, minus=minus)  # noqa: E731
    at = lambda m: f" at rate {rate(rates[m])}" if (rates or {}).get(m) else ""  # noqa: E731
    tested = rows[rows.precondition]
    lost = [(r.model, r["VL: " + PRIMARY]) for _, r in tested.iterrows()
            if r["VL: " + PRIMARY] is not None and r["VL: " + PRIMARY].hi < 0]
    said = "; ".join(f"{m} {iv(e)} points{at(m)}" for m, e in lost)
    v = primary_verdict(primary)
    out = [f"VL adaptation through LoRA lowered strict instruction format, against each base model, beyond the "
           f"paired noise in {len(lost)} of the {len(tested)} tested pairs" + (f" ({said})" if lost else "")
           + ", each model at a rate of a fixed grid chosen by whether it learned the image task and kept its "
           "knowledge; whether the image or the fine-tuning itself costs it is the text-only control's question "
           "(section 11.5).",
           f"{_ORDER[v.outcome]}: " + (f"Spearman ρ {signed(primary['rho'], 2, minus)} over {primary['n']} pairs, "
                                        f"one-sided exact p {primary['p']:.3f} ({v.outcome})." if primary["n"] >= 3
                                        else f"{v.why}.")]
    typed = [(m, by_type[m]) for m, _ in lost if has_interval((by_type or {}).get(m))]
    if typed:
        kept = sum(e.hi < 0 for _, e in typed)
        said = (f"this loss {'stays' if kept else 'does not stay'}" if len(typed) == 1 else
                f"{kept} of these {len(typed)} losses {'stays' if kept == 1 else 'stay'}")
        out.insert(1, f"Resampling the suite's instruction types instead of its items (when a model changes, the items "
                      f"of one type tend to change together), {said} outside the noise ("
                      + "; ".join(f"{m} {iv(e)}" for m, e in typed) + ").")
    if sensitivity is not None and len(tested):
        s_rows, s_primary, common = sensitivity
        top = tested.sort_values("S").iloc[-1]
        same = s_rows[s_rows.model == top.model]
        if len(same) and (rates or {}).get(top.model) and not math.isclose(rates[top.model], common):
            e = same.iloc[0]["VL: " + PRIMARY]
            where = "within the paired noise" if e.lo <= 0 <= e.hi else "beyond the paired noise"
            out.append(f"{top.model}, the model with the highest S, trained at {rate(rates[top.model])}; at "
                       f"{rate(common)}, "
                       f"the one rate the sensitivity analysis gives every model, its change was {iv(e)} points "
                       f"({where}) and ρ {signed(s_primary['rho'], 2, minus)}, one-sided p {s_primary['p']:.3f}: "
                       "the two analyses differ only in this model's rate.")
    if interim:
        out.append("This is an interim look: the first training seed only, the controls not run yet.")
    return " ".join(out)


def primary_table(rows: pd.DataFrame, rates: Mapping[str, float], S2: Mapping[str, float] | None, title: str):
    """What a primary test reads, one row per pair in order of base S: base S (and chapter 2's, `S2`, when it is
    given because it differs), the rate, the VL changes of strict instructions and knowledge, in the test or not."""
    from sinklib.plots import Table

    r = rows.sort_values("S", ascending=False)
    cell = lambda e: "-" if e is None else interval(e.v, e.lo, e.hi)  # noqa: E731
    shown = pd.DataFrame({"model": r.model, "base S": [f"{x:+.3f}" for x in r.S],
                          **({"S (chapter 2)": [f"{S2[m]:+.3f}" if m in S2 else "-" for m in r.model]} if S2 else {}),
                          "rate": [rate_text(rates[m]) for m in r.model],
                          "strict instructions, VL change (pt)": [cell(e) for e in r["VL: " + PRIMARY]],
                          "knowledge, VL change (pt)": [cell(e) for e in r["VL: knowledge acc"]],
                          "in the test": ["yes" if x else "no: precondition failed" for x in r.precondition]})
    same = "" if S2 else "; base S as this chapter's base evaluation measures it (equal to chapter 2's to 3 decimals)"
    return Table(shown.set_index("model"), f"{title}: in order of base S{same}; the paper predicts the smallest "
                                           "loss at the top")


def s_orderings(S: Mapping[str, float], margins: list[Mapping[str, Any]]) -> list[tuple[str, ...]]:
    """The orderings of the models of `S` (highest first) that chapter 2's S allows within its own noise: a pair
    whose margin never changed sign over chapter 2's calibration sets, its (N, seed) cells (`margins`: its
    'robustness_margins' rows, a, b, 'sign flips'), keeps its order; a pair whose margin flipped may come either
    way."""
    from itertools import permutations

    fixed = {(r["a"], r["b"]) if S[r["a"]] > S[r["b"]] else (r["b"], r["a"]) for r in margins
             if r["a"] in S and r["b"] in S and not r["sign flips"]}
    return [o for o in permutations(sorted(S, key=S.get, reverse=True))
            if all(o.index(a) < o.index(b) for a, b in fixed)]


def ordering_sentence(rows: pd.DataFrame, margins: list[Mapping[str, Any]], *, name_flips: bool = True) -> str:
    """How the primary test on `rows` (the pairs that pass) would come out over every ordering of S within chapter
    2's noise (`s_orderings`): which pairs may swap (unless not `name_flips`), the range of rho and the outcomes. A
    description: the verdict rule reads S as measured."""
    from collections import Counter

    from sinklib.adapt.primary import primary_verdict

    ok = rows[rows.precondition]
    S = dict(zip(ok.model, ok.S))
    change = {m: e.v for m, e in zip(ok.model, ok["VL: " + PRIMARY])}
    if len(S) < 3:
        return "not computed (fewer than three pairs in the test)"
    flips = [f"{r['a']} above {r['b']}, the order measured, holds in {'only ' * (2 * r['sign flips'] > r['cells'])}"
             f"{r['cells'] - r['sign flips']} of {r['cells']} (N, seed) cells" for r in margins
             if r["a"] in S and r["b"] in S and r["sign flips"]]
    tests = [primary_test({m: -o.index(m) for m in o}, change) for o in s_orderings(S, margins)]
    rhos = [t["rho"] for t in tests]
    outcomes = Counter(primary_verdict(t).outcome for t in tests)
    said = ", ".join(f"{k} in {n}" for k, n in outcomes.most_common())
    head = f"the pairs whose S ordering flips across chapter 2's calibration sets: {'; '.join(flips) or 'none'}; " \
        if name_flips else ""
    return (f"{head}over the {len(tests)} orderings of S they allow, rho ranges from {min(rhos):+.2f} to "
            f"{max(rhos):+.2f} and the outcome would be {said}")


def calibration_sentence(doc10: Mapping[str, Any], rows: pd.DataFrame, recipe: Mapping[str, Any]) -> str:
    """The calibration model's strict instruction change at the frozen LoRA point in chapter 10 beside its change
    here (same nominal recipe, other training questions), or '' when either is missing."""
    m = recipe.get("calibrated_on")
    pts = [p for p in ((doc10.get("results") or {}).get("lora_sweep") or {}).get(m, [])
           if math.isclose(p["lr_lm"], recipe["lr_lm"]) and p["steps"] == recipe["stage2_steps"]]
    here = rows[rows.model == m]
    if not pts or not len(here) or here.iloc[0]["VL: " + PRIMARY] is None:
        return ""
    p, e = pts[0], here.iloc[0]["VL: " + PRIMARY]
    return (f"On {m}, the model chapter 10 calibrated on, the same nominal recipe (rate {rate_text(recipe['lr_lm'])}, "
            f"{recipe['stage2_steps']} steps) changed strict instructions by "
            f"{interval(p[PRIMARY], p[PRIMARY + ' lo'], p[PRIMARY + ' hi'])} points in chapter 10 (VQA {p['VQA']:.1f} %) "
            f"and by {interval(e.v, e.lo, e.hi)} here (VQA {here.iloc[0].VQA:.1f} %): the training questions differ "
            "(here in the field phrasing of section 11.2), so the frozen dose is not the same dose here")


def design_texts(recipe: Mapping[str, Any], S2: Mapping[str, float], models: list[str], stage1_steps: int,
                 batch_size: int) -> dict[str, str]:
    """The numbers section 11.1 quotes, as {glue name: text}: the recipe, chapter 2's S, what three and four pairs
    can show (a perfect ordering, one neighbouring swap), the rate grid and the common rate."""
    from sinklib.adapt.ratechoice import common_rate, rate_grid

    r4, r3 = dict(enumerate(range(4))), dict(enumerate(range(3)))
    return {"p11_recipe": f"LoRA rank {recipe['lora_rank']} (alpha {recipe['lora_alpha']:g}, on "
                          f"{', '.join(recipe['lora_targets'])}) at stage-2 rate {rate_text(recipe['lr_lm'])} for "
                          f"{recipe['stage2_steps']} steps after {stage1_steps} projector steps, batch {batch_size}"
                          + (f", frozen by chapter 10 on {recipe['calibrated_on']}" if recipe["calibrated_on"] else ""),
            "p11_pmin": f"{primary_test(r4, r4)['p']:.3f}",
            "p11_pswap": f"{primary_test(r4, {0: 0, 1: 2, 2: 1, 3: 3})['p']:.3f}",
            "p11_S_ch2": ", ".join(f"{m} {S2[m]:+.3f}" for m in models if m in S2),
            "p11_pmin3": f"{primary_test(r3, r3)['p']:.3f}",
            "p11_grid": ", ".join(rate_text(r) for r in rate_grid(recipe)),
            "p11_common_rate": rate_text(common_rate(recipe))}


def stopped_texts(rows_stopped: Mapping[str, pd.DataFrame], recipe: Mapping[str, Any]) -> dict[str, str]:
    """What section 11.4 and the design box say of the two stopped designs, as {glue name: text}: each one's
    primary test and the pairs it left out ('not run in this profile' where it was not rerun), Gemma-3's amended
    rate, the knowledge the frozen rate cost Qwen2.5-Coder-0.5B and Gemma-3, and Qwen2.5-Coder-0.5B's strict
    instruction change there (seen before the second amendment was written)."""
    from sinklib.adapt.fourpanel import model_rate
    from sinklib.adapt.primary import primary_sentence

    out = {"p11_gemma_rate": rate_text(model_rate("gemma3-270m", recipe, "recipe-scaled"))}
    for rule, tag in (("frozen", "pre"), ("recipe-scaled", "am1")):
        r = rows_stopped.get(rule)  # absent in a profile that does not rerun this book's stopped designs (colab)
        out[f"p11_primary_{tag}"] = "not run in this profile" if r is None else primary_sentence(primary_of(r),
                                                                                                 bounds=False)
        out[f"p11_left_out_{tag}"] = "none" if r is None else left_out_sentence(r)
    q = rows_stopped["frozen"].set_index("model") if "frozen" in rows_stopped else pd.DataFrame()
    for tag, m in (("qwen", "qwen2.5-coder-0.5b"), ("gemma", "gemma3-270m")):
        out[f"p11_{tag}_knowledge"] = (f"{-q.loc[m, 'VL: knowledge acc'].v:.1f}" if m in q.index else
                                       "many (this book's run; not rerun in this profile)")
    e = q.loc["qwen2.5-coder-0.5b", "VL: " + PRIMARY] if "qwen2.5-coder-0.5b" in q.index else None
    out["p11_qwen_strict"] = ("not measured in this profile" if e is None else
                              f"{interval(e.v, e.lo, e.hi)} points")
    return out
