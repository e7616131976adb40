"""Chapter 7's controlled panel: tiny base LMs in three QK-norm variants, several training settings per
variant (so that S spreads *within* a variant), each adapted by chapter 4's VL recipe (`sinklib.tiny.adapt`),
and the statistics of the claim on the resulting panel (reused from `sinklib.stats.panel`).

    python -m sinklib.tiny.panel --profile quick        # 2 models, a few dozen steps (tests, CI)
    python -m sinklib.tiny.panel --profile full         # 3 variants x SETTINGS (>= 12 models), all cached

A setting is a dict of `train_tiny` keyword arguments applied on top of the profile's base recipe. The
statistics (`panel_statistics`) are those of chapter 5 on the tiny panel's task columns: Spearman rho of S
against each change with its permutation p-value and bootstrap / Fisher intervals, leave-one-model-out
prediction against the constant baseline, and the architecture test (nested OLS change ~ variant vs
change ~ variant + S with its F test, partial rho with the within-variant permutation test).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from sinklib.stats import panel as stats
from sinklib.errors import ParameterError
from sinklib.stats.schema import validate_panel
from sinklib.core.params import check_choice, check_int
from sinklib.core.train import THREADS_ENV
from sinklib.tiny.adapt import PANEL_METRICS, TINY_STRICT_TASK, adapt  # noqa: F401  (TINY_STRICT_TASK: for chapter 7)
from sinklib.tiny.evaluate import KNOWLEDGE_OPTIONS
from sinklib.tiny.model import VARIANTS
from sinklib.tiny.pilot import BASE_COLUMNS, PILOT_RECIPE, SCORE_BAND, SINK_RISE, pilot, sink_formed

#: training settings, applied on top of the profile's base recipe (name -> overrides)
SETTINGS: dict[str, dict] = {
    "pilot": {},                      # the base recipe itself
    "chain0": {"chain_share": 0.0},   # no Bigram-Backcopy chain drills (they grow heads that park on the first token)
    "lr_high": {"lr": 2e-2},          # a higher peak learning rate
    "lr_low": {"lr": 3e-3},           # a lower one
    "no_bos": {"bos": False},         # no BOS token: the first token is an ordinary word
    "seed1": {"seed": 1},             # another seed (initialisation and data order)
    "wd0": {"weight_decay": 0.0},     # no weight decay
}
#: the settings of the full panel: chosen to move S within a variant (chapter 7)
FULL_SETTINGS: tuple[str, ...] = ("pilot", "chain0", "lr_high", "no_bos")

#: the profiles: base recipe (train_tiny kwargs), settings, variants, adaptation recipe, evaluation sizes
PROFILES: dict[str, dict] = {
    "quick": {
        "train": dict(size=dict(d_model=32, n_layers=2, n_heads=2, ffn=64, context=64),
                      tokenizer={"vocab_size": 300, "n_docs": 800}, steps=40, batch_size=8, seq_len=48, lr=5e-3,
                      n_docs=600, checkpoints=[0, 40], sink={"n_prompts": 4, "max_tokens": 48}),
        "settings": {"pilot": {}}, "variants": ("none", "per_head"),
        "recipe": dict(stage1_steps=4, stage2_steps=4, batch_size=4),
        "eval": dict(n_format=10, n_knowledge=8, n_prose=4, max_new_tokens=4, vqa_n=12),
    },
    "full": {
        "train": PILOT_RECIPE, "settings": {k: SETTINGS[k] for k in FULL_SETTINGS}, "variants": VARIANTS, "recipe": {}, "eval": {},
    },
}

TASKS = tuple("delta_" + name.replace(" ", "_") for _, _, name in PANEL_METRICS)


def _merge(base: Mapping, over: Mapping) -> dict:
    """A setting's overrides on top of the base recipe; 'size' is merged key by key."""
    out = {**base, **dict(over)}
    if "size" in base and "size" in over:
        out["size"] = {**base["size"], **over["size"]}
    return out


def panel_plan(profile: str = "full", settings: Mapping[str, Mapping] | None = None,
               variants: Sequence[str] | None = None) -> list[dict]:
    """The models of a panel: [{'variant', 'setting', 'train': train_tiny kwargs}], variant-major."""
    prof = PROFILES[check_choice("profile", profile, tuple(PROFILES))]
    settings = prof["settings"] if settings is None else settings
    variants = prof["variants"] if variants is None else [check_choice("variant", v, VARIANTS) for v in variants]
    if not settings:
        raise ParameterError("parameter 'settings' is empty; give at least one training setting")
    return [{"variant": v, "setting": name, "train": _merge(prof["train"], over)}
            for v in variants for name, over in settings.items()]


_SHORT = {"format strict": "strict", "format lenient": "lenient", "knowledge acc": "knowledge"}


def _total(x) -> float:
    """The sum of a number or of the numbers in nested dicts (seconds logged per condition and stage)."""
    return float(sum(_total(v) for v in x.values())) if isinstance(x, Mapping) else float(x or 0.0)


def knowledge_above_chance(ci_low: float) -> bool:
    """Whether a base knowledge accuracy lies above chance: the lower end of its Wilson 95 % interval (%, as
    the evaluation stores it) above 100 / KNOWLEDGE_OPTIONS %."""
    from sinklib.tiny.evaluate import KNOWLEDGE_OPTIONS

    return bool(ci_low > 100 / KNOWLEDGE_OPTIONS)


def _eval_kwargs(prof: Mapping) -> dict:
    return {k: v for k, v in prof["eval"].items() if not k.startswith("vqa_")}


def _prepare_one(job: tuple[dict, str, int]) -> dict:
    """One model of a plan, in a worker process: trained, evaluated and adapted into the cache."""
    spec, profile, threads = job
    import torch

    os.environ[THREADS_ENV] = str(threads)  # the training loop's fixed count would put 2 x 2 threads on 2 cores

    from sinklib.tiny.train import train_tiny

    torch.set_num_threads(threads)
    prof = PROFILES[profile]
    t0 = time.perf_counter()
    pilot(spec["variant"], eval_kwargs=_eval_kwargs(prof), **spec["train"])
    adapt(train_tiny(spec["variant"], **spec["train"]), recipe=prof["recipe"], eval_kwargs=prof["eval"])
    return {"variant": spec["variant"], "setting": spec["setting"], "seconds": round(time.perf_counter() - t0, 1)}


def prepare(plan: Sequence[dict], profile: str, *, jobs: int = 2, threads: int = 1, log=print) -> list[dict]:
    """Fill the cache for every model of `plan` with `jobs` worker processes of `threads` torch threads each
    (training a tiny model barely uses a second core, so two one-thread jobs finish a panel sooner than one
    two-thread job; measured in chapter 7). The tokenizers are built first, in this process, so that the
    workers never build the same one at once; every later cache entry has its own key."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from sinklib.tiny.train import run_tokenizer, train_params

    jobs = check_int("jobs", jobs, 1, 64)
    threads = check_int("threads", threads, 1, 256)
    for spec in plan:
        run_tokenizer(train_params(spec["variant"], **spec["train"]))
    # setting-major: the base recipe's models (the pilot) of every variant come first
    order = list(dict.fromkeys(spec["setting"] for spec in plan))
    todo = sorted(plan, key=lambda spec: order.index(spec["setting"]))
    done = []
    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as ex:
        for r in ex.map(_prepare_one, [(dict(spec), profile, threads) for spec in todo]):
            done.append(r)
            if log:
                log(f"prepared {r['variant']:9s} {r['setting']:8s} in {r['seconds']:.0f} s")
    return done


def run_panel(profile: str = "full", *, settings: Mapping[str, Mapping] | None = None,
              variants: Sequence[str] | None = None, progress: bool = False, log=print, jobs: int = 1) -> dict:
    """Train (or load), evaluate and adapt every model of the plan; returns {'rows' (DataFrame in the panel
    schema, validated, plus setting, base scores and seconds), 'models' (per-model details), 'seconds'}.
    With `jobs` > 1 the models missing from the cache are first made by `prepare` (one torch thread per job)."""
    prof = PROFILES[check_choice("profile", profile, tuple(PROFILES))]
    t0 = time.perf_counter()
    plan = panel_plan(profile, settings, variants)
    if check_int("jobs", jobs, 1, 64) > 1:
        prepare(plan, profile, jobs=jobs, log=log)
    rows, models = [], []
    for spec in plan:
        t1 = time.perf_counter()
        base = pilot(spec["variant"], eval_kwargs=_eval_kwargs(prof), progress=progress, **spec["train"])
        from sinklib.tiny.train import train_tiny

        run = train_tiny(spec["variant"], **spec["train"])
        res = adapt(run, recipe=prof["recipe"], eval_kwargs=prof["eval"], progress=progress)
        row = {**res["panel_row"], "setting": spec["setting"], "S_init": run.S_init,
               "base_strict": base["strict"], "base_lenient": base["lenient"], "base_knowledge": base["knowledge"],
               "base_ppl": base["ppl"], "train_seconds": base["train_seconds"],
               "max_mass": base["max_mass_final"], "sink03": base["sink03_final"],
               "sink_formed": sink_formed(run.S_init, base["S_final"]),
               "in_band": bool(base["all_in_band"]),
               "knowledge_above_chance": knowledge_above_chance(base["ci"]["knowledge"]["acc"][0]),
               **{f"{_SHORT[name]}_paired_{b}": res["changes"][c][name][f"paired_{b}"]
                  for c, name in (("vl", "format strict"), ("vl", "format lenient"), ("vl", "knowledge acc"))
                  for b in ("lo", "hi")},
               **({f"text_only_strict_paired_{b}": res["changes"]["text_only"]["format strict"][f"paired_{b}"]
                   for b in ("lo", "hi")} if "text_only" in res["changes"] else {}),
               "eval_seconds": base["eval_seconds"], "adapt_seconds": round(_total(res["seconds"]), 1),
               "vqa_learned": bool(res["vqa"]["learned"]) if res["vqa"] else False}
        rows.append(row)
        models.append({"spec": spec, "pilot": {k: v for k, v in base.items() if k not in ("examples",)},
                       "changes": res["changes"], "vqa": res["vqa"], "S": res["S"]})
        if log:
            log(f"{spec['variant']:9s} {spec['setting']:8s} S {row['S']:+.3f} (init {run.S_init:+.3f}, VL "
                f"{row['S_vl']:+.3f})  strict change {row['delta_format_strict']:+.1f}  "
                f"VQA {row['vqa']:.1f} vs {row['vqa_majority']:.1f}  ({time.perf_counter() - t1:.0f} s)")
    df = pd.DataFrame(rows)
    # changes are differences of item shares: equal changes must compare equal (ties), also after a JSON round trip
    df[list(TASKS)] = df[list(TASKS)].astype(float).round(6)
    df = validate_panel(df, where=f"tiny panel ({profile})")
    return {"rows": df, "models": models, "seconds": round(time.perf_counter() - t0, 1)}


def results_entry(rows: pd.DataFrame) -> dict:
    """What chapter 7 saves so that chapter 5 reads its rows as the controlled panel
    (``results[PANEL_KEYS['tiny']]``, read back by ``collect_panel_rows(panel='tiny')``)."""
    from sinklib.stats.schema import PANEL_KEYS

    df = validate_panel(rows, where="tiny panel")
    return {PANEL_KEYS["tiny"]: json.loads(df.to_json(orient="records"))}


def preconditions(rows: pd.DataFrame) -> pd.DataFrame:
    """What the test of the claim presupposes, counted over the panel's models: a sink formed in training
    (`pilot.sink_formed`), every base score inside `pilot.SCORE_BAND`, VL adaptation lost strict-format
    score outside the noise (paired 95 % interval below zero), and the VL model learned the visual task (VQA
    interval above the majority answer)."""
    n = len(rows)
    checks = [
        ("a sink formed in training", f"S rose by at least {SINK_RISE} (log-odds) from initialisation",
         rows["sink_formed"]),
        ("base scores inside the band", f"strict, lenient and knowledge all in {SCORE_BAND[0]:.0f}-{SCORE_BAND[1]:.0f} %",
         rows["in_band"]),
        ("knowledge above chance", f"Wilson 95 % interval of the base knowledge score above chance "
         f"({KNOWLEDGE_OPTIONS} options: {100 / KNOWLEDGE_OPTIONS:.0f} %)", rows["knowledge_above_chance"]),
        ("VL lost strict-format score", "paired 95 % interval of the change below zero", rows["strict_paired_hi"] < 0),
        ("the VL model learned the visual task", "VQA interval above the blind majority answer", rows["vqa_learned"]),
    ]
    return pd.DataFrame([{"precondition": name, "rule": rule, "models": f"{int(v.sum())} of {n}",
                          "share": float(v.mean()) if n else float("nan")} for name, rule, v in checks])


def beyond_architecture(partial_rho: float, partial_p: float, alpha: float = 0.05) -> str:
    """The verdict on "S adds to the QK-norm type" (chapter 7's H2 and the claims page's 7e): the partial rho's
    two-sided within-variant permutation p-value below `alpha` decides, its sign gives the direction."""
    from sinklib.stats.verdicts import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED

    if not partial_p < alpha:
        return INCONCLUSIVE
    return REPRODUCED if partial_rho > 0 else NOT_REPRODUCED


def _rho_est(rho_table: pd.DataFrame, task: str):
    from sinklib.stats.verdicts import Est

    r = rho_table.set_index("task").loc[task]
    return Est(float(r["rho"]), float(r["ci_fisher_lo"]), float(r["ci_fisher_hi"])), r  # the book's interval for rho


def _hyp_row(h, paper, ours, verdict, why, e=None) -> dict:
    """One row of the `hypotheses` table; 'interval': [value, lo, hi] of the estimate `e` that decided it (None)."""
    return {"hypothesis": h, "paper": paper, "this panel": ours, "verdict": verdict, "why": why,
            "interval": None if e is None else [float(x) for x in e]}


def _hyp_strict(st: Mapping[str, pd.DataFrame], paper_rho: str) -> list[dict]:
    """H1 (rho of S against the strict-format change) and H2 (S beyond the QK-norm variant)."""
    import math

    from sinklib.stats.schema import TINY_STRICT_TASK
    from sinklib.stats.verdicts import INCONCLUSIVE, direction, est

    out = []
    e, r = _rho_est(st["rho"], TINY_STRICT_TASK)
    if math.isnan(e.v):
        out.append(_hyp_row("H1 S predicts the strict-format change", paper_rho, "not computed", INCONCLUSIVE,
                            r["note"]))
    else:
        out.append(_hyp_row("H1 S predicts the strict-format change", paper_rho,
                            f"rho {est(e, 2)} (n = {int(r['n'])}, p = {r['p_value']:.3g})", direction(e, +1),
                            "Fisher 95 % interval of rho", e))
    ar = st["architecture"].set_index("task").loc[TINY_STRICT_TASK]
    pr, pp = ar.get("partial_rho", float("nan")), ar.get("partial_p", float("nan"))
    if pr is None or not np.isfinite(pr):
        out.append(_hyp_row("H2 S adds to the QK-norm variant", "not tested (S co-clusters with the architecture)",
                            "not computed", INCONCLUSIVE, str(ar.get("note", ""))))
    else:
        v = beyond_architecture(pr, pp)
        out.append(_hyp_row("H2 S adds to the QK-norm variant", "not tested (S co-clusters with the architecture)",
                            f"partial rho {pr:+.2f}, within-variant permutation p = {pp:.3g}; "
                            f"nested F-test p = {ar['F_p']:.3g}", v, "two-sided within-variant permutation test at 5 %"))
    return out


def _hyp_no_relation(rho_t: pd.DataFrame) -> list[dict]:
    """H3: S does not predict the lenient-format and knowledge changes (the interval contains zero)."""
    import math

    from sinklib.stats.schema import task_column
    from sinklib.stats.verdicts import CONTRADICTED, INCONCLUSIVE, est

    out = []
    for metric in ("format lenient", "knowledge acc"):
        e, r = _rho_est(rho_t, task_column(metric))
        if math.isnan(e.v):
            out.append(_hyp_row(f"H3 S does not predict the {metric} change", "no relation", "not computed",
                                INCONCLUSIVE, r["note"]))
        else:
            out.append(_hyp_row(f"H3 S does not predict the {metric} change", "no relation",
                                f"rho {est(e, 2)} (p = {r['p_value']:.3g})",
                                INCONCLUSIVE if e.lo <= 0 <= e.hi else CONTRADICTED,
                                "the interval contains zero: no relation found, which on a small panel is not "
                                "evidence of none (an interval containing zero is never 'reproduced')"
                                if e.lo <= 0 <= e.hi else "the interval excludes zero: S relates to this change too", e))
    return out


def _hyp_per_head(rows: pd.DataFrame, paper_ph: str) -> dict:
    """H4: per-head QK-norm models lose less strict-format score than models without QK-norm (Welch interval)."""
    from scipy import stats as sst

    from sinklib.stats.schema import TINY_STRICT_TASK
    from sinklib.stats.verdicts import INCONCLUSIVE, Est, direction, est

    by = {q: rows.loc[rows["qk_norm"] == q, TINY_STRICT_TASK].dropna().to_numpy(float) for q in ("per_head", "none")}
    if min(len(x) for x in by.values()) < 2:
        return _hyp_row("H4 per-head QK-norm models lose less", paper_ph, "too few models", INCONCLUSIVE,
                        "needs two models of each variant")
    a, b = by["per_head"], by["none"]
    ci = sst.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    e = Est(float(a.mean() - b.mean()), float(ci.low), float(ci.high))
    return _hyp_row("H4 per-head QK-norm models lose less", paper_ph,
                    f"per-head minus none {est(e)} pt ({len(a)} + {len(b)} models)", direction(e, +1),
                    "Welch 95 % interval of the difference of mean strict-format changes", e)


def _hyp_lopo(lopo: pd.DataFrame, paper_lopo: str) -> dict:
    """H5: leave-one-model-out prediction from S beats the constant (within 10 % is a tie)."""
    from sinklib.stats.schema import TINY_STRICT_TASK
    from sinklib.stats.verdicts import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED

    lo = lopo.set_index("task").loc[TINY_STRICT_TASK]
    if not np.isfinite(lo["mae_model"]):
        return _hyp_row("H5 S predicts held-out models better than a constant", paper_lopo, "not computed",
                        INCONCLUSIVE, str(lo["note"]))
    return _hyp_row("H5 S predicts held-out models better than a constant", paper_lopo,
                    f"{lo['mae_model']:.2f} vs {lo['mae_constant']:.2f} pt (n = {int(lo['n'])})", INCONCLUSIVE
                    if abs(lo["mae_model"] - lo["mae_constant"]) < 0.1 * lo["mae_constant"] else
                    REPRODUCED if lo["mae_model"] < lo["mae_constant"] else NOT_REPRODUCED,
                    "leave-one-model-out mean absolute error, no interval: within 10 % of the constant's is a tie")


def _hyp_text_only(rows: pd.DataFrame) -> list[dict]:
    """H6: the text-only control loses less than VL (paired t interval); no row without the control."""
    from scipy import stats as sst

    from sinklib.book.reported import reported
    from sinklib.stats.verdicts import Est, direction, est

    if not ("text_only_format_strict" in rows and rows["text_only_format_strict"].notna().sum() >= 2):
        return []
    d = (rows[TINY_STRICT_TASK] - rows["text_only_format_strict"]).dropna().to_numpy(float)
    ci = sst.ttest_1samp(d, 0.0).confidence_interval(0.95)
    e = Est(float(d.mean()), float(ci.low), float(ci.high))
    return [_hyp_row("H6 the loss is VL-specific: text-only training to the same end loses less",
                     f"text-only IFEval change {reported('text_only_ifeval'):+.1f} pt against VL's "
                     f"{reported('ifeval_qwen25vl'):+.1f}", f"VL minus text-only strict-format change {est(e)} pt "
                     f"(mean over {len(d)} models)", direction(e, -1),
                     "paired t 95 % interval over models of the VL change minus the text-only change "
                     "(negative: VL loses more)", e)]


def hypotheses(rows: pd.DataFrame, st: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """A verdict per hypothesis of the paper on the controlled panel, by the book's rules (`sinklib.stats.verdicts`):
    the 95 % interval decides; a statistic that could not be computed is inconclusive, with the reason.

    H1 S predicts the strict-format change (rho > 0: a stronger sink, a smaller loss); H2 S adds to the QK-norm
    variant (partial rho > 0 with S permuted within variants); H3 S does not predict the lenient-format and
    knowledge changes (the paper: format-sensitive skills only; the interval containing zero agrees with it);
    H4 per-head QK-norm models lose less strict-format score than models without QK-norm (mean changes per
    variant, Welch interval); H5 leave-one-model-out prediction from S beats the constant (no interval); H6 the
    loss is specific to VL: the text-only control loses less (paired over models, t interval)."""
    from sinklib.book.reported import reported

    paper_rho = f"rho {reported('rho_ifeval_6'):.3f} (6 pairs, IFEval)"
    paper_lopo = f"{reported('lopo_S'):.2f} vs {reported('lopo_constant'):.2f} pt"
    paper_ph = (f"IFEval change per-head {reported('ifeval_per_head_max'):+.1f} to {reported('ifeval_per_head_min'):+.1f}, "
                f"none {reported('ifeval_none_max'):+.1f} to {reported('ifeval_none_min'):+.1f} pt")
    out = _hyp_strict(st, paper_rho) + _hyp_no_relation(st["rho"])
    out.append(_hyp_per_head(rows, paper_ph))
    out.append(_hyp_lopo(st["lopo"], paper_lopo))
    out += _hyp_text_only(rows)
    return pd.DataFrame(out)


def change_table(rows: pd.DataFrame) -> pd.DataFrame:
    """The panel for reading: one row per model, each change under VL with its paired 95 % interval, the
    text-only control's strict change beside it, S before and after, VQA against the majority answer."""
    def ci(v, lo, hi):
        return f"{v:+.0f} [{lo:+.0f}, {hi:+.0f}]"

    out = []
    for _, r in rows.iterrows():
        d = {"variant": r["qk_norm"], "setting": r["setting"], "S": round(r["S"], 2), "S after VL": round(r["S_vl"], 2),
             "strict: VL": ci(r[TINY_STRICT_TASK], r["strict_paired_lo"], r["strict_paired_hi"])}
        if "text_only_strict_paired_lo" in r and pd.notna(r.get("text_only_strict_paired_lo")):
            d["strict: text-only"] = ci(r["text_only_format_strict"], r["text_only_strict_paired_lo"],
                                        r["text_only_strict_paired_hi"])
        d["lenient: VL"] = ci(r["delta_format_lenient"], r["lenient_paired_lo"], r["lenient_paired_hi"])
        d["knowledge: VL"] = ci(r["delta_knowledge_acc"], r["knowledge_paired_lo"], r["knowledge_paired_hi"])
        d["VQA / majority"] = f"{r['vqa']:.0f} / {r['vqa_majority']:.0f}"
        out.append(d)
    return pd.DataFrame(out)


def pilot_table(models: Sequence[Mapping], setting: str = "pilot") -> pd.DataFrame:
    """The pilot: the models of `setting` (the base recipe, one per variant) from `run_panel(...)['models']`."""
    rows = []
    for m in models:
        if m["spec"]["setting"] != setting:
            continue
        r = m["pilot"]
        rows.append({"variant": m["spec"]["variant"], "parameters": r["n_parameters"], "steps": r["steps"],
                     "train s": r["train_seconds"], "S at init": r["S_init"], "S trained": r["S_final"],
                     "sink formed": sink_formed(r["S_init"], r["S_final"]), "max head mass": r["max_mass_final"],
                     "Sink_0.3": r["sink03_final"],
                     "strict": r["strict"], "lenient": r["lenient"], "knowledge": r["knowledge"], "ppl": r["ppl"],
                     "scores in band": r["all_in_band"]})
    return pd.DataFrame(rows)


#: the resampling sizes of chapter 5's full profile, so that chapter 7's summary and chapter 5's section on
#: the controlled panel print the same intervals and p-values
STAT_KW = {"n_boot": 9999, "n_perm": 99999}


def panel_statistics(df: pd.DataFrame, tasks: Sequence[str] = TASKS, *, seed: int = 0, **kw) -> dict[str, pd.DataFrame]:
    """`sinklib.stats.panel.panel_summary` on the tiny panel's task columns (never raises on a small panel), with
    chapter 5's resampling sizes (`STAT_KW`) unless given."""
    return stats.panel_summary(df, [t for t in tasks if t in df.columns], seed=seed, **{**STAT_KW, **kw})


def main(argv: list[str] | None = None) -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="quick", choices=tuple(PROFILES))
    ap.add_argument("--variants", nargs="+", default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=1, help="worker processes of one torch thread each (see prepare)")
    ap.add_argument("--out", default=None, help="write rows and statistics as JSON here")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    res = run_panel(a.profile, variants=a.variants, jobs=a.jobs)
    st = panel_statistics(res["rows"])
    with pd.option_context("display.width", 160, "display.max_columns", 20):
        for k in ("rho", "lopo", "architecture"):
            print(st[k].round(3).to_string(index=False))
    print(f"panel: {len(res['rows'])} models, {res['seconds']} s")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"rows": res["rows"].to_dict(orient="records"),
                       "statistics": {k: v.to_dict(orient="records") for k, v in st.items()},
                       "seconds": res["seconds"]}, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())


def _chapter7_params() -> dict:
    from sinklib.core.params import COMMON, boolean, choice, integer, list_of

    return {"panel": choice(tuple(PROFILES)), "variants": list_of(choice(VARIANTS)),
            "settings": list_of(choice(tuple(SETTINGS))), "jobs": integer(1, 64), "threads": integer(1, 256),
            "remark_prompts": integer(1, 64), "show_progress": boolean(), **COMMON}


#: the parameters of chapter 7 (one `validate` call in the notebook)
CHAPTER7_PARAMS = _chapter7_params()
