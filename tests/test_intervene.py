"""The sink intervention equals an explicit eager computation (each architecture's own eager attention with
a per-head additive mask on the sink column), on tiny random models with GQA, sliding windows, softcapping
and left padding; the mass-matched control takes the same mass from another key."""
import importlib

import numpy as np
import pytest
import torch

from sinklib.core import intervene
from sinklib.core import sink
from sinklib.errors import ParameterError
from sinklib.core.models import tiny_model

ARCHS = ["llama", "qwen3", "gemma3", "olmo2"]  # GQA no-norm, per-head QK-norm, sliding window + QK-norm, layerwise
REF_NAME = "sinkbook_test_reference"


def _batch(seed=0, lengths=(12, 7, 10), side="right"):
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(3, 128, (n,), generator=g).tolist() for n in lengths]
    return sink.pad_batch(seqs, 0, side)


def _reference_logits(model, ids, att, heads: dict, sink_index, add: float):
    """Transformers' own eager attention of each module, with `add` (-inf or a shift) added to the sink column
    of the chosen heads for every query after the sink."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    def ref(module, query, key, value, attention_mask, **kw):
        eager = importlib.import_module(type(module).__module__).eager_attention_forward
        layer = module.layer_idx
        b, h, tq, _ = query.shape
        tk = key.shape[2]
        m = attention_mask[:, :, :, :tk].expand(b, h, tq, tk).clone()
        for hh in heads.get(layer, []):
            for r in range(b):
                s = int(sink_index[r])
                m[r, hh, s + 1:, s] += add
        return eager(module, query, key, value, m, **kw)

    AttentionInterface.register(REF_NAME, ref)
    AttentionMaskInterface.register(REF_NAME, eager_mask)
    prev = model.config._attn_implementation
    model.set_attn_implementation(REF_NAME)
    try:
        with torch.no_grad():
            return model(input_ids=ids, attention_mask=att).logits
    finally:
        model.set_attn_implementation(prev)


def _intervened_logits(model, ids, att, heads, sink_index, **kw):
    with torch.no_grad(), intervene.sink_intervention(model, heads, sink_index, **kw) as plan:
        return model(input_ids=ids, attention_mask=att).logits, plan


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("mode,add", [("remove", float("-inf")), ("shift", -2.5), ("shift", 1.5)])
def test_intervention_equals_eager_reference(arch, side, mode, add):
    lm = tiny_model(arch, seed=1)
    ids, att = _batch(side=side)
    sink_index = att.argmax(dim=1)
    heads = {0: [1], 2: [0, 3], 3: [2]}
    kw = {"shift": add} if mode == "shift" else {}
    out, plan = _intervened_logits(lm.model, ids, att, heads, sink_index, mode=mode, chunk=5, **kw)
    ref = _reference_logits(lm.model, ids, att, heads, sink_index, add)
    m = att.bool()
    assert (out - ref)[m].abs().max().item() <= 1e-4
    with torch.no_grad():
        plain = lm.model(input_ids=ids, attention_mask=att).logits
    assert (out - plain)[m].abs().max().item() > 1e-3  # it did something
    assert set(plan.removed) == {0, 2, 3} and plan.removed[2][:, [1, 2]].abs().max() == 0  # other heads untouched
    if mode == "remove":
        assert plan.removed[0][:, 1].max() > 0 and plan.removed[0].min() >= 0
    assert lm.model.config._attn_implementation == "sdpa"  # restored


def test_softcapped_model_and_empty_plan():
    lm = tiny_model("gemma3", seed=3, attn_logit_softcapping=5.0)
    ids, att = _batch(side="left")
    sink_index = att.argmax(dim=1)
    heads = {1: [0, 1, 2, 3]}
    out, _ = _intervened_logits(lm.model, ids, att, heads, sink_index, mode="remove")
    ref = _reference_logits(lm.model, ids, att, heads, sink_index, float("-inf"))
    m = att.bool()
    assert (out - ref)[m].abs().max().item() <= 1e-4
    lm2 = tiny_model("llama", seed=4)
    ids, att = _batch()
    with torch.no_grad():
        plain = lm2.model(input_ids=ids, attention_mask=att).logits
    for plan_heads, kw in (({}, {"mode": "remove"}), ({0: [0, 1], 3: [2]}, {"mode": "shift", "shift": 0.0})):
        out, _ = _intervened_logits(lm2.model, ids, att, plan_heads, att.argmax(dim=1), **kw)
        assert (out - plain)[att.bool()].abs().max().item() <= 1e-5  # nothing, or a zero shift, changes nothing


def test_remove_matched_takes_the_sink_mass_from_the_other_keys_top_first():
    g = torch.Generator().manual_seed(0)
    b, h, c, tk = 2, 3, 5, 6
    logits = torch.randn(b, h, c, tk, generator=g) * 2
    logits[0, :, :, 0] += 4.0  # row 0: a dominant sink, more mass than the other keys hold
    q_pos = torch.arange(1, 6)
    allowed = (torch.arange(tk)[None, :] <= q_pos[:, None])[None, None]
    logits = logits.masked_fill(~allowed, torch.finfo(torch.float32).min)
    sink_idx = torch.tensor([0, 1])
    heads = torch.tensor([True, False, True])
    probs, m = intervene.adjust_logits_and_probs(logits, allowed, heads, sink_idx, q_pos, "remove_matched")
    base = torch.softmax(logits, -1)
    rem, m_rem = intervene.adjust_logits_and_probs(logits, allowed, heads, sink_idx, q_pos, "remove")
    assert torch.allclose(probs.sum(-1), torch.ones(b, h, c), atol=1e-6) and (probs >= -1e-7).all()
    assert torch.equal(probs[:, 1], base[:, 1]) and (m[:, 1] == 0).all()   # head 1 not in the plan
    assert (m[1, :, 0] == 0).all() and (m_rem[1, :, 0] == 0).all()         # query 1 of row 1 is the sink itself
    cases = {"capped": 0, "several keys": 0}
    for r in range(b):
        s = int(sink_idx[r])
        for hh in (0, 2):
            for i in range(c):
                if q_pos[i] <= s:
                    continue
                p = base[r, hh, i].clone()
                p_s = float(p[s])
                vis = [j for j in range(tk) if j != s and bool(allowed[0, 0, i, j])]
                want = min(p_s, sum(float(p[j]) for j in vis))
                expect, left = p.clone(), want
                for j in sorted(vis, key=lambda j: -float(p[j])):  # the most-attended other keys first
                    t = min(left, float(p[j]))
                    expect[j] -= t
                    left -= t
                expect /= 1 - want
                cases["capped"] += want < p_s - 1e-6
                cases["several keys"] += want > max(float(p[j]) for j in vis) + 1e-6  # more than the top key holds
                assert float(m[r, hh, i]) == pytest.approx(want, abs=1e-6)
                assert float(m_rem[r, hh, i]) == pytest.approx(p_s, abs=1e-6)   # remove takes the whole sink mass
                assert torch.allclose(probs[r, hh, i], expect, atol=1e-6)
                assert float(probs[r, hh, i, s]) >= p_s - 1e-6                  # the sink keeps (or gains) its mass
                assert float(rem[r, hh, i, s]) == 0.0
    assert cases["capped"] > 0 and cases["several keys"] > 0  # both regimes were exercised


def test_head_selection_and_errors():
    mass = np.array([[0.1, 0.9, 0.2], [0.8, 0.3, 0.95], [0.5, 0.5, 0.05]])
    assert intervene.heads_by_sink_mass(mass, [1, 2], 0.5) == {1: [0, 2], 2: [0]}
    assert intervene.heads_by_sink_mass(mass, [0, 1, 2], 0.0) == {}
    assert sum(map(len, intervene.heads_by_sink_mass(mass, [0, 1, 2], 1.0).values())) == 9
    r = intervene.random_heads([1, 2], 3, 4, seed=0)
    assert sum(map(len, r.values())) == 4 and set(r) <= {1, 2} and r == intervene.random_heads([1, 2], 3, 4, seed=0)
    plan = intervene.head_plan({1: [2]}, 3, 3)
    assert list(plan) == [1] and plan[1].tolist() == [False, False, True]
    assert list(intervene.head_plan(mass > 0.85, 3, 3)) == [0, 1]
    with pytest.raises(ParameterError, match="'k'"):
        intervene.random_heads([0], 3, 4)
    with pytest.raises(ParameterError, match="layer 5"):
        intervene.head_plan({5: [0]}, 3, 3)
    with pytest.raises(ParameterError, match="head 7"):
        intervene.head_plan({0: [7]}, 3, 3)
    with pytest.raises(ParameterError, match="shape"):
        intervene.head_plan(np.ones((2, 3), bool), 3, 3)
    lm = tiny_model("llama", seed=0)
    with pytest.raises(ParameterError, match="'mode'"):
        with intervene.sink_intervention(lm.model, {0: [0]}, torch.zeros(1, dtype=torch.long), mode="zero"):
            pass
    assert lm.model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_sink_from_the_mask_and_cached_decoding(arch):
    """sink_index=None reads each row's first real token from the mask, at prefill and at every cached
    decoding step: greedy generation with the KV cache equals a greedy loop that recomputes everything."""
    lm = tiny_model(arch, seed=5)
    ids, att = _batch(side="left")
    heads = {1: [0, 2], 3: [1]}
    explicit, _ = _intervened_logits(lm.model, ids, att, heads, att.argmax(dim=1), mode="remove")
    auto, _ = _intervened_logits(lm.model, ids, att, heads, None, mode="remove")
    assert torch.equal(explicit, auto)
    steps = 5
    with torch.no_grad(), intervene.sink_intervention(lm.model, heads, mode="remove"):
        gen = lm.model.generate(input_ids=ids, attention_mask=att, max_new_tokens=steps, do_sample=False,
                                pad_token_id=0, eos_token_id=None, use_cache=True)
        seq, mask = ids.clone(), att.clone()
        for _ in range(steps):
            pos = (mask.cumsum(1) - 1).clamp(min=0)
            nxt = lm.model(input_ids=seq, attention_mask=mask, position_ids=pos, use_cache=False).logits[:, -1].argmax(-1)
            seq = torch.cat([seq, nxt[:, None]], 1)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
    assert torch.equal(gen[:, ids.shape[1]:], seq[:, ids.shape[1]:])
    with torch.no_grad():
        plain = lm.model.generate(input_ids=ids, attention_mask=att, max_new_tokens=steps, do_sample=False,
                                  pad_token_id=0, eos_token_id=None)
    assert not torch.equal(plain, gen)  # the intervention changed some generated token


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_suites_decoder_under_the_intervention(arch):
    """sinklib.evals.decode (shared prefix copied into the cache, ended rows dropped) under the intervention gives
    transformers' generate's tokens under the same intervention."""
    from sinklib.evals import decode

    lm = tiny_model(arch, seed=5, **({"sliding_window": 64} if arch == "gemma3" else {}))
    g = torch.Generator().manual_seed(1)
    shared = torch.randint(4, 100, (9,), generator=g).tolist()
    prompts = [[1] + shared + torch.randint(4, 100, (n,), generator=g).tolist() for n in (3, 7, 1, 5)]
    assert decode.shared_length(lm.model, prompts) == 10
    heads, steps = {1: [0, 2], 3: [1]}, 6
    with torch.no_grad(), intervene.sink_intervention(lm.model, heads, mode="remove"):
        ids = torch.zeros(len(prompts), max(map(len, prompts)), dtype=torch.long)
        att = torch.zeros_like(ids)
        for r, p in enumerate(prompts):
            ids[r, ids.shape[1] - len(p):], att[r, ids.shape[1] - len(p):] = torch.tensor(p), 1
        want = lm.model.generate(input_ids=ids, attention_mask=att, max_new_tokens=steps, do_sample=False,
                                 pad_token_id=0, eos_token_id=None)[:, ids.shape[1]:].tolist()
        got = decode.greedy(lm.model, None, prompts, steps, pad=0, eos=[], batch_size=4)
    assert got == want


def test_the_decoder_moves_the_progress_on_per_batch(tmp_path, monkeypatch):
    """Each batch of `decode.greedy` advances the suite's reported step (the reproduce command's progress line)."""
    from sinklib.core import progress
    from sinklib.evals import decode

    f = tmp_path / "p.json"
    monkeypatch.setenv(progress.ENV, str(f))
    monkeypatch.setattr(progress, "_last", {"t": 0.0, "what": None, "total": None})
    monkeypatch.setattr(progress, "MIN_INTERVAL_S", 0.0)
    lm = tiny_model("llama", seed=5)
    progress.report("evaluating instructions", 0, 6)
    seen = []
    monkeypatch.setattr(progress, "report", lambda w, s=None, t=None: seen.append((w, s, t)))
    decode.greedy(lm.model, None, [[1, 5, 6, 7]] * 6, 2, pad=0, eos=[], batch_size=2)
    assert seen == [("evaluating instructions", k, 6) for k in (2, 4, 6)]
