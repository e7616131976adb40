"""Training the Bigram-Backcopy models of chapter 9 from scratch, the sink measured along training.

    rec, model = train_backcopy({"variant": "per_head", "steps": 600})   # cached by its parameters
    rec["history"]                      # one row per check: step, S, Sink_0.3, per-head masses, losses, norms
    rec["final"]                        # the same measures on the held-out set after the last step

S is the book's (``sinklib.core.sink.strength_from_logodds``): per head, the mean attention probability on
position 0 over every query at positions >= 1 of the held-out sequences, its log-odds, and the median over
the heads of the last K layers. These models have one or two layers, so K = every layer (``n_layers``)
and the median runs over all heads (with two heads it is the mean of the two log-odds). Sink_0.3 (Gu et al.)
is the share of those heads whose mean first-token attention exceeds 0.3. The 'dormant' masses use only the
queries that do not need the copy head (the input token is not a trigger).
"""
from __future__ import annotations

import time
from collections.abc import Mapping

import numpy as np
import torch
import torch.nn.functional as F

from sinklib.core import cache, train
from sinklib.errors import ParameterError
from sinklib.core.params import check_choice, check_float, check_int
from sinklib.core.sink import logit, strength_from_logodds
from sinklib.tiny import backcopy as bc

_VERSION = 1
SINK_EPS = 0.3
#: the pilot's first recipe (the block and optimiser measured to form a sink with one head; see chapter 9)
TRAIN_DEFAULTS: dict = {"variant": "none", "d_model": 128, "n_layers": 1, "n_heads": 2, "length": 256,
                        "lr": 2e-3, "weight_decay": 0.1, "batch": 64, "share": 0.27, "bos": "fixed",
                        "steps": 600, "check_every": 25, "seed": 0, "world_seed": 0, "alpha": 0.1,
                        "n_chain": 64, "eval_n": 32, "eval_share": 0.27}
#: the success rule of the pilot, stated before it ran: S up by at least 2 and Sink_0.3 at least one half
RULE = {"s_rise": 2.0, "sink03": 0.5}
EVAL_SEED_OFFSET = 10_007


def train_params(**overrides) -> dict:
    """The full, checked parameter dict of one run (defaults from TRAIN_DEFAULTS)."""
    bad = set(overrides) - set(TRAIN_DEFAULTS)
    if bad:
        raise ParameterError(f"unknown training parameter(s) {sorted(bad)}; allowed: {', '.join(TRAIN_DEFAULTS)}")
    p = {**TRAIN_DEFAULTS, **overrides}
    check_choice("variant", p["variant"], bc.VARIANTS)
    check_choice("bos", p["bos"], bc.BOS_MODES)
    for name in ("steps", "check_every", "batch", "length", "eval_n"):
        check_int(name, p[name], 1)
    check_float("share", p["share"], 0.0, 0.5)
    check_float("lr", p["lr"], 0.0, 1.0)
    check_float("weight_decay", p["weight_decay"], 0.0, 100.0)
    return p


def vocab_of(p: Mapping) -> bc.Vocab:
    return bc.Vocab(n_chain=p["n_chain"])


def config_of(p: Mapping) -> bc.BlockConfig:
    return bc.block_config(d_model=p["d_model"], n_layers=p["n_layers"], n_heads=p["n_heads"],
                           context=p["length"], vocab_size=vocab_of(p).size)


def eval_ids(p: Mapping) -> torch.Tensor:
    """The held-out sequences [eval_n, length]: their own seed stream, the run's BOS mode, the eval share."""
    v = vocab_of(p)
    rng = np.random.default_rng(p["world_seed"] + EVAL_SEED_OFFSET)
    trans = bc.transitions(v, p["alpha"], p["world_seed"])
    return torch.from_numpy(bc.sequences(trans, v, p["eval_n"], p["length"], p["eval_share"], p["bos"], rng))


def _masked_mean(x: torch.Tensor, m: torch.Tensor) -> float:
    return float(x[m].float().mean()) if m.any() else float("nan")


@torch.no_grad()
def measure(model: bc.BackcopyLM, ids: torch.Tensor, vocab: bc.Vocab) -> dict:
    """The sink and the skills of `model` on ids [B, T] (see module doc): masses [L][H] (all queries >= 1)
    and dormant masses, S, Sink_0.3, rule loss/accuracy, knowledge accuracy (argmax over chain tokens) and
    perplexity, the first token's value-norm and hidden-norm ratios (position 0 over the mean of the rest)."""
    model.keep_probs(True)
    f = model(ids)
    r = bc.roles(ids, vocab)
    q = torch.zeros(ids.shape[1], dtype=torch.bool)
    q[1:] = True
    mass = np.array([[float(p[:, h, 1:, 0].mean()) for h in range(p.shape[1])] for p in f.probs])
    dorm = r["dormant"][:, 1:]                                    # queries 1..T-2 as inputs of targets
    dormant = np.array([[_masked_mean(p[:, h, 1:-1, 0], dorm) for h in range(p.shape[1])] for p in f.probs])
    logits, tgt = f.logits[:, :-1], ids[:, 1:]
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), reduction="none").view_as(tgt)
    chain_pred = logits[..., 1:1 + vocab.n_chain].argmax(-1) + 1
    vnorm = [float(v[:, :, 0].norm(dim=-1).mean() / v[:, :, 1:].norm(dim=-1).mean()) for v in f.values]
    hnorm = [float(h[:, 0].norm(dim=-1).mean() / h[:, 1:].norm(dim=-1).mean()) for h in f.hidden]
    return {"mass": mass.tolist(), "dormant": dormant.tolist(),
            "S": strength_from_logodds(logit(mass), mass.shape[0]), "sink03": float((mass > SINK_EPS).mean()),
            "top_head": float(mass.max()), "rule_loss": _masked_mean(nll, r["rule"]),
            "rule_acc": _masked_mean(logits.argmax(-1) == tgt, r["rule"]),
            "know_acc": _masked_mean(chain_pred == tgt, r["knowledge"]),
            "know_ppl": float(np.exp(_masked_mean(nll, r["knowledge"]))),
            "bos_value_ratio": vnorm, "bos_hidden_ratio": hnorm}


def loss_of(model: bc.BackcopyLM, ids: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over every target position of ids [B, T]."""
    logits = model(ids).logits[:, :-1]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def checkpoint_path(p: Mapping):
    return cache.root() / "backcopy" / f"{cache.key(_key(p))}.pt"


def _key(p: Mapping) -> dict:
    return {"kind": "backcopy-base", "version": _VERSION, **dict(p)}


def _fit(p: dict) -> tuple[dict, bc.BackcopyLM]:
    """Train one model from scratch; returns (record, model)."""
    torch.manual_seed(p["seed"])
    v = vocab_of(p)
    model = bc.build(p["variant"], config_of(p), seed=p["seed"])
    trans = bc.transitions(v, p["alpha"], p["world_seed"])
    rng = np.random.default_rng([p["seed"], p["world_seed"]])
    held = eval_ids(p)
    history = [{"step": 0, **measure(model, held, v)}]

    def batches(i: int) -> torch.Tensor:
        return torch.from_numpy(bc.sequences(trans, v, p["batch"], p["length"], p["share"], p["bos"], rng))

    def after(info: train.StepInfo) -> None:
        if (info.i + 1) % p["check_every"] == 0 or info.i + 1 == p["steps"]:
            model.eval()
            history.append({"step": info.i + 1, "train_loss": info.loss, **measure(model, held, v)})
            model.train()
            model.keep_probs(False)

    model.train()
    model.keep_probs(False)
    seconds = train.run([{"params": list(model.parameters()), "lr": p["lr"]}], p["steps"], batches,
                        lambda ids: loss_of(model, ids), weight_decay=p["weight_decay"], after_step=after,
                        desc=f"backcopy {p['variant']}")
    model.eval()
    return {"params": p, "history": history, "final": history[-1], "seconds": seconds,
            "emergence_step": emergence_step(history)}, model


def emergence_step(history: list[Mapping]) -> int | None:
    """The first checked step at which the pilot's rule holds (S - S at step 0 >= RULE['s_rise'] and
    Sink_0.3 >= RULE['sink03']), or None."""
    s0 = history[0]["S"]
    for row in history:
        if row["S"] - s0 >= RULE["s_rise"] and row["sink03"] >= RULE["sink03"]:
            return int(row["step"])
    return None


def stable_step(history: list[Mapping]) -> int | None:
    """The first checked step from which the rule holds at every later check (the sink stays), or None.
    Added after the first pilot showed Sink_0.3 flickering around its threshold (chapter 9 says so)."""
    s0, out = history[0]["S"], None
    for row in history:
        ok = row["S"] - s0 >= RULE["s_rise"] and row["sink03"] >= RULE["sink03"]
        out = (out if out is not None else int(row["step"])) if ok else None
    return out


def train_backcopy(params: Mapping | None = None, need_model: bool = True) -> tuple[dict, bc.BackcopyLM | None]:
    """(record, model) of one run, cached: the record as JSON (``cache.cached_json``, folder 'backcopy'), the
    weights beside it. With need_model=False a cached record is returned without reading the weights."""
    p = train_params(**dict(params or {}))
    path = checkpoint_path(p)
    box: dict = {}

    def compute() -> dict:
        t0 = time.perf_counter()
        rec, model = _fit(p)
        rec["wall_seconds"] = time.perf_counter() - t0
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), path)
        box["model"] = model
        return rec

    if need_model and not path.exists():
        rec = cache.cached_json(_key(p), compute, folder="backcopy", refresh=True)
    else:
        rec = cache.cached_json(_key(p), compute, folder="backcopy")
    if "model" in box or not need_model:
        return rec, box.get("model")
    return rec, load_model(p)


def load_model(p: Mapping) -> bc.BackcopyLM:
    """The trained weights of run `p` (it must have been trained)."""
    model = bc.build(p["variant"], config_of(p), seed=p["seed"])
    model.load_state_dict(torch.load(checkpoint_path(p), weights_only=True))
    return model.eval()


def history_rows(rec: Mapping, label: str) -> list[dict]:
    """Flat rows for a table or figure: label, step, S, Sink_0.3, per-head dormant masses, losses, norms."""
    rows = []
    for h in rec["history"]:
        row = {"try": label, "variant": rec["params"]["variant"], "step": h["step"], "S": h["S"],
               "sink03": h["sink03"], "top_head": h["top_head"], "rule_loss": h["rule_loss"],
               "rule_acc": h["rule_acc"], "know_acc": h["know_acc"], "know_ppl": h["know_ppl"],
               "bos_value_ratio": h["bos_value_ratio"][-1], "bos_hidden_ratio": h["bos_hidden_ratio"][-1]}
        for li, layer in enumerate(h["dormant"]):
            for hi, m in enumerate(layer):
                row[f"dormant L{li}H{hi}"] = m
        rows.append(row)
    return rows
