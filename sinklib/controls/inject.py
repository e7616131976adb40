"""QK-RMSNorm injection: a negative control of the paper (the book's page of reported numbers).

A backbone without QK-norm (Llama, e.g. SmolLM2-135M) becomes a `Qwen3ForCausalLM` (Qwen3 =
Llama + per-head RMSNorm over head_dim on queries and keys after projection, before RoPE, one gain
vector [head_dim] per layer shared across heads), so it still runs through transformers'
attention registry. `injection_error` measures how far the outputs moved, `recovery_finetune`
fine-tunes briefly on text (through `sinklib.core.train.run`), `evaluate` scores a condition with the
text suites and S (cached under `injection/` by `injection_key`).
"""
from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from sinklib.core import train
from sinklib.core.anatomy import decoder_layers, pad_batch
from sinklib.errors import ParameterError
from sinklib.core.params import check_choice, check_float, check_int

#: prompts that calibrate the injected gains / measure the injection error: load_prompts(n, seed + offset)
CALIBRATION_SEED_OFFSET = 7
HELDOUT_SEED_OFFSET = 8
INJECTION_VERSION = 1  # part of every injection cache key


class AlreadyHasQKNorm(ParameterError):
    """inject_qk_norm was given a model that already normalises queries and keys."""


GAIN_RULES = ("match_rms", "ones")


def _qk_norm_modules(model: torch.nn.Module) -> list[str]:
    return [n for n, _ in model.named_modules() if n.split(".")[-1] in ("q_norm", "k_norm")]


@torch.no_grad()
def _mean_head_rms(model: torch.nn.Module, input_ids: torch.Tensor,
                   attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean over real tokens and heads of the per-(token, head) RMS of q and k, per layer.

    Returns (q_rms [L], k_rms [L]) measured on the projections' outputs (before RoPE,
    where the injected norm acts).
    """
    cfg = model.config
    hd = cfg.head_dim
    layers = decoder_layers(model)
    sums = torch.zeros(len(layers), 2, dtype=torch.float64)
    mask = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    n_tok = int(mask.sum())
    hooks = []

    def make(i: int, j: int):
        def hook(_mod, _inp, out):
            B, T, D = out.shape
            rms = out.float().view(B, T, D // hd, hd).pow(2).mean(-1).sqrt()  # [B, T, H]
            sums[i, j] += rms[mask.to(rms.device)].mean(-1).double().sum().cpu()
        return hook

    for i, layer in enumerate(layers):
        hooks.append(layer.self_attn.q_proj.register_forward_hook(make(i, 0)))
        hooks.append(layer.self_attn.k_proj.register_forward_hook(make(i, 1)))
    try:
        dev = next(model.parameters()).device
        model(input_ids=input_ids.to(dev),
              attention_mask=None if attention_mask is None else attention_mask.to(dev), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    mean = (sums / n_tok).float()
    return mean[:, 0], mean[:, 1]


def _check_injectable(model: torch.nn.Module, calib_input_ids: torch.Tensor | None,
                      attention_mask: torch.Tensor | None, gain_rule: str) -> None:
    """`inject_qk_norm`'s checks: a Llama without QK-norm and, for 'match_rms', calibration ids [B, T]."""
    cfg = model.config
    existing = _qk_norm_modules(model)
    if existing:
        raise AlreadyHasQKNorm(
            f"model (model_type={getattr(cfg, 'model_type', '?')!r}) already has QK-norm "
            f"(e.g. {existing[0]!r}); inject_qk_norm applies only to backbones without it, "
            "such as Llama / SmolLM2"
        )
    if getattr(cfg, "model_type", None) != "llama" or not hasattr(model, "model"):
        raise ParameterError(
            f"inject_qk_norm supports a LlamaForCausalLM (model_type 'llama'); got "
            f"{type(model).__name__} (model_type {getattr(cfg, 'model_type', None)!r})"
        )
    if getattr(cfg, "mlp_bias", False):
        raise ParameterError("inject_qk_norm: a Llama with mlp_bias=True has no Qwen3 counterpart")
    if gain_rule == "match_rms":
        if calib_input_ids is None or calib_input_ids.dim() != 2 or calib_input_ids.numel() == 0:
            raise ParameterError(
                "gain_rule 'match_rms' needs calib_input_ids, a non-empty LongTensor [B, T] of calibration prompts"
            )
        if attention_mask is not None and attention_mask.shape != calib_input_ids.shape:
            raise ParameterError(
                f"attention_mask shape {tuple(attention_mask.shape)} must equal calib_input_ids shape "
                f"{tuple(calib_input_ids.shape)}"
            )


def _qwen3_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A Qwen3ForCausalLM with the Llama `model`'s config and every weight (q_norm/k_norm gains left at init)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = model.config
    fields = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "initializer_range",
              "rms_norm_eps", "use_cache", "tie_word_embeddings", "rope_parameters", "attention_bias",
              "attention_dropout", "pad_token_id", "bos_token_id", "eos_token_id"]
    kwargs = {f: copy.deepcopy(getattr(cfg, f)) for f in fields if getattr(cfg, f, None) is not None}
    qcfg = Qwen3Config(**kwargs, use_sliding_window=False)
    qcfg._attn_implementation = cfg._attn_implementation
    p0 = next(model.parameters())
    new = Qwen3ForCausalLM(qcfg).to(device=p0.device, dtype=p0.dtype)
    missing, unexpected = new.load_state_dict(model.state_dict(), strict=False)
    bad_missing = [k for k in missing if not k.endswith(("q_norm.weight", "k_norm.weight"))]
    if bad_missing or unexpected:
        raise ParameterError(
            f"inject_qk_norm could not map every weight (missing {bad_missing[:3]}, unexpected {unexpected[:3]})"
        )
    return new


def _injected_gains(model: torch.nn.Module, calib_input_ids: torch.Tensor | None,
                    attention_mask: torch.Tensor | None, gain_rule: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The q_norm and k_norm gain per layer (q [L], k [L]) of `gain_rule` ('match_rms' or 'ones')."""
    cfg = model.config
    if gain_rule == "match_rms":
        was_training = model.training
        model.eval()
        q_rms, k_rms = _mean_head_rms(model, calib_input_ids, attention_mask)
        model.train(was_training)
    else:
        q_rms = k_rms = torch.ones(cfg.num_hidden_layers)
    return q_rms, k_rms


def inject_qk_norm(model: torch.nn.Module, calib_input_ids: torch.Tensor | None = None, *,
                   attention_mask: torch.Tensor | None = None, gain_rule: str = "match_rms") -> torch.nn.Module:
    """Return a Qwen3ForCausalLM equal to the Llama `model` plus per-head QK-RMSNorm.

    Every weight is copied; each layer gets q_norm/k_norm (RMSNorm over head_dim, eps =
    rms_norm_eps, gain [head_dim] shared across heads, applied after the projection and
    before RoPE). Gain rules:
    - "match_rms" (default): every entry of layer l's q_norm gain is the mean over
      calibration tokens (calib_input_ids [B, T], attention_mask [B, T] optional) and heads
      of the per-(token, head) RMS of that layer's query projection; likewise for keys.
      Directions of all queries and keys are kept exactly and their average length is
      kept; each token's deviation from the average length is lost, so the outputs cannot
      be identical. In a pretrained model token lengths vary a lot (the sink token's q/k RMS
      is far below the other tokens' in late layers), so the injected model's next-token
      distribution can move far (chapter 6 measures how far), which is why
      `recovery_finetune` exists.
    - "ones": Qwen3's own initialisation (unit gains); queries and keys get RMS 1.

    Raises AlreadyHasQKNorm if the model already has q_norm/k_norm modules (Qwen3,
    Gemma-3, OLMo-2, ...), ParameterError for any other architecture than Llama.
    """
    from transformers import Qwen3Config, Qwen3ForCausalLM  # noqa: F401  (fails early without Qwen3)

    gain_rule = check_choice("gain_rule", gain_rule, GAIN_RULES)
    _check_injectable(model, calib_input_ids, attention_mask, gain_rule)
    new = _qwen3_copy(model)
    q_rms, k_rms = _injected_gains(model, calib_input_ids, attention_mask, gain_rule)
    with torch.no_grad():
        for i, layer in enumerate(decoder_layers(new)):
            layer.self_attn.q_norm.weight.fill_(float(q_rms[i]))
            layer.self_attn.k_norm.weight.fill_(float(k_rms[i]))
    if getattr(model, "generation_config", None) is not None:
        new.generation_config = copy.deepcopy(model.generation_config)
    new.train(model.training)
    return new


@torch.no_grad()
def injection_error(original: torch.nn.Module, injected: torch.nn.Module, input_ids: torch.Tensor,
                    attention_mask: torch.Tensor | None = None) -> dict[str, float]:
    """How far the injected model's next-token outputs are from the original's.

    input_ids, attention_mask: [B, T]. Over real positions: max and mean |logit difference|,
    relative Frobenius error ||dz|| / ||z||, mean KL(p_original || p_injected) in nats,
    and top-1 agreement (fraction of positions with the same argmax).
    """
    was = (original.training, injected.training)
    original.eval(), injected.eval()
    dev = next(original.parameters()).device
    kw = {"attention_mask": None if attention_mask is None else attention_mask.to(dev), "use_cache": False}
    z0 = original(input_ids=input_ids.to(dev), **kw).logits.float()
    z1 = injected(input_ids=input_ids.to(dev), **kw).logits.float()
    original.train(was[0]), injected.train(was[1])
    m = torch.ones(input_ids.shape, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    m = m.to(z0.device)
    a, b = z0[m], z1[m]  # [N, V]
    d = (a - b).abs()
    lp0, lp1 = a.log_softmax(-1), b.log_softmax(-1)
    kl = (lp0.exp() * (lp0 - lp1)).sum(-1)
    return {
        "max_abs_logit_diff": float(d.max()),
        "mean_abs_logit_diff": float(d.mean()),
        "rel_logit_error": float((a - b).norm() / a.norm()),
        "mean_kl": float(kl.mean()),
        "top1_agreement": float((a.argmax(-1) == b.argmax(-1)).float().mean()),
    }


def recovery_finetune(model: torch.nn.Module, tokenizer: Any, texts: Sequence[str] | Sequence[Sequence[int]], *,
                      steps: int = 50, lr: float = 1e-4, batch_size: int = 8, seed: int = 0,
                      max_length: int = 128, train_params: str = "all", show_progress: bool = True) -> list[float]:
    """Short causal-LM fine-tune on text, in place; returns the loss of every step.

    texts: strings (tokenised with `tokenizer`, truncated to max_length) or, with
    tokenizer=None, lists of token ids. Each step draws `batch_size` texts (seeded
    shuffling, cycling), right-pads them into [B, T] and takes one AdamW step (`sinklib.core.train.run`)
    on the mean next-token cross-entropy over all real tokens. train_params="all" updates every
    weight, "qk_norm" only the q_norm/k_norm gains. Gradients clipped to norm 1.
    """
    steps = check_int("steps", steps, 1)
    batch_size = check_int("batch_size", batch_size, 1)
    max_length = check_int("max_length", max_length, 2)
    seed = check_int("seed", seed, 0)
    lr = check_float("lr", lr, 0.0)
    train_params = check_choice("train_params", train_params, ("all", "qk_norm"))
    if not texts:
        raise ParameterError("recovery_finetune needs at least one text in `texts`")
    if tokenizer is None:
        ids = [list(map(int, t))[:max_length] for t in texts]
    else:
        ids = [tokenizer(t, truncation=True, max_length=max_length)["input_ids"] for t in texts]
    if any(len(x) < 2 for x in ids):
        raise ParameterError("every text must have at least 2 tokens for a next-token loss")
    if train_params == "qk_norm":
        if not _qk_norm_modules(model):
            raise ParameterError("train_params='qk_norm' needs a model with q_norm/k_norm (run inject_qk_norm first)")
        params = [p for n, p in model.named_parameters() if n.rsplit(".", 2)[-2] in ("q_norm", "k_norm")]
    else:
        params = list(model.parameters())
    dev = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    order: list[int] = []

    def batches(_: int) -> list[list[int]]:
        batch = []
        while len(batch) < batch_size:
            if not order:
                order.extend(torch.randperm(len(ids), generator=gen).tolist())
            batch.append(ids[order.pop()])
        return batch

    def loss_fn(batch: list[list[int]]) -> torch.Tensor:
        inp, att = pad_batch(batch, 0, "right")
        labels = inp.masked_fill(att == 0, -100)
        return model(input_ids=inp.to(dev), attention_mask=att.to(dev), labels=labels.to(dev), use_cache=False).loss

    losses: list[float] = []
    was_training = model.training
    model.train()
    try:
        with train.only_training(model, params), torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
            torch.manual_seed(seed)
            train.run([{"params": params, "lr": lr}], steps, batches, loss_fn, max_grad_norm=1.0,
                      desc="recovery fine-tune", progress=show_progress, after_step=lambda s: losses.append(s.loss),
                      on_nonfinite=lambda i, v: ParameterError(f"recovery_finetune: loss became {v}; lower lr (got {lr})"))
    finally:
        model.train(was_training)
    return losses


# ----------------------------------------------------------------------------------------
# calibration prompts and cached evaluations of the injected conditions
# ----------------------------------------------------------------------------------------


def prompt_batch(tokenizer: Any, n: int, seed: int, offset: int, max_tokens: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and mask `[B, T]` of `load_prompts(n, seed + offset)` (CALIBRATION_ / HELDOUT_SEED_OFFSET)."""
    from sinklib.core.data import load_prompts
    from sinklib.core.sink import encode_prompts

    enc = encode_prompts(tokenizer, load_prompts(n, seed=seed + offset), max_tokens=max_tokens)
    return pad_batch(enc, tokenizer.pad_token_id or 0)


def recovery_texts(exclude: Sequence[str]) -> list[str]:
    """The recovery fine-tune's texts: every calibration prompt except `exclude` (the prompts S is measured on
    and the held-out prompts of the injection error), so that S after recovery is not measured on trained text."""
    from sinklib.core.data import load_prompts

    drop = set(exclude)
    texts = [t for t in load_prompts() if t not in drop]
    if not texts:
        raise ParameterError("recovery_texts: every calibration prompt is excluded; measure S on fewer prompts")
    return texts


def scores_by_condition(rows: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """{condition: {'suite metric': score}} of `evaluate`'s results, the form `pairs.strict_mean` reads."""
    return {c: {f"{s['suite']} {s['metric']}": s["score"] for s in r["scores"]} for c, r in rows.items()}


def score_table(rows: Mapping[str, Mapping[str, Any]]):
    """Chapter 6's injection table: one row per (suite, metric) of chapter 4's main metrics (`MAIN_METRICS`) plus
    ('sink', 'S'), one column per condition, each cell 'score [lo, hi]' (S to 3 decimals). Only the main metrics:
    the instruction-level scores (inst_strict, inst_lenient) repeat the prompt-level ones whenever every item
    carries one instruction, and acc_norm and bits_per_byte restate acc and ppl."""
    import pandas as pd

    from sinklib.adapt.scores import MAIN_METRICS

    out = {}
    for cond, r in rows.items():
        cells = {(s["suite"], s["metric"]): f"{s['score']:.1f} [{s['lo']:.1f}, {s['hi']:.1f}]" for s in r["scores"]}
        col = {k: cells[k] for k in MAIN_METRICS if k in cells}
        col[("sink", "S")] = f"{r['S']:.3f}"
        out[cond] = col
    frame = pd.DataFrame(out)
    frame.index = pd.MultiIndex.from_tuples(list(frame.index), names=["suite", "metric"])
    return frame


def injection_key(tag: str, *, model: str, weights: str, eval_n: Mapping[str, int], seed: int, prompts: list[str],
                  K: int, gain_rule: str, calib: int, recovery: Sequence) -> dict:
    """The parameters that identify one evaluated injection condition (hashed by `sinklib.core.cache.key`)."""
    from sinklib.evals.items import fingerprint

    return {"tag": tag, "model": model, "weights": weights, "eval_n": dict(eval_n), "seed": seed, "prompts": prompts,
            "K": K, "gain_rule": gain_rule, "calib": calib, "recovery": list(recovery),
            "items": fingerprint(dict(eval_n)), "version": INJECTION_VERSION}


def evaluate(model: torch.nn.Module | Callable[[], tuple[torch.nn.Module, dict]], tokenizer: Any,
             key_params: Mapping[str, Any], *, max_tokens: int, eval_batch_size: int) -> dict:
    """Text suites and S of one injection condition, cached under `injection/` by `key_params`
    (`injection_key`): {"scores": rows of evals.results_table, "outcomes": per-item outcomes, "S": float, **extra}.

    model: the module, or a function returning (module, extra) that is called only when the result is not
    cached, so that a recovery fine-tune is not run again for a cached evaluation; `extra` (JSON-able, for
    example the fine-tune's first and last loss) is stored with the result.
    """
    from sinklib import evals
    from sinklib.core import sink
    from sinklib.core.cache import cached_json
    from sinklib.evals.paired import outcomes

    eval_n = key_params["eval_n"]

    def compute() -> dict:
        m, extra = (model, {}) if isinstance(model, torch.nn.Module) else model()
        res = evals.run_suites(m, tokenizer, suites=tuple(k for k, v in eval_n.items() if v), n_items=eval_n,
                               seed=key_params["seed"], batch_size=eval_batch_size)
        s = sink.sink_strength(m, key_params["prompts"], tokenizer=tokenizer, last_k_layers=key_params["K"],
                               max_tokens=max_tokens)
        return {"scores": evals.results_table(res), "outcomes": outcomes(res), "S": s.S, **extra}

    return cached_json(key_params, compute, folder="injection")


def run_conditions(lm: Any, *, prompts: list[str], K: int, eval_n: Mapping[str, int], seed: int,
                   calib_prompts: int, gain_rule: str, recovery_steps: int, recovery_lr: float,
                   recovery_batch_size: int, max_tokens: int, eval_batch_size: int,
                   show_progress: bool = True) -> tuple[dict[str, dict], dict[str, float]]:
    """Chapter 6's injection experiment on a loaded model `lm` (sinklib.core.models.LoadedModel) without QK-norm.

    Conditions: `original`, `injected` (inject_qk_norm calibrated on `calib_prompts` prompts) and, when
    recovery_steps > 0, `injected + recovery` with its control `original + recovery`: the same fine-tune
    (recovery_finetune on `recovery_texts`, disjoint from the S prompts and the held-out prompts) applied to
    the original model. Each condition is scored by `evaluate` (cached; a cached condition is not fine-tuned
    again). Returns ({condition: evaluate's result}, injection_error on held-out prompts).
    """
    key = dict(model=lm.name, weights=lm.weights_sha256, eval_n=eval_n, seed=seed, prompts=prompts, K=K,
               gain_rule=gain_rule, calib=calib_prompts, recovery=[recovery_steps, recovery_lr, recovery_batch_size])

    def scored(model, tag: str, **over) -> dict:
        return evaluate(model, lm.tokenizer, injection_key(tag, **{**key, **over}), max_tokens=max_tokens,
                        eval_batch_size=eval_batch_size)

    calib_ids, calib_mask = prompt_batch(lm.tokenizer, calib_prompts, seed, CALIBRATION_SEED_OFFSET)
    rows = {"original": scored(lm.model, "original")}
    injected = inject_qk_norm(lm.model, calib_ids, attention_mask=calib_mask, gain_rule=gain_rule)
    held_ids, held_mask = prompt_batch(lm.tokenizer, calib_prompts, seed, HELDOUT_SEED_OFFSET)
    init_error = injection_error(lm.model, injected, held_ids, held_mask)
    rows["injected"] = scored(injected, "injected")
    if not recovery_steps:
        return rows, init_error
    from sinklib.core.data import load_prompts

    texts = recovery_texts(exclude=prompts + load_prompts(calib_prompts, seed=seed + HELDOUT_SEED_OFFSET))
    recovery = [recovery_steps, recovery_lr, recovery_batch_size, f"{len(texts)} texts, no S/held-out prompt"]

    def recovered(start: Callable[[], torch.nn.Module]) -> tuple[torch.nn.Module, dict]:
        model = start()
        losses = recovery_finetune(model, lm.tokenizer, texts, steps=recovery_steps, lr=recovery_lr,
                                   batch_size=recovery_batch_size, seed=seed, show_progress=show_progress)
        return model.eval(), {"recovery_loss": [losses[0], sum(losses[-5:]) / len(losses[-5:])]}

    starts = {"injected + recovery": lambda: injected, "original + recovery": lambda: copy.deepcopy(lm.model)}
    for tag, start in starts.items():
        rows[tag] = scored(lambda start=start: recovered(start), tag.replace(" ", ""), recovery=recovery)
    return rows, init_error
