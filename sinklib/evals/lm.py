"""The language-model side of the suites: prompts, batched greedy generation, continuation
log-likelihoods and perplexity. Works on any causal LM with a Hugging Face tokenizer: the embedded
models, hub models, an adapted (VL) backbone evaluated text-only, and tiny random test models.

Cost note: Gemma-3's vocabulary has 262k entries, so its LM head dominates. Likelihoods are computed
from the final hidden states and the head is applied only at the positions that are scored, in
chunks (``_head_logprobs``), never as a full ``[B, T, V]`` tensor.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from sinklib.core import progress
from sinklib.core.anatomy import apply_softcap, decoder, lm_head, pad_batch, pad_token_id, positions, softcap
from sinklib.errors import ParameterError
from sinklib.evals.decode import GENERATION_BATCH_SIZE, greedy

PROMPT_STYLES = ("chat", "plain", "auto")

#: End-of-turn markers of common chat templates; generation stops at any that the vocabulary knows.
END_OF_TURN = ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|end|>", "<|endoftext|>")


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def resolve_prompt_style(tokenizer: Any, prompt_style: str, default_auto: str | None = None) -> str:
    """'auto' -> 'chat' when the tokenizer has a chat template, else 'plain' (or ``default_auto``)."""
    if prompt_style not in PROMPT_STYLES:
        raise ParameterError(f"parameter 'prompt_style' got {prompt_style!r}; allowed: "
                             + ", ".join(repr(s) for s in PROMPT_STYLES))
    if prompt_style == "auto":
        if default_auto is not None:
            return default_auto
        return "chat" if has_chat_template(tokenizer) else "plain"
    if prompt_style == "chat" and not has_chat_template(tokenizer):
        raise ParameterError("parameter 'prompt_style' is 'chat' but this tokenizer has no chat template "
                             "(a base model such as gemma3-270m); use 'plain' or 'auto'")
    return prompt_style


def chat_text(tokenizer: Any, messages: list[dict]) -> str:
    """The chat template applied to ``messages`` with the assistant's generation prompt appended."""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def encode(tokenizer: Any, text: str, special: bool) -> list[int]:
    return list(tokenizer(text, add_special_tokens=special)["input_ids"])


def _device(model: Any) -> torch.device:
    try:
        return next(model.parameters()).device
    except StopIteration:  # pragma: no cover
        return torch.device("cpu")


pad_id = pad_token_id


def stop_token_ids(tokenizer: Any, model: Any = None) -> list[int]:
    """EOS ids: the tokenizer's, the model's generation config's, and known end-of-turn tokens."""
    ids: set[int] = set()
    for v in (getattr(tokenizer, "eos_token_id", None),
              getattr(getattr(model, "generation_config", None), "eos_token_id", None)):
        if isinstance(v, int):
            ids.add(v)
        elif isinstance(v, (list, tuple)):
            ids.update(int(x) for x in v)
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    for t in END_OF_TURN:
        if t in vocab:
            ids.add(int(vocab[t]))
    return sorted(ids)


def left_pad(seqs: Sequence[Sequence[int]], pad: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists: input_ids ``[B, T]`` and attention_mask ``[B, T]`` (1 = real token)."""
    return pad_batch(seqs, pad, "left", device=device)


def truncate_at_stop(text: str, stop: Sequence[str]) -> str:
    """Cut ``text`` at the first occurrence of any stop string."""
    cut = len(text)
    for s in stop:
        if s:
            j = text.find(s)
            if j >= 0:
                cut = min(cut, j)
    return text[:cut]


def _stop_strings(tokenizer: Any, prompt_len: int, stop: Sequence[str]):
    """A transformers StoppingCriteria: a row is done once its generated text contains a stop
    string (returns a bool tensor ``[B]``, the per-row protocol)."""
    from transformers import StoppingCriteria

    class StopStrings(StoppingCriteria):
        def __call__(self, input_ids: torch.Tensor, scores: Any = None, **kw) -> torch.Tensor:
            return _rows_done(tokenizer, prompt_len, stop, input_ids)

    return StopStrings()


def _rows_done(tokenizer: Any, prompt_len: int, stop: Sequence[str], input_ids: torch.Tensor) -> torch.Tensor:
    done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
    for i, row in enumerate(input_ids[:, prompt_len:].tolist()):
        text = tokenizer.decode(row, skip_special_tokens=True)
        done[i] = any(s in text for s in stop if s)
    return done


def _texts(tokenizer: Any, rows: Sequence[Sequence[int]], eos: Sequence[int], stop: Sequence[str]) -> list[str]:
    """Generated ids -> text: cut at the first EOS id, decoded without special tokens, cut at a stop string."""
    out = []
    for row in rows:
        cut = next((j for j, t in enumerate(row) if t in eos), len(row))
        out.append(truncate_at_stop(tokenizer.decode(list(row[:cut]), skip_special_tokens=True), stop))
    return out


@torch.inference_mode()
def generate(model: Any, tokenizer: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int,
             batch_size: int = GENERATION_BATCH_SIZE, stop: Sequence[str] = (), share_prefix: bool = True) -> list[str]:
    """Greedy decoding of token-id prompts in left-padded batches with the KV cache (`sinklib.evals.decode`).

    Each row stops at an EOS / end-of-turn token, at a stop string, or after ``max_new_tokens``, and leaves
    its batch when it stops. Prompts are batched in order of length (less padding); the token prefix they all
    share is computed once (``share_prefix``). Answers come back in input order, decoded without special
    tokens and cut at the first stop string.
    """
    eos = stop_token_ids(tokenizer, model)
    rows = greedy(model, tokenizer, prompts, int(max_new_tokens), pad_id(tokenizer, model), eos,
                  batch_size=batch_size, stop=stop, share_prefix=share_prefix)
    return _texts(tokenizer, rows, eos, stop)


@torch.inference_mode()
def hf_generate(model: Any, tokenizer: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int,
             batch_size: int = 8, stop: Sequence[str] = ()) -> list[str]:
    """Greedy decoding through `transformers`' `generate` in left-padded batches with the KV cache: the
    reference that `generate` is checked and benchmarked against (rows stay in the batch until all end).

    Each row stops at an EOS / end-of-turn token, at a stop string, or after ``max_new_tokens``.
    Prompts are batched in order of length (less padding) and answers returned in input order,
    decoded without special tokens and cut at the first stop string.
    """
    from transformers import GenerationConfig, StoppingCriteriaList

    dev = _device(model)
    pad = pad_id(tokenizer, model)
    eos = stop_token_ids(tokenizer, model)
    cfg = GenerationConfig(max_new_tokens=int(max_new_tokens), do_sample=False, num_beams=1,
                           eos_token_id=eos or None, pad_token_id=pad, use_cache=True)
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    out: list[str] = [""] * len(prompts)
    for b in range(0, len(order), batch_size):
        idx = order[b:b + batch_size]
        ids, mask = left_pad([prompts[i] for i in idx], pad, dev)
        crit = StoppingCriteriaList([_stop_strings(tokenizer, ids.shape[1], stop)]) if stop else None
        gen = model.generate(input_ids=ids, attention_mask=mask, generation_config=cfg,
                             stopping_criteria=crit)
        for row, i in zip(gen[:, ids.shape[1]:].tolist(), idx):
            cut = next((j for j, t in enumerate(row) if t in eos), len(row))
            text = tokenizer.decode(row[:cut], skip_special_tokens=True)
            out[i] = truncate_at_stop(text, stop)
    return out


# ---------------------------------------------------------------------------------------------
# likelihoods

def _split_body_head(model: Any):
    """(body, head, softcap) from `sinklib.core.anatomy`; body is None when the model hides them."""
    body, head = decoder(model, required=False), lm_head(model)
    if body is None or head is None:
        return None, None, None
    return body, head, softcap(model)


def _head_logprobs(head, softcap, hidden: torch.Tensor, targets: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """Log-probabilities of ``targets [N]`` from hidden states ``[N, D]``, applying the head in chunks."""
    out = []
    for s in range(0, hidden.shape[0], chunk):
        logits = apply_softcap(head(hidden[s:s + chunk]).float(), softcap)
        out.append(torch.log_softmax(logits, -1).gather(-1, targets[s:s + chunk, None])[:, 0])
    return torch.cat(out) if out else hidden.new_zeros(0)


def _scored_logprobs(model: Any, ids: torch.Tensor, mask: torch.Tensor, sel: torch.Tensor,
                     chunk: int = 256) -> torch.Tensor:
    """Log-probability of token ``ids[b, t+1]`` given the prefix, at every (b, t) where ``sel [B, T]``
    is True, in row-major order: a 1-D tensor of length ``sel.sum()``."""
    pos = positions(mask)
    body, head, softcap = _split_body_head(model)
    b_idx, t_idx = sel[:, :-1].nonzero(as_tuple=True)
    targets = ids[b_idx, t_idx + 1]
    if body is not None:
        hidden = body(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).last_hidden_state
        return _head_logprobs(head, softcap, hidden[b_idx, t_idx], targets, chunk)
    # fallback for models that hide their body/head: full logits (more memory, same numbers)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits.float()
    return torch.log_softmax(logits[b_idx, t_idx], -1).gather(-1, targets[:, None])[:, 0]


def split_continuation(tokenizer: Any, context: str, continuation: str, special: bool = True) -> tuple[list[int], list[int]]:
    """Token ids of context and continuation, split as lm-eval does: encode the whole string and take
    the tokens after the context's encoding, with trailing spaces of the context moved to the
    continuation."""
    n_sp = len(context) - len(context.rstrip(" "))
    if n_sp:
        context, continuation = context[:-n_sp], context[-n_sp:] + continuation
    whole = encode(tokenizer, context + continuation, special)
    ctx = encode(tokenizer, context, special)
    if whole[:len(ctx)] != ctx:  # tokenisation merged across the boundary: encode separately
        return ctx, encode(tokenizer, continuation, False)
    return ctx, whole[len(ctx):]


@torch.inference_mode()
def continuation_logprobs(model: Any, pairs: Sequence[tuple[list[int], list[int]]], pad: int,
                          batch_size: int = 16, max_length: int = 2048) -> list[tuple[float, int]]:
    """Sum log-probability and token count of each continuation given its context (token ids).

    Sequences are left-padded in batches; the context is cut from the left when context +
    continuation exceeds ``max_length`` tokens.
    """
    dev = _device(model)
    res: list[tuple[float, int]] = [(0.0, 0)] * len(pairs)
    order = sorted(range(len(pairs)), key=lambda i: -(len(pairs[i][0]) + len(pairs[i][1])))
    for b in range(0, len(order), batch_size):
        idx = order[b:b + batch_size]
        seqs, nconts = [], []
        for i in idx:
            ctx, cont = pairs[i]
            if not cont:
                raise ParameterError("a continuation encodes to zero tokens; every choice must be non-empty")
            if not ctx:
                raise ParameterError("a context encodes to zero tokens: the first continuation token would "
                                     "have no prefix; add a BOS token or text before it")
            seq = (list(ctx) + list(cont))[-max_length:]
            seqs.append(seq)
            nconts.append(len(cont))
        ids, mask = left_pad(seqs, pad, dev)
        T = ids.shape[1]
        sel = torch.zeros_like(mask, dtype=torch.bool)
        for r, n in enumerate(nconts):
            sel[r, T - 1 - n:T - 1] = True
        lp = _scored_logprobs(model, ids, mask, sel)
        off = 0
        for r, (i, n) in enumerate(zip(idx, nconts)):
            res[i] = (float(lp[off:off + n].sum()), n)
            off += n
        progress.advance(b + len(idx), len(order))
    return res


@torch.inference_mode()
def document_nll(model: Any, docs: Sequence[list[int]], pad: int, batch_size: int = 4,
                 max_length: int = 1024) -> list[tuple[float, int]]:
    """Summed negative log-likelihood (nats) and number of scored tokens of each document.

    Each document is a token list whose first token is a prefix (BOS, or EOS when there is no BOS)
    that is not scored. Documents longer than ``max_length`` are scored in consecutive windows, each
    window conditioned only on itself.
    """
    windows: list[tuple[int, list[int]]] = []
    for d, toks in enumerate(docs):
        if len(toks) < 2:
            raise ParameterError(f"document {d} has fewer than two tokens; perplexity needs text to score")
        start = 0
        while start < len(toks) - 1:
            w = toks[start:start + max_length]
            windows.append((d, w))
            start += max_length - 1  # the last token of a window is the first (unscored) of the next
    dev = _device(model)
    out = [[0.0, 0] for _ in docs]
    order = sorted(range(len(windows)), key=lambda i: -len(windows[i][1]))
    for b in range(0, len(order), batch_size):
        idx = order[b:b + batch_size]
        ids, mask = left_pad([windows[i][1] for i in idx], pad, dev)
        sel = mask.bool().clone()
        sel[:, -1] = False
        lp = _scored_logprobs(model, ids, mask, sel)
        off = 0
        for i in idx:
            d, w = windows[i]
            n = len(w) - 1
            out[d][0] += float(-lp[off:off + n].sum())
            out[d][1] += n
            off += n
        progress.advance(b + len(idx), len(order))
    return [(a, int(n)) for a, n in out]


def perplexity(nll_sum: float, n_tokens: int) -> float:
    return math.exp(nll_sum / n_tokens)
