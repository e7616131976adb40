"""Claims 9a-9e: the causal tests of the mechanism (chapter 8): ablation order (9a), repair (9b), the specificity of
the head ablation against its two controls (9c, 9d: the chapter's H2) and the BOS ablation (9e: its H3)."""
from __future__ import annotations

from sinklib.claims.core import CH8, claim, per_model, power_note, strict_metrics
from sinklib.controls.sizes import points
from sinklib.stats.verdicts import Est, decide, est


@claim("9a", "Mechanism (causal test, ours): removing the sink from the heads that use it most hurts format-sensitive "
       "skills before knowledge", (), CH8)
def ablation_order(res):
    doc = res(CH8)
    ver = doc["results"]["verdicts"]
    out = {}
    for m in dict.fromkeys(r["model"] for r in ver):
        by = {r["control"]: r for r in ver if r["model"] == m}
        s = by.get("sink")
        if s is None:
            continue
        f, k = s["format_dose"], s["knowledge_dose"]
        first = f is not None and (k is None or f < k)
        early = _early_controls(by, f)
        specific = f is not None and not early
        v, why = decide(None, counts=(int(first and specific), int(k is not None and (f is None or k < f)), 1),
                        quantity="orderings (for: format falls before knowledge and before as many random heads and "
                                 "the mass-matched control where it is tested; against: knowledge falls first)")
        if first and not specific:
            why = (f"{_what_fell(doc, m)} falls before any fall of knowledge, but {' and '.join(early)} make it fall "
                   "at the same dose or earlier, so the fall is not specific to the sink heads")
        ctl = "; ".join(f"{c}: {r['verdict']}" for c, r in by.items() if c != "sink")
        fell = _which(doc, m)
        out[m] = (f"sink heads: {s['verdict']}" + (f" (controls: {ctl})" if ctl else "") + (f". {fell}" if fell else "")
                  + _mass(doc, m), v,
                  why + " (rule: the smallest dose whose paired 95 % interval lies below zero)")
    return per_model(out)


def _rows(doc: dict):
    import pandas as pd

    return pd.DataFrame([r for r in doc["results"].get("dose_response") or [] if "lo" in r and "metric" in r])


def _which(doc: dict, model: str) -> str:
    """Which strict metrics fell under the sink heads, and whether their lenient grading fell too, with the fall a
    suite that never fell could detect at the churn the ablations caused (`causal.reading.which_fell`); empty for a
    run without per-metric rows."""
    from sinklib.causal import churn
    from sinklib.causal.reading import which_fell

    rows = _rows(doc)
    return which_fell(rows, [model], churn.from_document(doc)).rstrip(".") if len(rows) else ""


def _what_fell(doc: dict, model: str) -> str:
    """The strict metrics that fell under the sink heads, named ('math strict'), with '(its lenient grading fell
    too)' where it did; 'strict format' for a run without per-metric rows."""
    from sinklib.causal.reading import fell_metrics

    rows = _rows(doc)
    fell, lenient = fell_metrics(rows, [model]) if len(rows) else (set(), set())
    if not fell:
        return "strict format"
    return " and ".join(sorted(fell)) + (" (its lenient grading fell too, so not format alone)" if lenient else "")


def _early_controls(by: dict, f: float | None) -> list[str]:
    """The controls whose strict format falls at dose `f` or earlier: as many random heads, and the mass-matched
    control where it is tested (a dose at which its mass is outside the tolerance does not count)."""
    if f is None:
        return []
    names = {"random": "as many random heads", "matched": "the same attention mass removed elsewhere"}
    out = []
    for c, words in names.items():
        d = (by.get(c) or {}).get("format_dose")
        if d is not None and d <= f and f not in (by.get(c) or {}).get("untested_doses", []):
            out.append(words)
    return out


def _mass(doc: dict, model: str) -> str:
    """'; attention mass removed ... at dose d: sink x, random y, matched z (...)' for the doses below 1 (empty
    without rows): per query, in units of the dose's sink heads, with the matched control's tolerance check."""
    rows = doc["results"].get("dose_response") or []
    key = "mass_removed" if any("mass_removed" in r for r in rows) else "mass_taken"
    by = {(r["dose"], r["control"]): r for r in rows if r["model"] == model and key in r}
    doses = sorted({d for d, _ in by if 0 < d < 1})

    def one(d: float, c: str) -> str:
        r = by[(d, c)]
        flag = "" if c != "matched" or "matched_ok" not in r else (" within tolerance" if r["matched_ok"]
                                                                     else " outside tolerance: not tested")
        return f"{c} {r[key]:.2f}{flag}"

    parts = [f"dose {d:g}: " + ", ".join(one(d, c) for c in ("sink", "random", "matched") if (d, c) in by)
             for d in doses]
    what = ("attention mass removed per query (units of the dose's sink heads)" if key == "mass_removed"
            else "first-token attention mass removed")
    return f"; {what}, {'; '.join(parts)}" if parts else ""


@claim("9b", "Mechanism (causal test, ours): the VL loss flows through the sink heads' W_Q/W_K; restoring them "
       "brings strict formats back, random heads or other weights of the same norm do not", (), CH8)
def repair(res):
    doc = res(CH8)
    rows, p = doc["results"]["repair"], doc["parameters"]
    suites = f"chapter 8's {p.get('eval_instructions', '?')} + {p.get('eval_math', '?')}-item strict suites"
    sizes = {mt: int(p[k]) for mt in strict_metrics() for k in [f"eval_{mt.split()[0]}"] if k in p}
    out = {m: _repair_row([r for r in rows if r["model"] == m], suites, sizes)
           for m in dict.fromkeys(r["model"] for r in rows)}
    panel = doc["results"].get("panel_repair") or {}
    p11 = panel.get("sizes", {})
    for m in dict.fromkeys(r["model"] for r in panel.get("rows", [])):
        mine = [r for r in panel["rows"] if r["model"] == m]
        out[f"{m} (chapter 11's LoRA pair)"] = _repair_row(
            mine, f"chapter 11's {p11.get('instructions', '?')} + {p11.get('math', '?')}-item strict suites, pooled "
                  f"over {mine[0].get('seeds', 1)} seed(s)",
            {mt: int(p11[mt.split()[0]]) for mt in strict_metrics() if mt.split()[0] in p11},
            not_tested=panel.get("not_tested", {}).get(m, ""))
    return per_model(out)


def _repair_row(mine: list[dict], suites: str, sizes: dict[str, int], not_tested: str = "") -> tuple[str, str, str]:
    """One pair's repair (rows of `repair_changes`'s layout, its first fraction) by claim 9b's rule -> (ours,
    verdict, why); `sizes`: items per strict metric, for the power note; `not_tested`: why the pair cannot test the
    claim whatever its numbers (a failed precondition of chapter 11's pair)."""
    from sinklib.causal.repair import repair_outcome

    f0 = mine[0]["fraction"]
    t = [r for r in mine if r["fraction"] == f0 and r["metric"] in strict_metrics()]
    o = repair_outcome(t, strict_metrics())
    lost, back = o["lost"], o["back"]
    by = {(r["control"], r["metric"]): r for r in t}
    loss = "; ".join(f"{mt} VL minus base {est(Est(r['loss'], r['loss_lo'], r['loss_hi']))}"
                     for mt in strict_metrics() for r in [by.get(("sink heads", mt))] if r)
    moves = "; ".join(f"{c} {mt} {est(Est(r['change'], r['lo'], r['hi']))}" for (c, mt), r in by.items() if mt in lost)
    pw = power_note({mt: (sizes[mt], r["base"]) for mt in strict_metrics() for r in [by.get(("sink heads", mt))]
                     if r and mt in sizes})
    ours = f"{loss} ({suites}{'; ' + pw if pw.endswith(')') else ''})" + (
        f"; restored ({f0:.0%} of heads): {moves}" if moves else "")
    worse = o["down"]["sink heads"]
    good = back["sink heads"] and not (back["random heads"] or back["other rows"])
    bad = worse or not back["sink heads"] and (back["random heads"] or back["other rows"])
    ours += _ppl_repair(mine, f0)
    v, w = decide(None, counts=(int(good), int(bad), 1), not_tested=not_tested or ("" if lost else
                  "precondition failed: the VL loss on the strict-format metrics is within noise (nothing to "
                  "recover there)"),
                  quantity="restores (for: the sink heads' restore repairs and no control does; against: a "
                           "control repairs, or the sink heads' restore makes it worse)")
    if lost and not (good or bad):
        w = ("the sink heads and a control both repair" if back["sink heads"] else
             "no restore moves a lost score outside noise")
    return ours, v, w


def _ppl_repair(rows: list[dict], fraction: float) -> str:
    """'; perplexity VL minus base ... : restoring ... gives back ...' where the VL model's perplexity rose outside
    the noise (a loss the strict metrics do not show); empty otherwise."""
    ppl = {r["control"]: r for r in rows if r["fraction"] == fraction and r["metric"].startswith("perplexity")}
    s = ppl.get("sink heads")
    if s is None or not s["loss_lo"] > 0:
        return ""
    from sinklib.causal.cells import digits

    d = digits(s["metric"])
    moves = ", ".join(f"{c} {est(Est(r['change'], r['lo'], r['hi']), d)}" for c, r in ppl.items())
    sink = ppl["sink heads"]["change"]
    less = any(r["change"] < sink for c, r in ppl.items() if c != "sink heads")  # lower perplexity: more given back
    return (f"; perplexity VL minus base {est(Est(s['loss'], s['loss_lo'], s['loss_hi']), d)} (a loss outside the "
            f"noise): restored, {moves}" + (" (the sink heads give back less than a control)" if less else ""))

@claim("9c", "Specificity (causal test, ours, H2): removing the sink from the heads that use it most costs more strict "
       "format than removing it from as many random heads", (), CH8)
def specific_random(res):
    return _specificity(res(CH8), "random")


@claim("9d", "Specificity (causal test, ours, H2): removing the sink from the heads that use it most costs more strict "
       "format than removing the same attention mass from keys other than the sink", (), CH8)
def specific_matched(res):
    return _specificity(res(CH8), "matched")


def _contrasts(doc: dict, against: str, model: str, pooled: bool = True) -> tuple[list[dict], str]:
    """Chapter 8's strict-format contrasts (sink minus control) of `model` against one control at the doses its
    predictions were written for (`causal.reading.PREDICTED_DOSES`), with how they were chosen; the random heads
    pooled over their draws where the run has them and `pooled` (the first draw alone is the pre-registered column)."""
    from sinklib.causal.reading import PREDICTED_DOSES, STRICT_PAIR

    rows = [r for r in doc["results"].get("specificity") or [] if r["model"] == model and r["metric"] in STRICT_PAIR
            and r["dose"] in PREDICTED_DOSES and r.get("tested", True)]
    mixed = [r for r in rows if r["against"] == f"{against}, pooled"] if pooled else []
    if mixed:
        return mixed, (f"pooled over {int(mixed[0]['draws'])} draws of random heads; three draws catch only part of "
                       "the spread between random choices of heads, so read these intervals as a floor on the "
                       "uncertainty")
    return [r for r in rows if r["against"] == against], ""


def _counted(rows: list[dict], against: str) -> tuple[str, str]:
    """(verdict, why) of one model's contrasts by the one rule: for when a paired 95 % interval lies below zero (the
    sink heads cost more), against when above (the control cost more); every contrast must be on the claim's side."""
    from sinklib.causal.reading import PREDICTED_DOSES

    doses = " or ".join(f"{d:g}" for d in PREDICTED_DOSES)
    untested = "" if rows else ("precondition failed: the matched control was not within its mass tolerance at "
                                f"dose {doses}" if against == "matched" else f"no contrast at dose {doses} in this run")
    return decide(None, counts=(sum(r["hi"] < 0 for r in rows), sum(r["lo"] > 0 for r in rows), len(rows)),
                  not_tested=untested, quantity="contrasts (sink minus control; for: below zero, against: above)")


def detectable_contrast(rows: list[dict]) -> dict[str, float]:
    """{metric: the smallest contrast its intervals would detect four times in five}: (1.96 + 0.84) / 1.96 times
    the mean half-width of its paired 95 % intervals (a normal approximation read off the observed spread, so it
    fits a contrast between two ablated conditions, whose items churn more than against the base model)."""
    out: dict[str, list[float]] = {}
    for r in rows:
        out.setdefault(r["metric"], []).append((r["hi"] - r["lo"]) / 2)
    return {m: (1.96 + 0.84) / 1.96 * sum(h) / len(h) for m, h in out.items()}


def _specificity(doc: dict, against: str):
    """Rows 9c and 9d, one model at a time (`_counted` on `_contrasts`), with the contrasts' detectable size, the
    pre-registered first draw's verdict beside the pooled draws', and what the control cannot separate."""
    out, ms = {}, list(dict.fromkeys(r["model"] for r in doc["results"].get("specificity") or []))
    for m in ms:
        rows, how = _contrasts(doc, against, m)
        v, why = _counted(rows, against)
        first = _contrasts(doc, against, m, pooled=False)[0] if how else []
        cells = "; ".join(f"{r['metric']} at dose {r['dose']:g}: {est(Est(r['sink minus control'], r['lo'], r['hi']))}"
                          for r in rows)
        pw = ", ".join(f"{mt} {points(x)} points" for mt, x in detectable_contrast(rows).items())
        ours = (f"sink minus {against} control, {cells}" + (f" ({how})" if how else "")
                + f"; smallest contrast these intervals detect four times in five: {pw}") if rows else "—"
        why += f"; the pre-registered first draw of random heads alone: {_counted(first, against)[0]}" if first else ""
        extra = (_random_caveat(rows) + _shared(doc, m) + _prediction2(rows) if against == "random"
                 else _matched_caveat(doc, m, rows))
        out[m] = (ours, v, why + extra)
    return per_model(out)


def _shared(doc: dict, model: str) -> str:
    """'; the random sets share ... of the sink heads': each predicted dose's random sets drawn again from the
    stored sink mass and the run's parameters (`causal.dose_plans`, seeded as the chapter drew them), and their
    overlap with the sink heads counted (`causal.shared_with_sink`); empty for a run that stored no sink mass."""
    from sinklib import causal
    from sinklib.causal.reading import PREDICTED_DOSES
    from sinklib.causal.suites import shared_cells

    p, mass = doc.get("parameters") or {}, (doc["results"].get("sink_mass") or {}).get(model)
    need = ("last_k_layers", "fractions", "seed")
    if mass is None or any(k not in p for k in need):
        return ""
    n = len(mass)
    layers = list(range(n - min(int(p["last_k_layers"]), n), n))
    plans = causal.dose_plans(mass, layers, p["fractions"], seed=int(p["seed"]), controls=("sink", "random"),
                              random_draws=int(p.get("random_draws", 1)))
    rows = [r for r in causal.shared_with_sink(plans) if r["dose"] in PREDICTED_DOSES]
    return (f"; the random sets are drawn from every head of the last {len(layers)} layers, the sink heads among "
            f"them, so they share some of the sink heads ({shared_cells(rows)}), which pulls sink minus random "
            "toward zero") if rows else ""


def _prediction2(rows: list[dict]) -> str:
    """Where some but not every contrast lies below zero: chapter 8's prediction (2) (one contrast below zero in
    one model) reads 'held' while this row, which needs every contrast of the model, does not."""
    below = sum(r["hi"] < 0 for r in rows)
    return ("" if not 0 < below < len(rows) else
            f"; {below} of {len(rows)} contrasts lie below zero: chapter 8's prediction (2), which needs one "
            "contrast below zero in one model, holds, while this row needs every contrast of the model")


def _random_caveat(rows: list[dict]) -> str:
    """'; the random heads removed less attention ...' when they did at every contrast (read from the rows)."""
    less = [r for r in rows if r.get("mass removed, control", 1.0) < r.get("mass removed, sink", 0.0)]
    return ("" if not less or len(less) < len(rows) else
            f"; the random heads removed less attention per query than the sink heads (at most "
            f"{max(r['mass removed, control'] for r in less):.2f} against at least "
            f"{min(r['mass removed, sink'] for r in less):.2f}), so even a difference would not have isolated the sink")


def _matched_caveat(doc: dict, model: str, rows: list[dict]) -> str:
    """What the matched control did, from chapter 8's dose-response rows: the strict scores it left where it cost
    more than the sink ablation, and its heads against the sink condition's; with the chapter's prediction (3)."""
    if not any(r["lo"] > 0 for r in rows):
        return ""
    dose = {(r["dose"], r["control"], r["metric"]): r for r in doc["results"].get("dose_response") or []
            if r["model"] == model}
    cells = sorted({(r["dose"], r["metric"]) for r in rows})
    left = "; ".join(f"{mt} at {d:g}: {x['base']:.1f} → {x['other']:.1f} %" for d, mt in cells
                     for x in [dose.get((d, "matched", mt))] if x)
    heads = {d: (dose[(d, "sink", mt)].get("n_heads"), dose[(d, "matched", mt)].get("n_heads")) for d, mt in cells
             if (d, "sink", mt) in dose and (d, "matched", mt) in dose}
    more = {d: h for d, h in heads.items() if None not in h and h[1] > h[0]}
    where = (f"on more heads ({', '.join(f'{m} against {s} at {d:g}' for d, (s, m) in more.items())}) and "
             if more else "on the same number of heads, but ")
    return (f"; the matched control left {left}: it works {where}takes all the content of a head whose sink holds "
            "more than half its attention, so removing that mass from the other keys breaks the task outright, and "
            "this row says the sink's attention is the cheaper to lose, not that format rests on the sink (chapter "
            "8's prediction (3), written before the run, expected about the same cost as the sink ablation)")


@claim("9e", "Natural ablation (ours, H3): evaluating without the first (BOS) token, the sink's position, costs "
       "strict format while knowledge holds", (), CH8)
def first_token(res):
    results = res(CH8)["results"]
    rows, s0 = results.get("first_token") or [], results.get("first_token_S") or {}
    out = {}
    for m in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == m and r["first token"] == "none"]
        by = {r["metric"]: r for r in mine if not r.get("inputs unchanged")}
        eos = {r["metric"]: r for r in rows if r["model"] == m and r["first token"] == "eos"
               and not r.get("inputs unchanged")}
        ours, v, why = _first_token_row(by, s0.get(m), mine[0]["S"] if mine and "S" in mine[0] else None)
        out[m] = (ours + _eos_clause(eos), v, why)
    return per_model(out)


def _first_token_row(by: dict[str, dict], s_as_is: float | None = None,
                     s_none: float | None = None) -> tuple[str, str, str]:
    """Row 9e for one model ({metric: chapter 8's `none` row}, rows whose inputs the change left alone dropped):
    a strict metric counts for the claim when it falls (paired 95 % interval below zero) while knowledge holds, and
    every one counts against it when knowledge falls (the claim says knowledge holds); knowledge unmeasured (inputs
    unchanged) leaves them neither. With S as tokenised and without BOS (runs that stored both): calibration
    prompts the change left alone cannot show the sink removed, and a sink that did not weaken was not ablated;
    both are failed preconditions."""
    from sinklib.causal import falls

    k = by.get("knowledge acc")
    strict = [mt for mt in strict_metrics() if mt in by]
    k_falls = k is not None and falls(k)
    k_for = sum(falls(by[mt]) and k is not None and not k_falls for mt in strict)
    cells = "; ".join(f"{mt} {est(Est(r['change'], r['lo'], r['hi']))}" for mt in (*strict, "knowledge acc")
                      for r in [by.get(mt)] if r)
    both = s_as_is is not None and s_none is not None
    kept = "" if not both or s_none < s_as_is else (
        "precondition failed: " + ("chapter 8's calibration prompts have no BOS to remove, so S cannot show whether "
                                   "the sink was removed" if s_none == s_as_is else
                                   "evaluating without BOS did not weaken the sink") +
        f" (S {s_as_is:.2f} as tokenised, {s_none:.2f} without BOS)")
    v, why = decide(None, counts=(k_for, len(strict) if k_falls else 0, len(strict)), not_tested=kept or (
                    "" if strict else "no strict-format suite changed its inputs"),
                    quantity="strict metrics (for: it falls while knowledge holds; against: knowledge falls)")
    ppl = by.get("perplexity ppl")
    note = "" if k is not None else "; knowledge not measured (its prompts start with no BOS to remove)"
    note += f"; perplexity {ppl['base']:.1f} → {ppl['other']:.1f}" if ppl and falls(ppl) else ""
    s_text = f"S {s_as_is:.2f} as tokenised, {s_none:.2f} without BOS; " if both else ""
    return f"{s_text}without BOS minus with BOS, {cells}" + note, v, why


def _eos_clause(eos: dict[str, dict]) -> str:
    """' (with EOS in BOS's place: ...)': the `eos` condition's falls, the same ablation by another token."""
    from sinklib.causal import falls

    fell = [f"{mt} {est(Est(r['change'], r['lo'], r['hi']))}" for mt in (*strict_metrics(), "knowledge acc")
            for r in [eos.get(mt)] if r and falls(r)]
    return f" (with EOS in BOS's place: {'; '.join(fell)})" if fell else ""
