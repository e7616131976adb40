"""Dose-response along training: one run of a pair's VL (or text-only) condition, saved at several stage-2
steps, each snapshot evaluated like a condition of the pair.

The run repeats the pair's recipe and seed from the base weights, so its last snapshot should equal the
pair's cached checkpoint (`final_matches` checks it). Snapshots are cached by the pair's parameters, the
kind and the step (`snapshot_dir`); a series whose snapshots all exist is not retrained. Each snapshot is
evaluated under the condition name `snapshot_name(kind, step)` ('vl step 15'), with the snapshot's own
projector for VQA, so the cached evaluations of the pair itself are untouched.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from sinklib.core import cache
from sinklib import vl
from sinklib.errors import ParameterError
from sinklib.core.params import check_choice, check_int

KINDS = ("vl", "text_only")


def snapshot_name(kind: str, step: int) -> str:
    """The condition name of a snapshot: '<kind> step <n>' (n counted in stage 2, the LM's training)."""
    return f"{check_choice('kind', kind, KINDS)} step {check_int('step', step, 1)}"


def snapshot_dir(params: Mapping[str, Any], kind: str, step: int) -> Path:
    """Checkpoint folder of one snapshot of the pair `params`."""
    kind = check_choice("kind", kind, KINDS)
    return cache.checkpoint_dir(cache.key({**params, "kind": kind, "snapshot": check_int("step", step, 1)}))


def check_steps(params: Mapping[str, Any], steps: Sequence[int]) -> list[int]:
    """Sorted distinct stage-2 steps in [1, stage2_steps]; a clear error otherwise."""
    n = params["stage2_steps"]
    out = sorted({check_int(f"steps[{i}]", s, 1, n) for i, s in enumerate(steps)})
    if not out:
        raise ParameterError(f"parameter 'steps' is empty; give stage-2 steps in [1, {n}] to snapshot")
    return out


def train_series(lm: Any, params: Mapping[str, Any], kind: str, steps: Sequence[int], *,
                 progress: bool = False, restore: Callable[[], Mapping[str, torch.Tensor]] | None = None) -> dict[int, Path]:
    """Retrain the pair's `kind` condition ('vl' or 'text_only') from `lm.model`'s (base) weights with the
    pair's recipe and seed, saving the LM (and the VL projector) after each stage-2 step in `steps`; returns
    {step: checkpoint folder}. Cached: nothing is trained when every snapshot exists. With LoRA the last step's
    snapshot also gets its record (`sinklib.adapt.adapters`), from which a later call rebuilds it, on any machine
    whose cache holds the record, instead of training again. A snapshot carried without its weights is retrained
    when its weights are first read (`cache.defer_weights`). `lm.model` ends holding the base weights again: a copy
    taken before training, or what `restore()` returns (a model too large for a second copy in memory reads its base
    weights back from disk, `fourpanel.base_source`)."""
    from sinklib.adapt import adapters

    kind = check_choice("kind", kind, KINDS)
    steps = check_steps(params, steps)
    dirs = {s: snapshot_dir(params, kind, s) for s in steps}
    for d in dirs.values():  # a LoRA snapshot carried from another machine as its record (`adapters`)
        adapters.rebuild(d, lm.model)
    missing = [s for s, d in dirs.items() if not cache.checkpoint_exists(d)]
    weightless = [s for s, d in dirs.items() if cache.checkpoint_exists(d) and not cache.weights_present(d)]
    if missing:
        _run_series(lm, params, kind, dirs, progress, restore)
    elif weightless:  # made only if read: base weights from `restore` or a copy taken now
        base = restore or (lambda sd=vl.clone_state_dict(lm.model): sd)
        for s in weightless:
            cache.defer_weights(dirs[s], lambda: (lm.model.load_state_dict(base(), strict=True),
                                                  _run_series(lm, params, kind, dirs, progress, base)))
    return dirs


def _run_series(lm: Any, params: Mapping[str, Any], kind: str, dirs: Mapping[int, Path], progress: bool,
                restore: Callable[[], Mapping[str, torch.Tensor]] | None) -> None:
    """One training of `train_series` from the base weights in `lm.model`: each snapshot of `dirs` not cached is
    saved, each weightless one gets its weights (`cache.fill_weights`), the last step's LoRA record is kept."""
    from sinklib.adapt import adapters

    model, tok = lm.model, lm.tokenizer
    base_sd = vl.clone_state_dict(model) if restore is None else None
    offset = 0  # stage 2 counted from 1: a VL run starts it from the cached stage-1 projector (`_stage1`)

    def snap(step: int, model: torch.nn.Module, stage: str = "", projector: Any = None, encoder: Any = None) -> None:
        s = step - offset
        if "stage 1" in stage or s not in dirs:
            return
        if not cache.checkpoint_exists(dirs[s]):
            cache.save_checkpoint(dirs[s], model, projector, encoder,
                                  meta={"kind": kind, "stage2_step": s, "params": dict(params)})
        elif not cache.weights_present(dirs[s]):
            cache.fill_weights(dirs[s], model)

    common = dict(batch_size=params["batch_size"], seed=params["seed"], image_size=params["image_size"],
                  schedule=params.get("schedule", "constant"), callback=snap, callback_every=1, progress=progress,
                  phrasing=params.get("phrasing", "question"), **vl.lm_method_of(params).params())
    try:
        if kind == "vl":
            ck = _stage1(lm, params, progress)
            res = vl.train_vl(model, tok, stage1_steps=0, stage2_steps=params["stage2_steps"],
                              lr_projector=params["lr_projector"], lr_lm=params["lr_lm"],
                              lr_projector_stage2=params.get("lr_projector_stage2"), encoder=ck.encoder,
                              projector=ck.projector, **common)
        else:
            res = vl.train_text_only(model, tok, steps=params["stage2_steps"], lr=params["lr_lm"], **common)
        last = params["stage2_steps"]
        if res.adapters and last in dirs and not adapters.record_exists(dirs[last]):  # `model` holds the merged model
            adapters.save_record(dirs[last], res.adapters, vl.lm_method_of(params).scale, model)
    finally:
        model.load_state_dict(base_sd if restore is None else restore(), strict=True)
        model.eval()


def _stage1(lm: Any, params: Mapping[str, Any], progress: bool) -> Any:
    """The pair's stage 1 (the projector, the LM frozen), trained once and cached by the parameters it depends on
    (`sweep.stage1_dir`: not the stage-2 rates), read back as a checkpoint without the LM's weights. Stage 2 from
    it gives the very weights of one uninterrupted `train_vl` run (the encoder, the projector's start and the LoRA
    adapters come from seeded generators of their own, and each stage has its own optimizer; tested), so a rate
    walk trains stage 1 once, and a job stopped after stage 1 resumes at stage 2."""
    from sinklib.adapt import sweep

    return vl.load_checkpoint(sweep.train_stage1(lm, params, progress=progress), lm.model, weights=False)


def final_matches(lm: Any, params: Mapping[str, Any], kind: str,
                  pair_state: Mapping[str, torch.Tensor] | Callable[[], Mapping[str, torch.Tensor]]) -> float:
    """Largest absolute difference between the series' snapshot at the last stage-2 step and the pair's cached
    state of `kind` (0.0: the rerun reproduced the pair exactly); `pair_state` may be a function that returns it.
    Cached under both checkpoints' stamps (`cache.state_gap`); `lm.model` is not changed."""
    from sinklib.adapt.pairs import condition_dir

    return cache.state_gap(snapshot_dir(params, kind, params["stage2_steps"]), lm.model, pair_state,
                           condition_dir(params, kind))


def evaluate_series(lm: Any, pair: Any, kind: str, steps: Sequence[int], **evaluate_kwargs: Any) -> dict[int, dict]:
    """Each snapshot of `kind` at `steps` evaluated by `pairs.evaluate_condition` (cached under
    `snapshot_name(kind, step)` with the pair's parameters), VQA with the snapshot's projector; {step: evaluation}.
    A snapshot is read only when its evaluation is not cached (a cached one needs no snapshot at all), one at a
    time; `lm.model` ends holding the base weights."""
    from sinklib.adapt.pairs import LazyStates, Pair, cached_evaluation, evaluate_condition

    out = {}
    for s in check_steps(pair.params, steps):
        d = snapshot_dir(pair.params, kind, s)
        name = snapshot_name(kind, s)
        hit = cached_evaluation(pair.params, name, **evaluate_kwargs)
        if hit is not None:  # cached: neither the snapshot nor its projector is needed
            out[s] = hit
            continue
        if not cache.checkpoint_exists(d):
            raise ParameterError(f"no snapshot of {kind!r} at stage-2 step {s} for {pair.params['model']}: "
                                 "run `dose.train_series` with these steps first")
        ck = vl.load_checkpoint(d, lm.model, weights=False)
        states = LazyStates({"base": pair.states["base"]})
        states.defer(name, lambda d=d: cache.load_state(d, lm.model))
        one = Pair(params=pair.params, states=states, projector=ck.projector if kind == "vl" else None,
                   encoder=ck.encoder if kind == "vl" else None)
        out[s] = evaluate_condition(lm, one, name, **evaluate_kwargs)
    return out


def series_table(rows: pd.DataFrame) -> pd.DataFrame:
    """`isolate.sink_text_rows` of snapshot conditions -> the same rows with 'kind' and 'step' columns parsed
    from the condition names (rows of other conditions keep the condition as kind and the step empty)."""
    kinds, stepcol = [], []
    for c in rows.condition:
        kind, _, s = c.partition(" step ")
        kinds.append(kind)
        stepcol.append(int(s) if s.isdigit() else None)
    return rows.assign(kind=kinds, step=stepcol)


def dose_table(evaluations: Mapping[tuple[str, str], dict], steps: Sequence[int], stage2_steps: int,
               last_k: Mapping[str, int] | int) -> pd.DataFrame:
    """The dose-response rows of every model: for VL and text-only, each evaluated snapshot at `steps` and the
    pair's own condition (the end of training, step `stage2_steps`), with the changes from base of the last-K
    sink mass, S, the strict-format mean and knowledge (`isolate.sink_text_rows`); columns kind and step added,
    sorted by model, kind and step. Other conditions in `evaluations` are ignored."""
    from sinklib.adapt.isolate import sink_text_rows

    wanted = {snapshot_name(k, s) for k in KINDS for s in steps}
    sub = {}
    for (m, c), ev in evaluations.items():
        if c == "base" or c in wanted:
            sub[(m, c)] = ev
        elif c in KINDS:  # the pair's own condition: the snapshot at the last step
            sub[(m, snapshot_name(c, stage2_steps))] = ev
    rows = series_table(sink_text_rows(sub, last_k))
    return rows.sort_values(["model", "kind", "step"], kind="stable").reset_index(drop=True)


def complete_sentence(rows: pd.DataFrame, metrics: Sequence[str] = ("strict-format mean change",
                                                                    "sink mass change")) -> str:
    """Per model of a `dose_table`: each run's strict-format change at every snapshot, and the share of the spread
    of each metric over the snapshots that lies between the runs (between-run sum of squares over the total).
    A share near 1 means each run's change was complete by its first snapshot, so a rho over the snapshots
    contrasts the runs rather than tracing a dose within one."""
    from sinklib.adapt.pairs import CONDITION_LABELS
    from sinklib.core.numbers import signed

    parts = []
    for m, g in rows.groupby("model", sort=False):
        runs = [(k, r.sort_values("step")) for k, r in g.groupby("kind", sort=False)]
        first = int(g.step.min())
        series = "; ".join(f"{CONDITION_LABELS.get(k, k)} " + ", ".join(
            f"{signed(v)} at step {int(s)}" for s, v in zip(r.step, r["strict-format mean change"])) for k, r in runs)
        shares = []
        for metric in metrics:
            total = float(((g[metric] - g[metric].mean()) ** 2).sum())
            between = float(sum(len(r) * (r[metric].mean() - g[metric].mean()) ** 2 for _, r in runs))
            shares.append((metric.replace(" change", ""), between / total if total > 0 else float("nan")))
        share_text = " and ".join(f"{100 * v:.0f} % of the {name}'s" for name, v in shares)
        done = all(v >= 0.9 for _, v in shares)
        parts.append(f"{m}: strict-format mean {series}; the difference between the runs makes up {share_text} "
                     f"spread over the snapshots, so " + (
                         f"each run's changes were complete by step {first}, and the rho contrasts the two runs "
                         "rather than tracing a dose within one" if done else
                         "the runs also vary within themselves, and the rho traces a dose as well as the "
                         "difference between the runs"))
    return ". ".join(parts)


def run(lm_by: Mapping[str, Any], built: Mapping[str, Any], steps: Sequence[int], evaluations: dict, *,
        progress: bool = False, vqa_n: int = 0, **evaluate_kwargs: Any) -> dict[str, float]:
    """Chapter 4's dose-response for every model of `lm_by`: train (or load) each kind's series up to the pair's
    last stage-2 step, compare its last snapshot with the cached pair, evaluate the snapshots at `steps` (VQA only
    for VL) into `evaluations` under `snapshot_name`; returns {'<model> <kind label>': largest weight difference}.
    `evaluate_kwargs` go to `pairs.evaluate_condition`, with `last_k_layers` and `max_tokens` in place of
    `sink_kwargs` (`pairs.per_model_kwargs`)."""
    from sinklib.adapt.pairs import CONDITION_LABELS, per_model_kwargs

    gaps = {}
    for name, lm in lm_by.items():
        b = built[name]
        for kind in KINDS:
            train_series(lm, b.params, kind, [*steps, b.params["stage2_steps"]], progress=progress)
            gaps[f"{name} {CONDITION_LABELS[kind]}"] = final_matches(lm, b.params, kind, lambda b=b, kind=kind: b.states[kind])
            for s, ev in evaluate_series(lm, b, kind, steps, vqa_n=vqa_n if kind == "vl" else 0,
                                         **per_model_kwargs(lm, evaluate_kwargs)).items():
                evaluations[(name, snapshot_name(kind, s))] = ev
    return gaps


def plot(rows: pd.DataFrame):
    """Figure 4.8: per model, the strict-format and knowledge changes (top) and the last-K sink mass change
    (bottom) against the stage-2 step, VL solid and text-only dashed, step 0 being the base model."""
    import numpy as np

    from sinklib import plots
    from sinklib.adapt.pairs import CONDITION_LABELS

    models = list(dict.fromkeys(rows.model))
    fig, axes = plots.subplots(2, len(models), height=2.8)
    axes = np.asarray(axes).reshape(2, len(models))
    for j, name in enumerate(models):
        for kind, ls in (("vl", "-"), ("text_only", "--")):
            r = rows[(rows.model == name) & (rows.kind == kind)]
            x, label = [0, *r.step], CONDITION_LABELS[kind]
            axes[0, j].plot(x, [0, *r["strict-format mean change"]], ls, color="C0", marker="o",
                            label=f"{label}: strict-format mean")
            axes[0, j].plot(x, [0, *r["knowledge acc change"]], ls, color="C2", marker="s", label=f"{label}: knowledge")
            axes[1, j].plot(x, [0, *r["sink mass change"]], ls, color="C3", marker="o", label=f"{label}: last-K sink mass")
        axes[0, j].set_title(name); axes[0, j].set_ylabel("change from base (points)")
        axes[1, j].set_ylabel("change of sink mass"); axes[1, j].set_xlabel("stage-2 step")
        for ax in axes[:, j]:
            ax.axhline(0, color="k", lw=0.6)
    axes[0, 0].legend(fontsize=7); axes[1, 0].legend(fontsize=7)
    fig.tight_layout()
    return fig
