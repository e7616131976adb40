"""The book's bottom line and what it found beyond the paper's claims, in plain sentences whose every number is
read from `data/results/` (``python -m sinklib.claims`` writes them to ``book/_generated/bottom_line.md`` and
``book/_generated/other_findings.md``; the claims page and the landing page include them).

Each finding is a function (results -> sentence, or "" when its chapter has not run); a missing chapter drops
its sentence rather than inventing one.
"""
from __future__ import annotations

from collections.abc import Callable

from sinklib.claims.core import (CH4, CH7, CH8, CH11, INTERIM, Evaluated, Results, pooled, strict_metrics,
                                 tally_text, verdict_words)
from sinklib.core.words import qk_norm_words
from sinklib.errors import ResultsMissing
from sinklib.stats.verdicts import Est, est, num, t_interval

CH2 = "02_sink_strength"
PROVENANCE = ("The paper's values are those a public review of the paper reports (the paper itself was not "
              "available offline; {doc}`paper_reported` lists them).")


def _safe(fn: Callable[[Results], str], res: Results) -> str:
    try:
        return fn(res)
    except (ResultsMissing, KeyError, StopIteration, ValueError):
        return ""


def _models(doc: dict) -> list[str]:
    return list(dict.fromkeys(r["model"] for r in doc["results"]["scores"]))


def _side(es: list[Est]) -> str:
    """Where a set of intervals lies, in words: all below zero, all above, all containing zero, or mixed."""
    if all(e.hi < 0 for e in es):
        return "every interval below zero"
    if all(e.lo > 0 for e in es):
        return "every interval above zero"
    if all(e.lo <= 0 <= e.hi for e in es):
        return "every interval containing zero"
    return "the intervals on different sides of zero"


def vl_format(res: Results) -> str:
    doc = res(CH4)
    fs = {m: pooled(doc, m, "vl", "base", strict_metrics())[0] for m in _models(doc)}
    ks = {m: pooled(doc, m, "vl", "base", ("knowledge acc",))[0] for m in fs}
    parts = [f"{m} {est(fs[m])} points (knowledge {est(ks[m])})" for m in fs]
    lost = [m for m, e in fs.items() if e.hi < 0]
    head = (f"Chapter 4's miniature vision-language adaptation cost strict-format skill outside the noise in {', '.join(lost)}"
            if lost else "Chapter 4's miniature vision-language adaptation cost no detectable strict-format skill in "
            f"{'either of its two' if len(fs) == 2 else f'any of its {len(fs)}'} embedded real models")
    return (f"{head}: the strict-format change, pooled over the training seeds, is {' and '.join(parts)}; "
            f"{_side(list(fs.values()))}.")


def four_panel(res: Results) -> str:
    """Chapter 11's panel in words (`claims.ch11.short_summary`), when three or more pairs passed."""
    from sinklib.claims.ch11 import rows_of, short_summary

    r = res(CH11)["results"]
    rows, sens = rows_of(r["pairs"]), r.get("sensitivity")
    if int(rows.precondition.sum()) < 3:
        return ""
    s = (rows_of(sens["pairs"]), sens["primary"], sens["rate"]) if sens and sens.get("pairs") else None
    frozen = [p for p in ((r.get("stopped") or {}).get("frozen") or {}).get("pairs", [])]
    history = (f" The recipe's frozen rate had destroyed {sum(not p['precondition'] for p in frozen)} of the first "
               f"{len(frozen)} models (they did not learn the image task or lost knowledge), so this design, which "
               "chooses each model's rate by those preconditions, was written after those pairs had been seen."
               if frozen and not all(p["precondition"] for p in frozen) else "")
    return f"On {len(rows)} real models (chapter 11): " + short_summary(
        rows, r["primary"], r["rates"], interim=r.get("interim", False), sensitivity=s, minus="−",
        by_type={m: Est(*e) for m, e in (r.get("by_type") or {}).items()}) + history


def text_only(res: Results) -> str:
    doc = res(CH4)
    es = {m: pooled(doc, m, "text_only", "base", strict_metrics())[0] for m in _models(doc)}
    parts = [f"{m} {est(e)}" for m, e in es.items()]
    lost = all(e.hi < 0 for e in es.values())
    vl_lost = any(pooled(doc, m, "vl", "base", strict_metrics())[0].hi < 0 for m in es)
    why = ("here the loss is not specific to vision-language training" if vl_lost else
           "here format loss came with ordinary text fine-tuning while the vision-language adaptation cost none "
           "detectable")
    return (f"In chapter 4, ordinary text-only fine-tuning to the same end {'did' if lost else 'did not clearly'} cost format: "
            f"{' and '.join(parts)} points ({_side(list(es.values()))})." +
            (f" The paper's control has text-only training lose nothing, so {why}." if lost else ""))


def _s_changes(doc: dict, model: str, cond: str) -> list[float]:
    rows = (doc["results"].get("sink_text") or {}).get("rows") or []
    return [r["S change"] for r in rows if r["model"] == model and r["condition"].split(" seed ")[0] == cond]


def _direction(e: Est) -> str:
    from sinklib.core.numbers import direction

    return direction(e.lo, e.hi)


def s_trajectory(res: Results) -> str:
    """S under VL and under text-only over the training seeds (t intervals), with its direction per model and the
    number of seeds on each side of zero."""
    doc = res(CH4)
    parts, vls = [], {}
    for m in _models(doc):
        cells = []
        for cond, label in (("vl", "VL"), ("text_only", "text-only")):
            xs = _s_changes(doc, m, cond)
            e = t_interval(xs)
            if e is None:
                break
            up = sum(x > 0 for x in xs)
            cells.append(f"{label} {est(e, 3)} ({_direction(e)}; {up} of {len(xs)} seeds above zero)")
            if cond == "vl":
                vls[m] = e
        if len(cells) == 2:
            parts.append(f"{m}: {', '.join(cells)}")
    if not parts:
        return ""
    by = {w: [m for m, e in vls.items() if _direction(e) == w] for w in ("fell", "rose")}
    head = "; ".join(f"{w} in {' and '.join(ms)}" for w, ms in by.items() if ms) or "moved outside the noise in no model"
    return (f"Sink Strength S under VL training {head} (the paper's trajectory has it fall); the change in S over "
            f"the training seeds (t intervals) is {'; '.join(parts)}.")


def head_ablation(res: Results, with_bos: bool = False) -> str:
    """Chapter 8's head ablation in plain words (`causal.reading.plain_finding` on its stored tables; the BOS
    ablation too with `with_bos`, else left to claim row 9e); empty for a run without H2's contrasts."""
    import pandas as pd

    from sinklib.causal.reading import plain_finding

    from sinklib.causal.churn import from_document

    whole = res(CH8)
    doc = whole["results"]
    if not doc.get("specificity") or not doc.get("verdicts"):
        return ""
    ver = pd.DataFrame(doc["verdicts"])
    bos = pd.DataFrame(doc.get("first_token") or []) if with_bos else pd.DataFrame()
    text = plain_finding(ver, pd.DataFrame(doc["specificity"]), pd.DataFrame(doc.get("matched_at_full") or []),
                         bos, list(dict.fromkeys(ver.model)), table=pd.DataFrame(doc["dose_response"]),
                         churned=from_document(whole))
    return f"Switching the sink off (chapter 8, paired 95 % intervals): {text}"


def head_and_bos(res: Results) -> str:
    """`head_ablation` with the BOS ablation, for the bottom line (one paragraph for chapter 8)."""
    return head_ablation(res, with_bos=True)


def _qk_norms(res: Results) -> dict[str, str]:
    """Each model's QK-norm type: chapter 2 records it with S; copies of chapter 2 from before that record fall back
    on chapter 4's panel rows."""
    qk = dict(res(CH2)["results"].get("qk_norm") or {})
    if set(qk) < set(res(CH2)["results"]["S"]):
        try:
            qk = {**{r["llm"]: r["qk_norm"] for r in res(CH4)["results"]["panel_rows"]}, **qk}
        except (ResultsMissing, KeyError):
            pass
    return qk


def s_by_norm(res: Results) -> str:
    s, qk = res(CH2)["results"]["S"], _qk_norms(res)
    real = ", ".join(f"{m} ({qk_norm_words(qk[m]) if m in qk else '?'}) {s[m]:.2f}" for m in s)
    lower = min(s, key=s.get)
    tiny = res(CH7)["results"].get("tiny_panel_rows") or []
    by: dict[str, list[float]] = {}
    for r in tiny:
        by.setdefault(r["qk_norm"], []).append(r["S"])
    means = ", ".join(f"{q.replace('_', '-')} {num(sum(v) / len(v), 2, sign=False)}" for q, v in by.items())
    who = ("The per-head QK-norm model" if sum(qk.get(m) == "per_head" for m in s) == 1
           else f"{lower}, a per-head QK-norm model,")
    said = (f" {who} has the {'lower' if len(s) == 2 else 'lowest'} S, although the paper's positive correlation and "
            "its per-head pairs losing less would put per-head models higher." if qk.get(lower) == "per_head" else "")
    return (f"S of the real models (chapter 2): {real}.{said}" + (
        f" On chapter 7's tiny models, where no sink formed, mean S by variant is {means} (on their own sequences: "
        "S falls as prompts lengthen, since uniform attention's share of the first token does, so compare the "
        "order within each group, not values across them)." if means else ""))


def recovery_cost(res: Results) -> str:
    from sinklib.claims.core import paired_delta

    inj = res("06_negative_controls")["results"]["injection"]
    if "original + recovery" not in inj:
        return ""
    d = paired_delta(inj["original + recovery"].get("outcomes"), inj["original"].get("outcomes"), strict_metrics())
    return (f"The short recovery fine-tune of chapter 6 costs strict format by itself ({est(d)} points on the "
            "original model), so the injection's drop must be read against that control (row 8a).") if d else ""


def tiny_sinks_by_norm(res: Results) -> str:
    """Chapter 9: in how many Bigram-Backcopy models of each QK-norm variant a sink formed by the rule stated
    before the pilot (pilot tries and panel models together, each model once)."""
    from sinklib.tiny.sinkpanel import parse_setting

    r = res("09_sink_panel")["results"]
    seen: dict[str, dict] = {}
    one_head = False
    for row in r.get("pilot") or []:
        if row["variant"] == "layerwise" and parse_setting(row["try"]).get("n_heads") == 1:
            one_head = True   # with one head, layerwise and per-head QK-norm are one function: counted once
            continue
        # named as the panel names its models, so a pilot model that is also a panel model counts once
        seen[f"{row['variant']}|{row['try']}|s0"] = {"v": row["variant"], "sink": bool(row["sink formed"])}
    for row in r.get("base") or []:
        seen.setdefault(row["model"], {"v": row["variant"], "sink": row.get("holds_from") is not None})
    by: dict[str, list[bool]] = {}
    for x in seen.values():
        by.setdefault(x["v"], []).append(x["sink"])
    if not by:
        return ""
    parts = ", ".join(f"{sum(v)} of {len(v)} {qk_norm_words(k, with_=True)}" for k, v in by.items())
    normed = [x for k, v in by.items() if k != "none" for x in v]
    tail = ""
    if normed and not any(normed) and any(by.get("none", [])):
        from scipy.stats import fisher_exact

        plain = by["none"]
        p = fisher_exact([[sum(plain), len(plain) - sum(plain)], [0, len(normed)]]).pvalue
        tail = (" No sink formed with QK normalisation. That is about whether a sink forms in training, which the "
                "paper does not claim (it says per-head QK-norm protects an existing sink during fine-tuning); with "
                f"{sum(plain)} model{'s' if sum(plain) != 1 else ''} with a sink in all it is a hint, not a tested "
                f"difference (Fisher's exact p = {p:.2f} even if the models were independent, and they are not: they "
                "share settings and seeds).")
    once = ("; the one-head try's QK-normalised model counted once, under per-head: with one head the two "
            "normalisations are the same function") if one_head else ""
    return (f"In chapter 9's tiny Bigram-Backcopy models a sink formed, by the rule stated before the pilot, in "
            f"{parts} (pilot tries and panel models together{once}).{tail}")


def _power(doc: dict, suite: str, column: str = "paired, flip 0.05") -> float:
    return float(next(r[column] for r in doc["results"]["power"] if r["suite"] == suite))


def powered_dose(res: Results) -> str:
    """Chapter 10: chapter 4's dose on the 360-prompt instruction suite (the frozen recipe's point of the sweep),
    beside the smallest fall each suite can detect (the power tables' 'paired, flip 0.05' column)."""
    doc = res("10_calibration")
    r = doc["results"]
    parts, firm = [], True
    for m, rec in r["recipe"].items():
        pt = next(p for p in r["sweep"][m] if p["lr_lm"] == rec["lr_lm"] and p["steps"] == rec["stage2_steps"])
        e, k = (Est(pt[q], pt[f"{q} lo"], pt[f"{q} hi"]) for q in ("instructions strict", "knowledge acc"))
        row = next((p for p in (r.get("by_type") or {}).get("full", {}).get(m, [])
                    if p["lr_lm"] == rec["lr_lm"] and p["steps"] == rec["stage2_steps"]), None)
        typed = None if row is None else Est(*row["types"])
        typed = typed if typed is not None and typed.lo == typed.lo else None  # one type: no type-level interval
        firm = firm and (typed is None or typed.hi < 0)
        fall = row.get("smallest detectable fall, types") if row else None
        by_type = "" if typed is None else (
            f" ({est(typed)} with the suite's instruction types resampled, which detects falls of "
            f"{fall:.1f} points or more)" if fall is not None and fall == fall else
            f" ({est(typed)} with the suite's instruction types resampled)")
        n10 = next(p["items"] for p in r["power"] if p["suite"] == f"{m}: instructions strict")
        small10 = _power(doc, f"{m}: instructions strict")
        ch4 = ""
        try:
            doc4 = res(CH4)
            n4 = next(p["items"] for p in doc4["results"]["power"] if p["suite"] == f"{m}: instructions strict")
            ms = Est(pt["math strict"], pt["math strict lo"], pt["math strict hi"])
            ch4 = (f"; chapter 4's {n4}-prompt instruction suite can see only falls of "
                   f"{_power(doc4, f'{m}: instructions strict'):.1f} points or more, and its strict-format mean "
                   f"averages that suite with strict math, which this dose did not move ({est(ms)} here): chapter "
                   "4's null result is a matter of power and of that average, not evidence that nothing was lost")
        except (ResultsMissing, KeyError, StopIteration):
            pass
        parts.append(f"on chapter 10's {n10}-prompt instruction suite (smallest detectable fall {small10:.1f} points with "
                     "the items taken as independent; "
                     f"{m}, one training seed) VL adaptation at chapter 4's dose (stage-2 rate {rec['lr_lm']:g}, "
                     f"{rec['stage2_steps']} steps) changed the strict instruction pass rate by {est(e)} points"
                     f"{by_type}, "
                     f"with the image task learned (VQA {pt['VQA']:.0f} % against the {pt['majority']:.0f} % majority "
                     f"answer) and knowledge {est(k)}{ch4}")
    if not parts:
        return ""
    if firm:
        return "On a suite with more power, the same dose does cost format: " + "; ".join(parts) + "."
    return ("On a suite with more power, the same dose costs format on these items, but not clearly on instruction "
            "types like these in general: " + "; ".join(parts) + ". Resampled by instruction type (when a model "
            "changes, the items of one type tend to change together), the interval contains zero.")


FINDINGS = (s_by_norm, head_ablation, s_trajectory, recovery_cost, tiny_sinks_by_norm, powered_dose)


def _verdicts_sentence(evaluated: list[Evaluated]) -> str:
    v = {e.claim.id: verdict_words(e.row) for e in evaluated}
    named = (("5a", "VL adaptation erodes format but not knowledge"), ("6a", "text-only training is harmless"),
             ("6c", "S falls under VL"), ("7a", "S predicts the loss across pairs"))
    parts = [f"{what} (row {i}): **{v[i]}**" for i, what in named if i in v]
    interim = sum(e.row.reason.startswith(INTERIM) for e in evaluated)
    return ("What this means for the paper, claim by claim: " + "; ".join(parts) + "."
            + (f" {interim} row(s) rest on an interim look, whose verdict the confirmatory look may change." if interim
               else ""))


def _untested(evaluated: list[Evaluated]) -> str:
    nt = [e for e in evaluated if e.row.verdict == "not tested"]
    pre = sum("precondition" in e.row.reason or any("precondition" in o for o in e.row.ours) for e in nt)
    return (f"Of the {len(nt)} rows not tested, {pre} failed a precondition (named in the row) and "
            f"{len(nt) - pre} need models, benchmarks or panels that do not exist here.")


def bottom_line(evaluated: list[Evaluated]) -> str:
    res = Results()
    sentences = [_safe(fn, res) for fn in (vl_format, powered_dose, four_panel, text_only, s_trajectory, head_and_bos)]
    sentences += [f"Over the {len(evaluated)} claim rows: {tally_text(evaluated)}. {_untested(evaluated)}".rstrip(),
                  _verdicts_sentence(evaluated)]
    return "\n\n".join(s for s in sentences if s)


def other_findings() -> str:
    res = Results()
    items = [_safe(fn, res) for fn in FINDINGS]
    return "\n".join(f"- {x}" for x in items if x)


#: findings beyond the claim rows that belong on a chapter's "What we found" (chapter 8's head ablation is the
#: plain finding atop its own Summary, so only the bottom line and "other findings" carry `head_ablation`)
CHAPTER_FINDINGS: dict[str, tuple[Callable[[Results], str], ...]] = {
    CH2: (s_by_norm,), CH4: (s_trajectory, powered_dose), "06_negative_controls": (recovery_cost,),
    "09_sink_panel": (tiny_sinks_by_norm,)}


def chapter_found(stem: str, evaluated: list[Evaluated]) -> str:
    """A chapter's "What we found": the verdict of each claim row it tests or whose test its results decided, in
    the claims page's words, and the chapter's other findings; every number read from data/results/."""
    res, lines = Results(), []
    for e in (e for e in evaluated if stem == e.claim.chapter or stem in e.decided_by):
        body = "; ".join(o for o in e.row.ours if o != "—")
        why = f" Why: {e.row.reason}" if e.row.reason else ""
        lines.append(f"- **Row {e.claim.id}, {verdict_words(e.row)}.** {e.claim.text}. {body}{why}".rstrip())
    lines += [f"- {x}" for x in (_safe(fn, res) for fn in CHAPTER_FINDINGS.get(stem, ())) if x]
    if not lines:
        return ""
    return "\n".join(["The verdicts below follow the claims page's rule ({doc}`../claims`)."] + lines)


def pages(evaluated: list[Evaluated]) -> dict[str, str]:
    """{file name under book/_generated: text} of the generated passages: the bottom line, the other findings
    and each chapter's "What we found" (``found/<notebook>.md``)."""
    from sinklib.book.runner import notebook_names

    head = "% generated by `python -m sinklib.claims` from data/results/: do not edit\n\n"
    out = {"bottom_line.md": head + bottom_line(evaluated) + "\n\n" + PROVENANCE + "\n",
           "other_findings.md": head + other_findings() + "\n"}
    for stem in notebook_names():
        found = chapter_found(stem, evaluated)
        out[f"found/{stem}.md"] = head + (found or "This chapter tests no claim row; it prepares the later ones.") + "\n"
    return out
