"""Chapter 7's controlled panel: tiny base LMs in three QK-norm variants, several training settings per
variant (so that S spreads *within* a variant), each adapted by chapter 4's VL recipe (`sinklib.tiny.adapt`),
and the statistics of the claim on the resulting panel (reused from `sinklib.panel`).

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
import sys
import time
from collections.abc import Mapping, Sequence

import pandas as pd

from .. import panel as stats
from ..errors import ParameterError
from ..panel_schema import validate_panel
from ..params import check_choice
from .adapt import PANEL_METRICS, adapt
from .model import VARIANTS
from .pilot import PILOT_RECIPE, pilot

#: the training settings of the full panel, applied on top of the profile's base recipe (name -> overrides):
#: the pilot recipe itself, another seed, a lower learning rate, no weight decay, no BOS token
SETTINGS: dict[str, dict] = {
    "pilot": {},
    "seed1": {"seed": 1},
    "lr_low": {"lr": 3e-3},
    "wd0": {"weight_decay": 0.0},
    "no_bos": {"bos": False},
}

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
        "train": PILOT_RECIPE, "settings": SETTINGS, "variants": VARIANTS, "recipe": {}, "eval": {},
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


def run_panel(profile: str = "full", *, settings: Mapping[str, Mapping] | None = None,
              variants: Sequence[str] | None = None, progress: bool = False, log=print) -> dict:
    """Train (or load), evaluate and adapt every model of the plan; returns {'rows' (DataFrame in the panel
    schema, validated, plus setting, base scores and seconds), 'models' (per-model details), 'seconds'}."""
    prof = PROFILES[check_choice("profile", profile, tuple(PROFILES))]
    t0 = time.perf_counter()
    rows, models = [], []
    for spec in panel_plan(profile, settings, variants):
        t1 = time.perf_counter()
        base = pilot(spec["variant"], eval_kwargs={k: v for k, v in prof["eval"].items() if not k.startswith("vqa_")},
                     progress=progress, **spec["train"])
        from .train import train_tiny

        run = train_tiny(spec["variant"], **spec["train"])
        res = adapt(run, recipe=prof["recipe"], eval_kwargs=prof["eval"], progress=progress)
        row = {**res["panel_row"], "setting": spec["setting"], "S_init": run.S_init,
               "base_strict": base["strict"], "base_lenient": base["lenient"], "base_knowledge": base["knowledge"],
               "base_ppl": base["ppl"], "train_seconds": base["train_seconds"],
               "vqa_learned": bool(res["vqa"]["learned"]) if res["vqa"] else False}
        rows.append(row)
        models.append({"spec": spec, "pilot": {k: v for k, v in base.items() if k not in ("examples",)},
                       "changes": res["changes"], "vqa": res["vqa"], "S": res["S"]})
        if log:
            log(f"{spec['variant']:9s} {spec['setting']:8s} S {row['S']:+.3f} (init {run.S_init:+.3f}, VL "
                f"{row['S_vl']:+.3f})  strict change {row['delta_format_strict']:+.1f}  "
                f"VQA {row['vqa']:.1f} vs {row['vqa_majority']:.1f}  ({time.perf_counter() - t1:.0f} s)")
    df = validate_panel(pd.DataFrame(rows), where=f"tiny panel ({profile})")
    return {"rows": df, "models": models, "seconds": round(time.perf_counter() - t0, 1)}


def panel_statistics(df: pd.DataFrame, tasks: Sequence[str] = TASKS, *, seed: int = 0, **kw) -> dict[str, pd.DataFrame]:
    """`sinklib.panel.panel_summary` on the tiny panel's task columns (never raises on a small panel)."""
    return stats.panel_summary(df, [t for t in tasks if t in df.columns], seed=seed, **kw)


def main(argv: list[str] | None = None) -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="quick", choices=tuple(PROFILES))
    ap.add_argument("--variants", nargs="+", default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None, help="write rows and statistics as JSON here")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    res = run_panel(a.profile, variants=a.variants)
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
    from ..params import COMMON, boolean, choice, integer, list_of

    return {"panel": choice(tuple(PROFILES)), "variants": list_of(choice(VARIANTS)),
            "settings": list_of(choice(tuple(SETTINGS))), "threads": integer(1, 256), "show_progress": boolean(),
            **COMMON}


#: the parameters of chapter 7 (one `validate` call in the notebook)
CHAPTER7_PARAMS = _chapter7_params()
