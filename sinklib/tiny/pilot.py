"""The pilot of chapter 7: one tiny LM per QK-norm variant; does a sink form (S after training against S
at initialisation), and are the base scores inside 20-95 % on every suite?

    python -m sinklib.tiny.pilot --threads 1 --out pilot.json      # TRAIN_DEFAULTS: 600 steps, lr 1e-2

Training and evaluation are cached by their parameters (a rerun only reads the cache).

Every configuration tried on the way to a sink is listed in `PILOT_TRIALS`, in the order tried, and
`trial_table` recomputes their numbers (S at initialisation and after training, the largest first-token
mass of any head, scores) from the cache; the chapter shows that table, so no result is written here.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch

from sinklib.core.cache import cached_json
from sinklib.tiny.corpus import CORPUS_VERSION
from sinklib.tiny.evaluate import EVAL_DEFAULTS, evaluate, summary
from sinklib.tiny.model import VARIANTS
from sinklib.tiny.train import TRAIN_DEFAULTS, train_tiny

#: the pilot's goal (issue 12): S clearly above its initial value; every suite's base score in this band (%)
SCORE_BAND = (20.0, 95.0)
#: "clearly above": S (a median of log-odds) at least this much above its value at initialisation
SINK_RISE = 0.5


def sink_formed(S_init: float, S_final: float, rise: float = SINK_RISE) -> bool:
    """The pilot's sink criterion: S rose by at least `rise` (log-odds) during training."""
    return bool(S_final - S_init >= rise)

#: every configuration tried on the way to a sink (label, variant, train_tiny overrides of TRAIN_DEFAULTS), in
#: the order tried; each is cached by its parameters, so a chapter reloads them instead of retraining.
#: Their numbers (S at init and after, max first-token mass, scores) are in the chapter's pilot table.
PILOT_TRIALS: list[tuple[str, str, dict]] = [
    ("p0 600 steps, 16x128 concat", "none", {}),
    ("p0 600 steps, 16x128 concat", "per_head", {}),
    ("p0 600 steps, 16x128 concat", "layerwise", {}),
    ("e1 1200 steps, 16x64", "none", {"seq_len": 64, "steps": 1200}),
    ("e2 8 heads, wd 0.5", "none", {"size": {"n_heads": 8}, "weight_decay": 0.5}),
    ("e3 one document per row", "none", {"packing": "doc", "batch_size": 32, "steps": 800}),
    ("e4 d_model 64, 2000 steps", "none", {"size": {"d_model": 64, "ffn": 256}, "steps": 2000}),
    ("e5 chain drills 30 %", "none", {"chain_share": 0.3}),
    ("e6 chain drills 50 %", "none", {"chain_share": 0.5}),
    ("e7 chain 30 %, 8 heads", "none", {"chain_share": 0.3, "size": {"n_heads": 8}}),
    ("e8 chain 30 %, 8 heads, lr 2e-2", "none", {"chain_share": 0.3, "size": {"n_heads": 8}, "lr": 0.02}),
    ("e9 chain 30 %, 8 heads, wd 1.0", "none", {"chain_share": 0.3, "size": {"n_heads": 8}, "weight_decay": 1.0}),
    ("L 2000 steps, chain 30 %, 8 heads", "none", {"chain_share": 0.3, "size": {"n_heads": 8}, "steps": 2000}),
    ("L 2000 steps, chain 30 %, 8 heads", "per_head", {"chain_share": 0.3, "size": {"n_heads": 8}, "steps": 2000}),
    ("L 2000 steps, chain 30 %, 8 heads", "layerwise", {"chain_share": 0.3, "size": {"n_heads": 8}, "steps": 2000}),
]

#: the recipe of the last pilot (the 'L' rows above), the base of the full panel (`sinklib.tiny.panel`); on
#: top of TRAIN_DEFAULTS (16 x 128 concatenated rows, lr 1e-2 with 5 % warm-up then cosine, wd 0.1, BOS)
PILOT_RECIPE: dict = {"chain_share": 0.3, "size": {"n_heads": 8}, "steps": 1000}


def S_from_mass(mass, first_layer: int = 1) -> float:
    """S recomputed from a logged sink-mass map [L, H] over layers >= first_layer (median of the heads'
    log-odds, the 'mass_then_logodds' rule of `sinklib.core.sink`): S without layer 0, where sinks rarely form.
    With first_layer=0 it equals the logged S (K clamped to the depth)."""
    from sinklib.core.sink import logit, strength_from_logodds

    m = np.asarray(mass, dtype=float)[first_layer:]
    return strength_from_logodds(logit(m), len(m))


def max_mass(checkpoint: dict) -> float:
    """The largest mean first-token attention of any head at one logged checkpoint."""
    return round(float(np.max(checkpoint["mass"])), 4)


#: the base-model table of chapter 7 as shown: column -> header a reader sees
BASE_COLUMNS = {"qk_norm": "QK-norm", "setting": "setting", "S_init": "S at init", "S": "S trained",
                "max_mass": "strongest head", "sink03": "Sink_0.3", "base_strict": "strict %",
                "base_lenient": "lenient %", "base_knowledge": "knowledge %", "base_ppl": "perplexity"}


#: Gu et al.'s threshold: a head is a sink head when its mean first-token attention exceeds it (chapter 9 uses it too)
SINK03_EPS = 0.3


def sink03(checkpoint: dict) -> float:
    """Sink_0.3 (Gu et al.): the share of heads whose mean first-token attention exceeds 0.3 at one checkpoint."""
    return round(float((np.asarray(checkpoint["mass"], dtype=float) > SINK03_EPS).mean()), 4)


def sink03_sentence(rows: "pd.DataFrame") -> str:
    """'No sink' by the looser metric too: Sink_0.3 (Gu et al.'s share of heads whose first-token attention exceeds
    0.3) and the strongest head, over the panel's models (chapter 9 uses the same threshold)."""
    if "sink03" not in rows:
        return "Sink_0.3 not computed in this run"
    any03 = int((rows["sink03"] > 0).sum())
    half = int((rows["sink03"] >= 0.5).sum())
    return (f"by Gu et al.'s looser metric, Sink_0.3 (the share of heads whose first-token attention exceeds 0.3) "
            f"is at most {rows['sink03'].max():.2f} (median {rows['sink03'].median():.2f}): {any03} of {len(rows)} "
            f"models have any head above 0.3 and {half} have half their heads above it; the strongest head of any "
            f"model puts {rows['max_mass'].max():.2f} of its attention on the first token")


def _between_layers(ratio: list) -> list:
    return list(ratio[1:-1]) if len(ratio) > 2 else list(ratio)


def emergence_table(log: dict) -> "pd.DataFrame":
    """Sink emergence along training, one row per logged checkpoint of a run's log (`TinyRun.log`): step, S,
    S without layer 0 (`S_from_mass`), the largest and the median head mass on the first token, the share of
    heads whose mass exceeds 0.5 (sink heads) and the largest ratio, over the residual stream between layers
    (`sink_norms`' entries 1..L-1: neither the embeddings nor the final normed output), of the first token's
    hidden-state norm to the median of the other tokens' (a massive activation shows as a ratio far above 1)."""
    import pandas as pd

    rows = []
    for c in log["checkpoints"]:
        m = np.asarray(c["mass"], dtype=float)
        rows.append({"step": int(c["step"]), "S": float(c["S"]), "S_L1": S_from_mass(m),
                     "max_mass": float(m.max()), "median_mass": float(np.median(m)),
                     "sink_heads": float((m > 0.5).mean()), "sink03": float((m > SINK03_EPS).mean()),
                     "max_norm_ratio": float(max(_between_layers(c["sink_norm"]["ratio"])))})
    return pd.DataFrame(rows)


def trial_table(trials=None, *, only_cached: bool = True, evaluate_too: bool = False):
    """The pilot's configurations (`PILOT_TRIALS`) as a table: label, variant, steps, S at init and after,
    max first-token mass of any head at init and after, training seconds (and base scores when
    `evaluate_too`). With `only_cached` a configuration not in the cache is listed with NaNs, not trained."""
    import pandas as pd

    from sinklib.core.cache import checkpoint_exists
    from sinklib.tiny.train import run_dir, train_params

    rows = []
    for label, variant, kw in (PILOT_TRIALS if trials is None else trials):
        row = {"trial": label, "variant": variant}
        if only_cached and not checkpoint_exists(run_dir(train_params(variant, **kw))):
            rows.append({**row, "cached": False})
            continue
        if evaluate_too:
            r = pilot(variant, **kw)
            row.update({k: r[k] for k in ("steps", "S_init", "S_final", "max_mass_init", "max_mass_final",
                                          "train_seconds", "strict", "lenient", "knowledge", "ppl", "all_in_band")})
        else:
            run = train_tiny(variant, **kw)
            row.update({"steps": run.params["steps"], "S_init": run.S_init, "S_final": run.S_final,
                        "S_L1_init": S_from_mass(run.log["checkpoints"][0]["mass"]),
                        "S_L1_final": S_from_mass(run.log["checkpoints"][-1]["mass"]),
                        "max_mass_init": max_mass(run.log["checkpoints"][0]),
                        "max_mass_final": max_mass(run.log["checkpoints"][-1]), "train_seconds": run.log["seconds"]})
        rows.append({**row, "cached": True})
    return pd.DataFrame(rows)


def pilot(variant: str, *, eval_kwargs: dict | None = None, progress: bool = False, **train_kwargs) -> dict:
    """Train (or load) one tiny LM of `variant` and evaluate it: a flat dict of the pilot's numbers."""
    run = train_tiny(variant, progress=progress, **train_kwargs)
    ev = {**EVAL_DEFAULTS, **dict(eval_kwargs or {})}

    def compute() -> dict:
        t0 = time.perf_counter()
        res = evaluate(run.model, run.tokenizer, **ev)
        out = {"summary": summary(res), "scores": {k: r.scores for k, r in res.items()},
               "ci": {k: {m: list(v) for m, v in r.ci.items()} for k, r in res.items()},
               "examples": [{k: p[k] for k in ("task", "prompt", "reference", "response", "strict", "lenient")}
                            for p in res["format"].per_item[:10]] if "format" in res else [],
               "seconds": round(time.perf_counter() - t0, 2)}
        return out

    evals = cached_json({"kind": "tiny_eval", "run": run.key, "corpus_version": CORPUS_VERSION, **ev}, compute, folder="tiny/evals")
    s = evals["summary"]
    in_band = [SCORE_BAND[0] <= s[m] <= SCORE_BAND[1] for m in ("strict", "lenient", "knowledge") if m in s]
    return {"variant": variant, "key": run.key, "from_cache": run.from_cache,
            "n_parameters": run.info.get("n_parameters"), "steps": run.params["steps"],
            "train_seconds": run.log.get("seconds"), "threads": run.info.get("torch_threads"),
            "final_loss": sum(run.log["loss"][-20:]) / max(1, len(run.log["loss"][-20:])) if run.log["loss"] else None,
            "S_init": run.S_init, "S_final": run.S_final,
            "S_curve": [(c["step"], round(c["S"], 3)) for c in run.log["checkpoints"]],
            "sink_norm_ratio_final": [round(x, 2) for x in run.log["checkpoints"][-1]["sink_norm"]["ratio"]],
            "max_mass_init": max_mass(run.log["checkpoints"][0]), "max_mass_final": max_mass(run.log["checkpoints"][-1]),
            "sink03_final": sink03(run.log["checkpoints"][-1]),
            "layer_mass_final": [round(float(x), 3) for x in np.asarray(run.log["checkpoints"][-1]["mass"]).mean(1)],
            **s, "scores": evals["scores"], "ci": evals["ci"], "examples": evals["examples"], "eval_seconds": evals["seconds"],
            "all_in_band": all(in_band)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS))
    ap.add_argument("--steps", type=int, default=TRAIN_DEFAULTS["steps"])
    ap.add_argument("--lr", type=float, default=TRAIN_DEFAULTS["lr"])
    ap.add_argument("--weight-decay", type=float, default=TRAIN_DEFAULTS["weight_decay"])
    ap.add_argument("--batch-size", type=int, default=TRAIN_DEFAULTS["batch_size"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-bos", action="store_true")
    ap.add_argument("--warmup-frac", type=float, default=TRAIN_DEFAULTS["warmup_frac"])
    ap.add_argument("--seq-len", type=int, default=TRAIN_DEFAULTS["seq_len"])
    ap.add_argument("--packing", default="concat", choices=("concat", "doc"))
    ap.add_argument("--chain-share", type=float, default=0.0)
    ap.add_argument("--size", type=json.loads, default=None, help='JSON, e.g. \'{"d_model": 128}\'')
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    rows = []
    for v in a.variants:
        r = pilot(v, steps=a.steps, lr=a.lr, weight_decay=a.weight_decay, batch_size=a.batch_size, seed=a.seed,
                  bos=not a.no_bos, size=a.size, warmup_frac=a.warmup_frac, seq_len=a.seq_len, packing=a.packing,
                  chain_share=a.chain_share, progress=False)
        rows.append(r)
        print(json.dumps({k: r[k] for k in ("variant", "n_parameters", "steps", "train_seconds", "final_loss", "S_init",
                                             "S_final", "strict", "lenient", "knowledge", "ppl", "all_in_band")}),
              flush=True)
        print("  per task:", {k: round(x, 1) for k, x in r["scores"]["format"].items() if ":" in k}, flush=True)
        print("  S curve:", r["S_curve"], " sink/other norm (final, per layer):", r["sink_norm_ratio_final"], flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
