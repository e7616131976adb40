"""Tests of sinklib.vl on tiny random models with a character-level tokenizer (fast, offline)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sinklib.core import cache, train
from sinklib import vl
from sinklib.vl.evaluate import _first_word
from sinklib.errors import ParameterError, SinkbookError
from sinklib.core.models import tiny_model


class CharTokenizer:
    """Minimal tokenizer: pad 0, bos 1, eos 2, newline 3, printable ASCII 32..126 -> 4..98 (fits vocab 128)."""

    pad_token_id, bos_token_id, eos_token_id = 0, 1, 2

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = [3 if c == "\n" else 4 + ord(c) - 32 for c in text]
        assert all(3 <= i <= 98 for i in ids), text
        return ([self.bos_token_id] if add_special_tokens else []) + ids

    def decode(self, ids) -> str:
        return "".join("\n" if i == 3 else chr(i - 4 + 32) for i in ids if 3 <= i <= 98)


TOK = CharTokenizer()


def tiny(seed: int = 0, **kw):
    return tiny_model("llama", seed=seed, **kw).model


# ---------------------------------------------------------------------------------------
# data

def test_scenes_and_items_are_deterministic_per_seed():
    a, b, c = vl.make_scenes(30, seed=5), vl.make_scenes(30, seed=5), vl.make_scenes(30, seed=6)
    assert all(x.shapes == y.shapes and np.array_equal(x.image, y.image) for x, y in zip(a, b))
    assert any(x.shapes != y.shapes for x, y in zip(a, c))
    ia, ib = vl.make_items(a, seed=1), vl.make_items(b, seed=1)
    assert [(i.question, i.answer) for i in ia] == [(i.question, i.answer) for i in ib]
    ba = vl.batch_items(3, 8, seed=0, tag="lm")
    bb = vl.batch_items(3, 8, seed=0, tag="lm")
    assert [(i.question, i.answer, vl.describe(i.scene)) for i in ba] == \
           [(i.question, i.answer, vl.describe(i.scene)) for i in bb]
    assert [vl.describe(i.scene) for i in ba] != [vl.describe(i.scene) for i in vl.batch_items(3, 8, tag="projector")]
    assert a[0].image.shape == (48, 48, 3) and a[0].image.dtype == np.uint8


def _scene_from_pixels(img: np.ndarray) -> list[tuple[str, str, int, int]]:
    """Independent decoding of a rendered image: per grid cell, the colour by exact RGB match
    and the kind by how much of its bounding box the shape fills (square ~1, circle ~0.79, triangle ~0.5)."""
    cell = img.shape[0] // 3
    found = []
    for r in range(3):
        for c in range(3):
            patch = img[r * cell:(r + 1) * cell, c * cell:(c + 1) * cell]
            for name, rgb in vl.COLOURS.items():
                m = np.all(patch == np.array(rgb, dtype=np.uint8), axis=-1)
                if m.sum() > 0:
                    ys, xs = np.nonzero(m)
                    fill = m.sum() / ((ys.max() - ys.min() + 1) * (xs.max() - xs.min() + 1))
                    kind = "square" if fill > 0.93 else "circle" if fill > 0.65 else "triangle"
                    found.append((kind, name, r, c))
    return found


def test_answers_agree_with_the_rendered_pixels():
    scenes = vl.make_scenes(150, seed=11)
    items = vl.make_items(scenes, seed=2, per_scene=4)
    assert {it.qtype for it in items} == set(vl.QUESTION_TYPES)
    for it in items:
        shapes = _scene_from_pixels(it.scene.image)
        assert sorted(shapes, key=lambda s: (s[2], s[3])) == [(s.kind, s.colour, s.row, s.col) for s in it.scene.shapes]
        words = it.question.rstrip("?").split()
        if it.qtype == "count":
            expected = str(len(shapes))
        elif it.qtype == "colour":  # "What colour is the <kind>?"
            expected = [s[1] for s in shapes if s[0] == words[-1]]
            assert len(expected) == 1
            expected = expected[0]
        elif it.qtype == "exists":  # "Is there a <colour> <kind>?"
            expected = "yes" if any(s[1] == words[-2] and s[0] == words[-1] for s in shapes) else "no"
        else:  # "Where is the <colour> shape?"
            cols = [s[3] for s in shapes if s[1] == words[-2]]
            assert len(cols) == 1
            expected = ("left", "middle", "right")[cols[0]]
        assert it.answer == expected, (it.question, it.answer, shapes)


def test_max_shapes_and_schedules():
    assert all(len(it.scene.shapes) == 1 for it in vl.batch_items(0, 20, max_shapes=1))
    assert max(len(it.scene.shapes) for it in vl.batch_items(0, 200)) == 4
    const = train.lr_lambda(20, 0.1, "constant")
    cos = train.lr_lambda(20, 0.1, "cosine")
    assert [const(i) for i in range(3)] == [0.5, 1.0, 1.0] and const(19) == 1.0
    assert cos(1) == 1.0 and cos(10) < 1.0 and cos(19) < 0.01


def test_answer_balance_and_majority_baseline():
    items = vl.eval_items(800, seed=0)
    assert {it.answer for it in items if it.qtype == "exists"} == {"yes", "no"}
    base = vl.majority_baseline(vl.batch_items(0, 800, seed=0), items)
    assert 0.25 < base < 0.5  # four question types with 2-4 roughly balanced answers each


def test_bad_parameters_raise_clear_errors():
    with pytest.raises(ParameterError, match="image_size"):
        vl.make_scenes(2, image_size=50)
    with pytest.raises(ParameterError, match="qtypes"):
        vl.make_items(vl.make_scenes(2), qtypes=["shape"])
    with pytest.raises(ParameterError, match="n_visual_tokens"):
        vl.make_encoder(n_visual_tokens=5)
    with pytest.raises(ParameterError, match="encoder"):
        vl.vqa_accuracy(tiny(), TOK, vl.make_encoder(), None, vl.make_scenes(2))
    with pytest.raises(ParameterError, match="stage1_steps"):
        vl.train_vl(tiny(), TOK, stage1_steps=-1, stage2_steps=0, progress=False)


# ---------------------------------------------------------------------------------------
# encoder, projector, batches

def test_encoder_is_deterministic_frozen_and_informative():
    e1, e2 = vl.make_encoder(seed=0), vl.make_encoder(seed=0)
    assert all(torch.equal(a, b) for a, b in zip(e1.state_dict().values(), e2.state_dict().values()))
    assert not any(p.requires_grad for p in e1.parameters())
    e1.train()
    assert not e1.training
    feats = e1.encode_scenes(vl.make_scenes(4))
    assert feats.shape == (4, 9, 256)
    probe = vl.encoder_probe_accuracy(e1, n_train=200, n_test=100)
    assert probe["colour_accuracy"] > 0.95 and probe["kind_accuracy"] > 0.9
    assert probe["kind_accuracy"] > probe["kind_majority"] + 0.15


def test_projector_starts_at_the_embedding_scale():
    model = tiny()
    enc = vl.make_encoder()
    proj = vl.make_projector(enc, model, seed=0)
    out = proj(enc.encode_scenes(vl.make_scenes(32, seed=99)))
    assert out.shape == (32, 9, 64)
    assert out.pow(2).mean().sqrt().item() == pytest.approx(vl.embedding_rms(model), rel=0.2)


@pytest.mark.parametrize("mode", ["vl", "text"])
def test_loss_covers_only_the_answer_tokens(mode):
    model = tiny()
    enc = vl.make_encoder()
    proj = vl.make_projector(enc, model)
    items = vl.batch_items(0, 5, seed=0)
    kw = dict(encoder=enc, projector=proj) if mode == "vl" else {}
    b = vl.build_batch(model, TOK, items, mode=mode, **kw)
    for i, it in enumerate(items):
        want = TOK.encode(" " + it.answer, add_special_tokens=False) + [TOK.eos_token_id]
        sel = b.example == i
        assert b.targets[sel].tolist() == want
        t = b.src_t[sel] + 1  # the supervised positions: the last len(want) real positions
        assert t.tolist() == list(range(int(b.lengths[i]) - len(want), int(b.lengths[i])))
    # the sliced loss equals the plain full-logits loss with every non-answer label masked
    labels = torch.full(b.attention_mask.shape, -100)
    labels[b.src_b, b.src_t + 1] = b.targets
    with torch.no_grad():
        logits = model(inputs_embeds=b.inputs_embeds, attention_mask=b.attention_mask,
                       position_ids=b.position_ids).logits
        ref = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                labels[:, 1:].reshape(-1), ignore_index=-100)
        assert vl.answer_loss(model, b).item() == pytest.approx(ref.item(), rel=1e-5)
    if mode == "vl":
        assert b.n_visual == 9 and torch.equal(b.inputs_embeds[:, 7:16], proj(enc.encode_scenes([i.scene for i in items])))


def _naive_greedy(model, items, enc, proj, max_new_tokens):
    """Reference: one item at a time, full forward pass (no cache) through the model's own LM head."""
    out = []
    for it in items:
        gen = []
        for _ in range(max_new_tokens):
            b = vl.build_batch(model, TOK, [it], mode="vl" if enc is not None else "text", encoder=enc,
                               projector=proj, answers=[list(gen)])
            with torch.no_grad():
                t = int(model(inputs_embeds=b.inputs_embeds, position_ids=b.position_ids).logits[0, -1].argmax())
            if t == TOK.eos_token_id:
                break
            gen.append(t)
        out.append(TOK.decode(gen))
    return out


@pytest.mark.parametrize("arch,text", [("llama", False), ("llama", True), ("gemma3", False), ("qwen3", False),
                                       ("olmo2", False)])
def test_cached_greedy_equals_naive_greedy(arch, text):
    model = tiny_model(arch, seed=3).model
    enc = vl.make_encoder()
    proj = vl.make_projector(enc, model)
    if text:
        enc = proj = None
    items = vl.eval_items(10, seed=1)
    fast = vl.vqa_predict(model, TOK, enc, proj, items, batch_size=4, max_new_tokens=3, raw=True)
    assert fast == _naive_greedy(model, items, enc, proj, 3)
    assert any(fast)  # tokens were generated (not eos straight away)
    words = vl.vqa_predict(model, TOK, enc, proj, items, batch_size=4, max_new_tokens=3)
    assert words == [_first_word(f) for f in fast]
    opts = vl.vqa_predict(model, TOK, enc, proj, items, method="options", batch_size=4)
    assert all(p in vl.ANSWERS[it.qtype] for p, it in zip(opts, items))


# ---------------------------------------------------------------------------------------
# training

def test_stage1_changes_only_the_projector_and_stage2_changes_the_lm():
    model = tiny()
    base = vl.clone_state_dict(model)
    seen = []
    r = vl.train_vl(model, TOK, stage1_steps=3, stage2_steps=0, batch_size=4, seed=0, progress=False,
                    callback=lambda step, m, stage: seen.append((step, stage)), callback_every=1)
    assert all(torch.equal(base[k], v) for k, v in model.state_dict().items())  # bit-identical LM
    p0 = vl.make_projector(r.encoder, tiny(), seed=0)
    assert not torch.equal(p0.fc1.weight, r.projector.fc1.weight)
    assert seen[0] == (0, "start") and [s for s, _ in seen[1:]] == [1, 2, 3]
    assert r.budget["stage1"]["steps"] == 3 and r.budget["stage2"]["steps"] == 0
    assert all(p.requires_grad for p in model.parameters())  # restored
    r2 = vl.train_vl(model, TOK, stage1_steps=0, stage2_steps=2, batch_size=4, seed=0, progress=False,
                     projector=r.projector, encoder=r.encoder)
    changed = [k for k, v in model.state_dict().items() if not torch.equal(base[k], v)]
    assert any("q_proj" in k for k in changed) and any("embed_tokens" in k for k in changed)
    assert r2.history[-1]["stage"].startswith("VL stage 2")


def test_text_only_control_matches_the_vl_token_budget():
    vl_run = vl.train_vl(tiny(), TOK, stage1_steps=1, stage2_steps=3, batch_size=4, lr_lm=1e-3, seed=7,
                         progress=False)
    txt = vl.train_text_only(tiny(), TOK, steps=3, batch_size=4, lr=1e-3, seed=7, progress=False)
    a, b = vl_run.budget["stage2"], txt.budget["stage2"]
    for k in ("steps", "examples", "answer_tokens"):
        assert a[k] == b[k], k
    assert a["visual_positions"] == 3 * 4 * 9 and b["visual_positions"] == 0
    assert b["text_positions"] > a["text_positions"]  # descriptions are longer than the "Scene:" slot
    lm_lrs = [h["lr"] for h in vl_run.history if h["stage"].startswith("VL stage 2")]
    assert lm_lrs == [h["lr"] for h in txt.history]  # same schedule
    assert txt.projector is None and txt.kind == "text_only"


def test_tiny_model_learns_a_trivial_vqa():
    """One shape, 'What colour is the <kind>?': the answer loss of a random tiny LM falls from about
    ln(128) = 4.85 (uniform over the vocabulary) to well under 1 in 40 steps (the answer format is
    learnt; reading the colour from the image takes far longer for a tiny random LM)."""
    model = tiny(seed=1)
    r = vl.train_vl(model, TOK, stage1_steps=0, stage2_steps=40, batch_size=16, lr_lm=3e-3, lr_projector_stage2=3e-3,
                    seed=0, qtypes=["colour"], max_shapes=1, progress=False)
    losses = [h["loss"] for h in r.history]
    assert np.mean(losses[:5]) > 3.0
    assert np.mean(losses[-5:]) < 1.0 and np.mean(losses[-5:]) < 0.25 * np.mean(losses[:5])
    preds = vl.vqa_predict(model, TOK, r.encoder, r.projector, vl.eval_items(20, qtypes=["colour"], max_shapes=1),
                           max_new_tokens=8)  # characters: " yellow" + eos
    assert sum(p in vl.COLOURS for p in preds) >= 15  # it answers with colour words


# ---------------------------------------------------------------------------------------
# weight deltas, random control, checkpoints

def _delta_norms(base, sd):
    return {k: float(torch.linalg.vector_norm(sd[k].double() - base[k].double())) for k in base
            if base[k].is_floating_point()}


def _delta_cosines(base, sd_a, sd_b):
    out = {}
    for k in base:
        if base[k].is_floating_point():
            da, db = (sd_a[k].double() - base[k].double()).flatten(), (sd_b[k].double() - base[k].double()).flatten()
            na, nb = torch.linalg.vector_norm(da), torch.linalg.vector_norm(db)
            out[k] = float(da @ db / (na * nb)) if na > 0 and nb > 0 else float("nan")
    return out


def test_random_direction_matches_norms_and_is_not_the_vl_direction():
    model = tiny(tie_word_embeddings=True)
    base = vl.clone_state_dict(model)
    assert base["lm_head.weight"] is base["model.embed_tokens.weight"]
    vl.train_vl(model, TOK, stage1_steps=0, stage2_steps=2, batch_size=4, lr_lm=1e-3, progress=False)
    adapted = vl.clone_state_dict(model)
    rand = vl.random_direction_like(base, adapted, seed=0)
    want, got = _delta_norms(base, adapted), _delta_norms(base, rand)
    assert set(want) == set(got) and len(want) > 10
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-5, abs=1e-12), k
    cos = _delta_cosines(base, adapted, rand)
    big = [k for k in cos if base[k].numel() >= 4096 and want[k] > 0]
    assert big and max(abs(cos[k]) for k in big) < 0.1
    assert torch.equal(rand["lm_head.weight"], rand["model.embed_tokens.weight"])  # tied stays tied
    again = vl.random_direction_like(base, adapted, seed=0)
    other = vl.random_direction_like(base, adapted, seed=1)
    assert all(torch.equal(again[k], rand[k]) for k in rand)
    assert not torch.equal(other["model.layers.0.self_attn.q_proj.weight"], rand["model.layers.0.self_attn.q_proj.weight"])
    keep = vl.random_direction_like(base, adapted, one_d="keep")
    copy = vl.random_direction_like(base, adapted, one_d="copy")
    k1 = "model.layers.0.input_layernorm.weight"
    assert torch.equal(keep[k1], base[k1]) and torch.equal(copy[k1], adapted[k1]) and want[k1] > 0
    model.load_state_dict(rand)  # loadable as is


def test_checkpoint_round_trip_and_key(tmp_path):
    model = tiny()
    r = vl.train_vl(model, TOK, stage1_steps=1, stage2_steps=1, batch_size=2, progress=False)
    params = {"model": "tiny-llama", "stage1_steps": 1, "stage2_steps": 1, "seed": 0}
    key = cache.key(params)
    assert key == cache.key(dict(reversed(list(params.items())))) and len(key) == 16
    assert key != cache.key({**params, "seed": 1})
    d = cache.checkpoint_dir(key, tmp_path)
    assert not cache.checkpoint_exists(d)
    with pytest.raises(SinkbookError, match="no complete checkpoint"):
        vl.load_checkpoint(d, tiny())
    cache.save_checkpoint(d, model, r.projector, r.encoder, meta={"params": params})
    assert cache.checkpoint_exists(d)
    fresh = tiny(seed=9)
    ck = vl.load_checkpoint(d, fresh)
    assert all(torch.equal(v, fresh.state_dict()[k]) for k, v in model.state_dict().items())
    assert all(torch.equal(v, ck.projector.state_dict()[k]) for k, v in r.projector.state_dict().items())
    assert all(torch.equal(v, ck.encoder.state_dict()[k]) for k, v in r.encoder.state_dict().items())
    assert ck.meta == {"params": params}
    with pytest.raises(ParameterError, match="does not fit"):
        vl.load_checkpoint(d, tiny(hidden_size=32, head_dim=8))
    # tied embeddings survive the round trip
    tied = tiny(tie_word_embeddings=True)
    cache.save_checkpoint(tmp_path / "tied", tied)
    back = cache.load_checkpoint(tmp_path / "tied", tiny(seed=4, tie_word_embeddings=True)).model
    assert torch.equal(back.lm_head.weight, tied.lm_head.weight) and back.lm_head.weight is back.model.embed_tokens.weight
    assert math.isfinite(float(back.lm_head.weight.detach().sum()))


def test_against_majority_is_chapter_4s_rule():
    """Wilson interval of the held-out accuracy against the blind majority answer on the same items."""
    from sinklib.evals.grading import wilson_interval

    r = vl.against_majority(0.5, 200, 0, 48)
    lo, hi = wilson_interval(100, 200)
    maj = 100 * vl.majority_baseline(vl.eval_items(vl.MAJORITY_TRAIN_ITEMS, seed=0, image_size=48),
                                     vl.heldout_items(200, 0, 48))
    assert (r["vqa"], r["vqa_lo"], r["vqa_hi"], r["n"], r["majority"]) == (50.0, 100 * lo, 100 * hi, 200, maj)
    assert r["learned"] == (100 * lo > maj)
    assert not vl.against_majority(maj / 100, 200, 0, 48)["learned"]  # at the baseline itself: not learned


def test_relative_change_by_group():
    import torch

    from sinklib.vl import relative_change_by_group, tensor_group

    emb = torch.ones(4, 2)
    base = {"model.embed_tokens.weight": emb, "lm_head.weight": emb, "model.layers.0.self_attn.q_proj.weight": torch.ones(2, 2),
            "model.layers.0.mlp.up_proj.weight": torch.full((2, 2), 2.0), "model.norm.weight": torch.ones(2),
            "steps": torch.tensor([3])}
    other = {k: v.clone() for k, v in base.items()}
    other["model.layers.0.self_attn.q_proj.weight"][0, 0] += 2.0   # ||dW|| 2, ||W|| 2 -> 1.0
    other["model.layers.0.mlp.up_proj.weight"] += 0.2              # ||dW|| 0.4, ||W|| 4 -> 0.1
    rows = {r["group"]: r for r in relative_change_by_group(base, other)}
    assert list(rows) == ["embeddings / LM head", "attention Q, K", "MLP", "norm gains"]
    assert rows["embeddings / LM head"]["tensors"] == 1 and rows["embeddings / LM head"]["relative change"] == 0  # tied: once
    assert rows["attention Q, K"]["relative change"] == pytest.approx(1.0)
    assert rows["MLP"]["relative change"] == pytest.approx(0.1) and rows["MLP"]["largest tensor"] == pytest.approx(0.1)
    assert tensor_group("model.layers.3.self_attn.k_norm.weight") == "attention Q, K"
    assert tensor_group("model.layers.3.input_layernorm.weight") == "norm gains" and tensor_group("x.bias") == "other"


def test_scaled_change_scales_the_norm_and_keeps_ties():
    import torch

    from sinklib.errors import ParameterError
    from sinklib.vl import relative_change_by_group, scaled_change

    w = torch.randn(4, 3)
    base = {"model.embed_tokens.weight": w, "lm_head.weight": w, "model.layers.0.mlp.up_proj.weight": torch.ones(3, 3),
            "n": torch.tensor([1])}
    other = {k: (v + 0.1 if v.is_floating_point() else v) for k, v in base.items()}
    other["lm_head.weight"] = other["model.embed_tokens.weight"]
    r1 = {r["group"]: r["relative change"] for r in relative_change_by_group(base, other)}
    for s in (0.0, 0.5, 4.0):
        sd = scaled_change(base, other, s)
        assert sd["lm_head.weight"] is sd["model.embed_tokens.weight"] and torch.equal(sd["n"], base["n"])
        rs = {r["group"]: r["relative change"] for r in relative_change_by_group(base, sd)}
        assert rs["MLP"] == pytest.approx(s * r1["MLP"], rel=1e-5, abs=1e-9)
        assert rs["embeddings / LM head"] == pytest.approx(s * r1["embeddings / LM head"], rel=1e-5, abs=1e-9)
    assert torch.equal(scaled_change(base, other, 1.0)["model.layers.0.mlp.up_proj.weight"], other["model.layers.0.mlp.up_proj.weight"])
    with pytest.raises(ParameterError, match="scale"):
        scaled_change(base, other, -1.0)


def test_sentence_answers_keep_the_content():
    items = vl.eval_items(200, seed=3)
    seen = set()
    for it in items:
        s = vl.sentence_answer(it)
        seen.add(it.qtype)
        assert s.endswith(".") and s[0].isupper()
        if it.qtype == "count":
            assert (it.answer in s) or (it.answer == "1" and "one shape" in s)
        elif it.qtype == "exists":
            assert s.startswith("Yes," if it.answer == "yes" else "No,")
        else:
            assert f" {it.answer}" in s
    assert seen == set(vl.QUESTION_TYPES)


def test_format_preserving_text_only_control():
    word = vl.train_text_only(tiny(), TOK, steps=2, batch_size=4, lr=1e-3, seed=7, progress=False)
    sent = vl.train_text_only(tiny(), TOK, steps=2, batch_size=4, lr=1e-3, seed=7, progress=False,
                              answer_style="sentence")
    assert "answer_style" not in word.params and sent.params["answer_style"] == "sentence"
    a, b = word.budget["stage2"], sent.budget["stage2"]
    assert a["examples"] == b["examples"] and b["answer_tokens"] > a["answer_tokens"]  # same items, longer answers
    with pytest.raises(ParameterError, match="answer_style"):
        vl.train_text_only(tiny(), TOK, steps=1, batch_size=2, progress=False, answer_style="haiku")


def test_training_does_not_depend_on_the_callers_thread_count(monkeypatch):
    """train.run fixes torch's intra-op threads (train.TRAIN_THREADS), so two runs started under different
    thread settings give bit-identical weights, and the caller's setting is restored afterwards."""
    monkeypatch.delenv(train.THREADS_ENV, raising=False)
    outer = torch.get_num_threads()
    states, inside = [], []
    try:
        for n in (1, 3):
            torch.set_num_threads(n)
            model = tiny(hidden_size=128, intermediate_size=512)
            r = vl.train_vl(model, TOK, stage1_steps=2, stage2_steps=2, batch_size=8, lr_lm=1e-3, seed=0, progress=False,
                            callback=lambda step, m: step and inside.append(torch.get_num_threads()), callback_every=1)
            assert torch.get_num_threads() == n  # restored
            states.append({**vl.clone_state_dict(model), **{f"p.{k}": v for k, v in r.projector.state_dict().items()}})
    finally:
        torch.set_num_threads(outer)
    assert set(inside) == {train.TRAIN_THREADS}
    assert states[0].keys() == states[1].keys()
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])


def test_training_threads_override_and_bad_values(monkeypatch):
    seen = []
    w = torch.nn.Parameter(torch.ones(3))
    loss = lambda b: (w * w).sum()  # noqa: E731
    monkeypatch.setenv(train.THREADS_ENV, "1")
    train.run([{"params": [w], "lr": 0.1}], 1, lambda i: None, loss, after_step=lambda s: seen.append(torch.get_num_threads()))
    train.run([{"params": [w], "lr": 0.1}], 1, lambda i: None, loss, threads=3,
              after_step=lambda s: seen.append(torch.get_num_threads()))
    assert seen == [1, 3]
    monkeypatch.setenv(train.THREADS_ENV, "two")
    with pytest.raises(SinkbookError, match=train.THREADS_ENV):
        train.run([{"params": [w], "lr": 0.1}], 1, lambda i: None, loss)
