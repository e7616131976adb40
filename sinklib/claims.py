"""The claims page: one row per claim of the paper, its reported value, ours and a verdict, all computed.

Each claim is a record (`Claim`) registered with ``@claim(...)``; its function reads the chapters' results
through ``sinklib.book.load_results`` and returns a `Row` (our numbers as text, the verdict, the reason).
The paper's values come from ``sinklib.reported`` (``data/paper_reported_values.csv``). A chapter that has
not run gives a "not run yet" row. ``python -m sinklib.claims`` writes ``book/_generated/claims_table.md``
(``--check`` only compares); a later chapter adds its claims here with the same decorator.
"""
from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import book as _book
from . import evals
from .errors import ResultsMissing
from .reported import reported_values
from .resources import checkout_root
from .verdicts import (INCONCLUSIVE, INTERVALS, NOT_REPRODUCED, NOT_RUN, NOT_TESTABLE, REPRODUCED, RULES,  # noqa: F401
                       VERDICTS, Est, combine, compare_words, diff, direction, est, mean, num, wilson_pct)

SINK_MARGIN = 5.0       # sink: mass on position 0 at least this many times the uniform-attention share
COST_RATIO_MAX = 1.5    # S is cheap: probe time / plain forward time at most this (3x: not cheap)
INJECT_TOP1_MIN = 0.9   # a fair injection starts as the same function: top-1 agreement with the original


@dataclass(frozen=True)
class Row:
    ours: tuple[str, ...]
    verdict: str
    reason: str


@dataclass(frozen=True)
class Claim:
    id: str
    text: str
    paper_keys: tuple[str, ...]
    chapter: str                              # notebook stem, "" when no chapter tests it
    compute: Callable[["Results"], Row]
    paper: str = ""                           # format string over the reported values of paper_keys


CLAIMS: list[Claim] = []
#: reported keys that back no claim row, with the reason
CONTEXT_ONLY: dict[str, str] = {
    "s_last_layers": "a definition choice of S (the K that chapter 2 uses by default), not a finding",
}


def claim(id: str, text: str, paper_keys: tuple[str, ...] = (), chapter: str = "", paper: str = ""):
    """Register the decorated function (results -> Row) as a claim row."""
    def deco(fn):
        CLAIMS.append(Claim(id, text, tuple(paper_keys), chapter, fn, paper))
        return fn
    return deco


def not_testable(id: str, text: str, paper_keys: tuple[str, ...], chapter: str, paper: str, why: str) -> None:
    claim(id, text, paper_keys, chapter, paper)(lambda res: Row(("—",), NOT_TESTABLE, why))


class Results:
    """Chapter results, loaded once each; remembers which chapters a claim read (for its models and profile)."""

    def __init__(self):
        self.docs: dict[str, dict] = {}
        self.missing = ""

    def __call__(self, notebook: str) -> dict:
        if notebook not in self.docs:
            try:
                self.docs[notebook] = _book.load_results(notebook)
            except ResultsMissing:
                self.missing = notebook
                raise
        return self.docs[notebook]


# ------------------------------------------------------------------------------------------------
# numbers and verdicts


def chapter4_verdicts(doc: dict, model: str) -> dict[str, str]:
    """Chapter 4's elements of the paper's pattern for one model, each with its interval and in words.

    doc: chapter 4's results (``{"results": {"scores": [...], "outcomes": {...}}}``; the notebook passes its
    own tables). Changes are VL (or control) minus base in points; the strict-format mean is instructions
    strict and math strict. Intervals are paired (per-item bootstrap, `delta`) where the doc holds per-item
    outcomes, MOVER intervals of the stored scores otherwise."""
    f = {c: delta(doc, model, c, "base", _strict()) for c in ("vl", "text_only", "random")}
    k = delta(doc, model, "vl", "base", ("knowledge acc",))
    return {"model": model,
            "VL: strict-format change (pt)": est(f["vl"]),
            "VL: knowledge change (pt)": est(k),
            "strict format vs knowledge under VL": compare_words(
                gap(doc, model, ("vl", "base", _strict()), ("vl", "base", ("knowledge acc",))),
                "format fell more", "format fell less"),
            "text-only vs VL (strict format)": compare_words(delta(doc, model, "text_only", "vl", _strict()),
                                                             "text-only lost more", "text-only lost less"),
            "random vs VL (strict format)": compare_words(delta(doc, model, "random", "vl", _strict()),
                                                          "random lost more", "random lost less")}


def chapter4_summary(verdict) -> str:
    """The paper's pattern, element by element, with the models for which it holds outside the noise
    (`verdict`: rows of `chapter4_verdicts`, plus an "S under VL" column of "fell"/"rose")."""
    def who(col, words):
        ms = [r["model"] for _, r in verdict.iterrows() if str(r[col]).startswith(words)]
        return ", ".join(ms) if ms else "no model"

    parts = [f"format fell more than knowledge: {who('strict format vs knowledge under VL', 'format fell more (')}",
             f"text-only lost less than VL: {who('text-only vs VL (strict format)', 'text-only lost less (')}",
             f"random lost more than VL: {who('random vs VL (strict format)', 'random lost more (')}"]
    if "S under VL" in verdict:
        parts.append(f"S fell under VL (point values, no interval): {who('S under VL', 'fell')}")
    return "; ".join(parts)


def per_model(results: dict[str, tuple[str, str, str]]) -> Row:
    """{model: (ours, verdict, why)} -> one Row (verdicts combined by `combine`)."""
    return Row(tuple(f"{m}: {o}. *{v}*: {w}" for m, (o, v, w) in results.items()),
               combine(v for _, v, _ in results.values()), "")


# ------------------------------------------------------------------------------------------------
# chapter 4 and 6 readers

CH4, CH6 = "04_vl_adaptation", "06_negative_controls"


def _strict() -> tuple[str, ...]:
    from .pairs import STRICT_METRICS

    return STRICT_METRICS


def score(doc: dict, model: str, cond: str, metric: str) -> Est:
    """Chapter 4's score of `model` under `cond` for a metric 'suite metric', with its stored interval."""
    suite, m = metric.split(" ", 1)
    for r in doc["results"]["scores"]:
        if (r["model"], r["condition"], r["suite"], r["metric"]) == (model, cond, suite, m):
            return Est(r["score"], r["lo"], r["hi"])
    raise KeyError(f"{CH4}: no score for {model} / {cond} / {metric}")


def outcomes_of(doc: dict, model: str, cond: str) -> dict | None:
    """The per-item outcomes a chapter stored for (model, condition), or None when it stored none."""
    return doc["results"].get("outcomes", {}).get(model, {}).get(cond)


def paired_change(a_out: dict | None, b_out: dict | None, metrics) -> tuple[float, object] | None:
    """(point, bootstrap draws) of a - b of the mean of `metrics` on the shared items, from two per-item outcome
    records (`sinklib.evals.paired`); None when either record is missing (the caller falls back to MOVER)."""
    from .evals import paired

    return None if a_out is None or b_out is None else paired.change(b_out, a_out, list(metrics))


def paired_delta(a_out: dict | None, b_out: dict | None, metrics) -> Est | None:
    """`paired_change` as a point value with its interval, or None."""
    from .evals import paired

    d = paired_change(a_out, b_out, metrics)
    return None if d is None else paired.estimate(*d)


def _draws(doc: dict, model: str, cond: str, ref: str, metrics) -> tuple[float, object] | None:
    return paired_change(outcomes_of(doc, model, cond), outcomes_of(doc, model, ref), metrics)


def delta(doc: dict, model: str, cond: str, ref: str, metrics) -> Est:
    """cond minus ref of the mean of `metrics` ('suite metric'), in points: a paired bootstrap interval over
    the shared items when the doc holds per-item outcomes of both, else the MOVER interval of the scores."""
    e = paired_delta(outcomes_of(doc, model, cond), outcomes_of(doc, model, ref), metrics)
    if e is not None:
        return e
    return diff(mean(*(score(doc, model, cond, m) for m in metrics)), mean(*(score(doc, model, ref, m) for m in metrics)))


def gap(doc: dict, model: str, a: tuple, b: tuple) -> Est:
    """delta(*a) minus delta(*b) (each (cond, ref, metrics)): paired draws where per-item outcomes exist (the
    two changes' suites resampled as in `sinklib.evals.paired`), MOVER otherwise."""
    from .evals import paired

    da, db = _draws(doc, model, *a), _draws(doc, model, *b)
    if da is not None and db is not None:
        return paired.estimate(da[0] - db[0], da[1] - db[1])
    return diff(delta(doc, model, *a), delta(doc, model, *b))


def models4(doc: dict) -> list[str]:
    return list(dict.fromkeys(r["model"] for r in doc["results"]["scores"]))


def vqa_learned(doc: dict, model: str) -> tuple[bool, str]:
    """Precondition: the VL model's VQA interval lies above the blind majority-answer baseline."""
    r = next(r for r in doc["results"]["vqa"] if r["model"] == model)
    e, maj = wilson_pct(r["VL model (%)"], r["n"]), r["majority baseline (%)"]
    return e.lo > maj, f"VQA {e.v:.0f} % [{e.lo:.0f}, {e.hi:.0f}] vs majority {maj:.0f} %"


NO_VQA = "precondition failed: the VL model did not learn the visual task"


def _ch4_claim(res: Results, test: Callable[[dict, str], tuple[str, str, str]]) -> Row:
    doc = res(CH4)
    out = {}
    for m in models4(doc):
        ok, vqa = vqa_learned(doc, m)
        o, v, w = test(doc, m)
        out[m] = (f"{o}; {vqa}", v, w) if ok else (f"{o}; {vqa}", NOT_REPRODUCED, f"{NO_VQA} (without it: {v}, {w})")
    return per_model(out)


# ------------------------------------------------------------------------------------------------
# the claims, in the paper's order

@claim("1", "Attention in many heads anchors on an early sink position", (), "01_sink_definition")
def _sink_exists(res):
    doc = res("01_sink_definition")
    r, T = doc["results"], int(doc["parameters"]["max_tokens"])
    uniform = sum(1 / (i + 1) for i in range(1, T)) / (T - 1)
    peaks = {p["model"]: p["ratio"] for p in r.get("massive_activation_peak", [])}
    out = {}
    for m, mass in r["mass_last10"].items():
        ratio = mass / uniform
        v = REPRODUCED if ratio >= SINK_MARGIN else NOT_REPRODUCED if ratio <= 1 else INCONCLUSIVE
        extra = f"; sink-token norm {peaks[m]:.0f}x the median" if m in peaks else ""
        out[m] = (f"mass on position 0, last 10 layers {mass:.2f}{extra}", v,
                  f"{ratio:.0f}x the uniform share {uniform:.3f} of {T}-token prompts (margin rule: {SINK_MARGIN:g}x)")
    return per_model(out)


@claim("2a", "Sink Strength S is cheap: about 15 prompts, about 15 forward passes", ("s_prompts",),
       "02_sink_strength", "{s_prompts:.0f} prompts")
def _s_cheap(res):
    rows = res("02_sink_strength")["results"]["timing"]
    out = {}
    for m in dict.fromkeys(r["model"] for r in rows):
        probe = [r for r in rows if r["model"] == m and r["method"].startswith("S probe")]
        ratio, n = max(r["ratio to plain forward (SDPA)"] for r in probe), probe[0]["prompts"]
        v = REPRODUCED if ratio <= COST_RATIO_MAX else NOT_REPRODUCED if ratio >= 2 * COST_RATIO_MAX else INCONCLUSIVE
        out[m] = (f"probe / plain forward time {ratio:.2f} on {n} prompts", v,
                  f"ratio {'≤' if ratio <= COST_RATIO_MAX else '>'} {COST_RATIO_MAX} (no interval stored: medians of repeats)")
    return per_model(out)


not_testable("2b", "Measuring S takes about 8 s for a 7B model on one A6000 GPU", ("s_seconds_7b",), "02_sink_strength",
             "{s_seconds_7b:.0f} s", "no 7B model and no A6000 here; the performance page times random-weight 7-8B "
             "configurations when its GPU benchmark has run")


@claim("3", "The sign of the S margin between models is stable over calibration size N in [10, 100]",
       ("robust_cells",), "02_sink_strength", "{robust_cells:.0f} of 108 cells")
def _s_stable(res):
    r = res("02_sink_strength")["results"]
    a, b = sorted(r["S"], key=r["S"].get, reverse=True)[:2]
    margins = [c[a] - c[b] for c in r["robustness"]]
    same = sum(x > 0 for x in margins)
    flips = sorted({s["choice"] + " = " + s["value"] for s in r["sensitivity"] for t in r["sensitivity"]
                    if s["model"] == a and t["model"] == b and (s["choice"], s["value"]) == (t["choice"], t["value"])
                    and s["S"] <= t["S"]})
    ours = (f"S({a}) − S({b}) > 0 in {same} of {len(margins)} (N, seed) cells, smallest margin {num(min(margins), 2)}",)
    if flips:
        ours += (f"the ordering flips for {', '.join(flips)} (chapter 2's definition choices)",)
    ns = [c["N"] for c in r["robustness"]]
    spans = min(ns) <= 10 and max(ns) >= 100
    v = NOT_REPRODUCED if same < len(margins) else REPRODUCED if spans else INCONCLUSIVE
    return Row(ours, v, f"{len(margins) - same} sign flips over N = {min(ns)} to {max(ns)} (rule: every cell keeps "
                        f"the sign{'' if spans else '; the grid does not span N = 10 to 100'})")


@claim("4a", "Theorem 1: per-head QK-RMSNorm removes the input-magnitude term from the sink-gap bound", (),
       "03_perturbation_bound")
def _theorem(res):
    r = res("03_perturbation_bound")["results"]
    rnd, real, sl = r["random_layers"], r["real_models"], r["scale_sweep_slopes"]
    n = 3 * rnd["n_per_variant"] + sum(x["gap_values"] for x in real.values())
    viol = rnd["violations"] + sum(x["violations"] for x in real.values())
    worst = max(r["adversary"].values())
    s_none, s_ph = sl["random none"]["slope_change"], sl["random per-head"]["slope_change"]
    ours = (f"{viol} violations in {n:,} random and real-weight cases; adversary's worst tightness {worst:.2f}",
            f"slope of the actual change in input scale: {s_none:.2f} without QK-norm, {s_ph:.3f} per-head")
    if viol or worst > 1:
        return Row(ours, NOT_REPRODUCED, "the bound was violated")
    ok = abs(s_none - 2) < 0.5 and abs(s_ph) < 0.5
    return Row(ours, REPRODUCED if ok else INCONCLUSIVE,
               "no violation, and the input-scale slope is about 2 without and about 0 with per-head QK-norm"
               if ok else "no violation, but the input-scale slopes are not about 2 and 0")


CH7 = "07_controlled_panel"


@claim("4b", "Remark 1: layerwise QK-RMSNorm compresses weak heads", (), CH7)
def _remark(res):
    r = {x["variant"]: x for x in res(CH7)["results"]["remark1"]}
    lw, ph = r.get("layerwise"), r.get("per_head")
    if lw is None or ph is None:
        return Row(("no trained layerwise and per-head model in chapter 7's run",), INCONCLUSIVE,
                   "chapter 7 measures the remark on its trained layerwise and per-head models")
    rho, p = lw["rho_share_query_norm"], lw["p_share_query_norm"]
    ours = (f"trained layerwise model: raw query shares vary {lw['raw_share_spread']:.2f}-fold, normalised query "
            f"norms {lw['query_norm_spread']:.2f}-fold, ρ(share, query norm) = {num(rho, 2)} (p = {p:.2g}), "
            f"ρ(share, logit range) = {num(lw['rho_share_logit_range'], 2)}",
            f"trained per-head model: query norms vary {ph['query_norm_spread']:.2f}-fold")
    if rho != rho:
        return Row(ours, INCONCLUSIVE, "the layerwise model's query norms are equal: nothing to rank")
    if p < 0.05 and rho > 0 and lw["query_norm_spread"] > ph["query_norm_spread"]:
        return Row(ours, REPRODUCED, "weak heads have smaller normalised queries under layerwise norm (permutation "
                   "p < 0.05), and the spread of query norms exceeds the per-head model's; trained tiny models")
    if p < 0.05 and rho < 0:
        return Row(ours, NOT_REPRODUCED, "heads with a smaller raw share have larger normalised queries")
    return Row(ours, INCONCLUSIVE, "no clear dependence of the normalised query norm on the raw share, or a "
               "per-head model as spread as the layerwise one")


@claim("5a", "VL adaptation erodes format-sensitive text skills while knowledge (MMLU, BoolQ) stays put",
       ("ifeval_qwen25vl", "gsm8k_cot_qwen25vl", "knowledge_bound"), CH4,
       "Qwen2.5-VL: IFEval {ifeval_qwen25vl:+.1f}, GSM8K-CoT {gsm8k_cot_qwen25vl:+.1f}; knowledge within "
       "±{knowledge_bound:.1f} pt")
def _format_not_knowledge(res):
    def test(doc, m):
        f = delta(doc, m, "vl", "base", _strict())
        k = delta(doc, m, "vl", "base", ("knowledge acc",))
        v = NOT_REPRODUCED if k.hi < 0 or f.lo > 0 else REPRODUCED if f.hi < 0 else INCONCLUSIVE
        why = ("knowledge lost outside noise (broad damage)" if k.hi < 0 else
               "strict-format change excludes zero" if f.lo > 0 or f.hi < 0 else "strict-format change within noise")
        return f"strict-format {est(f)} pt, knowledge {est(k)} pt{_seeds(doc, m, 'vl')}", v, why
    return _ch4_claim(res, test)


@claim("5b", "IFEval loss depends on the backbone: per-head QK-norm pairs lose less than pairs without QK-norm",
       ("ifeval_per_head_min", "ifeval_per_head_max", "ifeval_none_min", "ifeval_none_max"), CH4,
       "per-head {ifeval_per_head_max:+.1f} to {ifeval_per_head_min:+.1f}; none {ifeval_none_max:+.1f} to "
       "{ifeval_none_min:+.1f} pt")
def _backbone(res):
    doc = res(CH4)
    qk = {r["llm"]: r["qk_norm"] for r in doc["results"]["panel_rows"]}
    ch = {m: delta(doc, m, "vl", "base", ("instructions strict",)) for m in models4(doc)}
    ours = tuple(f"{m} ({qk.get(m, '?')}): instructions strict {est(e)} pt" for m, e in ch.items())
    ph, no = [m for m in ch if qk.get(m) == "per_head"], [m for m in ch if qk.get(m) == "none"]
    if not ph or not no:
        return Row(ours, INCONCLUSIVE, "no measured pair on one of the two backbone types")
    d = diff(mean(*(ch[m] for m in ph)), mean(*(ch[m] for m in no)))
    failed = [m for m in ph + no if not vqa_learned(doc, m)[0]]
    if failed:
        return Row(ours, NOT_REPRODUCED, f"{NO_VQA} in {', '.join(failed)} "
                   f"({vqa_learned(doc, failed[0])[1]}); per-head minus none {est(d)} pt")
    return Row(ours, direction(d, +1), f"per-head minus none {est(d)} pt, {len(ph)} + {len(no)} pairs")


not_testable("5c", "InternVL3.5 (Qwen3 backbone, per-head QK-RMSNorm) loses little IFEval", ("ifeval_internvl35",),
             "05_panel_correlations", "{ifeval_internvl35:+.1f} pt", "a 7B VLM pair and the real IFEval; no Qwen3 "
             "model runs offline here")
not_testable("5d", "Molmo2-O (Olmo-3, layerwise QK-RMSNorm) loses much IFEval although its aggregate sink looks "
             "healthy", ("ifeval_molmo2o",), "03_perturbation_bound", "{ifeval_molmo2o:+.1f} pt",
             "no layerwise QK-norm model of that size runs offline here (chapter 7 measures Remark 1 on trained tiny layerwise models: claim 4b)")
not_testable("5e", "Coding (MBPP) improves on average after VL adaptation", ("mbpp_mean",), CH4, "{mbpp_mean:+.1f} pt",
             "the book has no coding suite")


@claim("6a", "Text-only fine-tuning to the same endpoint does not cause the loss", ("text_only_ifeval",), CH4,
       "IFEval {text_only_ifeval:+.2f} pt (VL {ifeval_qwen25vl:+.1f})")
def _text_only(res):
    def test(doc, m):
        t = delta(doc, m, "text_only", "base", _strict())
        tv = delta(doc, m, "text_only", "vl", _strict())
        v = NOT_REPRODUCED if t.hi < 0 or tv.hi < 0 else direction(tv, +1)
        why = ("text-only itself lost strict format outside noise" if t.hi < 0 else
               "text-only minus VL excludes zero" if v != INCONCLUSIVE else "text-only minus VL within noise")
        return (f"text-only strict-format {est(t)} pt, minus VL {est(tv)} pt{_format_step(doc, m)}"
                f"{_seeds(doc, m, 'text_only')}", v, why)
    return _ch4_claim(res, test)


def _seeds(doc: dict, model: str, condition: str) -> str:
    """'; strict-format change over 3 seeds: ...' from chapter 4's seed summary, worded by `seeds.verdict_note`
    (empty where the model has one training seed)."""
    import pandas as pd

    from .seeds import verdict_note

    summ = pd.DataFrame((doc["results"].get("seeds") or {}).get("summary") or [])
    note = verdict_note(summ, model, condition, fmt=lambda v: num(v, 1))
    return "" if note == "one training seed" else f"; strict-format change (pt) over {note}"


def _format_step(doc: dict, model: str) -> str:
    """'; of which the one-word format ...' from chapter 4's decomposition (empty where it stored none)."""
    rows = [r for r in doc["results"].get("decomposition") or [] if r["model"] == model
            and r["metric"] == "strict-format mean"]
    by = {r["step"]: Est(r["change"], r["lo"], r["hi"]) for r in rows}
    if "one-word answer format" not in by or "fine-tuning as such" not in by:
        return ""
    return (f" (format-preserving control: fine-tuning as such {est(by['fine-tuning as such'])} pt, "
            f"the one-word format {est(by['one-word answer format'])} pt)")


def _random_sizes(doc: dict, model: str) -> str:
    """'; random at up to Kx: ...' from chapter 4's random curve (empty where it stored none)."""
    import pandas as pd

    from .isolate import first_harm

    curve = pd.DataFrame(doc["results"].get("random_curve") or [])
    if curve.empty or model not in set(curve.model):
        return ""
    c = curve[curve.model == model]
    if set(c.scale) <= {1.0}:  # the norm-matched control alone: the row already says it
        return ""
    k = first_harm(c).get(model)
    sizes = "/".join(f"{x:g}x" for x in sorted(set(c.scale)))
    return (f"; random at {sizes} the VL norm: strict-format below zero outside the noise "
            + (f"from {k:g}x" if k is not None else "at no size"))


@claim("6b", "A norm-matched random weight change hurts far more than the VL change", ("random_ifeval",), CH4,
       "IFEval {random_ifeval:+.1f} pt (VL {ifeval_qwen25vl:+.1f})")
def _random(res):
    def test(doc, m):
        r = delta(doc, m, "random", "vl", _strict())
        v = direction(r, -1)
        return (f"random minus VL strict-format {est(r)} pt{_random_sizes(doc, m)}{_seeds(doc, m, 'random')}", v,
                "random minus VL excludes zero" if v != INCONCLUSIVE else "random minus VL within noise")
    return _ch4_claim(res, test)


@claim("6c", "S falls under VL training and holds under text-only training (3B Tulu trajectory)",
       ("tulu_S_base_vl", "tulu_S_after_vl", "tulu_S_text_only_min", "tulu_S_text_only_max"), CH4,
       "S {tulu_S_base_vl:.2f} → {tulu_S_after_vl:.2f} (VL); {tulu_S_text_only_min:.2f} to "
       "{tulu_S_text_only_max:.2f} (text-only)")
def _tulu(res):
    rob, n = res("02_sink_strength")["results"]["robustness"], res(CH4)["parameters"]["n_prompts"]
    cells = [c for c in rob if c["N"] == n] or rob
    srow = {r["model"]: r for r in res(CH4)["results"]["S"]}

    def test(doc, m):
        xs = [c[m] for c in cells]
        noise = max(xs) - min(xs)
        s = srow[m]
        d = s["vl"] - s["base"]
        v = INCONCLUSIVE if abs(d) <= noise else REPRODUCED if d < 0 else NOT_REPRODUCED
        return (f"S {s['base']:.2f} → {s['vl']:.2f} (VL), {s['text_only']:.2f} (text-only)", v,
                f"VL change {num(d, 2)} {'within' if abs(d) <= noise else 'beyond'} the spread {noise:.2f} of S over "
                f"calibration seeds at N = {cells[0]['N']} (chapter 2; no interval stored)")
    return _ch4_claim(res, test)


CH5 = "05_panel_correlations"


@claim("6d", "Text-only fine-tuning to the same endpoint does not cause the loss (controlled tiny panel)",
       ("text_only_ifeval",), CH7, "{text_only_ifeval:+.1f} pt (text-only)")
def _tiny_text_only(res):
    hyp = [h for h in res(CH7)["results"]["hypotheses"] if h["hypothesis"].startswith("H6")]
    if not hyp:
        return Row(("no text-only control in chapter 7's run",), INCONCLUSIVE, "run chapter 7 with its text-only control")
    h = hyp[0]
    return Row((h["this panel"],), h["verdict"], h["why"] + "; tiny models that did not learn the visual task")


@claim("7a", "S predicts the loss: Spearman ρ(S, IFEval change) over six pairs; leave-one-pair-out error below a "
       "constant's", ("rho_ifeval_6", "lopo_S", "lopo_constant"), CH5,
       "ρ = {rho_ifeval_6:.3f} (n = 6); LOPO {lopo_S:.2f} vs {lopo_constant:.2f} pt")
def _predicts(res):
    from .panel_schema import STRICT_TASK

    r = res(CH5)["results"]
    rho = next(x for x in r["measured_rho"] if x["task"] == STRICT_TASK)
    lopo = next(x for x in r["measured_lopo"] if x["task"] == STRICT_TASK)
    p = max(r["rho_0971_p_exact_one_sided"])
    ctx = f"the reported ρ at n = 6 has exact one-sided p = {p:.4f} (computed)"
    if rho["rho"] is None or rho["ci_fisher_lo"] is None:
        return Row((f"{rho['n']} measured pairs: no ρ", ctx), INCONCLUSIVE,
                   f"too few pairs: {rho['note'] or 'no interval'}")
    e = Est(rho["rho"], rho["ci_fisher_lo"], rho["ci_fisher_hi"])
    ours = (f"ρ = {est(e, 2)} (n = {rho['n']})", f"LOPO {lopo['mae_model']:.2f} vs {lopo['mae_constant']:.2f} pt"
            if lopo["mae_model"] is not None else "LOPO: too few pairs", ctx)
    return Row(ours, direction(e, +1), f"Fisher interval of ρ on {rho['n']} measured pairs")


not_testable("7b", "ρ ≥ 0.82 on each of four format-sensitive tasks (IFEval, EQ-Bench, GSM8K-CoT, GPQA-Diamond-CoT)",
             ("rho_four_tasks_min",), CH5, "min ρ = {rho_four_tasks_min:.2f} (n = 6)",
             "needs EQ-Bench and GPQA-Diamond and six VLM-LLM pairs; chapter 5 computes only what n = 6 can support")
not_testable("7c", "ρ = 0.88 on a 17-pair panel", ("rho_17",), CH5, "ρ = {rho_17:.2f} (n = 17)",
             "the 17 pairs and their per-pair values are not reported; we have two measured pairs")


def _tiny_precondition(res) -> tuple[str, str]:
    """Chapter 7's preconditions as text, and the failed one that makes a controlled-panel verdict
    inconclusive ('' when none): fewer than half the models formed a sink, or none lost strict score."""
    pre = {x["precondition"]: x for x in res(CH7)["results"]["preconditions"]}
    sink, lost = pre["a sink formed in training"], pre["VL lost strict-format score"]
    text = f"sink formed in {sink['models']} models; VL lost strict-format score outside the noise in {lost['models']}"
    if sink["share"] < 0.5:
        return text, (f"precondition: a sink formed in {sink['models']} tiny models, so S varies among models "
                      f"{'without' if sink['share'] == 0 else 'mostly without'} a sink")
    if lost["share"] == 0:
        return text, "precondition: no tiny model lost strict-format score outside the noise, so there is no loss to predict"
    return text, ""


@claim("7d", "S predicts the strict-format loss on a controlled panel (tiny models identical but for the QK-norm "
       "variant and one training setting)", ("rho_ifeval_6",), CH5, "ρ = {rho_ifeval_6:.3f} on six real pairs")
def _tiny_predicts(res):
    from .panel_schema import TINY_STRICT_TASK

    r = res(CH5)["results"]
    if not r.get("tiny_rho"):
        return Row(("no controlled panel in chapter 5's run",), INCONCLUSIVE, "run chapter 7, then chapter 5")
    rho = next(x for x in r["tiny_rho"] if x["task"] == TINY_STRICT_TASK)
    lopo = next(x for x in r["tiny_lopo"] if x["task"] == TINY_STRICT_TASK)
    ctx, failed = _tiny_precondition(res)
    if rho["rho"] is None or rho["ci_boot_lo"] is None:
        return Row((f"{rho['n']} tiny models: no ρ", ctx), INCONCLUSIVE, f"too few models: {rho['note']}")
    e = Est(rho["rho"], rho["ci_boot_lo"], rho["ci_boot_hi"])
    ours = (f"ρ = {est(e, 2)} (n = {rho['n']}, p = {rho['p_value']:.2g})",
            f"LOPO {lopo['mae_model']:.2f} vs constant {lopo['mae_constant']:.2f} pt", ctx)
    v = direction(e, +1)
    if failed:
        return Row(ours, INCONCLUSIVE, f"{failed}; the interval alone would say {v}")
    return Row(ours, v, f"bootstrap interval of ρ on {rho['n']} tiny models")


@claim("7e", "S adds to the QK-norm architecture (the paper's panel cannot tell: S co-clusters with the QK-norm "
       "type)", (), CH5)
def _tiny_beyond(res):
    from .panel_schema import TINY_STRICT_TASK

    r = res(CH5)["results"]
    if not r.get("tiny_architecture"):
        return Row(("no controlled panel in chapter 5's run",), INCONCLUSIVE, "run chapter 7, then chapter 5")
    a = next(x for x in r["tiny_architecture"] if x["task"] == TINY_STRICT_TASK)
    ctx, failed = _tiny_precondition(res)
    if a.get("partial_rho") is None:
        return Row(("architecture test not computed", ctx), INCONCLUSIVE, a.get("note") or "too few models")
    ours = (f"partial ρ of S given the variant = {num(a['partial_rho'], 2)}, within-variant permutation p = "
            f"{a['partial_p']:.2g}; nested F-test p = {a['F_p']:.2g} (n = {a['n']})", ctx)
    from .tiny.panel import beyond_architecture

    v = beyond_architecture(a["partial_rho"], a["partial_p"])
    if failed:
        return Row(ours, INCONCLUSIVE, f"{failed}; the test alone would say {v}")
    return Row(ours, v, "two-sided within-variant permutation test at 5 %")


CH9 = "09_sink_panel"


def _sink_panel(res) -> tuple[dict, str, str]:
    """Chapter 9's results, its sink precondition as text, and the failed precondition ('' when none): fewer than
    half of the panel's base models still have a sink at the end of training (chapter 9's stated rule)."""
    r = res(CH9)["results"]
    base = r.get("base") or []
    n_sink = sum(b.get("holds_from") is not None for b in base)
    text = f"{n_sink} of {len(base)} panel models have a sink by chapter 9's rule"
    failed = "" if base and n_sink >= len(base) / 2 else f"precondition: only {text}"
    return r, text, failed


@claim("7f", "S predicts the format-like loss on a panel whose models form a sink (chapter 9: Bigram-Backcopy "
       "models, the backcopy rule lost under miniature VL adaptation)", ("rho_ifeval_6",), CH9,
       "ρ = {rho_ifeval_6:.3f} on six real pairs")
def _sink_panel_predicts(res):
    r, ctx, failed = _sink_panel(res)
    t, word = r["tests"].get("rule loss", {}), r["verdicts"].get("rule loss", "")
    if t.get("rho") is None:
        return Row((f"no ρ: {t.get('error', 'not computed')}", ctx), INCONCLUSIVE, "too few models or a constant side")
    ours = (f"ρ(S, rule loss) = {num(t['rho'], 2)} [{num(t['lo'], 2)}, {num(t['hi'], 2)}] (n = {t['n']}, "
            f"p = {t['p']:.2g}; the paper predicts ρ < 0 for a loss)", ctx)
    if failed:
        return Row(ours, INCONCLUSIVE, f"{failed}, so S varies mostly among models without a sink; chapter 9 says {word}")
    if word.startswith("not tested"):
        return Row(ours, NOT_REPRODUCED, "precondition failed: fewer than half of the VL models learned the image task")
    v = {"reproduced": REPRODUCED, "contradicted": NOT_REPRODUCED}.get(word, INCONCLUSIVE)
    return Row(ours, v, "bootstrap interval and permutation p of ρ (chapter 9's rule)")


@claim("7g", "S adds to the QK-norm architecture on a panel whose models form a sink (chapter 9)", (), CH9)
def _sink_panel_beyond(res):
    r, ctx, failed = _sink_panel(res)
    t = r["tests"].get("rule loss", {})
    if t.get("within_p") is None or t.get("partial_rho") is None:
        return Row(("architecture test not computed", ctx), INCONCLUSIVE, t.get("error") or "too few models")
    ours = (f"partial ρ of S given the variant = {num(t['partial_rho'], 2)}, within-variant permutation p = "
            f"{t['within_p']:.2g}; nested F-test p = {t['f_p']:.2g} (n = {t['n']})", ctx)
    v = INCONCLUSIVE if not t["within_p"] < 0.05 else REPRODUCED if t["partial_rho"] < 0 else NOT_REPRODUCED
    if failed:
        return Row(ours, INCONCLUSIVE, f"{failed}; the test alone would say {v}")
    return Row(ours, v, "two-sided within-variant permutation test at 5 % (a loss: the paper predicts ρ < 0)")


@claim("8a", "Injecting QK-RMSNorm after pretraining fails", ("inject_ifeval_before", "inject_ifeval_after"), CH6,
       "IFEval {inject_ifeval_before:.1f} → {inject_ifeval_after:.0f}")
def _inject(res):
    r = res(CH6)["results"]
    inj, top1 = r["injection"], r["injection_init_error"]["top1_agreement"]
    sc = {c: {f"{s['suite']} {s['metric']}": Est(s["score"], s["lo"], s["hi"]) for s in v["scores"]}
          for c, v in inj.items()}
    final = "injected + recovery" if "injected + recovery" in sc else "injected"
    outs = {c: v.get("outcomes") for c, v in inj.items()}

    def paired_d(a: str, b: str) -> Est | None:  # a - b on the shared items, when both stored them
        return paired_delta(outs.get(a), outs.get(b), _strict())

    d = paired_d(final, "original") or diff(mean(*(sc[final][m] for m in _strict())),
                                            mean(*(sc["original"][m] for m in _strict())))
    ppl = " → ".join(f"{sc[c]['perplexity ppl'].v:.0f}" for c in sc)
    ours = (f"{final} minus original, strict-format {est(d)} pt", f"top-1 agreement at initialisation {top1:.2f}; "
            f"perplexity {ppl} ({' → '.join(sc)})")
    no_control = final != "injected" and "original + recovery" not in sc
    if top1 < INJECT_TOP1_MIN:
        return Row(ours, NOT_REPRODUCED, f"precondition failed: the injection breaks the model at initialisation "
                   f"(top-1 agreement {top1:.2f} < {INJECT_TOP1_MIN}), so the drop measures a broken start, not the "
                   f"norm{'; the recovery fine-tune has no control either' if no_control else ''}")
    if no_control:
        return Row(ours, NOT_REPRODUCED, "precondition failed: the recovery fine-tune has no control "
                   "(the original model fine-tuned the same way)")
    if "original + recovery" in sc:
        d = paired_d(final, "original + recovery") or diff(d, diff(mean(*(sc["original + recovery"][m] for m in _strict())),
                                                                   mean(*(sc["original"][m] for m in _strict()))))
    return Row(ours, direction(d, -1), f"strict-format change against its control {est(d)} pt")


def merge_recovers(to_base: Est, to_vl: Est) -> bool:
    """A merge recovers the VL loss: its strict-format change from the base is above zero outside the noise, or
    not below it while the change from the VL model is above zero outside the noise (paired where stored)."""
    return to_base.lo > 0 or (to_base.hi >= 0 and to_vl.lo > 0)


def merge_worse(to_vl: Est) -> bool:
    """A merge makes the text loss worse: its strict-format change from the VL model is below zero outside the noise."""
    return to_vl.hi < 0


def _merges(res: Results, test: Callable[[Callable[[str, str], Est], list[str]], tuple[str, str, str]]) -> Row:
    """Per model of chapter 6: `test(d, merges)` where d(a, b) is the strict-format change a - b (points) with a
    paired interval when chapter 6 stored per-item outcomes, else with MOVER intervals of Wilson intervals from
    chapter 6's n; merges are the model's 'merge:...' conditions."""
    doc = res(CH6)
    n, rows = evals.counts(doc["parameters"]), doc["results"]["merges"]  # the saved flat eval_* parameters
    out = {}
    for m in dict.fromkeys(r["model"] for r in rows):
        conds = {r["condition"]: mean(*(wilson_pct(r[k], n[k.split()[0]]) for k in _strict()))
                 for r in rows if r["model"] == m}

        def d(a: str, b: str, m=m, conds=conds) -> Est:
            e = paired_delta(outcomes_of(doc, m, a), outcomes_of(doc, m, b), _strict())
            return diff(conds[a], conds[b]) if e is None else e

        vl = next(r for r in rows if r["model"] == m and r["condition"] == "vl")
        e = wilson_pct(vl["VQA (%)"], doc["parameters"]["vqa_n"])
        maj = next(x["majority baseline (%)"] for x in res(CH4)["results"]["vqa"] if x["model"] == m)
        o, v, w = test(d, [c for c in conds if c.startswith("merge:")])
        out[m] = (o, v, w) if e.lo > maj else (o, NOT_REPRODUCED, f"{NO_VQA} (VQA {e.v:.0f} % [{e.lo:.0f}, "
                                               f"{e.hi:.0f}] vs majority {maj:.0f} %; without it: {v}, {w})")
    return per_model(out)


@claim("8b", "No merging setting recovers the VL loss", ("merge_settings",), CH6, "{merge_settings:.0f} settings, none recovers")
def _no_recovery(res):
    def test(d, merges):
        vl = d("vl", "base")
        merged = {c: d(c, "base") for c in merges}
        rec = [c for c, e in merged.items() if merge_recovers(e, d(c, "vl"))]
        below = [c for c, e in merged.items() if e.hi < 0]
        ours = f"VL strict-format {est(vl)} pt; below base outside noise: {len(below)} of {len(merged)}"
        if vl.hi >= 0:
            return ours, NOT_REPRODUCED, "precondition failed: the VL loss is within noise (nothing to recover)"
        v = NOT_REPRODUCED if rec else REPRODUCED if len(below) == len(merged) else INCONCLUSIVE
        return ours, v, f"{len(rec)} merges recover outside noise, {len(below)} stay below the base"
    return _merges(res, test)


@claim("8c", "Most merging settings make the text loss worse", ("merge_settings", "merge_settings_not_worse"), CH6,
       "{merge_settings_not_worse:.0f} of {merge_settings:.0f} avoid making it worse")
def _merges_worse(res):
    def test(d, merges):
        dd = {c: d(c, "vl") for c in merges}
        worse, better = sum(merge_worse(e) for e in dd.values()), sum(e.lo > 0 for e in dd.values())
        pts = sum(e.v < 0 for e in dd.values())
        v = REPRODUCED if worse > len(dd) / 2 else NOT_REPRODUCED if better >= len(dd) / 2 else INCONCLUSIVE
        return (f"worse than VL: {pts} of {len(dd)} by point value, {worse} outside noise; better outside noise: {better}",
                v, f"{worse} of {len(dd)} worse outside noise (rule: more than half)")
    return _merges(res, test)


CH8 = "08_causal_tests"


@claim("9a", "Mechanism (causal test, ours): removing the sink from the heads that use it most hurts format-sensitive "
       "skills before knowledge", (), CH8)
def _ablation_order(res):
    doc = res(CH8)
    ver = doc["results"]["verdicts"]
    out = {}
    for m in dict.fromkeys(r["model"] for r in ver):
        by = {r["control"]: r for r in ver if r["model"] == m}
        s = by.get("sink")
        if s is None:
            continue
        f, k = s["format_dose"], s["knowledge_dose"]
        rf = (by.get("random") or {}).get("format_dose")
        specific = f is not None and (rf is None or rf > f)
        if f is not None and (k is None or f < k) and specific:
            v, why = REPRODUCED, "format falls before knowledge, and as many random heads do not make it fall at that dose"
        elif k is not None and (f is None or k < f):
            v, why = NOT_REPRODUCED, "knowledge falls first"
        elif f is not None and (k is None or f < k):
            v, why = INCONCLUSIVE, ("format falls before knowledge, but as many random heads make it fall at the same "
                                    "dose (at dose 1 both are every head), so the fall is not specific to the sink heads")
        else:
            v, why = INCONCLUSIVE, "neither falls first outside the noise"
        ctl = "; ".join(f"{c}: {r['verdict']}" for c, r in by.items() if c != "sink")
        out[m] = (f"sink heads: {s['verdict']}" + (f" (controls: {ctl})" if ctl else ""), v,
                  why + " (rule: the smallest dose whose paired 95 % interval lies below zero)")
    return per_model(out)


@claim("9b", "Mechanism (causal test, ours): the VL loss flows through the sink heads' W_Q/W_K; restoring them "
       "brings strict formats back, random heads or other weights of the same norm do not", (), CH8)
def _repair(res):
    from .repair import repair_outcome

    doc = res(CH8)
    rows = doc["results"]["repair"]
    out = {}
    for m in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == m]
        f0 = mine[0]["fraction"]
        t = [r for r in mine if r["fraction"] == f0 and r["metric"] in _strict()]
        o = repair_outcome(t, _strict())
        lost, back = o["lost"], o["back"]
        by = {(r["control"], r["metric"]): r for r in t}
        loss = "; ".join(f"{mt} VL - base {r['loss']:+.1f} [{r['loss_lo']:+.1f}, {r['loss_hi']:+.1f}]"
                         for mt in _strict() for r in [by.get(("sink heads", mt))] if r)
        moves = "; ".join(f"{c} {mt} {r['change']:+.1f} [{r['lo']:+.1f}, {r['hi']:+.1f}]"
                          for (c, mt), r in by.items() if mt in lost)
        ours = f"{loss}" + (f"; restored ({f0:.0%} of heads): {moves}" if moves else "")
        if not lost:
            out[m] = (ours, NOT_REPRODUCED, "precondition failed: the VL loss is within noise (nothing to recover)")
            continue
        worse = o["down"]["sink heads"]
        if back["sink heads"] and not (back["random heads"] or back["other rows"]):
            v, w = REPRODUCED, "the sink heads' restore brings a lost score back outside noise; neither control does"
        elif worse or not back["sink heads"] and (back["random heads"] or back["other rows"]):
            v, w = NOT_REPRODUCED, "a control repairs, or the sink heads' restore makes it worse"
        else:
            v, w = INCONCLUSIVE, ("the sink heads and a control both repair" if back["sink heads"] else
                                  "no restore moves a lost score outside noise")
        out[m] = (ours, v, w)
    return per_model(out)


# ------------------------------------------------------------------------------------------------
# evaluation and the page

@dataclass
class Evaluated:
    claim: Claim
    row: Row
    models: list[str] = field(default_factory=list)
    profile: str = ""


def evaluate(c: Claim) -> Evaluated:
    res = Results()
    try:
        row = c.compute(res)
    except ResultsMissing:
        nb = res.missing
        row = Row(("—",), NOT_RUN, f"run notebooks/{nb}.ipynb (`python -m sinklib.book run --profile full --only {nb[:2]}`)")
    provs = [d.get("provenance") or {} for d in res.docs.values()]
    models = list(dict.fromkeys(m.get("name", "?") if isinstance(m, dict) else str(m)
                                for p in provs for m in p.get("models", [])))
    return Evaluated(c, row, models, ", ".join(sorted({str(p.get("profile", "?")) for p in provs})))


def paper_text(c: Claim) -> str:
    vals = reported_values()
    text = c.paper.format(**{k: vals[k]["value"] for k in vals}) if c.paper else "—"
    return re.sub(r"(?<!\w)-(?=\d)", "−", text)


def _cell(lines) -> str:
    return "\n\n    ".join(lines)


def render(evaluated: list[Evaluated]) -> str:
    tally = {v: sum(e.row.verdict == v for e in evaluated) for v in VERDICTS + (NOT_RUN,)}
    out = ["% generated by `python -m sinklib.claims` from data/results/ and data/paper_reported_values.csv: "
           "do not edit", "", "**Verdict rules** (one set for every row):", ""]
    out += [f"- **{v}**: {t}." for v, t in RULES]
    out += ["", INTERVALS, "", "Tally: " + ", ".join(f"{v} {n}" for v, n in tally.items() if n) + ".", "",
            "```{list-table}", ":header-rows: 1", ":widths: 4 24 16 44 12", ":class: full-width", "",
            "* - #", "  - claim (reported by the paper)", "  - paper", "  - ours, and why the verdict", "  - verdict"]
    for e in evaluated:
        c, r = e.claim, e.row
        where = (f"{{doc}}`ch. {c.chapter[:2].lstrip('0')} </book/chapters/{c.chapter}>`" if c.chapter else "no chapter")
        meta = " · ".join(x for x in (where, ", ".join(e.models), f"profile {e.profile}" if e.profile else "") if x)
        ours = ((f"*Not measured*: {r.reason}",) if r.ours == ("—",) and r.reason else
                r.ours + ((f"*Why*: {r.reason}",) if r.reason else ()))
        out += [f"* - {c.id}", f"  - {_cell([c.text, meta])}", f"  - {paper_text(c)}", f"  - {_cell(ours)}",
                f"  - **{r.verdict}**"]
    return "\n".join(out + ["```", ""])


def generate() -> str:
    return render([evaluate(c) for c in CLAIMS])


def default_path() -> Path:
    return (checkout_root() or Path.cwd()) / "book" / "_generated" / "claims_table.md"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sinklib.claims", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(default_path()))
    ap.add_argument("--check", action="store_true", help="exit 1 when the file differs from what would be written")
    a = ap.parse_args(argv)
    text, path = generate(), Path(a.out)
    if a.check:
        ok = path.exists() and path.read_text(encoding="utf-8") == text
        print("claims table is fresh" if ok else f"{path.name} is stale: run python -m sinklib.claims")
        return 0 if ok else 1
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path.name}: {len(CLAIMS)} claims")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
