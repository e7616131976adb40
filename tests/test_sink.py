"""The probe equals naive eager output_attentions; S and its open choices behave as documented."""
import numpy as np
import pytest
import torch

from sinklib.core import probe, sink
from sinklib.errors import ParameterError
from sinklib.core.models import tiny_model

ARCHS = ["llama", "qwen3", "gemma3", "olmo2"]  # GQA no-norm, per-head QK-norm, sliding window + QK-norm, layerwise


def _batch(seed=0, lengths=(12, 7, 10), side="right"):
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(3, 128, (n,), generator=g).tolist() for n in lengths]
    return sink.pad_batch(seqs, 0, side)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("method", ["fused", "chunked"])
def test_probe_equals_eager(arch, side, method):
    lm = tiny_model(arch, seed=1)
    ids, att = _batch(side=side)
    rec = sink.record_sink(lm.model, ids, att, method=method)
    ref = sink.eager_sink_probs(lm.model, ids, att, rec.sink_index)
    v = rec.valid[:, None, None, :].expand_as(rec.p)
    assert rec.p.shape == ref.shape == (3, 4, 4, ids.shape[1])
    assert (rec.p - ref)[v].abs().max().item() <= 1e-5
    # left padding: the sink is the first real token, not index 0
    expected = (att.argmax(dim=1)).tolist()
    assert rec.sink_index.tolist() == expected


def test_sliding_window_changes_sink_mass():
    """Gemma-3 tiny model has window 4: beyond it the sink is invisible to sliding layers (p = 0)."""
    lm = tiny_model("gemma3", seed=2)
    ids, att = _batch(lengths=(12,))
    rec = sink.record_sink(lm.model, ids, att)
    sliding = [i for i, t in enumerate(lm.model.config.layer_types) if t == "sliding_attention"]
    full = [i for i, t in enumerate(lm.model.config.layer_types) if t == "full_attention"]
    assert rec.p[0, sliding, :, 6:].abs().max() == 0  # query 6 is > window away from key 0
    assert rec.p[0, full, :, 6:].min() > 0


def test_probe_output_identical_to_sdpa():
    lm = tiny_model("llama", seed=3)
    ids, att = _batch()
    with torch.no_grad():
        ref = lm.model(input_ids=ids, attention_mask=att).logits
        with sink.sink_probe(lm.model, torch.zeros(3, dtype=torch.long)):
            out = lm.model(input_ids=ids, attention_mask=att).logits
    m = att.bool()
    assert torch.allclose(out[m], ref[m], atol=1e-5)
    assert lm.model.config._attn_implementation == "sdpa"  # restored after the context


def test_mask_registry_is_registered():
    """Without the mask-interface registration every layer would get attention_mask=None."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    sink.register_probe()
    assert sink.PROBE_NAME in ALL_MASK_ATTENTION_FUNCTIONS


def test_sink_strength_definition_by_hand():
    lm = tiny_model("llama", seed=4)
    seqs = [torch.randint(3, 128, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (9, 14)]
    res = sink.sink_strength(lm, input_ids=seqs, last_k_layers=2, query_start=1, all_layers=True)
    ids, att = sink.pad_batch(seqs)
    ref = sink.eager_sink_probs(lm.model, ids, att, torch.zeros(2, dtype=torch.long))  # [B, L, H, T]
    ps = torch.cat([ref[0, :, :, 1:9], ref[1, :, :, 1:14]], dim=-1).double()  # [L, H, queries]
    mass = ps.mean(-1).numpy()
    assert np.allclose(res.mass, mass, atol=1e-6)
    z = np.log(mass / (1 - mass))
    assert res.S == pytest.approx(np.median(z[-2:]), abs=1e-5)
    res2 = sink.sink_strength(lm, input_ids=seqs, last_k_layers=2, aggregate="logodds_then_mean")
    zq = sink.logit(ps).mean(-1).numpy()
    assert res2.S == pytest.approx(np.median(zq[-2:]), abs=1e-5)
    assert res.n_queries == 8 + 13
    # uniform attention's mass over the same queries: a query at position t sees t + 1 keys
    assert res.uniform == pytest.approx((sum(1 / (t + 1) for t in range(1, 9)) + sum(1 / (t + 1) for t in range(1, 14)))
                                        / 21)
    for side in ("left", "right"):   # the same whatever the padding and batching
        r = sink.sink_strength(lm, input_ids=seqs, last_k_layers=2, padding_side=side,
                               batch_size=1 if side == "left" else 8)
        assert r.uniform == pytest.approx(res.uniform)


def test_query_start_and_padding_invariance():
    lm = tiny_model("qwen3", seed=5)
    seqs = [torch.randint(3, 128, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (9, 14, 6)]
    a = sink.sink_strength(lm, input_ids=seqs, last_k_layers=3, padding_side="right").S
    b = sink.sink_strength(lm, input_ids=seqs, last_k_layers=3, padding_side="left").S
    c = sink.sink_strength(lm, input_ids=seqs, last_k_layers=3, batch_size=1).S
    assert a == pytest.approx(b, abs=1e-5) and a == pytest.approx(c, abs=1e-5)
    s0 = sink.sink_strength(lm, input_ids=seqs, last_k_layers=3, query_start=0).S
    assert s0 > a  # q0 = 0 adds the sink's own row (probability 1)


def test_strength_from_stats_equals_sink_strength():
    lm = tiny_model("gemma3", seed=6)
    seqs = [torch.randint(3, 128, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (5, 9, 12, 7, 10)]
    st = sink.prompt_stats(lm, input_ids=seqs)
    idx = [0, 2, 3]
    for agg in sink.AGGREGATES:
        direct = sink.sink_strength(lm, input_ids=[seqs[i] for i in idx], last_k_layers=2, aggregate=agg).S
        assert sink.strength_from_stats(st, idx, last_k_layers=2, aggregate=agg) == pytest.approx(direct, abs=1e-6)


def test_argmax_and_bos_sink_detection():
    lm = tiny_model("llama", seed=7)
    ids, att = _batch(lengths=(10, 8))
    ids[:, 0] = 1  # bos id of the tiny config
    assert sink.find_sink(lm.model, ids, att, "bos").tolist() == [0, 0]
    ids2 = ids.clone(); ids2[1, 0] = 5
    with pytest.raises(ParameterError, match="BOS"):
        sink.find_sink(lm.model, ids2, att, "bos")
    am = sink.find_sink(lm.model, ids, att, "argmax")
    assert am.shape == (2,) and (am < att.sum(1)).all()


def test_bad_inputs_name_the_parameter():
    lm = tiny_model("llama", seed=0)
    seqs = [[5, 6, 7, 8, 9]]
    with pytest.raises(ParameterError, match="last_k_layers"):
        sink.sink_strength(lm, input_ids=seqs, last_k_layers=99)
    with pytest.raises(ParameterError, match="last_k_layers"):
        sink.sink_strength(lm, input_ids=seqs, last_k_layers="ten")
    with pytest.raises(ParameterError, match="aggregate"):
        sink.sink_strength(lm, input_ids=seqs, last_k_layers=2, aggregate="mean")
    with pytest.raises(ParameterError, match="sink"):
        sink.sink_strength(lm, input_ids=seqs, last_k_layers=2, sink="last")
    with pytest.raises(ParameterError, match="query_start"):
        sink.sink_strength(lm, input_ids=seqs, last_k_layers=2, query_start=-1)
    with pytest.raises(ParameterError, match="query_start"):
        sink.sink_strength(lm, input_ids=[[5, 6]], last_k_layers=2, query_start=1)


def test_empty_prompt_is_rejected(smollm2):
    with pytest.raises(ParameterError, match="empty"):
        sink.sink_strength(smollm2, ["A fine prompt with words.", "   "])
    with pytest.raises(ParameterError, match="empty"):
        sink.sink_strength(smollm2, [])


def test_nan_attention_raises():
    from sinklib.errors import AttentionError

    lm = tiny_model("llama", seed=0)
    with torch.no_grad():
        lm.model.model.layers[3].self_attn.q_proj.weight.fill_(float("nan"))
    with pytest.raises(AttentionError, match="NaN"):
        sink.sink_strength(lm, input_ids=[[5, 6, 7, 8, 9, 10]], last_k_layers=1)


def test_unregistered_attention_falls_back_with_warning(monkeypatch):
    """A model whose attention ignores the registry: eager fallback, same numbers, and a warning."""
    lm = tiny_model("llama", seed=8)
    ids, att = _batch(lengths=(8, 6))
    ref = sink.record_sink(lm.model, ids, att).p
    monkeypatch.setattr(probe, "probe_attention", lambda *a, **k: None)
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers import AttentionInterface

    AttentionInterface.register(sink.PROBE_NAME, sdpa_attention_forward)  # a registry entry that records nothing
    monkeypatch.setattr(probe, "register_probe", lambda: None)
    try:
        with pytest.warns(UserWarning, match="registry"):
            got = sink.record_sink(lm.model, ids, att).p
    finally:
        AttentionInterface.register(sink.PROBE_NAME, sink.probe_attention)
    v = sink._query_valid(att, torch.zeros(2, dtype=torch.long), 1)[:, None, None, :].expand_as(ref)
    assert torch.allclose(got[v], ref[v], atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("fixture", ["smollm2", "gemma3"])
def test_probe_equals_eager_on_embedded_models(fixture, request):
    lm = request.getfixturevalue(fixture)
    seqs = sink.encode_prompts(lm.tokenizer, ["The cat sat on the mat and looked at the door.",
                                              "Write a haiku about rain."], max_tokens=24)
    ids, att = sink.pad_batch(seqs, lm.tokenizer.pad_token_id)
    rec = sink.record_sink(lm.model, ids, att)
    ref = sink.eager_sink_probs(lm.model, ids, att, rec.sink_index)
    v = rec.valid[:, None, None, :].expand_as(rec.p)
    # fp32 rounding: the two paths sum in different orders, and Gemma-3's large attention logits make that reach
    # 1.3e-5 on some CPUs (2.5e-6 for SmolLM2); an error in the probe shows as 1e-3 or more
    assert (rec.p - ref)[v].abs().max().item() <= 5e-5


def test_short_prompts_can_be_skipped():
    lm = tiny_model("llama", seed=9)
    seqs = [[5, 6, 7], list(range(3, 20))]
    with pytest.raises(ParameterError, match="query_start"):
        sink.sink_strength(lm, input_ids=seqs, last_k_layers=2, query_start=4)
    r = sink.sink_strength(lm, input_ids=seqs, last_k_layers=2, query_start=4, short="skip")
    assert r.n_prompts == 1 and r.n_queries == 17 - 4


def test_reading_the_sensitivity_table():
    import pandas as pd
    from types import SimpleNamespace

    idx = pd.MultiIndex.from_tuples([("K (last layers)", "10"), ("K (last layers)", "all layers"),
                                     ("aggregate", "mass_then_logodds"), ("aggregate", "logodds_then_mean")])
    table = pd.DataFrame({"a": [0.7, -0.3, 0.7, 0.9], "b": [0.0, -0.2, 0.0, 0.01]}, index=idx)
    main = {"a": SimpleNamespace(S=0.7), "b": SimpleNamespace(S=0.0)}
    assert sink.ordering_flips(table, main) == [("K (last layers)", "all layers")]
    assert sink.ordering_flips(table[["a"]], main) == []
    assert sink.flips_text(table, main) == "K (last layers) = all layers (a and b swap)"
    assert sink.flips_text(table[["a"]], main) == "none of them"
    assert sink.aggregate_direction(table) == "higher for every model"
    table.loc[("aggregate", "logodds_then_mean"), "b"] = -0.5
    assert sink.aggregate_direction(table) == "higher for a and lower for b"
    rob = pd.DataFrame({"a": [0.6, 0.8], "b": [-0.2, 0.02]})
    assert sink.sign_note(rob) == "The S of b changes sign from one calibration set to another."
    assert sink.sign_note(rob[["a"]]).startswith("Each model")


def test_readings_with_four_models():
    """#29: with more than two models every pair is ranked, and a swap names its pair."""
    import pandas as pd
    from types import SimpleNamespace

    idx = pd.MultiIndex.from_tuples([("K (last layers)", "10"), ("q0 (query_start)", "0 (15 prompts)")])
    table = pd.DataFrame({"a": [0.7, 0.7], "b": [0.0, 0.8], "c": [-0.1, 0.9], "d": [-2.0, -2.0]}, index=idx)
    main = {m: SimpleNamespace(S=s) for m, s in zip("abcd", (0.7, 0.0, -0.1, -2.0))}
    assert sink.ordering_flips(table, main) == [("q0 (query_start)", "0 (15 prompts)")]
    assert sink.swapped_pairs(table.iloc[1], {m: r.S for m, r in main.items()}) == [("a", "b"), ("a", "c"), ("b", "c")]
    assert sink.flips_text(table, main) == "q0 (query_start) = 0 (15 prompts) (a and b, a and c, b and c swap)"
    rob = pd.DataFrame({"a": [0.6, 0.8, 0.7], "b": [0.1, 0.0, -0.1], "c": [0.0, 0.1, -0.2], "d": [-2.0, -2.1, -1.9]})
    m = sink.pair_margins(rob, {"a": 0.7, "b": 0.0, "c": -0.1, "d": -2.0})
    assert list(m.pair) == ["S(a) − S(b)", "S(a) − S(c)", "S(a) − S(d)", "S(b) − S(c)", "S(b) − S(d)", "S(c) − S(d)"]
    bc = m.set_index("pair").loc["S(b) − S(c)"]
    assert bc["sign flips"] == 1 and bc["min"] == pytest.approx(-0.1) and bc["cells"] == 3
    assert sink.margin_note(m) == "5 of the 6 pairwise margins keep their sign in all 3 (N, seed) cells; S(b) − S(c) is not positive in 1 of 3."
    two = sink.pair_margins(rob[["a", "d"]])
    assert sink.margin_note(two) == "The margin S(a) − S(d) keeps its sign in all 3 (N, seed) cells (smallest +2.600)."
    assert sink.margin_note(sink.pair_margins(rob[["a", "b", "d"]])).startswith(
        "Every one of the 3 pairwise margins keeps its sign in all 3 (N, seed) cells; the smallest is S(a) − S(b) = +0.500")
    assert sink.margin_note(sink.pair_margins(rob[["a"]])).startswith("With one model")


def test_first_token_reading_and_layer_means():
    masses = {"pos": {"default": 0.46, "bos": 0.43, "none": 0.46, "word": 0.47},
              "tied": {"default": 0.472, "bos": 0.472, "none": 0.024, "word": 0.026},
              "nobos": {"default": 0.372, "bos": 0.06, "none": 0.372, "word": 0.35}}
    text = sink.first_token_reading(masses)
    assert "pos: mean sink mass 0.460 with the default first token, 0.430 with its BOS token forced first" in text
    assert "its sink is positional: it stays at position 0 whatever ordinary word is there." in text
    assert ("0.026 with an ordinary word first (6% kept); its sink is tied to its default first token (measured at "
            "position 0: without that token the attention may sit elsewhere).") in text
    assert ("(94% kept); its sink is positional: it stays at position 0 whatever ordinary word is there, except its "
            "own BOS token, which, put first, keeps only 16% of it.") in text
    tokens = {"pos": {"default": "User", "bos": "<|im_start|>", "none": "User", "word": "Hello"},
              "tied": {"default": "<bos>", "bos": "<bos>", "none": "User", "word": "Hello"}}
    text = sink.first_token_reading(masses, first_tokens=tokens)
    assert "pos (its tokenizer adds no special token: the prompt's own first word, User, comes first): mean" in text
    assert "with its BOS token (<|im_start|>) forced first" in text and "tied (default first token <bos>): mean" in text
    assert "nobos: mean sink mass 0.372" in text
    out = sink.layer_means_text(np.array([[0.0, 0.2], [1.0, 0.4]]), [0, 1], per_line=1)
    assert out == "L0 0.10\nL1 0.70"
