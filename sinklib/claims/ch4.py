"""Claims 5a, 5b, 5e and 6a to 6c: what VL adaptation does to text skills, and its controls (chapter 4); also
chapter 4's own verdict table (`chapter4_verdicts`, `chapter4_summary`)."""
from __future__ import annotations

from collections.abc import Callable

from sinklib.claims.core import (CH4, NO_VQA, Results, Row, claim, not_testable, per_model, pooled, pooled_gap,
    strict_metrics, vqa_learned)
from sinklib.stats.verdicts import (CONTRADICTED, INCONCLUSIVE, Est, Verdict, compare_words, decide, diff, est,
    mean, num, t_interval)


def chapter4_verdicts(doc: dict, model: str) -> dict[str, str]:
    """Chapter 4's elements of the paper's pattern for one model, each with its interval and in words.

    doc: chapter 4's results (``{"results": {"scores": [...], "outcomes": {...}}}``; the notebook passes its
    own tables). Changes are VL (or control) minus base in points; the strict-format mean is instructions
    strict and math strict. Intervals are paired (per-item bootstrap) and pooled over the training seeds
    (`pooled`: items and seeds resampled) where the doc holds per-item outcomes, MOVER intervals of the stored
    scores otherwise."""
    f = pooled(doc, model, "vl", "base", strict_metrics())[0]
    k = pooled(doc, model, "vl", "base", ("knowledge acc",))[0]
    return {"model": model,
            "VL: strict-format change (pt)": est(f),
            "VL: knowledge change (pt)": est(k),
            "strict format vs knowledge under VL": compare_words(
                pooled_gap(doc, model, "vl", "base", strict_metrics(), ("knowledge acc",)),
                "format fared worse than knowledge", "format fared better than knowledge"),
            "text-only vs VL (strict format)": compare_words(pooled(doc, model, "text_only", "vl", strict_metrics())[0],
                                                             "text-only lost more", "text-only lost less"),
            "random vs VL (strict format)": compare_words(pooled(doc, model, "random", "vl", strict_metrics())[0],
                                                          "random lost more", "random lost less")}


def chapter4_summary(verdict) -> str:
    """The paper's pattern, element by element, with the models for which it holds outside the noise
    (`verdict`: rows of `chapter4_verdicts`, plus an "S under VL" column of "fell"/"rose")."""
    def who(col, words):
        ms = [r["model"] for _, r in verdict.iterrows() if str(r[col]).startswith(words)]
        return ", ".join(ms) if ms else "no model"

    parts = [f"format fared worse than knowledge (a difference of two changes, not a fall of format): "
             f"{who('strict format vs knowledge under VL', 'format fared worse than knowledge (')}",
             f"text-only lost less than VL: {who('text-only vs VL (strict format)', 'text-only lost less (')}",
             f"random lost more than VL: {who('random vs VL (strict format)', 'random lost more (')}"]
    if "S under VL" in verdict:
        seeded = any("t interval" in str(v) for v in verdict["S under VL"])
        note = "t interval over the training seeds" if seeded else "point values, no interval"
        parts.append(f"S fell under VL ({note}): {who('S under VL', 'fell')}")
    return "; ".join(parts)


def s_under_vl(rows, model: str, seed: int = 0) -> str:
    """The change of S under VL for a verdict table, from `isolate.sink_text_rows` (one row per training seed):
    'rose'/'fell'/'within noise' by the t interval over the seeds where there are two or more, else by the point
    value of the one seed."""
    xs = [float(x) for x in rows.loc[(rows.model == model) & (rows.condition.str.split(" seed ").str[0] == "vl"),
                                     "S change"]]
    if not xs:
        return "not measured"
    e = t_interval(xs)
    if e is None:
        return f"{'fell' if xs[0] < 0 else 'rose'} (point value, training seed {seed})"
    word = "fell" if e.hi < 0 else "rose" if e.lo > 0 else "within noise"
    return f"{word}: {est(e, 3)} (t interval over {len(xs)} training seeds)"


def models4(doc: dict) -> list[str]:
    return list(dict.fromkeys(r["model"] for r in doc["results"]["scores"]))


def _ch4_claim(res: Results, test: Callable[[dict, str], tuple[str, Verdict]]) -> Row:
    """Per model of chapter 4: `test(doc, model)` -> (ours, verdict); a model whose VL training did not learn the
    visual task is not tested (the precondition, `vqa_learned`)."""
    doc = res(CH4)
    out = {}
    for m in models4(doc):
        ok, vqa = vqa_learned(doc, m)
        o, v = test(doc, m)
        if not ok:
            v = decide(None, not_tested=f"{NO_VQA} (the interval alone: {v.outcome})")
        out[m] = (f"{o}; {vqa}", v.outcome, v.why)
    return per_model(out)


def _pooled(doc: dict, m: str, cond: str, ref: str, metrics) -> tuple[Est, str]:
    """`pooled` and its label: '(3 seeds pooled)' or '(seed 0)'."""
    e, k = pooled(doc, m, cond, ref, metrics)
    p = doc.get("parameters") or {}
    items = (f", chapter 4's {p['eval_instructions']} + {p['eval_math']}-item strict suites"
             if "eval_instructions" in p and "eval_math" in p else "")
    return e, f"({k} seeds pooled{items})" if k > 1 else f"(one training seed{items})"


# ------------------------------------------------------------------------------------------------
# the claims, in the paper's order

@claim("5a", "VL adaptation erodes format-sensitive text skills while knowledge (MMLU, BoolQ) stays put",
       ("ifeval_qwen25vl", "gsm8k_cot_qwen25vl", "knowledge_bound"), CH4,
       "Qwen2.5-VL: IFEval {ifeval_qwen25vl:+.1f}, GSM8K-CoT {gsm8k_cot_qwen25vl:+.1f}; knowledge within "
       "±{knowledge_bound:.1f} pt")
def format_not_knowledge(res):
    def test(doc, m):
        f, lab = _pooled(doc, m, "vl", "base", strict_metrics())
        k, _ = _pooled(doc, m, "vl", "base", ("knowledge acc",))
        v = decide(f, -1, quantity="the VL strict-format change")
        if k.hi < 0:
            v = Verdict(CONTRADICTED, "knowledge also fell outside noise: the loss is not format-specific")
        return f"VL strict-format {est(f)} pt, knowledge {est(k)} pt {lab}{_seeds(doc, m, 'vl')}", v
    return _ch4_claim(res, test)


@claim("5b", "IFEval loss depends on the backbone: per-head QK-norm pairs lose less than pairs without QK-norm",
       ("ifeval_per_head_min", "ifeval_per_head_max", "ifeval_none_min", "ifeval_none_max"), CH4,
       "per-head {ifeval_per_head_max:+.1f} to {ifeval_per_head_min:+.1f}; none {ifeval_none_max:+.1f} to "
       "{ifeval_none_min:+.1f} pt")
def backbone(res):
    doc = res(CH4)
    qk = {r["llm"]: r["qk_norm"] for r in doc["results"]["panel_rows"]}
    ch = {m: _pooled(doc, m, "vl", "base", ("instructions strict",)) for m in models4(doc)}
    ours = tuple(f"{m} ({qk.get(m, '?')}): VL instructions strict {est(e)} pt {lab}" for m, (e, lab) in ch.items())
    ph, no = [m for m in ch if qk.get(m) == "per_head"], [m for m in ch if qk.get(m) == "none"]
    if not ph or not no:
        return Row(ours, *decide(None, not_tested="no measured pair on one of the two backbone types"), 0)
    d = diff(mean(*(ch[m][0] for m in ph)), mean(*(ch[m][0] for m in no)))
    failed = [m for m in ph + no if not vqa_learned(doc, m)[0]]
    v = decide(d, +1, quantity=f"per-head minus none {est(d)} pt ({len(ph)} + {len(no)} pairs, MOVER)",
               not_tested=f"{NO_VQA} in {', '.join(failed)} ({vqa_learned(doc, failed[0])[1]})" if failed else "")
    return Row(ours, *v)


coding = not_testable("5e", "Coding (MBPP) improves on average after VL adaptation", ("mbpp_mean",), CH4, "{mbpp_mean:+.1f} pt",
                      "the book has no coding suite")


@claim("6a", "Text-only fine-tuning to the same endpoint does not cause the loss", ("text_only_ifeval",), CH4,
       "IFEval {text_only_ifeval:+.2f} pt (VL {ifeval_qwen25vl:+.1f})")
def text_only(res):
    def test(doc, m):
        t, lab = _pooled(doc, m, "text_only", "base", strict_metrics())
        tv, _ = _pooled(doc, m, "text_only", "vl", strict_metrics())
        v = decide(tv, +1, quantity="text-only minus VL")
        if v.outcome == INCONCLUSIVE and t.hi < 0:
            v = Verdict(CONTRADICTED, "text-only itself lost strict format outside noise")
        return (f"text-only strict-format {est(t)} pt, minus VL {est(tv)} pt {lab}{_format_step(doc, m)}"
                f"{_seeds(doc, m, 'text_only')}", v)
    return _ch4_claim(res, test)


def _seeds(doc: dict, model: str, condition: str) -> str:
    """'; strict-format change over 3 seeds: ...' from chapter 4's seed summary, worded by `seeds.verdict_note`
    (empty where the model has one training seed)."""
    import pandas as pd

    from sinklib.adapt.seeds import verdict_note

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

    from sinklib.adapt.isolate import first_harm

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
def random_change(res):
    def test(doc, m):
        r, lab = _pooled(doc, m, "random", "vl", strict_metrics())
        return (f"random minus VL strict-format {est(r)} pt {lab}{_random_sizes(doc, m)}{_seeds(doc, m, 'random')}",
                decide(r, -1, quantity="random minus VL"))
    return _ch4_claim(res, test)


@claim("6c", "S falls under VL training and holds under text-only training (3B Tulu trajectory)",
       ("tulu_S_base_vl", "tulu_S_after_vl", "tulu_S_text_only_min", "tulu_S_text_only_max"), CH4,
       "S {tulu_S_base_vl:.2f} → {tulu_S_after_vl:.2f} (VL); {tulu_S_text_only_min:.2f} to "
       "{tulu_S_text_only_max:.2f} (text-only)")
def tulu(res):
    doc = res(CH4)
    rows = (doc["results"].get("sink_text") or {}).get("rows") or []

    def test(doc, m):
        ch = {c: {r["condition"].split(" seed ")[-1] if " seed " in r["condition"] else "0": r["S change"]
                  for r in rows if r["model"] == m and r["condition"].split(" seed ")[0] == c}
              for c in ("vl", "text_only")}
        seeds = sorted(set(ch["vl"]) & set(ch["text_only"]))
        e = t_interval(ch["vl"][s] - ch["text_only"][s] for s in seeds)
        each = "; ".join(f"{c} {', '.join(num(ch[c][s], 3) for s in seeds)}" for c in ("vl", "text_only"))
        ours = (f"change in S per training seed: {each}" if seeds else "no per-seed change in S stored") + (
            f"; VL minus text-only {est(e, 3)} (t interval over {len(seeds)} seeds, paired by seed)" if e else "")
        return ours, decide(e, -1, quantity="VL minus text-only change in S",
                            too_small="" if e else "fewer than two training seeds: no interval of the change in S")
    return _ch4_claim(res, test)
