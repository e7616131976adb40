"""Chapter 4's VL adaptation in miniature on a Bigram-Backcopy model (chapter 9).

A synthetic "image" is a vector x = c_y + noise in R^d_img for one of ``n_labels`` classes y (class centres
N(0, I), fixed by ``task_seed``). A projector (LLaVA-1.5's shape: Linear, GELU, Linear) maps it to
``n_prefix`` embeddings placed right after the first token. A VL sequence is
``[first][image x n_prefix][caption: a chain walk of caption_len tokens, no triggers][ANSWER][label]``, the
loss is on the label only (chapter 4's answer-only loss). Stage 1 trains the projector (the LM frozen);
stage 2 trains the projector and every LM weight. The text-only control runs stage 2 (no projector) with the
image replaced by ``n_prefix`` copies of its class's description token; the random control adds to each base
tensor a Gaussian direction with the norm of VL's change to it (``sinklib.vl.controls.random_direction_like``).
The same recipe for every model. Held-out measures before and after: ``backcopy_train.measure`` (rule and
knowledge skills, S, Sink_0.3) and the image task's accuracy against the majority answer.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from sinklib.core import cache, train
from sinklib.errors import ParameterError
from sinklib.evals.grading import wilson_interval
from sinklib.vl.controls import random_direction_like
from sinklib.tiny import backcopy as bc
from sinklib.tiny import backcopy_train as bt

_VERSION = 1
ADAPT_DEFAULTS: dict = {"d_img": 16, "n_prefix": 4, "noise": 1.0, "caption_len": 48, "batch": 32,
                        "stage1_steps": 200, "stage2_steps": 100, "lr_projector": 3e-3, "lr_lm": 3e-4,
                        "task_seed": 0, "seed": 0, "vqa_n": 400}
#: the first adaptation recipe tried on the pilot's 'none' model (chapter 9 shows it beside the one kept)
FIRST_TRY: dict = {"stage1_steps": 100, "lr_projector": 1e-3}
CONDITIONS = ("base", "vl", "text_only", "random")


def adapt_params(**overrides) -> dict:
    bad = set(overrides) - set(ADAPT_DEFAULTS)
    if bad:
        raise ParameterError(f"unknown adaptation parameter(s) {sorted(bad)}; allowed: {', '.join(ADAPT_DEFAULTS)}")
    return {**ADAPT_DEFAULTS, **overrides}


class Projector(nn.Module):
    """image [B, d_img] -> prefix embeddings [B, n_prefix, D]."""

    def __init__(self, d_img: int, d_model: int, n_prefix: int):
        super().__init__()
        self.n_prefix, self.d_model = n_prefix, d_model
        self.net = nn.Sequential(nn.Linear(d_img, d_model), nn.GELU(), nn.Linear(d_model, n_prefix * d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).view(x.shape[0], self.n_prefix, self.d_model)


def items(base: Mapping, a: Mapping, n: int, rng: np.random.Generator) -> dict[str, torch.Tensor]:
    """n image-task items: 'image' [n, d_img], 'label' [n] (0-based), 'text' [n, T] token ids of
    [first][prefix slots][caption][ANSWER][label] where the prefix slots hold the description tokens."""
    v = bt.vocab_of(base)
    centres = np.random.default_rng(a["task_seed"]).standard_normal((v.n_labels, a["d_img"]))
    y = rng.integers(0, v.n_labels, size=n)
    image = centres[y] + a["noise"] * rng.standard_normal((n, a["d_img"]))
    trans = bc.transitions(v, base["alpha"], base["world_seed"])
    cap = bc.sequences(trans, v, n, a["caption_len"] + 1, 0.0, "resampled", rng)
    first = cap[:, :1] if base["bos"] == "resampled" else np.full((n, 1), bc.BOS)
    desc = np.repeat(np.asarray(v.descriptions)[y][:, None], a["n_prefix"], axis=1)
    tail = np.stack([np.full(n, v.answer), np.asarray(v.labels)[y]], axis=1)
    text = np.concatenate([first, desc, cap[:, 1:], tail], axis=1)
    return {"image": torch.tensor(image, dtype=torch.float32), "label": torch.from_numpy(y),
            "text": torch.from_numpy(text)}


def embeds(model: bc.BackcopyLM, proj: Projector | None, batch: Mapping) -> torch.Tensor:
    """Input embeddings [B, T-1, D] (the label is the last target): the prefix slots hold the projected
    image when `proj` is given, else the description tokens' embeddings (the text-only control)."""
    x = model.embed(batch["text"][:, :-1])
    if proj is None:
        return x
    p = proj.n_prefix
    return torch.cat([x[:, :1], proj(batch["image"]), x[:, 1 + p:]], dim=1)


def answer_logits(model: bc.BackcopyLM, proj: Projector | None, batch: Mapping, vocab: bc.Vocab) -> torch.Tensor:
    """Logits over the label tokens at the ANSWER position -> [B, n_labels]."""
    logits = model(embeds=embeds(model, proj, batch)).logits[:, -1]
    return logits[:, vocab.labels.start:vocab.labels.stop]


def _stage(model, proj, base, a, groups, steps, rng, with_image: bool) -> float:
    v = bt.vocab_of(base)
    params = [p for g in groups for p in g["params"]]

    def loss_fn(batch):
        return F.cross_entropy(answer_logits(model, proj if with_image else None, batch, v), batch["label"])

    with train.only_training(model, params):
        model.train()
        model.keep_probs(False)
        sec = train.run(groups, steps, lambda i: items(base, a, a["batch"], rng), loss_fn, desc="adapt")
    model.eval()
    return sec


def train_vl(model: bc.BackcopyLM, base: Mapping, a: Mapping) -> tuple[Projector, float]:
    """Stage 1 (projector) then stage 2 (projector + LM), in place on `model`; returns (projector, seconds)."""
    torch.manual_seed(a["seed"])
    proj = Projector(a["d_img"], model.cfg.d_model, a["n_prefix"])
    rng = np.random.default_rng([a["seed"], 1])
    s1 = _stage(model, proj, base, a, [{"params": list(proj.parameters()), "lr": a["lr_projector"]}],
                a["stage1_steps"], rng, True)
    groups = [{"params": list(proj.parameters()), "lr": a["lr_projector"]},
              {"params": list(model.parameters()), "lr": a["lr_lm"]}]
    return proj, s1 + _stage(model, proj, base, a, groups, a["stage2_steps"], rng, True)


def train_text_only(model: bc.BackcopyLM, base: Mapping, a: Mapping) -> float:
    """Stage 2 with the images described in tokens (no projector), in place on `model`."""
    torch.manual_seed(a["seed"])
    rng = np.random.default_rng([a["seed"], 1])
    return _stage(model, None, base, a, [{"params": list(model.parameters()), "lr": a["lr_lm"]}],
                  a["stage2_steps"], rng, False)


@torch.no_grad()
def task_accuracy(model, proj, base: Mapping, a: Mapping) -> dict:
    """Held-out image-task accuracy (%) with its Wilson interval and the majority answer's share (%)."""
    v = bt.vocab_of(base)
    batch = items(base, a, a["vqa_n"], np.random.default_rng([a["task_seed"], 99]))
    pred = answer_logits(model, proj, batch, v).argmax(-1)
    k = int((pred == batch["label"]).sum())
    lo, hi = wilson_interval(k, a["vqa_n"])
    majority = 100 * np.bincount(batch["label"].numpy()).max() / a["vqa_n"]
    return {"acc": 100 * k / a["vqa_n"], "lo": 100 * lo, "hi": 100 * hi, "majority": float(majority),
            "learned": bool(100 * lo > majority)}


def recipe_tries(base_params: Mapping, adapt_overrides: Mapping) -> pd.DataFrame:
    """The first recipe (``FIRST_TRY`` over `adapt_overrides`) and the kept one on one base model: the image
    task against the majority answer, and the rule, knowledge and S changes of VL (cached by ``adapt``)."""
    rows = []
    for label, over in (("first try", {**dict(adapt_overrides), **FIRST_TRY}), ("kept", dict(adapt_overrides))):
        r = adapt(base_params, over)
        b, v = r["base"], r["vl"]
        rows.append({"recipe": label, "stage1_steps": adapt_params(**over)["stage1_steps"],
                     "projector rate": f"{adapt_params(**over)['lr_projector']:.0e}", "VL task acc %": v["task"]["acc"],
                     "majority %": v["task"]["majority"], "learned": v["task"]["learned"],
                     "rule change": 100 * (v["rule_acc"] - b["rule_acc"]),
                     "knowledge change": 100 * (v["know_acc"] - b["know_acc"]), "S change": v["S"] - b["S"]})
    return pd.DataFrame(rows)


def _evaluate(model, base: Mapping) -> dict:
    v = bt.vocab_of(base)
    m = bt.measure(model, bt.eval_ids(base), v)
    return {k: m[k] for k in ("S", "sink03", "top_head", "mass", "rule_acc", "rule_loss", "know_acc", "know_ppl")}


def _conditions(base_p: dict, a: dict) -> dict:
    model = bt.train_backcopy(base_p)[1]
    base_sd = {k: t.clone() for k, t in model.state_dict().items()}
    out = {"base": _evaluate(model, base_p)}
    proj, sec = train_vl(model, base_p, a)
    out["vl"] = {**_evaluate(model, base_p), "task": task_accuracy(model, proj, base_p, a), "seconds": sec}
    vl_sd = {k: t.clone() for k, t in model.state_dict().items()}
    model.load_state_dict(random_direction_like(base_sd, vl_sd, seed=a["seed"]))
    out["random"] = _evaluate(model, base_p)
    model.load_state_dict(base_sd)
    sec = train_text_only(model, base_p, a)
    out["text_only"] = {**_evaluate(model, base_p), "task": task_accuracy(model, None, base_p, a), "seconds": sec}
    return out


def adapt(base_params: Mapping, adapt_overrides: Mapping | None = None) -> dict:
    """Every condition of one base model, evaluated on held-out items; cached by both parameter sets."""
    base_p = bt.train_params(**dict(base_params))
    a = adapt_params(**dict(adapt_overrides or {}))
    key = {"kind": "backcopy-adapt", "version": _VERSION, "base": base_p, "adapt": a}
    return cache.cached_json(key, lambda: _conditions(base_p, a), folder="backcopy")
