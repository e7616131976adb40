"""Chapter 8 in words: its three dose predictions judged against the run, the mass-matched control at dose 1
(outside the primary test, labelled so), and a plain finding for the top of the Summary.
Every direction word follows the intervals of `suites.dose_response`'s table and `specific.contrasts`."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from sinklib.causal.specific import POOLED, outside
from sinklib.causal.suites import falls
from sinklib.controls.sizes import points
from sinklib.causal.cells import digits
from sinklib.core.numbers import interval, signed
from sinklib.core.words import qk_norm_words
from sinklib.evals.paired import paired_changes

PREDICTED_DOSES = (0.5, 0.7)  # the doses the predictions were written for (session 40)
#: the strict-format metrics of the real models' suites (chapter 8's verdicts are about these two)
STRICT_PAIR = ("instructions strict", "math strict")


def _strict(spec, against: str):
    """The contrasts of `spec` (`specific.contrasts`) against one control, on the two strict-format metrics."""
    return spec[(spec.against == against) & spec.metric.isin(STRICT_PAIR)]


def _row(table, model: str, dose: float, control: str, metric: str):
    r = table[(table.model == model) & (table.dose == dose) & (table.control == control) & (table.metric == metric)]
    return None if r.empty else r.iloc[0]


def _cell(r) -> str:
    return interval(r.change, r.lo, r.hi)


def prediction_1(table, models: Sequence[str], doses: Sequence[float] = PREDICTED_DOSES) -> str:
    """(1) strict math falls at the predicted doses under the sink ablation in every model, knowledge does not."""
    bad, cells = [], []
    for m in models:
        for d in doses:
            math, know = _row(table, m, d, "sink", "math strict"), _row(table, m, d, "sink", "knowledge acc")
            if math is None or know is None:
                return "(1) not tested: a predicted dose or suite is missing from this run"
            ok = falls(math.to_dict()) and not falls(know.to_dict())
            cells.append(f"{m} at {d:g}: math {_cell(math)}, knowledge {_cell(know)}")
            bad += [] if ok else [f"{m} at {d:g}"]
    word = "held" if not bad else f"did not hold ({', '.join(bad)})"
    return f"(1) {word}: " + "; ".join(cells)


def prediction_2(spec, doses: Sequence[float] = PREDICTED_DOSES) -> str:
    """(2) the random heads cost less strict format than the sink heads outside the noise (sink minus random below
    zero) at a predicted dose in at least one model."""
    r = spec[(spec.against == "random") & spec.dose.isin(list(doses)) & spec.metric.isin(["instructions strict",
                                                                                         "math strict"])]
    if not len(r):
        return "(2) not tested: no sink-minus-random contrast at the predicted doses"
    below = r[r.hi < 0]
    lo, hi = r["sink minus control"].min(), r["sink minus control"].max()
    if len(below):
        where = ", ".join(f"{m} {mt} at {d:g}" for m, mt, d in zip(below.model, below.metric, below.dose))
        return f"(2) held: the sink heads cost more strict format than as many random heads in {where}"
    return (f"(2) did not hold: in none of the {len(r)} strict-format contrasts at dose "
            f"{' and '.join(f'{d:g}' for d in doses)} did the sink heads cost more than as many random heads outside "
            f"the noise (sink minus random from {lo:+.1f} to {hi:+.1f} points); the random heads also removed less "
            "attention mass, so even a difference would not have isolated the sink")


def prediction_3(spec, table, doses: Sequence[float] = PREDICTED_DOSES) -> str:
    """(3) the mass-matched control costs about as much as the sink ablation (within the noise)."""
    r = spec[(spec.against == "matched") & spec.dose.isin(list(doses))]
    if not len(r):
        return "(3) not tested: no matched control at the predicted doses"
    t = r[r.tested]
    if not len(t):
        m = table[(table.control == "matched") & table.dose.isin(list(doses))]
        diff = m.groupby(["model", "dose"]).mass_diff.first() if "mass_diff" in m else []
        span = (f" (it removed {min(diff):+.3f} to {max(diff):+.3f} of the sink condition's mass per query)"
                if len(diff) else "")
        return ("(3) not tested: at the predicted doses the matched control's removed mass was outside the "
                f"tolerance in every model{span}")
    inside = t[(t.lo <= 0) & (t.hi >= 0) & t.metric.isin(STRICT_PAIR)]
    s = t[t.metric.isin(STRICT_PAIR)]
    word = "held" if len(inside) == len(s) else "did not hold"
    more, less = outside(s)
    way = (f"; the matched control cost more in {len(less)} (sink minus matched from "
           f"{less['sink minus control'].min():+.1f} to {less['sink minus control'].max():+.1f} points)"
           if len(less) else "") + (f"; less in {len(more)}" if len(more) else "")
    return f"(3) {word}: {len(inside)} of {len(s)} tested strict-format contrasts inside the noise{way}"


def matched_at_full(results: Mapping[str, Mapping], table, models: Sequence[str], seed: int = 0,
                    metrics: Sequence[str] = ("instructions strict", "math strict", "knowledge acc")):
    """Sink minus matched at dose 1, paired on the items, for the models whose matched control is within the
    tolerance there (`matched_ok`): the one dose where the mass is matched. Not part of the pre-registered test
    (which used the doses below 1); a page shows it labelled as a look added after the run."""
    import pandas as pd

    rows = []
    for m in models:
        ok = table[(table.model == m) & (table.dose == 1.0) & (table.control == "matched")]
        res = results.get(m, {})
        if ok.empty or not bool(ok.matched_ok.iloc[0]) or (1.0, "sink") not in res or (1.0, "matched") not in res:
            continue
        for ch in paired_changes(res[(1.0, "matched")], res[(1.0, "sink")], seed=seed):
            if ch["metric"] in metrics:
                rows.append({"model": m, "metric": ch["metric"], "sink minus matched": ch["change"], "lo": ch["lo"],
                             "hi": ch["hi"], "p": ch["p"]})
    return pd.DataFrame(rows, columns=["model", "metric", "sink minus matched", "lo", "hi", "p"])


def dose1_sentence(full, table=None, brief: bool = False) -> str:
    """`matched_at_full` in words: where the same attention mass taken from other keys cost more (or less) than
    taking it from the sink (`brief`: without the intervals, models with the same answer together). `table` (the
    dose-response rows) tells an empty `full` apart: dose 1 not run with the matched control, or outside its
    tolerance there."""
    if not len(full):
        if table is not None and not len(table[(table.dose == 1.0) & (table.control == "matched")]):
            return "this run has no matched control at dose 1, so nothing compares it with the sink there"
        return "at dose 1 the matched control is outside its tolerance, so nothing compares it with the sink there"
    parts = []
    for m, g in full.groupby("model", sort=False):
        cells = ", ".join(f"{mt} {interval(v, lo, hi)}" for mt, v, lo, hi in
                          zip(g.metric, g["sink minus matched"], g.lo, g.hi))
        more = (g.lo > 0).sum()
        less = (g.hi < 0).sum()
        how = ("removing the sink cost less than taking the same mass from other keys" if more and not less else
               "removing the sink cost more than taking the same mass from other keys" if less and not more else
               "neither cost more outside the noise" if not more and not less else "the metrics disagree")
        parts.append((m, how, cells))
    if brief:
        hows = {}
        for m, how, _ in parts:
            hows.setdefault(how, []).append(m)
        return "; ".join(f"in {' and '.join(ms)}, {how}" for how, ms in hows.items())
    return "; ".join(f"{m}: {how} (sink minus matched: {cells})" for m, how, cells in parts)


def fell_metrics(table, models: Sequence[str]) -> tuple[set[str], set[str]]:
    """The strict metrics that fell under the sink ablation at any dose, and those of them whose lenient grading
    fell too."""
    if table is None or not len(table):
        return set(), set()
    t = table[(table.control == "sink") & table.model.isin(list(models))]
    fell = {mt for mt in ("instructions strict", "math strict")
            if any(falls(r) for r in t[t.metric == mt].to_dict("records"))}
    lenient = {mt for mt in fell if any(falls(r) for r in t[t.metric == mt.replace("strict", "lenient")]
                                        .to_dict("records"))}
    return fell, lenient


def detectable(churned, metric: str, models: Sequence[str]) -> str:
    """' (not detected: ...)' for a score that never fell: the smallest fall its suite detects with 80 % power at the
    churn the ablations caused (`sinklib.causal.churn.observed` rows), per model; empty without churn rows."""
    if churned is None or not len(churned):
        return ""
    fall = "smallest fall at that churn (pt)"
    r = churned[(churned.metric == metric) & churned.model.isin(list(models))]
    if not len(r):
        return ""
    parts = [f"{points(v)} points" + (f" in {m}" if len(r) > 1 else "") for m, v in zip(r.model, r[fall])]
    return f" (the smallest fall detected four times in five at the churn the ablations caused: {', '.join(parts)})"


def which_fell(table, models: Sequence[str], churned=None) -> str:
    """Which strict metrics fell under the sink ablation at any dose (with, for one that never fell, the smallest
    fall it could detect: `detectable`), and whether their lenient grading fell as far (then the fall is in the
    skill, not only its format)."""
    fell, lenient = fell_metrics(table, models)
    if not fell:
        return ""
    never = sorted({"instructions strict", "math strict"} - fell)
    words = f"What fell was {' and '.join(sorted(fell))}" + "".join(
        f"; {n} never fell{detectable(churned, n, models)}" for n in never)
    if lenient:
        words += (f", and {' and '.join(sorted(m.replace('strict', 'lenient') for m in lenient))} fell with it, "
                  "so the loss is in the task itself, not only in its format")
    return words + "."


def _matched_below_one(spec, out: list[str]) -> tuple[int, int]:
    """Adds to `out` the mass-matched control's strict-format contrasts below dose 1 (sink minus matched), where it
    was within its tolerance; returns (contrasts where the sink cost more outside the noise, tested contrasts)."""
    r = _strict(spec, "matched")
    if not len(r):
        return 0, 0
    t = r[r.tested]
    if not len(t):
        out.append("The mass-matched control was outside its tolerance at every dose below 1, so it tests nothing "
                   "there.")
        return 0, 0
    more, less = outside(t)
    out.append(f"Against the same attention mass taken from other keys (the matched control, within its tolerance "
               f"in {len(t)} of {len(r)} strict-format contrasts below dose 1): the sink heads cost more outside the "
               f"noise in {len(more)} and less in {len(less)}" + (f" ({_listed(less)})" if len(less) else "") + ".")
    return len(more), len(t)


def _listed(rows, most: int = 2) -> str:
    """Contrasts (sink minus control) in words: each of them up to `most`, else their range and the largest."""
    cells = [f"{m} {mt} at {d:g}: {interval(v, lo, hi)}" for m, mt, d, v, lo, hi in
             zip(rows.model, rows.metric, rows.dose, rows["sink minus control"], rows.lo, rows.hi)]
    if len(cells) <= most:
        return ", ".join(cells)
    v = rows["sink minus control"]
    return (f"sink minus control from {signed(v.min())} to {signed(v.max())} points; the largest, "
            f"{cells[int(v.values.argmax())]}")


def _pooled_sentence(spec, out: list[str]) -> None:
    """Adds to `out` the sink heads against every random head set of a dose pooled (`specific.POOLED`, a look added
    after session 48's run, which drew one random set per dose), on strict format, where the run has it."""
    r = _strict(spec, POOLED)
    if not len(r):
        return
    more, less = outside(r)
    out.append(f"Pooled over {int(r.draws.max())} random head sets per dose (added after the previous run, which drew "
               f"one), the sink heads cost more strict format outside the noise in {len(more)} of {len(r)} contrasts"
               + (f" and less in {len(less)}" if len(less) else "") + ".")


def _random_sentence(spec, out: list[str]):
    """Adds to `out` the sink heads against as many random heads (the first, pre-registered set) on strict format,
    and the contrasts that go the other way (over the pooled random sets where the run has them: one draw can be a
    lucky one). -> (the strict contrasts where the sink heads cost more, the pooled strict contrasts)."""
    r = _strict(spec, "random")
    below = outside(r)[0]
    pooled = _strict(spec, POOLED)
    against = POOLED if len(pooled) else "random"  # one random draw can be a lucky one: the pooled sets decide
    other = outside(spec[spec.against == against])[1]
    which = " (the first random set of each dose, the pre-registered control)" if len(pooled) else ""
    out.append(f"As many random heads{which} cost about as much: " if not len(below) else
               f"Against as many random heads{which}: ")
    out[-1] += (f"in none of {len(r)} strict-format contrasts did the sink heads cost more outside the noise, so "
                "the fall is not shown to be specific to the sink." if not len(below) else
                f"the sink heads cost more outside the noise in {len(below)} of {len(r)} strict-format contrasts "
                "(uncorrected for their number).")
    if len(other):
        out[-1] += (" The contrasts outside the noise go the other way"
                    + (" (pooled over the random sets; uncorrected for their number)" if against == POOLED else
                       " (uncorrected for their number)") + ": the random heads cost more ("
                    + ", ".join(f"{m} {mt} at {d:g}: sink minus random {interval(v, lo, hi)}" for m, mt, d, v, lo, hi in
                                zip(other.model, other.metric, other.dose, other["sink minus control"], other.lo,
                                    other.hi)) + "), although they removed less attention mass.")
    return below, pooled


def _at(table, model: str, dose: float, metrics) -> str:
    """': math strict -17.0 [-27.0, -7.0]' for the sink ablation's rows of `metrics` at `dose` that fell."""
    if table is None or not len(table) or "change" not in table:
        return ""
    t = table[(table.model == model) & (table.dose == dose) & (table.control == "sink") & table.metric.isin(sorted(metrics))]
    cells = [f"{r.metric} {interval(r.change, r.lo, r.hi)}" for r in t.itertuples() if falls(r._asdict())]
    return f": {', '.join(cells)}" if cells else ""


def plain_finding(verdicts, spec, full, bos, models: Sequence[str], table=None, churned=None) -> str:
    """Three to six plain sentences of what chapter 8 found, every direction from the data (`table`: the
    dose-response rows, for which strict metrics fell and whether their lenient grading fell too; `churned`:
    `churn.observed`, the power of each 'did not fall')."""
    sink = verdicts[verdicts.control == "sink"].set_index("model")
    def dose(m: str, col: str) -> float | None:
        v = sink.loc[m, col] if m in sink.index else None
        return None if v is None or v != v else float(v)

    fmt = {m: dose(m, "format_dose") for m in models if m in sink.index}
    know = {m: dose(m, "knowledge_dose") for m in models if m in sink.index}
    first = [m for m in fmt if fmt[m] is not None and (know[m] is None or know[m] > fmt[m])]
    out = []
    fell, lenient = fell_metrics(table, first) if first else (set(), set())
    if first:
        what = " and ".join(sorted(fell)) if fell else "strict format"
        never = all(know[m] is None for m in first)
        out.append(f"Removing the sink from the heads that use it most cost {what}"
                   + (" " if never else " before knowledge ") + "in "
                   + ", ".join(f"{m} (from dose {fmt[m]:g}{_at(table, m, fmt[m], fell)})" for m in first)
                   + (" and in no other model" if len(first) < len(fmt) else "")
                   + ("; knowledge did not fall at any dose" + detectable(churned, "knowledge acc", first)
                      if never else "") + ".")
        which = which_fell(table, first, churned)
        if which:
            out.append(which)
    else:
        out.append("Removing the sink from the heads that use it most did not cost strict format before knowledge "
                   "in any model.")
    below, pooled = _random_sentence(spec, out)
    _pooled_sentence(spec, out)
    m_more, m_tested = _matched_below_one(spec, out)
    if len(full):
        out.append(f"At dose 1 (every head; outside the primary test), {dose1_sentence(full, brief=True)}.")
    if first and not len(below) and not (pooled.hi < 0).any() and not m_more:
        out.append("Together, these tests do not show the role the paper's mechanism needs: "
                   + ("the loss is not specific to format (its lenient grading fell as far) and " if lenient else "")
                   + "not specific to the sink heads"
                   + (", nor to the sink as such: the same attention mass taken from other keys cost as much or "
                      "more, though that control works on more heads and takes all the content of sink-dominated heads "
                      "(section 8.1)" if m_tested else "") + ".")
    out += bos_sentences(bos)
    return " ".join(out)


def bos_sentences(bos) -> list[str]:
    """Section 8.4 in plain words, per model: what evaluating without BOS cost (rows whose inputs it left unchanged
    are no measurement), whether knowledge fell as far as format (the paper's ordering predicts format first), and
    a perplexity that rose."""
    out = []
    m_bos = bos[(bos["first token"] == "none")] if len(bos) else bos
    if "inputs unchanged" in m_bos:
        m_bos = m_bos[~m_bos["inputs unchanged"].astype(bool)]
    for m, g in (m_bos.groupby("model", sort=False) if len(m_bos) else []):
        rows = {r.metric: r for r in g.itertuples()}
        fell = [mt for mt in ("instructions strict", "math strict", "knowledge acc") if mt in rows
                and falls(rows[mt]._asdict())]
        if not fell:
            continue
        words = (f"Evaluating {m} without its BOS token cost {', '.join(fell)}"
                 + ("" if "instructions strict" in fell else ", but not strict instruction format"))
        strict = [rows[mt].change for mt in STRICT_PAIR if mt in fell]
        if "knowledge acc" in fell and (not strict or rows["knowledge acc"].change <= min(strict)):
            k = rows["knowledge acc"]
            words += (f"; knowledge fell as far or further ({interval(k.change, k.lo, k.hi)}"
                      + (f" against {', '.join(f'{mt} {interval(rows[mt].change, rows[mt].lo, rows[mt].hi)}' for mt in STRICT_PAIR if mt in fell)}"
                         if strict else "") + "), the opposite of the order the paper's mechanism predicts")
        ppl = rows.get("perplexity ppl")
        if ppl is not None and falls(ppl._asdict()):
            words += (f", and its perplexity rose by {interval(ppl.change, ppl.lo, ppl.hi, digits=digits(ppl.metric))}: a broad "
                      "breakage, not a loss of format alone")
        out.append(words + ".")
    return out


def tiny_sentence(tiny_info: Sequence[Mapping]) -> str:
    """Section 8.6 in plain words: whether its question (does per-head QK-norm change reliance on the sink?) can be
    answered, which needs a sink to have formed (chapter 7's criterion, `sink formed` of each variant's row)."""
    if not tiny_info:
        return ""
    words = {r["variant"]: qk_norm_words(r["variant"]) for r in tiny_info}
    formed = [words[r["variant"]] for r in tiny_info if r["sink formed"]]
    span = ", ".join(f"{words[r['variant']]} {r['S at init']:+.2f} to {r['S']:+.2f}" for r in tiny_info)
    if not formed:
        return (f"None of chapter 7's tiny models formed a sink (S at initialisation to S after training: {span}), "
                "so section 8.6 cannot say whether per-head QK-norm changes a model's reliance on its sink: there "
                "it measures reliance on the first position only.")
    missing = [words[r["variant"]] for r in tiny_info if not r["sink formed"]]
    return (f"A sink formed in the tiny model{'s' if len(formed) > 1 else ''} with {' and '.join(formed)} "
            f"(S at initialisation to S after training: {span})"
            + (f" but not in the one{'s' if len(missing) > 1 else ''} with {' and '.join(missing)}, so the variants "
               "are not compared on a sink" if missing else "") + ".")


def twin_sentence(table, models: Sequence[str], suite: str = "math") -> str:
    """How often a suite's strict and lenient grading give the same score under the conditions of `table` (the
    dose-response rows), per model: where the unablated scores are equal too, every item the model solves it also
    answers in the required format, so the strict grading adds nothing the lenient one does not see."""
    parts = []
    for m in models:
        s = table[(table.model == m) & (table.metric == f"{suite} strict")].reset_index(drop=True)
        le = table[(table.model == m) & (table.metric == f"{suite} lenient")].reset_index(drop=True)
        if not len(s) or len(s) != len(le):
            continue
        same = int(((s.other == le.other) & (s.base == le.base)).sum())
        base = s.base.iloc[0] == le.base.iloc[0]
        parts.append(f"{m}: {same} of {len(s)} conditions" + (
            f" (unablated both {s.base.iloc[0]:.1f} %: every {suite} item it solves, it answers in the required "
            "format, so there its strict and lenient falls are one fall)" if base and same >= len(s) / 2 else ""))
    return (f"{suite} strict and {suite} lenient give the same score in " + "; ".join(parts)) if parts else ""
