"""VQA evaluation of a (VL-adapted) model: greedy short answers or scoring the closed answer set."""
from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from sinklib.core.anatomy import decoder, head_logits
from sinklib.errors import ParameterError
from sinklib.core.params import check_choice, check_int
from sinklib.vl.model import FrozenVisionEncoder, Projector, _eos_id, _segments, answer_logits, build_batch
from sinklib.vl.scenes import (ANSWERS, QUESTION_TYPES, QAItem, Scene, check_phrasing, check_qtypes, eval_items,
    majority_baseline, make_items)

#: held-out VQA items of a run with seed s use eval_items(seed=s + VQA_EVAL_SEED_OFFSET)
VQA_EVAL_SEED_OFFSET = 10_000
#: the smaller held-out set scored along training (chapter 4's callback) uses s + VQA_TRACK_SEED_OFFSET
VQA_TRACK_SEED_OFFSET = 20_000


def heldout_items(n: int, seed: int = 0, image_size: int = 48, phrasing: str = "question") -> list[QAItem]:
    """The held-out VQA questions every condition is scored on (never trained on), written in the `phrasing` the
    condition was trained in (`scenes.PHRASINGS`; the scenes and answers do not depend on it)."""
    return eval_items(n, seed=VQA_EVAL_SEED_OFFSET + seed, image_size=image_size, phrasing=phrasing)


def tracking_items(n: int, seed: int = 0, image_size: int = 48, phrasing: str = "question") -> list[QAItem]:
    """The held-out VQA questions scored along training (a different stream from `heldout_items`), in the
    training's `phrasing`."""
    return eval_items(n, seed=VQA_TRACK_SEED_OFFSET + seed, image_size=image_size, phrasing=phrasing)


_WORD = re.compile(r"[a-z0-9]+")


def _first_word(text: str) -> str:
    m = _WORD.search(text.lower())
    return m.group(0) if m else ""


def _mode_of(encoder, projector) -> str:
    if (encoder is None) != (projector is None):
        raise ParameterError("give both 'encoder' and 'projector' (visual questions) or neither (the scene as text)")
    return "text" if encoder is None else "vl"


def _as_items(scenes_or_items: Sequence, seed: int, qtypes, phrasing: str = "question") -> list[QAItem]:
    items = list(scenes_or_items)
    if not items:
        raise ParameterError("parameter 'scenes_or_items' is empty; allowed: scenes or QA items")
    if all(isinstance(x, Scene) for x in items):
        return make_items(items, seed=seed, qtypes=qtypes, phrasing=phrasing)
    if all(isinstance(x, QAItem) for x in items):
        return items
    raise ParameterError("parameter 'scenes_or_items' must hold only Scene or only QAItem objects")


def _prompt_length(tokenizer, item: QAItem, mode: str, n_visual: int) -> int:
    sg = _segments(tokenizer, item, mode, n_visual, [])
    return len(sg["prefix"]) + (sg["n_visual"] if sg["scene"] is None else len(sg["scene"])) + len(sg["prompt"])


def _greedy_equal_length(model, tokenizer, chunk: list[QAItem], mode: str, encoder, projector,
                         max_new_tokens: int, eos: int) -> list[list[int]]:
    """Greedy decoding with the KV cache for prompts of equal length (so no padding at all)."""
    b = build_batch(model, tokenizer, chunk, mode=mode, encoder=encoder, projector=projector,
                    answers=[[] for _ in chunk])
    if int(b.attention_mask.sum()) != b.attention_mask.numel():
        raise AssertionError("internal: prompts of one greedy batch must have equal lengths")
    dec, emb = decoder(model), model.get_input_embeddings()
    T = b.inputs_embeds.shape[1]
    out = dec(inputs_embeds=b.inputs_embeds, position_ids=b.position_ids, use_cache=True)
    gen: list[list[int]] = [[] for _ in chunk]
    done = [False] * len(chunk)
    for k in range(max_new_tokens):
        nxt = head_logits(model, out.last_hidden_state[:, -1]).argmax(-1)  # [B]
        for i, t in enumerate(nxt.tolist()):
            if not done[i]:
                if t == eos:
                    done[i] = True
                else:
                    gen[i].append(int(t))
        if all(done) or k == max_new_tokens - 1:
            break
        pos = torch.full((len(chunk), 1), T + k, dtype=torch.long, device=nxt.device)
        out = dec(inputs_embeds=emb(nxt[:, None]), position_ids=pos, past_key_values=out.past_key_values,
                  use_cache=True)
    return gen


@torch.no_grad()
def vqa_predict(model: nn.Module, tokenizer, encoder: FrozenVisionEncoder | None, projector: Projector | None,
                items: Sequence[QAItem], *, method: str = "greedy", batch_size: int = 32, max_new_tokens: int = 4,
                raw: bool = False, progress: bool = False) -> list[str]:
    """Predicted one-word answers (`raw=True`, greedy only: the whole decoded text instead).

    'greedy' (default): greedy decoding with the KV cache (items grouped by prompt length, so
    no padding), up to `max_new_tokens` or eos; the answer is the first alphanumeric word of the
    decoded text, lower-cased. 'options': the option of the question type's closed answer set
    (`ANSWERS`) with the highest summed log-probability of its answer tokens + eos (the tokens
    the training loss covers); costs one sequence per option. encoder = projector = None: the
    scene is given as text (the text-only control's input).
    """
    from tqdm.auto import tqdm

    method = check_choice("method", method, ("greedy", "options"))
    batch_size = check_int("batch_size", batch_size, 1)
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, 1, 64)
    mode = _mode_of(encoder, projector)
    if raw and method != "greedy":
        raise ParameterError("parameter 'raw' is True but method is 'options'; raw text needs method='greedy'")
    items = list(items)
    was = model.training
    model.eval()
    eos = _eos_id(tokenizer)
    preds: list[str | None] = [None] * len(items)
    try:
        if method == "options":
            for s in tqdm(range(0, len(items), batch_size), desc="VQA (options)", disable=not progress):
                chunk = items[s:s + batch_size]
                flat = [(it, o) for it in chunk for o in ANSWERS[it.qtype]]
                b = build_batch(model, tokenizer, [f[0] for f in flat], mode=mode, encoder=encoder,
                                projector=projector, answers=[f[1] for f in flat])
                lp = torch.log_softmax(answer_logits(model, b), -1).gather(1, b.targets[:, None])[:, 0]
                score = torch.zeros(len(flat), dtype=lp.dtype, device=lp.device).index_add_(0, b.example, lp)
                k = 0
                for j, it in enumerate(chunk):
                    o = ANSWERS[it.qtype]
                    preds[s + j] = o[int(score[k:k + len(o)].argmax())]
                    k += len(o)
        else:
            n_vis = encoder.n_visual_tokens if mode == "vl" else 0
            groups: dict[int, list[int]] = {}
            for i, it in enumerate(items):
                groups.setdefault(_prompt_length(tokenizer, it, mode, n_vis), []).append(i)
            chunks = [idx[s:s + batch_size] for _, idx in sorted(groups.items()) for s in range(0, len(idx), batch_size)]
            for idx in tqdm(chunks, desc="VQA (greedy)", disable=not progress):
                gen = _greedy_equal_length(model, tokenizer, [items[i] for i in idx], mode, encoder, projector,
                                           max_new_tokens, eos)
                for i, g in zip(idx, gen):
                    text = tokenizer.decode(g)
                    preds[i] = text if raw else _first_word(text)
    finally:
        model.train(was)
    return preds  # type: ignore[return-value]


def vqa_accuracy(model: nn.Module, tokenizer, encoder: FrozenVisionEncoder | None, projector: Projector | None,
                 scenes_or_items: Sequence, *, method: str = "greedy", batch_size: int = 32, max_new_tokens: int = 4,
                 seed: int = 0, qtypes: Sequence[str] = QUESTION_TYPES, by_type: bool = False,
                 progress: bool = False,
                 phrasing: str = "question") -> tuple[float, int] | tuple[float, int, dict[str, tuple[float, int]]]:
    """Exact-match accuracy of `vqa_predict` -> (accuracy, n) [, {qtype: (accuracy, n)} if by_type].

    Scenes are turned into one item each with `make_items(scenes, seed, qtypes=qtypes, phrasing=phrasing)`
    (items are scored as they are written: pass those of the training's phrasing, e.g. `heldout_items`).
    """
    items = _as_items(scenes_or_items, seed, check_qtypes(qtypes), check_phrasing(phrasing))
    preds = vqa_predict(model, tokenizer, encoder, projector, items, method=method, batch_size=batch_size,
                        max_new_tokens=max_new_tokens, progress=progress)
    ok = [p == it.answer for p, it in zip(preds, items)]
    acc = (float(np.mean(ok)), len(ok))
    if not by_type:
        return acc
    per = {}
    for q in QUESTION_TYPES:
        sel = [o for o, it in zip(ok, items) if it.qtype == q]
        if sel:
            per[q] = (float(np.mean(sel)), len(sel))
    return acc[0], acc[1], per


MAJORITY_TRAIN_ITEMS = 2000  # items whose most frequent answer per question type is the blind baseline


def against_majority(accuracy: float, n: int, seed: int, image_size: int) -> dict:
    """Held-out VQA accuracy (a fraction over `n` items of `heldout_items(n, seed, image_size)`) against the blind
    majority answer on the same items: {'vqa', 'vqa_lo', 'vqa_hi' (Wilson 95 %), 'n', 'majority' (all in %),
    'learned': the interval lies above the majority baseline}. The rule chapters 4 and 7 judge a VL model by.
    The same in either phrasing (`scenes.PHRASINGS` change the questions' words, never the scenes or answers)."""
    from sinklib.evals.grading import wilson_interval

    n = check_int("n", n, 1)
    lo, hi = wilson_interval(int(round(accuracy * n)), n)
    maj = 100 * majority_baseline(eval_items(MAJORITY_TRAIN_ITEMS, seed=seed, image_size=image_size),
                                  heldout_items(n, seed, image_size))
    return {"vqa": 100 * accuracy, "vqa_lo": 100 * lo, "vqa_hi": 100 * hi, "n": n, "majority": maj,
            "learned": bool(100 * lo > maj)}
