"""The three tiny QK-norm variants: same modules and weights up to the norm gains, the probe equals
eager attention on each, the project's code labels them right; training lowers the loss, is
deterministic and cached."""
import numpy as np
import pytest
import torch

from sinklib.core import sink
from sinklib.core.cache import tensor_sha
from sinklib.errors import ParameterError
from sinklib.tiny import model as M

SMALL = dict(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn=64, context=64, vocab_size=96)


def _batch(seed=0, lengths=(12, 7, 10), side="right", vocab=96):
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]
    return sink.pad_batch(seqs, 0, side)


def test_variants_share_every_module_but_the_qk_norm_gains():
    ms = {v: M.build(v, SMALL, seed=5) for v in M.VARIANTS}
    params = {v: dict(m.named_parameters()) for v, m in ms.items()}
    shared = {v: {n: p for n, p in ps.items() if not M.is_qk_norm_gain(n)} for v, ps in params.items()}
    ref = shared["none"]
    L, H, Hkv, dh = SMALL["n_layers"], SMALL["n_heads"], SMALL["n_kv_heads"], SMALL["d_model"] // SMALL["n_heads"]
    extra = {"none": 0, "per_head": 2 * L * dh, "layerwise": L * (H + Hkv) * dh}
    for v in M.VARIANTS:
        assert list(shared[v]) == list(ref)  # same names, same order
        for n, p in shared[v].items():
            assert p.shape == ref[n].shape
            assert torch.equal(p, ref[n]), n  # same seed -> same initial weights (drawn by name)
        assert M.n_parameters(ms[v], exclude_qk_norm=True) == M.n_parameters(ms["none"])
        assert M.n_parameters(ms[v]) - M.n_parameters(ms["none"]) == extra[v]
        names = {n.split(".")[-1] for n, _ in ms[v].named_modules()}
        assert ("q_norm" in names) == (v != "none")
        gains = [p for n, p in params[v].items() if M.is_qk_norm_gain(n)]
        assert all(torch.equal(g, torch.ones_like(g)) for g in gains)
    assert not torch.equal(M.build("none", SMALL, seed=6).lm_head.weight, ms["none"].lm_head.weight)


@pytest.mark.parametrize("variant", ["per_head", "layerwise"])
def test_qk_norm_is_the_only_difference(variant):
    """Replace q_norm/k_norm by the identity: the model computes exactly what the Llama variant computes."""
    base, other = M.build("none", SMALL, seed=2), M.build(variant, SMALL, seed=2)
    ids, att = _batch()
    for layer in other.model.layers:
        layer.self_attn.q_norm = torch.nn.Identity()
        layer.self_attn.k_norm = torch.nn.Identity()
    with torch.no_grad():
        a = base(input_ids=ids, attention_mask=att).logits
        b = other(input_ids=ids, attention_mask=att).logits
    assert torch.allclose(a, b, atol=1e-6)


def test_layerwise_normalises_all_heads_together():
    m = M.build("layerwise", SMALL, seed=3)
    seen = {}
    attn = m.model.layers[1].self_attn
    attn.q_norm.register_forward_hook(lambda mod, i, o: seen.setdefault("q", o.detach()))
    ids, _ = _batch(lengths=(9,))
    with torch.no_grad():
        m(input_ids=ids)
    q = seen["q"][0]  # [T, H * dh], gains are 1 at init
    assert q.shape[-1] == SMALL["d_model"]
    assert torch.allclose(q.pow(2).mean(-1), torch.ones(q.shape[0]), atol=1e-4)  # RMS 1 over all heads
    per_head = q.view(q.shape[0], SMALL["n_heads"], -1).pow(2).mean(-1)
    assert (per_head - 1).abs().max() > 0.05  # but not head by head


def test_qk_norm_labels_in_the_projects_code():
    from sinklib.bound import capture_qk_inputs
    from sinklib.core.models import Loaded

    ids, _ = _batch(lengths=(8,))
    for v in M.VARIANTS:
        m = M.build(v, SMALL, seed=0)
        assert M.qk_norm_of(m) == v
        lm = Loaded(model=m, tokenizer=None, name=f"tiny-{v}", device=torch.device("cpu"), dtype=torch.float32,
                    source="tiny", weights_sha256="", load_seconds=0.0)
        assert lm.qk_norm == v
        layers = capture_qk_inputs(m, ids, layers=[0])
        assert layers[0].spec.norm == v


@pytest.mark.parametrize("variant", M.VARIANTS)
@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("method", ["fused", "chunked"])
def test_probe_equals_eager(variant, side, method):
    m = M.build(variant, SMALL, seed=1)
    with torch.no_grad():  # random gains, so that the QK-norm matters
        for n, p in m.named_parameters():
            if M.is_qk_norm_gain(n):
                p.uniform_(0.5, 2.0, generator=torch.Generator().manual_seed(len(n)))
    ids, att = _batch(side=side)
    rec = sink.record_sink(m, ids, att, method=method)
    ref = sink.eager_sink_probs(m, ids, att, rec.sink_index)
    v = rec.valid[:, None, None, :].expand_as(rec.p)
    assert rec.p.shape == ref.shape == (3, SMALL["n_layers"], SMALL["n_heads"], ids.shape[1])
    assert (rec.p - ref)[v].abs().max().item() <= 1e-5
    assert rec.sink_index.tolist() == att.argmax(dim=1).tolist()


@pytest.mark.parametrize("variant", M.VARIANTS)
def test_sink_strength_by_hand(variant):
    m = M.build(variant, SMALL, seed=4)
    seqs = [torch.randint(3, 96, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (9, 14)]
    res = sink.sink_strength(m, input_ids=seqs, last_k_layers=2, all_layers=True)
    ids, att = sink.pad_batch(seqs)
    ref = sink.eager_sink_probs(m, ids, att, torch.zeros(2, dtype=torch.long))  # [B, L, H, T]
    ps = torch.cat([ref[0, :, :, 1:9], ref[1, :, :, 1:14]], dim=-1).double()
    mass = ps.mean(-1).numpy()
    assert np.allclose(res.mass, mass, atol=1e-6)
    assert res.S == pytest.approx(np.median(np.log(mass / (1 - mass))), abs=1e-5)


def test_layerwise_auto_classes_round_trip(tmp_path):
    from transformers import AutoModelForCausalLM

    m = M.build("layerwise", SMALL, seed=7)
    m.save_pretrained(tmp_path)
    back = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert type(back) is M.LayerwiseQKForCausalLM and tensor_sha(back) == tensor_sha(m)


def test_model_parameter_errors():
    with pytest.raises(ParameterError, match="'variant'"):
        M.build("qk_magic", SMALL)
    with pytest.raises(ParameterError, match="'d_model'"):
        M.size_config(d_model=30, n_heads=4)
    with pytest.raises(ParameterError, match="'n_kv_heads'"):
        M.size_config(n_heads=4, n_kv_heads=3)
    with pytest.raises(ParameterError, match="unknown size parameter"):
        M.size_config(width=3)


# ---------------------------------------------------------------------------------------
# training


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SINKBOOK_CACHE", str(tmp_path))
    return tmp_path


TRAIN = dict(size=dict(d_model=32, n_layers=2, n_heads=2, ffn=64, context=64), tokenizer={"vocab_size": 300, "n_docs": 800},
             steps=30, batch_size=8, seq_len=48, lr=5e-3, n_docs=600, checkpoints=[0, 30],
             sink={"n_prompts": 4, "max_tokens": 48})


def test_pack_rows():
    from sinklib.tiny.train import pack
    from sinklib.tiny.tokenizer import BOS_ID, EOS_ID

    rows = pack([[5, 6, 7], [8, 9], [10, 11, 12, 13]], seq_len=5, bos=True)
    assert rows.tolist() == [[BOS_ID, 5, 6, 7, EOS_ID], [BOS_ID, 8, 9, EOS_ID, 10]]
    assert pack([[5, 6, 7], [8, 9]], seq_len=3, bos=False).tolist() == [[5, 6, 7], [8, 9, EOS_ID]]
    with pytest.raises(ParameterError, match="seq_len"):
        pack([[5]], seq_len=50, bos=True)


def test_training_lowers_loss_is_deterministic_and_cached(tmp_cache):
    from sinklib.tiny.train import train_tiny

    torch.set_num_threads(1)
    run = train_tiny("per_head", **TRAIN)
    loss = run.log["loss"]
    assert len(loss) == 30 and not run.from_cache
    assert np.mean(loss[-5:]) < np.mean(loss[:5]) - 0.5
    assert [c["step"] for c in run.log["checkpoints"]] == [0, 30]
    ck = run.log["checkpoints"][-1]
    assert np.asarray(ck["mass"]).shape == (2, 2) and len(ck["sink_norm"]["ratio"]) == 3
    assert np.isfinite(ck["S"])
    sha = tensor_sha(run.model)
    hit = train_tiny("per_head", **TRAIN)
    assert hit.from_cache and hit.key == run.key and tensor_sha(hit.model) == sha and hit.log == run.log
    again = train_tiny("per_head", refresh=True, **TRAIN)  # retrained from scratch: bit-identical
    assert not again.from_cache and tensor_sha(again.model) == sha and again.log["loss"] == loss
    other = train_tiny("per_head", **{**TRAIN, "seed": 1})
    assert other.key != run.key and tensor_sha(other.model) != sha


def test_train_parameter_errors():
    from sinklib.tiny.train import train_params

    with pytest.raises(ParameterError, match="'steps'"):
        train_params("none", steps=-1)
    with pytest.raises(ParameterError, match="'lr'"):
        train_params("none", lr="fast")
    with pytest.raises(ParameterError, match="'seq_len'"):
        train_params("none", seq_len=4096)
    with pytest.raises(ParameterError, match="vocab_size"):
        train_params("none", size={"vocab_size": 512})
    with pytest.raises(ParameterError, match="'checkpoints"):
        train_params("none", steps=10, checkpoints=[0, 11])
    p = train_params("layerwise", steps=100, bos="false")
    assert p["bos"] is False and p["checkpoints"][0] == 0 and p["checkpoints"][-1] == 100


def test_evaluate_runs_on_a_random_model(tmp_cache):
    from sinklib.tiny.evaluate import evaluate
    from sinklib.tiny.tokenizer import get_tokenizer

    tok = get_tokenizer(vocab_size=300, n_docs=800)
    m = M.build("layerwise", dict(TRAIN["size"], vocab_size=300), seed=0)
    res = evaluate(m, tok, n_format=10, n_knowledge=8, n_prose=4, max_new_tokens=4)
    assert res["format"].n == 10 and set(res["format"].scores) >= {"strict", "lenient", "strict:upper"}
    assert res["knowledge"].n == 8 and 0 <= res["knowledge"].scores["acc"] <= 100
    assert res["perplexity"].scores["ppl"] > 1
    assert all(len(p["loglik"]) == 4 for p in res["knowledge"].per_item)


def test_pilot_end_to_end_and_cached(tmp_cache):
    from sinklib.tiny.pilot import pilot

    kw = dict(TRAIN, steps=5, checkpoints=[0, 5],
              eval_kwargs={"n_format": 5, "n_knowledge": 4, "n_prose": 2, "max_new_tokens": 3})
    r = pilot("layerwise", **kw)
    assert r["variant"] == "layerwise" and r["steps"] == 5 and not r["from_cache"]
    assert [s for s, _ in r["S_curve"]] == [0, 5]
    assert r["S_init"] == pytest.approx(r["S_curve"][0][1], abs=1e-3) and np.isfinite(r["S_final"])
    assert {"strict", "lenient", "knowledge", "ppl", "all_in_band"} <= set(r)
    again = pilot("layerwise", **kw)
    assert again["from_cache"] and again["strict"] == r["strict"] and again["S_final"] == r["S_final"]
    from sinklib.tiny.pilot import S_from_mass, trial_table
    from sinklib.tiny.train import train_tiny

    run = train_tiny("layerwise", **{k: v for k, v in kw.items() if k != "eval_kwargs"})
    assert S_from_mass(run.log["checkpoints"][-1]["mass"], 0) == pytest.approx(run.S_final, abs=1e-4)
    assert r["max_mass_final"] == pytest.approx(float(np.max(run.log["checkpoints"][-1]["mass"])), abs=1e-4)
    t = trial_table([("t", "layerwise", {k: v for k, v in kw.items() if k != "eval_kwargs"}),
                     ("missing", "none", {**{k: v for k, v in kw.items() if k != "eval_kwargs"}, "seed": 9})])
    assert list(t.cached) == [True, False] and t.S_final.iloc[0] == pytest.approx(run.S_final)


def test_pack_docs_one_document_per_row_padding_unscored():
    from sinklib.tiny.tokenizer import BOS_ID, EOS_ID, PAD_ID
    from sinklib.tiny.train import doc_batch, pack_docs, train_params

    rows = pack_docs([[5, 6, 7], [8, 9], [10, 11, 12, 13, 14]], seq_len=5, bos=True)
    assert rows.tolist() == [[BOS_ID, 5, 6, 7, EOS_ID], [BOS_ID, 8, 9, EOS_ID, PAD_ID], [BOS_ID, 10, 11, 12, 13]]
    assert pack_docs([[5, 6]], seq_len=5, bos=False).tolist() == [[5, 6, EOS_ID, PAD_ID, PAD_ID]]
    ids, labels = doc_batch(pack_docs([[5, 6], [8]], seq_len=8, bos=True))
    assert ids.tolist() == [[BOS_ID, 5, 6, EOS_ID], [BOS_ID, 8, EOS_ID, PAD_ID]]  # cut to the longest row
    assert labels.tolist() == [[BOS_ID, 5, 6, EOS_ID], [BOS_ID, 8, EOS_ID, -100]]
    with pytest.raises(ParameterError, match="packing"):
        train_params("none", packing="zip")
    assert "packing" not in train_params("none")  # the default keeps the keys of earlier runs
    assert train_params("none", packing="doc")["packing"] == "doc"


def test_doc_packing_trains_and_scores_only_real_tokens(tmp_cache):
    from sinklib.tiny.train import train_tiny

    torch.set_num_threads(1)
    run = train_tiny("none", **{**TRAIN, "steps": 12, "checkpoints": [0, 12], "packing": "doc"})
    assert len(run.log["loss"]) == 12 and np.mean(run.log["loss"][-3:]) < np.mean(run.log["loss"][:3])
    assert 0 < run.info["tokens_seen"] < 12 * TRAIN["batch_size"] * TRAIN["seq_len"]
