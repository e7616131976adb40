"""Chapter 9's panel: Bigram-Backcopy models in three QK-norm variants at settings that move the sink, their
miniature VL adaptation, the test of the claim with chapter 5's statistics, and chapter 8's causal check.

A setting is a string ``"base"`` (the defaults of ``backcopy_train.TRAIN_DEFAULTS``) or ``"knob:value,knob:value"``
over those training parameters: e.g. ``"weight_decay:0.5"``, ``"bos:resampled"`` (a colon, not '=', so that
papermill can parse the notebook's parameters cell).
"""
from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from sinklib.core import cache
from sinklib.stats import panel
from sinklib.stats.architecture import architecture_test
from sinklib.errors import ParameterError
from sinklib.core.intervene import head_plan, random_heads
from sinklib.tiny import backcopy as bc
from sinklib.tiny import backcopy_adapt as ba
from sinklib.tiny import backcopy_train as bt

_VERSION = 2  # 2: the random heads are drawn outside the sink heads where enough remain
#: the panel's task columns: points lost from base to VL (positive = a loss)
RULE_TASK, KNOW_TASK = "rule loss", "knowledge loss"
#: the controlled contrasts: points VL lost beyond the matched text-only control (text-only minus VL accuracy;
#: positive = VL lost more than the same task without the image). The book's primary contrast where a control exists.
RULE_CTRL, KNOW_CTRL = "rule loss vs text-only", "knowledge loss vs text-only"


def parse_setting(setting: str) -> dict:
    """'base' -> {}; 'lr:0.001,bos:resampled' -> {'lr': 0.001, 'bos': 'resampled'} (numbers parsed)."""
    if setting == "base":
        return {}
    out: dict = {}
    for part in setting.split(","):
        if ":" not in part:
            raise ParameterError(f"parameter 'settings' got {setting!r}; allowed: 'base' or 'knob:value,...'")
        k, val = (s.strip() for s in part.split(":", 1))
        if k not in bt.TRAIN_DEFAULTS or k in ("variant", "seed"):
            raise ParameterError(f"parameter 'settings' names {k!r}; allowed: {', '.join(bt.TRAIN_DEFAULTS)}")
        out[k] = type(bt.TRAIN_DEFAULTS[k])(val) if not isinstance(bt.TRAIN_DEFAULTS[k], str) else val
    return out


def model_grid(variants: Sequence[str], settings: Sequence[str], seeds: Sequence[int], common: Mapping,
               replicated: Sequence[str] | None = None) -> list[dict]:
    """One entry per model: {'name', 'variant', 'setting', 'seed', 'params'} (params: training parameters).
    With `replicated` (a subset of `settings`), only those settings are trained with every seed and the others
    with the first seed alone; None or empty: every setting with every seed."""
    bad = [s for s in (replicated or []) if s not in settings]
    if bad:
        raise ParameterError(f"parameter 'replicate_settings' names {bad}, which are not in settings {list(settings)}")
    grid = []  # seeds outermost: a panel cut short still holds every setting and variant of the first seeds
    for i, seed in enumerate(seeds):
        for setting in settings:
            if i > 0 and replicated and setting not in replicated:
                continue
            for variant in variants:
                p = bt.train_params(**{**dict(common), **parse_setting(setting), "variant": variant, "seed": int(seed)})
                grid.append({"name": f"{variant}|{setting}|s{seed}", "variant": variant, "setting": setting,
                             "seed": int(seed), "params": p})
    return grid


def base_table(grid: Sequence[Mapping]) -> pd.DataFrame:
    """Trains (or reads) every base model: name, variant, setting, seed, S, Sink_0.3, strongest head,
    emergence step, skills, seconds."""
    rows = []
    for g in grid:
        rec, _ = bt.train_backcopy(g["params"], need_model=False)
        f = rec["final"]
        rows.append({"model": g["name"], "variant": g["variant"], "setting": g["setting"], "seed": g["seed"],
                     "S": f["S"], "sink03": f["sink03"], "top_head": f["top_head"],
                     "emergence_step": rec["emergence_step"], "holds_from": bt.stable_step(rec["history"]),
                     "rule_acc": 100 * f["rule_acc"],
                     "know_acc": 100 * f["know_acc"], "know_ppl": f["know_ppl"], "seconds": rec["seconds"]})
    return pd.DataFrame(rows)


def adapt_table(grid: Sequence[Mapping], adapt_overrides: Mapping) -> pd.DataFrame:
    """Every condition of every model (``backcopy_adapt.adapt``, cached), one row per (model, condition)."""
    rows = []
    for g in grid:
        res = ba.adapt(g["params"], adapt_overrides)
        for cond in ba.CONDITIONS:
            r = res[cond]
            task = r.get("task", {})
            rows.append({"model": g["name"], "variant": g["variant"], "setting": g["setting"], "condition": cond,
                         "S": r["S"], "sink03": r["sink03"], "rule_acc": 100 * r["rule_acc"],
                         "know_acc": 100 * r["know_acc"], "know_ppl": r["know_ppl"],
                         "task_acc": task.get("acc", np.nan), "task_lo": task.get("lo", np.nan),
                         "majority": task.get("majority", np.nan), "learned": task.get("learned", np.nan)})
    return pd.DataFrame(rows)


def panel_frame(adapted: pd.DataFrame, condition: str = "vl", control: str = "text_only") -> pd.DataFrame:
    """chapter 5's panel layout: pair, qk_norm, S (base), the losses under `condition` in points (base minus
    adapted: positive = the skill got worse) and, where `control` was run, the controlled losses (control minus
    `condition`: what `condition` lost beyond its matched control; ``RULE_CTRL``, ``KNOW_CTRL``)."""
    b = adapted[adapted.condition == "base"].set_index("model")
    c = adapted[adapted.condition == condition].set_index("model").loc[b.index]
    out = {"pair": b.index, "qk_norm": b["variant"].to_numpy(), "S": b["S"].to_numpy(),
           RULE_TASK: (b["rule_acc"] - c["rule_acc"]).to_numpy(), KNOW_TASK: (b["know_acc"] - c["know_acc"]).to_numpy(),
           "ppl ratio": (c["know_ppl"] / b["know_ppl"]).to_numpy()}
    if (adapted.condition == control).any():
        t = adapted[adapted.condition == control].set_index("model").loc[b.index]
        out[RULE_CTRL] = (t["rule_acc"] - c["rule_acc"]).to_numpy()
        out[KNOW_CTRL] = (t["know_acc"] - c["know_acc"]).to_numpy()
    return pd.DataFrame(out).reset_index(drop=True)


def claim_test(df: pd.DataFrame, task: str, *, n_perm: int = 9999, n_boot: int = 9999, seed: int = 0) -> dict:
    """rho of base S vs `task` (permutation p; lo/hi the Fisher interval, the book's interval for rho at small n,
    with the bootstrap interval beside it as boot_lo/boot_hi), LOPO vs the constant, the within-variant
    permutation test and the nested F-test (chapter 5's functions); NaN where undefined."""
    out: dict = {"task": task, "n": int(len(df))}
    try:
        sp = panel.spearman(df["S"], df[task], n_perm=n_perm, n_boot=n_boot, seed=seed)
        out.update(rho=sp.rho, p=sp.p_value, lo=sp.ci_fisher[0], hi=sp.ci_fisher[1], boot_lo=sp.ci_bootstrap[0],
                   boot_hi=sp.ci_bootstrap[1])
        lo = panel.lopo(df, task)
        out.update(lopo_mae=lo.mae_model, const_mae=lo.mae_constant)
        ar = architecture_test(df, task, n_perm=n_perm, seed=seed)
        out.update(within_p=ar.partial_p, partial_rho=ar.partial_rho, f_stat=ar.f_stat, f_p=ar.f_pvalue,
                   caveats=ar.caveats)
    except Exception as e:  # a constant side or too few models: reported, not raised
        out["error"] = str(e)
    return out


# ---------------------------------------------------------------------------------------
# chapter 8's causal check on a base model


def _measure_under(model: bc.BackcopyLM, p: Mapping, heads: Mapping[int, Sequence[int]] | None, mode: str) -> dict:
    plans = {} if not heads else head_plan(heads, model.cfg.n_layers, model.cfg.n_heads)
    model.plans = {layer: {"heads": m, "mode": mode} for layer, m in plans.items()}
    try:
        m = bt.measure(model, bt.eval_ids(p), bt.vocab_of(p))
    finally:
        model.plans = {}
    return {"rule_acc": 100 * m["rule_acc"], "know_acc": 100 * m["know_acc"], "know_ppl": m["know_ppl"]}


def sink_heads(mass: Sequence[Sequence[float]], eps: float = bt.SINK_EPS) -> dict[int, list[int]]:
    """{layer: [head, ...]} of the heads whose first-token mass exceeds eps (the heads that use the sink)."""
    out: dict[int, list[int]] = {}
    for layer, row in enumerate(mass):
        for h, m in enumerate(row):
            if m > eps:
                out.setdefault(layer, []).append(h)
    return out


def control_heads(heads: Mapping[int, Sequence[int]], n_layers: int, n_heads: int, seed: int) -> dict[int, list[int]]:
    """As many random heads as `heads` holds, drawn among the other heads when at least that many remain (with two
    heads a draw from all heads would often be the sink head itself), else among all heads
    (``sinklib.core.intervene.random_heads``)."""
    k = sum(len(v) for v in heads.values())
    others = [(l, h) for l in range(n_layers) for h in range(n_heads) if h not in heads.get(l, [])]
    if len(others) < k:
        return random_heads(list(range(n_layers)), n_heads, k, seed=seed)
    idx = np.random.default_rng(seed).choice(len(others), size=k, replace=False)
    out: dict[int, list[int]] = {}
    for l, h in sorted(others[i] for i in idx):
        out.setdefault(l, []).append(h)
    return out


def _causal(p: dict, seed: int) -> dict:
    rec, model = bt.train_backcopy(p)
    heads = sink_heads(rec["final"]["mass"])
    k = sum(len(v) for v in heads.values())
    out = {"sink_heads": {str(l): h for l, h in heads.items()}, "k": k, "none": _measure_under(model, p, None, "remove")}
    if k == 0:
        return out
    rnd = control_heads(heads, model.cfg.n_layers, model.cfg.n_heads, seed)
    out["random_heads"] = {str(l): h for l, h in rnd.items()}
    out["remove"] = _measure_under(model, p, heads, "remove")
    out["random"] = _measure_under(model, p, rnd, "remove")
    out["matched"] = _measure_under(model, p, heads, "remove_matched")
    return out


def causal(p: Mapping, seed: int = 0) -> dict:
    """Remove the sink (chapter 8's ``remove``) in the heads with first-token mass > 0.3, in as many random heads,
    and the mass-matched control (``remove_matched``) in the sink heads; rule and knowledge scores. Cached."""
    p = bt.train_params(**dict(p))
    key = {"kind": "backcopy-causal", "version": _VERSION, "base": p, "seed": seed}
    return cache.cached_json(key, lambda: _causal(p, seed), folder="backcopy")


def causal_table(grid: Sequence[Mapping], seed: int = 0) -> pd.DataFrame:
    """One row per (model, intervention): rule and knowledge change in points against no intervention."""
    rows = []
    for g in grid:
        c = causal(g["params"], seed)
        for cond in ("remove", "random", "matched"):
            if cond not in c:
                continue
            rows.append({"model": g["name"], "variant": g["variant"], "intervention": cond, "k": c["k"],
                         "same_heads": c.get("random_heads") == c["sink_heads"],
                         "rule change": c[cond]["rule_acc"] - c["none"]["rule_acc"],
                         "knowledge change": c[cond]["know_acc"] - c["none"]["know_acc"]})
    return pd.DataFrame(rows)


def torch_threads(n: int = 1) -> None:
    """One torch thread (the 2-core machine is shared; DEVELOPING.md)."""
    torch.set_num_threads(n)


# ---------------------------------------------------------------------------------------
# the pilot: every try, its table and its figure


def split_try(t: str, variants: Sequence[str]) -> tuple[str, list[str]]:
    """A pilot try 'setting' or 'setting @v1+v2' (the try runs only on those variants) -> (setting, variants)."""
    setting, _, only = t.partition("@")
    chosen = [v.strip() for v in only.split("+")] if only.strip() else list(variants)
    bad = [v for v in chosen if v not in variants]
    if bad:
        raise ParameterError(f"parameter 'pilot_tries' names variant(s) {bad} in {t!r}; allowed: {', '.join(variants)}")
    return setting.strip(), chosen


def pilot_records(tries: Sequence[str], variants: Sequence[str], common: Mapping) -> list[dict]:
    """One cached training record per (try, variant); a try is a setting string (see ``parse_setting``),
    optionally limited to some variants with ' @v1+v2' (``split_try``)."""
    out = []
    for t in tries:
        setting, chosen = split_try(t, variants)
        for v in chosen:
            rec, _ = bt.train_backcopy({**dict(common), **parse_setting(setting), "variant": v}, need_model=False)
            out.append({"try": setting, **rec})
    return out


def pilot_table(records: Sequence[Mapping]) -> pd.DataFrame:
    """Per (try, variant): S at step 0 and at the end, Sink_0.3, the strongest head's first-token mass, the
    dormant (non-trigger query) mass of each head, the skills, the emergence step and whether the rule holds."""
    rows = []
    for r in records:
        h0, f = r["history"][0], r["final"]
        row = {"try": r["try"], "variant": r["params"]["variant"], "S step 0": h0["S"], "S end": f["S"],
               "Sink_0.3": f["sink03"], "strongest head": f["top_head"],
               "dormant per head": ", ".join(f"{m:.2f}" for layer in f["dormant"] for m in layer),
               "rule acc %": 100 * f["rule_acc"], "knowledge acc %": 100 * f["know_acc"],
               "BOS value-norm ratio": f["bos_value_ratio"][-1], "BOS hidden-norm ratio": f["bos_hidden_ratio"][-1], "emergence step": r["emergence_step"],
               "holds from step": bt.stable_step(r["history"]),
               "sink formed": bt.stable_step(r["history"]) is not None, "seconds": r["seconds"]}
        rows.append(row)
    return pd.DataFrame(rows)


def history_frame(records: Sequence[Mapping]) -> pd.DataFrame:
    """Every check of every pilot run, flat (``backcopy_train.history_rows``), with the mean dormant mass."""
    rows = [row for r in records for row in bt.history_rows(r, r["try"])]
    df = pd.DataFrame(rows)
    cols = [c for c in df.columns if c.startswith("dormant L")]
    df["dormant mean"] = df[cols].mean(axis=1)
    return df


def emergence_figure(hist: pd.DataFrame):
    """One row of three panels per pilot try, against training step, one line per variant: S, the mean
    first-token attention of the non-trigger queries, and the backcopy (rule) loss."""
    import matplotlib.pyplot as plt

    tries = list(dict.fromkeys(hist["try"]))
    fig, axes = plt.subplots(len(tries), 3, figsize=(12, 3.2 * len(tries)), squeeze=False)
    specs = (("S", "S (log-odds)"), ("dormant mean", "first-token attention,\nnon-trigger queries"),
             ("rule_loss", "backcopy loss (nats)"))
    for row, t in zip(axes, tries):
        d = hist[hist["try"] == t]
        for ax, (col, label) in zip(row, specs):
            for v, g in d.groupby("variant", sort=False):
                ax.plot(g["step"], g[col], marker="o", ms=2.5, label=v)
            ax.set_xlabel("training step")
            ax.set_ylabel(label)
            ax.set_title(f"try '{t}'", fontsize=9)
    axes[0][0].legend(title="QK-norm")
    fig.suptitle("Sink emergence along training, pilot")
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------------
# verdicts and parameters

CONTRADICTED, NOT_TESTED = "contradicted", "not tested (precondition failed)"


def _no_signal(test: Mapping, alpha: float) -> bool:
    """rho undefined, its (Fisher) interval containing 0, or its permutation p at or above alpha."""
    return ("rho" not in test or not np.isfinite(test.get("lo", np.nan)) or test["lo"] <= 0 <= test["hi"]
            or not test["p"] < alpha)


def claim_verdict(test: Mapping, sign: int, precondition: bool, alpha: float = 0.05) -> str:
    """'not tested' when the precondition failed; 'inconclusive' when rho is undefined, its Fisher interval
    contains 0 or its permutation p >= alpha (too few models); else 'reproduced' when rho has the predicted
    sign, 'contradicted' when the opposite."""
    from sinklib.stats.verdicts import INCONCLUSIVE, REPRODUCED

    if not precondition:
        return NOT_TESTED
    if _no_signal(test, alpha):
        return INCONCLUSIVE
    return REPRODUCED if np.sign(test["rho"]) == sign else CONTRADICTED


def null_verdict(test: Mapping, precondition: bool, alpha: float = 0.05) -> str:
    """For a prediction of *no* relation (knowledge): 'no relation found, as predicted' or 'a relation,
    against the prediction' (the same signal rule as ``claim_verdict``)."""
    if not precondition:
        return NOT_TESTED
    return "no relation found, as predicted" if _no_signal(test, alpha) else "a relation, against the prediction"


def _chapter9_params() -> dict:
    from sinklib.core.params import COMMON, boolean, choice, integer, list_of, number, text

    return {"variants": list_of(choice(bc.VARIANTS)), "pilot_tries": list_of(text()), "pilot_steps": integer(1),
            "check_every": integer(1), "batch": integer(1), "eval_n": integer(1), "settings": list_of(text()),
            "seeds": list_of(integer(0)), "replicate_settings": list_of(text(), min_len=0), "panel_steps": integer(1), "stage1_steps": integer(1),
            "stage2_steps": integer(1), "lr_lm": number(0.0, 1.0), "vqa_n": integer(10), "n_perm": integer(99),
            "n_boot": integer(99), "threads": integer(1, 64), "run_panel": boolean(), **COMMON}


#: the parameters of chapter 9 (one `validate` call in the notebook)
CHAPTER9_PARAMS = _chapter9_params()


# ---------------------------------------------------------------------------------------
# sentences the chapter glues (computed, never typed)


def pilot_sentence(table: pd.DataFrame) -> str:
    """Which try made the sink form in every variant, with the emergence steps, or that none did."""
    tries, n_var = list(dict.fromkeys(table["try"])), table["variant"].nunique()
    for i, t in enumerate(tries):
        d = table[table["try"] == t]
        if len(d) == n_var and d["sink formed"].all():
            steps = ", ".join(f"{r['variant']} first at step {int(r['emergence step'])}, for good from step "
                              f"{int(r['holds from step'])}" for _, r in d.iterrows())
            knob = ("no knob had to change: the first recipe formed it" if i == 0
                    else f"the one knob changed in try '{t}' (against the first recipe) made it form")
            return f"the sink formed in every variant under try '{t}' ({steps}); {knob}"
    formed = table[table["sink formed"]]
    if formed.empty:
        return "no try formed the sink in any variant"
    part = "; ".join(f"the {r['variant']} variant under try '{r['try']}'" for _, r in formed.iterrows())
    return f"no try formed the sink in every variant; it formed only in {part}"


def spread_table(base: pd.DataFrame) -> pd.DataFrame:
    """S and Sink_0.3 per variant: n, min, max, range of S, the settings at the extremes."""
    rows = []
    for v, g in base.groupby("variant", sort=False):
        lo, hi = g.loc[g["S"].idxmin()], g.loc[g["S"].idxmax()]
        rows.append({"variant": v, "models": len(g), "S min": lo["S"], "S max": hi["S"], "S range": hi["S"] - lo["S"],
                     "lowest at": lo["setting"], "highest at": hi["setting"],
                     "Sink_0.3 min": g["sink03"].min(), "Sink_0.3 max": g["sink03"].max(),
                     "with a sink": int((g["holds_from"].notna()).sum())})
    return pd.DataFrame(rows)


#: chapter 9's table columns as a reader sees them (``readable``)
HEADERS = {"sink03": "Sink_0.3", "top_head": "strongest head", "emergence_step": "first at step",
           "holds_from": "holds from step", "rule_acc": "rule acc %", "know_acc": "knowledge acc %",
           "know_ppl": "knowledge ppl", "task_acc": "image task acc %", "task_lo": "its Wilson lo", "majority": "majority %",
           "learned": "task learned", "seconds": "train s", "same_heads": "random = sink heads", "k": "heads removed"}


def readable(df: pd.DataFrame) -> pd.DataFrame:
    """`df` with the snake_case columns of chapter 9's tables renamed to words (``HEADERS``)."""
    return df.rename(columns=HEADERS)


def metrics_sentence(grid: Sequence[Mapping]) -> str:
    """Why S and Sink_0.3 can disagree, shown on the panel's models where they do (Sink_0.3 at least one half
    while S did not rise by the rule's 2): S is the median of the heads' log-odds (with two heads their mean), so
    a head at almost 0 drags it far down; Sink_0.3 only counts heads above 0.3."""
    out = []
    for g in grid:
        rec, _ = bt.train_backcopy(g["params"], need_model=False)
        f, s0 = rec["final"], rec["history"][0]["S"]
        if f["sink03"] >= bt.RULE["sink03"] and f["S"] - s0 < bt.RULE["s_rise"]:
            heads = ", ".join(f"{m:.3f}" for layer in f["mass"] for m in layer)
            out.append(f"{g['name']}: head masses {heads}, so Sink_0.3 = {f['sink03']:.2f} while S = {f['S']:.2f} "
                       f"({'a rise' if f['S'] >= s0 else 'a fall'} of {abs(f['S'] - s0):.2f} from initialisation)")
    if not out:
        return "S and Sink_0.3 agree on every panel model"
    return ("S and Sink_0.3 disagree where one head crosses 0.3 and another attends to the first token almost "
            "never, since S averages the heads' log-odds and Sink_0.3 counts heads: " + "; ".join(out))


def seed_sentence(base: pd.DataFrame, within: float = 0.5) -> str:
    """How far S moves with the training seed alone: for every (variant, setting) trained with more than one seed,
    S of each later seed minus S of the first, in words; the pairs beyond `within` are named."""
    pairs = [(v, s, float(r.S - g.iloc[0].S)) for (v, s), g in base.sort_values("seed").groupby(
        ["variant", "setting"], sort=False) for _, r in g.iloc[1:].iterrows()]
    if not pairs:
        return "no setting was trained with a second seed"
    d = sorted(abs(x) for *_, x in pairs)
    far = [f"{v} at {s} ({x:+.2f})" for v, s, x in pairs if abs(x) > within]
    return (f"over the {len(pairs)} variant-setting cells trained with two seeds, S of the second seed minus the first's ranges "
            f"over {d[0]:.2f}-{d[-1]:.2f} in size (median {statistics.median(d):.2f}); "
            f"{len(pairs) - len(far)} of {len(pairs)} lie within {within:g}"
            + (f", beyond it: {', '.join(far)}" if far else ""))


def band_sentence(base: pd.DataFrame, col: str, lo: float = 20.0, hi: float = 95.0) -> str:
    """How many base models score inside [lo, hi] % on `col`, with the observed range."""
    inside = int(base[col].between(lo, hi).sum())
    return (f"{inside} of {len(base)} models inside {lo:.0f}-{hi:.0f} % "
            f"(observed {base[col].min():.1f}-{base[col].max():.1f} %)")


def condition_summary(adapted: pd.DataFrame) -> pd.DataFrame:
    """Mean over models per condition of S, Sink_0.3, rule and knowledge accuracy, perplexity, task accuracy."""
    cols = ["S", "sink03", "rule_acc", "know_acc", "know_ppl", "task_acc", "majority"]
    out = adapted.groupby("condition", sort=False)[cols].mean()
    out["task learned"] = adapted.groupby("condition", sort=False)["learned"].apply(
        lambda s: f"{int(s.fillna(False).astype(bool).sum())}/{int(s.notna().sum())}" if s.notna().any() else "")
    return out.reset_index()


def test_sentence(t: Mapping, verdict: str) -> str:
    """rho, p, interval, LOPO and the architecture test of ``claim_test`` in words; a leave-one-out error within
    5 % of the constant's reads "about the same", never "better"."""
    if "error" in t or "rho" not in t:
        return f"{verdict}: not computable on this panel ({t.get('error', 'no statistics')})"
    lopo = ""
    if "lopo_mae" in t:
        better = ("about the same" if abs(t["lopo_mae"] - t["const_mae"]) < 0.05 * t["const_mae"]
                  else "better" if t["lopo_mae"] < t["const_mae"] else "worse")
        nd = next((d for d in (1, 2, 3) if f"{t['lopo_mae']:.{d}f}" != f"{t['const_mae']:.{d}f}"), 3)  # never "1.3 against 1.3 (better)"
        lopo = (f"; leave-one-model-out error {t['lopo_mae']:.{nd}f} points against {t['const_mae']:.{nd}f} for the "
                f"constant ({better})")
    arch = ""
    if t.get("within_p") is not None and np.isfinite(t["within_p"]):
        arch = f"; within-variant permutation p = {t['within_p']:.3f}, nested F-test p = {t['f_p']:.3f}"
    return (f"{verdict}: rho = {t['rho']:+.2f} (n = {t['n']}, permutation p = {t['p']:.3f}, Fisher 95 % "
            f"interval [{t['lo']:+.2f}, {t['hi']:+.2f}]){lopo}{arch}")


def causal_summary(ct: pd.DataFrame, with_sink: Sequence[str] | None = None) -> pd.DataFrame:
    """Mean rule and knowledge change per intervention, with the number of models; with `with_sink` (model
    names with a sink by the pilot's rule) only over those, so a sink model is never averaged with one whose
    head merely crosses 0.3."""
    if with_sink is not None and not ct.empty:
        ct = ct[ct["model"].isin(list(with_sink))]
    if ct.empty:
        return ct
    return ct.groupby("intervention", sort=False).agg(models=("model", "count"), rule=("rule change", "mean"),
                                                      knowledge=("knowledge change", "mean"),
                                                      same_heads=("same_heads", "sum")).reset_index()


def protect_sentence(df: pd.DataFrame, col: str = RULE_TASK) -> str:
    """Prediction 3 (per-head QK-norm protects): the variants ordered by their mean `col` (a loss), in words."""
    m = df.groupby("qk_norm", sort=False)[col].mean().sort_values()
    order = ", ".join(f"{k} {v:+.1f}" for k, v in m.items())
    held = m.index[0] == "per_head"
    lost = int((df[col] > 0).sum())
    neg = " (a negative loss: the model kept more than its reference)" if (m < 0).any() else ""
    return (f"mean {col} by variant, smallest first: {order} points{neg}; per-head QK-norm "
            f"{'has' if held else 'does not have'} the smallest loss; the loss is positive in {lost} of {len(df)} models")


def causal_reading(ct: pd.DataFrame, with_sink: Sequence[str], within: float = 1.0) -> str:
    """Section 9.7 in words: whether removing the sink moved the rule in any model with a sink by more than
    `within` points (one rule item or so), against the controls; the largest change per intervention."""
    mine = ct[ct["model"].isin(list(with_sink))] if not ct.empty else ct
    if mine.empty:
        return "no model with a sink by the pilot's rule, so nothing to remove"
    big = mine.groupby("intervention", sort=False)["rule change"].apply(lambda x: float(x.abs().max()))
    moved = [i for i, v in big.items() if v > within]
    sizes = ", ".join(f"{i} {v:.1f}" for i, v in big.items())
    return (f"in the {mine['model'].nunique()} model(s) with a sink, the largest rule change per intervention is "
            f"{sizes} points: " + ("removing the sink left the backcopy rule where it was, so nothing here says the "
                                  "rule rests on the sink" if not moved else
                                  f"{' and '.join(moved)} moved the rule by more than {within:g} point"))


def conditions_sentence(adapted: pd.DataFrame) -> str:
    """Mean rule and knowledge accuracy and S per condition, in words."""
    s = adapted.groupby("condition", sort=False)[["rule_acc", "know_acc", "S"]].mean()
    return "; ".join(f"{c}: rule {r['rule_acc']:.1f} %, knowledge {r['know_acc']:.1f} %, S {r['S']:.2f}"
                     for c, r in s.iterrows())
