"""Training a tiny LM from scratch on the tiny corpus, through the one training loop `sinklib.core.train.run`,
with sink measurements along the way, cached by its parameters.

    docs = make_corpus(n_docs, seed)                 # strings; tokenised without special tokens
    rows = pack(docs, seq_len, bos)                  # [N, seq_len]: [BOS] doc <eos> doc <eos> ... (cut)
    for step i: batch = rows[order[i*B:(i+1)*B]]     # epoch-wise permutation seeded by `seed`
                loss = mean next-token cross-entropy over every position
                AdamW (decay on matrices only), warm-up then cosine/constant, clip at max_grad_norm

At each step of `checkpoints` (0 = before training) the log records, on the calibration prompts
(`corpus.calibration_prompts`, never trained on): S (``sinklib.core.sink.sink_strength``, the sink = the
first token, K clamped to the depth), the sink mass map [L, H], and the hidden-state norm of the
sink token against the median of the other tokens, per layer [L + 1] (see `sink_norms`).

A run is stored as ``cache_dir()/tiny/models/<key>/`` (model.safetensors + meta.json with the
parameters and the log) by ``sinklib.core.cache.save_checkpoint``; the same parameters load it back.
"""
from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from sinklib.core import train as loop
from sinklib.core.anatomy import clamp_last_k, pad_batch
from sinklib.core.cache import checkpoint_exists, key, key_seed, load_checkpoint, root, save_checkpoint
from sinklib.errors import ParameterError, SinkbookError
from sinklib.core.params import check_bool, check_choice, check_float, check_int, check_list
from sinklib.core.sink import sink_strength
from sinklib.tiny.corpus import CORPUS_VERSION, calibration_prompts, make_corpus
from sinklib.tiny.model import VARIANTS, SizeConfig, build, n_parameters, size_config
from sinklib.tiny.tokenizer import BOS_ID, EOS_ID, PAD_ID, TOKENIZER_DEFAULTS, get_tokenizer, tokenizer_params

_VERSION = 1
#: the pilot's recipe (python -m sinklib.tiny.pilot): 600 steps of 16 x 128 tokens
TRAIN_DEFAULTS = {"steps": 600, "batch_size": 16, "seq_len": 128, "lr": 1e-2, "weight_decay": 0.1,
                  "warmup_frac": 0.05, "schedule": "cosine", "max_grad_norm": 1.0, "bos": True,
                  "n_docs": 40_000, "format_share": 0.5}
PACKINGS = ("concat", "doc")
SINK_DEFAULTS = {"n_prompts": 16, "last_k_layers": 10, "query_start": 1, "max_tokens": 128}


def default_checkpoints(steps: int, n: int = 8) -> list[int]:
    """0, then about `n` roughly log-spaced steps up to `steps` (always included)."""
    if steps <= 0:
        return [0]
    pts = {0, steps} | {int(round(x)) for x in np.geomspace(max(1, steps / 2 ** (n - 1)), steps, n)}
    return sorted(p for p in pts if 0 <= p <= steps)


def train_params(variant: str, *, size: SizeConfig | dict | None = None, seed: int = 0,
                 steps: int = TRAIN_DEFAULTS["steps"], batch_size: int = TRAIN_DEFAULTS["batch_size"],
                 seq_len: int = TRAIN_DEFAULTS["seq_len"], lr: float = TRAIN_DEFAULTS["lr"],
                 weight_decay: float = TRAIN_DEFAULTS["weight_decay"], warmup_frac: float = TRAIN_DEFAULTS["warmup_frac"],
                 schedule: str = TRAIN_DEFAULTS["schedule"], max_grad_norm: float = TRAIN_DEFAULTS["max_grad_norm"],
                 bos: bool = TRAIN_DEFAULTS["bos"], n_docs: int = TRAIN_DEFAULTS["n_docs"],
                 format_share: float = TRAIN_DEFAULTS["format_share"], checkpoints: Sequence[int] | None = None,
                 tokenizer: dict | None = None, sink: dict | None = None, packing: str = "concat",
                 chain_share: float = 0.0) -> dict:
    """Every parameter of a run, checked (ParameterError names the one that is wrong): the cache key.

    packing 'concat' (rows of seq_len tokens: [BOS] doc <eos> doc <eos> ..., see `pack`) or 'doc' (one
    document per row, [BOS] doc <eos> right-padded, the padding not scored: every document starts at
    position 0 with BOS, as every evaluation prompt does; see `pack_docs`). The key holds 'packing' only
    when it is not 'concat', so runs made before the option existed keep their cache keys. chain_share: the
    share of Bigram-Backcopy chain drills in the training corpus (`corpus.make_corpus`; in the key only when
    > 0, for the same reason; the tokenizer is always trained on the corpus without them)."""
    variant = check_choice("variant", variant, VARIANTS)
    tok_p = tokenizer_params(**{**TOKENIZER_DEFAULTS, **dict(tokenizer or {})})
    size = size_config(**{"vocab_size": tok_p["vocab_size"]}) if size is None else (
        size if isinstance(size, SizeConfig) else size_config(**{"vocab_size": tok_p["vocab_size"], **dict(size)}))
    if size.vocab_size != tok_p["vocab_size"]:
        raise ParameterError(f"parameter 'size' has vocab_size={size.vocab_size} but the tokenizer has "
                             f"{tok_p['vocab_size']}; give the same vocab_size to both (or leave size's out)")
    steps = check_int("steps", steps, 0, 10_000_000)
    seq_len = check_int("seq_len", seq_len, 8, size.context)
    sink_p = {**SINK_DEFAULTS, **dict(sink or {})}
    bad = set(sink_p) - set(SINK_DEFAULTS)
    if bad:
        raise ParameterError(f"unknown sink parameter(s) {sorted(bad)}; allowed: {', '.join(SINK_DEFAULTS)}")
    packing = check_choice("packing", packing, PACKINGS)
    ck = default_checkpoints(steps) if checkpoints is None else sorted(set(
        check_list("checkpoints", list(checkpoints), lambda n, v: check_int(n, v, 0, steps), min_len=0)))
    return {
        "kind": "tiny_lm", "version": _VERSION, "corpus_version": CORPUS_VERSION, "variant": variant, "size": size.as_dict(),
        "seed": check_int("seed", seed, 0), "steps": steps, "batch_size": check_int("batch_size", batch_size, 1, 4096),
        "seq_len": seq_len, "lr": check_float("lr", lr, 0.0, 1.0),
        "weight_decay": check_float("weight_decay", weight_decay, 0.0, 10.0),
        "warmup_frac": check_float("warmup_frac", warmup_frac, 0.0, 1.0),
        "schedule": check_choice("schedule", schedule, loop.SCHEDULES),
        "max_grad_norm": check_float("max_grad_norm", max_grad_norm, 0.0), "bos": check_bool("bos", bos),
        "n_docs": check_int("n_docs", n_docs, 1, 10_000_000), "format_share": check_float("format_share", format_share, 0.0, 1.0),
        "checkpoints": ck, "tokenizer": tok_p,
        "sink": {"n_prompts": check_int("sink.n_prompts", sink_p["n_prompts"], 1, 10_000),
                 "last_k_layers": check_int("sink.last_k_layers", sink_p["last_k_layers"], 1, 1000),
                 "query_start": check_int("sink.query_start", sink_p["query_start"], 0, 64),
                 "max_tokens": check_int("sink.max_tokens", sink_p["max_tokens"], 4, 1 << 16)},
        "optimizer": loop.OPTIMIZER, **({} if packing == "concat" else {"packing": packing}),
        **({"chain_share": chain_share} if check_float("chain_share", chain_share, 0.0, 1.0) > 0 else {}),
    }


# ---------------------------------------------------------------------------------------
# data


def pack(token_docs: Sequence[Sequence[int]], seq_len: int, bos: bool) -> torch.Tensor:
    """Rows of exactly `seq_len` tokens: [BOS] (when `bos`), then whole documents each followed by
    <eos>, the last one cut at the row's end; the next row starts with the next document. [N, seq_len]"""
    rows, cur = [], [BOS_ID] if bos else []
    start = len(cur)
    for d in token_docs:
        cur.extend(list(d) + [EOS_ID])
        if len(cur) >= seq_len:
            rows.append(cur[:seq_len])
            cur = [BOS_ID] if bos else []
    if not rows:
        raise ParameterError(f"the corpus holds fewer than seq_len={seq_len} tokens (without {start} BOS); "
                             "raise n_docs or lower seq_len")
    return torch.tensor(rows, dtype=torch.long)


def pack_docs(token_docs: Sequence[Sequence[int]], seq_len: int, bos: bool) -> torch.Tensor:
    """One row per document: [BOS] (when `bos`) doc <eos>, cut at `seq_len`, right-padded with <pad>
    (PAD_ID, never a document token; `doc_batch` leaves it unscored). [N, seq_len]"""
    if not token_docs:
        raise ParameterError("parameter 'n_docs' gives no documents; raise n_docs")
    rows = torch.full((len(token_docs), seq_len), PAD_ID, dtype=torch.long)
    for i, d in enumerate(token_docs):
        r = ([BOS_ID] if bos else []) + list(d) + [EOS_ID]
        r = r[:seq_len]
        rows[i, :len(r)] = torch.tensor(r, dtype=torch.long)
    return rows


def doc_batch(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded document rows [B, T] -> (input_ids cut to the longest row, labels with -100 at padding).
    Right padding and causal attention: a real token never sees a pad, so no attention mask is needed."""
    real = rows != PAD_ID
    t = int(real.sum(1).max())
    ids = rows[:, :t]
    return ids, ids.masked_fill(~real[:, :t], -100)


def training_rows(params: dict, tokenizer) -> torch.Tensor:
    """The training rows of a run [N, seq_len] (`pack` or `pack_docs`, by params['packing'])."""
    docs = make_corpus(params["n_docs"], params["seed"], params["format_share"], params.get("chain_share", 0.0))
    ids = tokenizer(docs, add_special_tokens=False)["input_ids"]
    if params.get("packing", "concat") == "doc":
        return pack_docs(ids, params["seq_len"], params["bos"])
    return pack(ids, params["seq_len"], params["bos"])


def batch_indices(i: int, n_rows: int, batch_size: int, seed: int) -> torch.Tensor:
    """Row indices of step i: consecutive slices of a fresh permutation per epoch (seeded by seed, epoch)."""
    per_epoch = max(1, n_rows // batch_size)
    epoch, j = divmod(i, per_epoch)
    g = torch.Generator().manual_seed(key_seed(seed, f"tiny-train:order:{epoch}", 2**63))
    return torch.randperm(n_rows, generator=g)[j * batch_size:(j + 1) * batch_size]


# ---------------------------------------------------------------------------------------
# measurements


@torch.no_grad()
def sink_norms(model, tokenizer, prompts: Sequence[str], max_tokens: int = 128) -> dict:
    """Hidden-state norm of the sink (first) token and the median norm of the other tokens, averaged over
    prompts: {'sink', 'other', 'ratio'}, each [L + 1] in transformers' `hidden_states` order: index 0 =
    embeddings, l = residual stream after layer l for l < L, L = the final (RMS-normed) output."""
    seqs = [tokenizer(p)["input_ids"][:max_tokens] for p in prompts]
    ids, att = pad_batch(seqs, PAD_ID, "right")
    hs = model(input_ids=ids, attention_mask=att, output_hidden_states=True).hidden_states  # L+1 x [B, T, D]
    sink, other = [], []
    for h in hs:
        n = h.float().norm(dim=-1)  # [B, T]
        sink.append(float(n[:, 0].mean()))
        other.append(float(np.mean([n[b, 1:int(att[b].sum())].median().item() for b in range(len(seqs))])))
    return {"sink": sink, "other": other, "ratio": [s / o for s, o in zip(sink, other)]}


def measure(model, tokenizer, sink_params: dict) -> dict:
    """S, the sink mass map [L, H] and the sink token's hidden-state norms on the calibration prompts."""
    prompts = calibration_prompts(sink_params["n_prompts"])
    was = model.training
    model.eval()
    try:
        res = sink_strength(model, prompts, tokenizer=tokenizer,
                            last_k_layers=clamp_last_k(sink_params["last_k_layers"], model),
                            query_start=sink_params["query_start"], max_tokens=sink_params["max_tokens"],
                            all_layers=True, batch_size=16)
        norms = sink_norms(model, tokenizer, prompts, sink_params["max_tokens"])
    finally:
        model.train(was)
    return {"S": res.S, "mass": res.mass.round(6).tolist(), "sink_norm": norms}


# ---------------------------------------------------------------------------------------
# the run


@dataclass
class TinyRun:
    """A trained tiny LM. `log`: loss and lr per step, measurements per checkpoint step, seconds."""

    model: torch.nn.Module
    tokenizer: object
    params: dict
    log: dict
    key: str
    path: Path
    from_cache: bool
    info: dict = field(default_factory=dict)

    @property
    def S_init(self) -> float:
        return self.log["checkpoints"][0]["S"]

    @property
    def S_final(self) -> float:
        return self.log["checkpoints"][-1]["S"]


def run_dir(params: dict) -> Path:
    return root() / "tiny" / "models" / key(params)


def _param_groups(model, lr: float, weight_decay: float) -> list[dict]:
    """Weight decay on matrices and embeddings; none on the norm gains (QK-norm gains included)."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    keep = [p for p in model.parameters() if p.ndim < 2]
    return [{"params": decay, "lr": lr, "weight_decay": weight_decay}, {"params": keep, "lr": lr, "weight_decay": 0.0}]


def run_tokenizer(params: dict):
    """The tokenizer of a run's parameters (`train_params`): trained on first use, then loaded from the cache."""
    return get_tokenizer(add_bos=params["bos"], **{k: v for k, v in params["tokenizer"].items()
                                                   if k not in ("kind", "version", "corpus_version")})


def _run_info(model, params: dict, n_rows: int, tokens_seen: int) -> dict:
    """The 'info' of a finished run (stored in meta.json next to the parameters and the log)."""
    return {"n_parameters": n_parameters(model), "n_rows": n_rows,
            "tokens_seen": tokens_seen,
            "epochs": round(params["steps"] * params["batch_size"] / n_rows, 3),
            "torch_threads": torch.get_num_threads()}


def train_tiny(variant: str, *, refresh: bool = False, progress: bool = False, **kwargs) -> TinyRun:
    """Train (or load from the cache) one tiny LM; keyword arguments as in `train_params`."""
    params = train_params(variant, **kwargs)
    tok = run_tokenizer(params)
    size = size_config(**params["size"])
    model = build(variant, size, params["seed"])
    path = run_dir(params)
    if checkpoint_exists(path) and not refresh:
        ck = load_checkpoint(path, model)
        return TinyRun(model, tok, params, ck.meta["log"], key(params), path, True, ck.meta.get("info", {}))

    torch.manual_seed(params["seed"])
    rows = training_rows(params, tok)
    log: dict = {"loss": [], "lr": [], "grad_norm": [], "checkpoints": []}
    checkpoints = set(params["checkpoints"])
    t_measure = 0.0
    if 0 in checkpoints:
        t0 = time.perf_counter()
        log["checkpoints"].append({"step": 0, **measure(model, tok, params["sink"])})
        t_measure += time.perf_counter() - t0

    def batches(i: int) -> torch.Tensor:
        return rows[batch_indices(i, len(rows), params["batch_size"], params["seed"])]

    by_doc = params.get("packing", "concat") == "doc"
    seen = {"tokens": 0}

    def loss_fn(batch: torch.Tensor) -> torch.Tensor:
        ids, labels = doc_batch(batch) if by_doc else (batch, batch)
        seen["tokens"] += int((labels != -100).sum())
        return model(input_ids=ids, labels=labels, use_cache=False).loss

    def after_step(s: loop.StepInfo) -> None:
        nonlocal t_measure
        log["loss"].append(round(s.loss, 5))
        log["lr"].append(s.lrs[0])
        log["grad_norm"].append(round(s.grad_norm, 4))
        if s.i + 1 in checkpoints:
            t0 = time.perf_counter()
            log["checkpoints"].append({"step": s.i + 1, **measure(model, tok, params["sink"])})
            t_measure += time.perf_counter() - t0

    def nonfinite(i: int, v: float) -> Exception:
        return SinkbookError(f"tiny LM training ({variant}): loss is {v} at step {i + 1}; lower parameter 'lr' "
                             f"(got {params['lr']}) or raise 'warmup_frac'")

    model.train()
    try:
        seconds = loop.run(_param_groups(model, params["lr"], params["weight_decay"]), params["steps"], batches, loss_fn,
                           warmup_frac=params["warmup_frac"], schedule=params["schedule"],
                           max_grad_norm=params["max_grad_norm"], desc=f"tiny {variant}", progress=progress,
                           after_step=after_step, on_nonfinite=nonfinite)
    finally:
        model.eval()
    log["seconds"] = round(seconds, 2)
    log["seconds_measuring"] = round(t_measure, 2)
    info = _run_info(model, params, len(rows), seen["tokens"])
    save_checkpoint(path, model, meta={"params": params, "log": log, "info": info})
    return TinyRun(model, tok, params, log, key(params), path, False, info)


def loss_curve(log: dict, window: int = 20) -> list[float]:
    """Running mean of the training loss over `window` steps (for plots and quick reading)."""
    x = np.asarray(log["loss"], dtype=float)
    if x.size == 0:
        return []
    c = np.cumsum(np.insert(x, 0, 0.0))
    w = np.minimum(np.arange(1, x.size + 1), window)
    return ((c[1:] - c[np.arange(1, x.size + 1) - w]) / w).tolist()


def steps_per_second(log: dict) -> float:
    n = len(log["loss"])
    sec = log.get("seconds", math.nan) - log.get("seconds_measuring", 0.0)
    return n / sec if sec and sec > 0 else math.nan
