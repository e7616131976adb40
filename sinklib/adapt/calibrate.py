"""The calibration sweep (#29): how much VL training does it take before VL costs instruction format?

Chapter 4's recipe moved about 0.14 % of the weights and cost no detectable format, so the paired changes it
measured had nothing to explain. The sweep trains VL on one model at several stage-2 learning rates, each
for the longest stage 2 of the grid with snapshots at the shorter lengths (`dose.train_series`: with the
constant schedule a snapshot differs from a run of that length only by the shorter run's warm-up), and
evaluates every snapshot on the same items as the base model.

A point *qualifies* (`RULE`, stated in the chapter before the run) when
1. the VL model learned its task: held-out VQA's Wilson interval lies above the blind majority answer;
2. it cost instruction format: the paired 95 % interval of the strict instruction pass rate lies below zero;
3. knowledge held: the paired interval of the knowledge accuracy does not lie below zero.
The recipe frozen for the panel is the qualifying point with the least training (fewest stage-2 steps, then
the lowest rate); with no qualifying point that is the finding, and `choose` returns None.

Section 10.4 repeats the sweep with the LM trained through LoRA adapters (`sinklib.vl.lora`), the method a
model too large for a full fine-tune must use, paired with the same evaluation of the base model (`base_params`),
and `method_check` says whether the method changes the model's verdict.

Every training and evaluation is cached: the snapshots by the pair parameters and the step, the evaluations by
their key with `KEY_EXTRA`, so no evaluation of chapter 4's pairs is touched.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from sinklib.core.params import check_float, check_int
from sinklib.errors import ParameterError

#: joins every calibration evaluation's cache key
KEY_EXTRA = {"calibration": "VL stage-2 dose series"}
#: the primary metric: IFEval-style prompt-level strict pass rate (the paper's instruction metric)
PRIMARY = "instructions strict"
#: the paired metrics the table reports, in order
METRICS = ("instructions strict", "instructions lenient", "math strict", "math lenient", "knowledge acc",
           "perplexity ppl")
RULE = ("a point qualifies when its VL model learned the task (held-out VQA's Wilson 95 % interval above the "
        "blind majority answer), the paired 95 % interval of the strict instruction pass rate lies below zero, and "
        "the paired interval of the knowledge accuracy does not lie below zero; the frozen recipe is the qualifying "
        "point with the fewest stage-2 steps, then the lowest rate")


def point_params(params: Mapping[str, Any], lr_lm: float, stage2_steps: int) -> dict:
    """The pair parameters of one series: `params` with the stage-2 rate `lr_lm` for the LM and the projector
    (LLaVA-1.5's rule) and `stage2_steps` steps."""
    lr = check_float("lr_lm", lr_lm, 1e-9, 1.0)
    return {**params, "lr_lm": lr, "lr_projector_stage2": lr,
            "stage2_steps": check_int("stage2_steps", stage2_steps, 1, 10**6)}


def base_params(params: Mapping[str, Any]) -> dict:
    """The pair parameters that key the base model's evaluation: `params` without the LoRA keys, so a LoRA
    series (section 10.4) is paired with the same cached evaluation of the base model as the full fine-tune."""
    from sinklib.vl import LORA_KEYS

    return {k: v for k, v in params.items() if k not in LORA_KEYS}


def check_grid(lrs: Sequence[float], steps: Sequence[int]) -> tuple[list[float], list[int]]:
    """Sorted distinct rates and steps; a clear error when either is empty."""
    if not lrs or not steps:
        raise ParameterError("the calibration grid needs at least one rate (lrs) and one stage-2 length (steps), "
                             f"got lrs={list(lrs)}, steps={list(steps)}")
    return (sorted({check_float(f"lrs[{i}]", x, 1e-9, 1.0) for i, x in enumerate(lrs)}),
            sorted({check_int(f"steps[{i}]", s, 1, 10**6) for i, s in enumerate(steps)}))


def run(lm: Any, params: Mapping[str, Any], lrs: Sequence[float], steps: Sequence[int], *,
        eval_n: Mapping[str, int], seed: int, prompts: list[str], sink_kwargs: Mapping[str, Any], vqa_n: int,
        eval_batch_size: int = 8, progress: bool = False) -> dict:
    """Train (or read from the cache) one VL series per rate and evaluate every snapshot and the base model on
    the same items. -> {'base': evaluation, 'points': [{'lr_lm', 'steps', 'eval'}]} (`pairs.evaluate_condition`
    evaluations; `lm.model` ends holding the base weights). A series whose every evaluation is cached is not
    trained again (a cache carried from another machine holds evaluations, not snapshots)."""
    from sinklib import vl
    from sinklib.adapt import dose
    from sinklib.adapt.pairs import LazyStates, Pair, cached_evaluation, evaluate_condition

    lrs, steps = check_grid(lrs, steps)
    kw = dict(eval_n=dict(eval_n), seed=seed, prompts=prompts, sink_kwargs=sink_kwargs,
              eval_batch_size=eval_batch_size, key_extra=KEY_EXTRA)
    base_state = vl.clone_state_dict(lm.model)
    base_pair = Pair(params=base_params(params), states={"base": base_state}, projector=None, encoder=None)
    out: dict = {"base": evaluate_condition(lm, base_pair, "base", **kw), "points": []}
    for lr in lrs:
        pp = point_params(params, lr, steps[-1])
        if any(cached_evaluation(pp, dose.snapshot_name("vl", s), vqa_n=vqa_n, **kw) is None for s in steps):
            dose.train_series(lm, pp, "vl", steps, progress=progress)  # else nothing to train: all evaluated
        pair = Pair(params=pp, states=LazyStates({"base": base_state}), projector=None, encoder=None)
        evs = dose.evaluate_series(lm, pair, "vl", steps, vqa_n=vqa_n, **kw)
        out["points"] += [{"lr_lm": lr, "steps": s, "eval": evs[s]} for s in steps]
    return out


def table(res: Mapping[str, Any], *, seed: int, image_size: int) -> pd.DataFrame:
    """One row per point of `run`'s result: rate, steps, VQA [Wilson] against the majority answer and 'learned',
    each metric's paired change from base with its 95 % interval (`paired.paired_changes`), S, and 'qualifies'
    by `RULE`. Sorted by steps, then rate."""
    from sinklib.evals import paired
    from sinklib.vl import against_majority

    rows = []
    for p in res["points"]:
        ev = p["eval"]
        row: dict = {"lr_lm": p["lr_lm"], "steps": p["steps"]}
        if ev.get("vqa"):
            v = against_majority(*ev["vqa"], seed, image_size)
            row.update({"VQA": v["vqa"], "VQA lo": v["vqa_lo"], "VQA hi": v["vqa_hi"], "majority": v["majority"],
                        "learned": bool(v["learned"])})
        else:
            row.update({"VQA": float("nan"), "learned": False})
        for r in paired.paired_changes(res["base"], ev, seed=seed):
            if r["metric"] in METRICS:
                row.update({f"{r['metric']} base": r["base"], f"{r['metric']}": r["change"],
                            f"{r['metric']} lo": r["lo"], f"{r['metric']} hi": r["hi"]})
        row["S"] = ev["S"]
        row["S base"] = res["base"]["S"]
        rows.append(row)
    t = pd.DataFrame(rows).sort_values(["steps", "lr_lm"], kind="stable").reset_index(drop=True)
    t["qualifies"] = [qualifies(r) for _, r in t.iterrows()]
    return t


def qualifies(row: Mapping[str, Any]) -> bool:
    """`RULE` for one row of `table`."""
    hi, k_hi = row.get(f"{PRIMARY} hi"), row.get("knowledge acc hi")
    if hi is None or k_hi is None or hi != hi or k_hi != k_hi:
        return False
    return bool(row.get("learned")) and hi < 0 and not k_hi < 0


def choose(t: pd.DataFrame) -> dict | None:
    """The frozen recipe: the qualifying row with the fewest steps, then the lowest rate, as {'lr_lm', 'steps'};
    None when no row qualifies."""
    ok = t[t.qualifies].sort_values(["steps", "lr_lm"], kind="stable")
    if ok.empty:
        return None
    r = ok.iloc[0]
    return {"lr_lm": float(r.lr_lm), "stage2_steps": int(r.steps)}


def rate(x: float) -> str:
    """A learning rate as the text writes it: 5e-5, 5e-4, 2e-3, 2.5e-4."""
    m, e = f"{float(x):.6e}".split("e")
    return f"{m.rstrip('0').rstrip('.')}e{int(e)}"


def _num(v: float, d: int) -> str:
    from sinklib.core.numbers import signed

    return signed(v, d)  # no signed zeros


def _cell(r: Mapping[str, Any], metric: str) -> str:
    d = 2 if metric.startswith("perplexity") else 1  # perplexity moves by hundredths under LoRA
    return f"{_num(r[metric], d)} [{_num(r[metric + ' lo'], d)}, {_num(r[metric + ' hi'], d)}]"


def sentence(t: pd.DataFrame, model: str) -> str:
    """The sweep in words: which points learned the task, which cost instruction format, the chosen recipe or
    that no point qualified, with the numbers."""
    learned = t[t.learned]
    lost = t[t[f"{PRIMARY} hi"] < 0]
    name = lambda r: f"rate {rate(r.lr_lm)} for {int(r.steps)} steps"  # noqa: E731
    parts = [f"{model}: {len(learned)} of {len(t)} points learned the image task"]
    if lost.empty:
        worst = t.loc[t[PRIMARY].idxmin()]
        parts.append(f"no point cost strict instruction format beyond the paired noise (the largest fall: "
                     f"{_cell(worst, PRIMARY)} points at {name(worst)})")
    else:
        parts.append("strict instruction format fell beyond the noise at " + "; ".join(
            f"{name(r)} ({_cell(r, PRIMARY)} points, knowledge {_cell(r, 'knowledge acc')})"
            for _, r in lost.iterrows()))
    c = choose(t)
    parts.append("no point met all three conditions of the rule, so no recipe is frozen" if c is None else
                 f"the frozen recipe is rate {rate(c['lr_lm'])} for {c['stage2_steps']} stage-2 steps")
    return "; ".join(parts) + "."


#: the changes `point_sentence` gives, in its order
POINT_METRICS = ("instructions strict", "knowledge acc", "math strict", "math lenient", "perplexity ppl")


def point_sentence(r: Mapping[str, Any], metrics: Sequence[str] = POINT_METRICS) -> str:
    """One point of `table` in words: 'rate 0.002 for 60 steps: VQA 68.5 % (majority 38 %), instructions strict
    -11.4 [-16.1, -6.9], ..., S 0.943 (base 0.725)': the changes from the base model with their paired intervals
    (points; perplexity in its own units)."""
    vqa = r.get("VQA")
    vqa = f"VQA {vqa:.1f} % (majority {r['majority']:.0f} %)" if vqa is not None and vqa == vqa else "VQA not measured"
    cells = ", ".join(f"{m.replace(' acc', '').replace(' ppl', '')} {_cell(r, m)}" for m in metrics if f"{m} lo" in r)
    return f"rate {rate(r['lr_lm'])} for {int(r['steps'])} steps: {vqa}, {cells}, S {r['S']:.3f} (base {r['S base']:.3f})"


def points_at(t: pd.DataFrame, lr_lm: float | None = None, frozen: bool = False) -> str:
    """`point_sentence` of the points of `t` at stage-2 rate `lr_lm`, or of the frozen recipe's point
    (`frozen=True`; '' when no point qualifies), joined by '; '."""
    if frozen:
        c = choose(t)
        rows = t[(t.lr_lm == c["lr_lm"]) & (t.steps == c["stage2_steps"])] if c else t.iloc[0:0]
    else:
        rows = t[np.isclose(t.lr_lm, lr_lm, rtol=1e-9, atol=0)]
    return "; ".join(point_sentence(r) for _, r in rows.iterrows())


def method_check(full: pd.DataFrame, lora: pd.DataFrame, model: str, method: str) -> str:
    """Section 10.4 in words: does training the LM through LoRA adapters (`method`, for example 'LoRA rank 16')
    instead of every weight change the model's verdict under `RULE` (some point of the grid qualifies, or none
    does)? With the LoRA recipe that a model too large for a full fine-tune would use."""
    verdict = lambda t: choose(t) is not None  # noqa: E731
    said = lambda t: f"{int(t.qualifies.sum())} of {len(t)} points qualified"  # noqa: E731
    c = choose(lora)
    same = verdict(full) == verdict(lora)
    recipe = ("" if c is None else
              f"; the LoRA recipe frozen for a model too large for a full fine-tune is rate {rate(c['lr_lm'])} for "
              f"{c['stage2_steps']} stage-2 steps")
    return (f"{model}: with the full fine-tune {said(full)}, with {method} {said(lora)}, so the method "
            f"{'does not change' if same else 'changes'} whether some dose qualifies{recipe}.")


def display(t: pd.DataFrame, what: str = "Calibration sweep"):
    """`table` as the chapter shows it: two `plots.Table`s (the rule's columns, then the rest), each fitting the
    column; `what` opens both captions (for example the LoRA sweep of section 10.4)."""
    from sinklib.plots import Table

    rows = [{"stage-2 rate": rate(r.lr_lm), "stage-2 steps": int(r.steps),
             "VQA % [95 %]": f"{r.VQA:.1f} [{r['VQA lo']:.1f}, {r['VQA hi']:.1f}]" if r.VQA == r.VQA else "-",
             "majority %": round(r.majority, 1) if "majority" in r and r.majority == r.majority else "-",
             "learned": "yes" if r.learned else "no",
             "instr. strict (pt)": _cell(r, PRIMARY), "math strict (pt)": _cell(r, "math strict"),
             "knowledge (pt)": _cell(r, "knowledge acc"),
             "perplexity": _cell(r, "perplexity ppl"), "S": f"{r.S:.3f}",
             "qualifies": "yes" if r.qualifies else "no"} for _, r in t.iterrows()]
    frame = pd.DataFrame(rows).set_index(["stage-2 rate", "stage-2 steps"])
    rule = ["VQA % [95 %]", "majority %", "learned", "instr. strict (pt)", "knowledge (pt)", "qualifies"]
    return [Table(frame[rule], f"{what}, the rule's columns: each VL snapshot against the base model on the "
                  "same items (instr.: the instruction suite). Changes are paired, in points, with 95 % bootstrap intervals; VQA with its Wilson "
                  "95 % interval against the blind majority answer. 'qualifies': " + RULE + "."),
            Table(frame[[c for c in frame.columns if c not in rule]],
                  f"{what}, the other measurements of the same snapshots (perplexity in its own units; "
                  f"S of the adapted model){_base_note(t)}.")]


def _base_note(t: pd.DataFrame) -> str:
    """The base model's own perplexity and S, which the other measurements' table is read against."""
    said = [f"{name} {t[col].iloc[0]:{fmt}}" for col, name, fmt in (("perplexity ppl base", "perplexity", ".2f"),
                                                                       ("S base", "S", ".3f"))
            if col in t and len(t) and t[col].iloc[0] == t[col].iloc[0]]
    return f"; the base model: {', '.join(said)}" if said else ""


def figure(t: pd.DataFrame, model: str):
    """Paired change from base (points, 95 % intervals) of strict instructions, strict math and knowledge
    against stage-2 steps, one line per rate; the dotted line is zero."""
    from sinklib import plots

    metrics = (("instructions strict", "strict instructions"), ("math strict", "strict math"),
               ("knowledge acc", "knowledge"))
    fig, axes = plots.subplots(1, len(metrics), height=3.2)
    span = max(float(t.steps.max() - t.steps.min()), 1.0)  # rates side by side, a few % of the axis apart
    for ax, (m, title) in zip(axes, metrics):
        for i, (lr, g) in enumerate(t.groupby("lr_lm", sort=True)):
            g = g.sort_values("steps")
            ax.errorbar(g.steps + span * (i - 0.5) * 0.03, g[m], yerr=[g[m] - g[m + " lo"], g[m + " hi"] - g[m]],
                        marker="o", capsize=3, label=f"rate {rate(lr)}")
        ax.axhline(0, color="grey", ls=":", lw=1)
        ax.set_xticks(sorted(set(t.steps)))
        ax.set_title(title)
        ax.set_xlabel("stage-2 steps")
    axes[0].set_ylabel("change from base (points)")
    fig.suptitle(model)
    for ax in axes:  # room beside the outermost points
        lo, hi = ax.get_xlim()
        ax.set_xlim(lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo))
    handles, labels = axes[0].get_legend_handles_labels()
    fig.tight_layout(rect=(0, 0.12, 1, 1))  # the legend under the panels, clear of every point; the model above
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), frameon=False)
    return fig


def _params():
    from sinklib import vl
    from sinklib.core.models import MODEL_PARAMS
    from sinklib.core.params import COMMON, boolean, choice, integer, list_of, number
    from sinklib.core.sink import prompt_count
    from sinklib.evals import COUNT_PARAMS

    return {**MODEL_PARAMS, "seed": integer(0), "image_size": lambda _, v: vl.check_image_size(v),
            "stage1_steps": integer(0, 10**6), "batch_size": integer(1, 4096), "lr_projector": number(0.0, 1.0),
            "schedule": choice(vl.SCHEDULES), "lrs": list_of(number(1e-9, 1.0)), "steps": list_of(integer(1, 10**6)),
            "lora_lrs": list_of(number(1e-9, 1.0), min_len=0), "lora_rank": integer(1, 1 << 16),
            "n_prompts": prompt_count, "last_k_layers": integer(1, 1000), "max_tokens": integer(8, 8192),
            "vqa_n": integer(1, 100_000), **COUNT_PARAMS, "eval_batch_size": integer(1, 1024),
            "show_progress": boolean(), **COMMON}


#: the notebook's parameters and their checks (`params.validate`)
CALIBRATION_PARAMS = _params()


def by_type(res: Mapping[str, Any], labels: Sequence[Any]) -> pd.DataFrame:
    """Every point's strict-instruction change from the base model (`run`'s result) with the items resampled and
    with the instruction types resampled (`labels`: `sinklib.evals.clustered.instruction_types` of the suite run),
    and the design effect. A check added after the sweep had run: `RULE` reads the item-level interval."""
    from sinklib.evals import clustered

    t = clustered.points_table(res["base"]["outcomes"], {(p["lr_lm"], p["steps"]): p["eval"]["outcomes"]
                                                         for p in res["points"]}, labels, PRIMARY)
    t.insert(0, "lr_lm", [k[0] for k in t.point])
    t.insert(1, "steps", [int(k[1]) for k in t.point])
    return t.drop(columns="point")


def by_type_display(t: pd.DataFrame, what: str):
    """`by_type` as a table: one row per point, each change 'v [lo, hi]' in points."""
    from sinklib.evals.clustered import cell
    from sinklib.plots import Table

    num = lambda v: "-" if v != v else f"{v:.1f}"  # noqa: E731
    frame = pd.DataFrame({"stage-2 rate": [rate(x) for x in t.lr_lm], "stage-2 steps": t.steps,
                          "items resampled": [cell(e) for e in t["change, items resampled"]],
                          "instruction types resampled": [cell(e) for e in t["change, types resampled"]],
                          "design effect (CR1)": [num(d) for d in t["design effect"]],
                          "detectable fall, items / effective items": [
                              f"{num(a)} / {num(b)}" for a, b in zip(t["smallest detectable fall, items"],
                                                                     t["smallest detectable fall, types"])]})
    return Table(frame.set_index(["stage-2 rate", "stage-2 steps"]),
                 f"{what}: the paired change of the strict instruction pass rate from the base model (points, 95 % "
                 "intervals), resampling the items one by one (the rule's interval) or the suite's instruction "
                 "types; the design effect and the smallest fall detectable with 80 % power at the number of items "
                 "and at the effective number (sinklib.evals.clustered).")


def _name(r) -> str:
    return f"rate {rate(r.lr_lm)} for {int(r.steps)} steps"


def by_type_sentence(t: pd.DataFrame, what: str, frozen: Mapping[str, Any] | None = None) -> str:
    """`by_type` in words: how many points whose loss lies outside the item-level noise keep it outside the
    type-level one, naming them, and the frozen point's two intervals (`frozen`: `choose`'s recipe)."""
    from sinklib.evals.clustered import has_interval, where

    out = where(t, [e.hi < 0 for e in t["change, items resampled"]])
    typed = where(out, [has_interval(e) for e in out["change, types resampled"]])
    kept = where(typed, [e.hi < 0 for e in typed["change, types resampled"]])
    text = (f"{what}: {len(out)} of {len(t)} points lose strict instruction format beyond the item-level noise, and "
            f"{len(kept)} of them beyond the noise with the instruction types resampled"
            + (f" ({'; '.join(_name(r) for _, r in kept.iterrows())})" if len(kept) else "")
            + (f" ({len(out) - len(typed)} without a type-level interval)" if len(typed) < len(out) else ""))
    at = frozen_by_type(t, frozen)
    return text + (f"; {at}" if at else "")


def _frozen_row(t: pd.DataFrame, frozen: Mapping[str, Any] | None):
    at = t[(t.lr_lm == frozen["lr_lm"]) & (t.steps == frozen["stage2_steps"])] if frozen else t.iloc[0:0]
    return at.iloc[0] if len(at) else None


def frozen_by_type(t: pd.DataFrame, frozen: Mapping[str, Any] | None) -> str:
    """The frozen point's row of `by_type` in words ('' when no recipe was frozen)."""
    from sinklib.evals.clustered import cell

    r = _frozen_row(t, frozen)
    if r is None:
        return ""
    num = lambda v: "none" if v != v else f"{v:.1f}"  # noqa: E731
    return (f"the frozen point ({_name(r)}) {cell(r['change, items resampled'])} by item, "
            f"{cell(r['change, types resampled'])} by type (design effect {num(r['design effect'])}; "
            f"smallest detectable fall {num(r['smallest detectable fall, items'])} points with the items taken as "
            f"independent, {num(r['smallest detectable fall, types'])} at the effective number)")


def by_type_finding(checks: Mapping[str, tuple[pd.DataFrame, Mapping[str, Any] | None]]) -> str:
    """Section 10.5 for the chapter's findings, one sentence per sweep (`checks`: {what: (`by_type` table, frozen
    recipe)}): whether the frozen point's loss stays outside the noise with the instruction types resampled, and
    which other points lose beyond the item-level noise but not beyond the type-level one."""
    from sinklib.evals.clustered import cell, has_interval, where

    out = []
    for what, (t, frozen) in checks.items():
        r = _frozen_row(t, frozen)
        e = None if r is None else r["change, types resampled"]
        head = (f"{what}: no recipe was frozen" if r is None else
                f"{what}: the frozen point's loss has no type-level interval" if not has_interval(e) else
                f"{what}: the frozen point's loss {'stays' if e.hi < 0 else 'does not stay'} outside the noise "
                f"with the instruction types resampled ({cell(e)})")
        gone = where(t, [a.hi < 0 and has_interval(b) and b.hi >= 0
                         for a, b in zip(t["change, items resampled"], t["change, types resampled"])])
        if len(gone):
            head += (f"; the item-level loss{'es' if len(gone) > 1 else ''} at "
                     + ", ".join(f"{_name(g)} ({cell(g['change, types resampled'])}, design effect "
                                 f"{g['design effect']:.1f})" for _, g in gone.iterrows())
                     + f" {'do' if len(gone) > 1 else 'does'} not")
        out.append(head)
    return "; ".join(out)


def outcomes_record(res: Mapping[str, Any]) -> dict:
    """`run`'s per-item outcomes in the results file's compact form: {'base': ..., '<rate>/<steps>': ...}
    (`sinklib.evals.paired.pack`), so that a check of the sweep can be recomputed from the results alone."""
    from sinklib.evals.paired import pack

    out = {"base": pack(res["base"]["outcomes"])}
    out.update({f"{rate(p['lr_lm'])}/{int(p['steps'])}": pack(p["eval"]["outcomes"]) for p in res["points"]})
    return out
