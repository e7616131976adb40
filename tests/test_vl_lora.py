"""The LoRA option of the VL adaptation and its text-only control (`sinklib.vl.lora`), on tiny random models."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from sinklib import vl
from sinklib.adapt import pairs
from sinklib.core import cache
from sinklib.core import train as core_train
from sinklib.core.anatomy import n_layers
from sinklib.core.models import tiny_model
from sinklib.errors import ParameterError
from sinklib.vl import lora
from tests.test_vl import TOK

#: cache keys of default (full) recipes computed before the LoRA option existed: existing checkpoints stay valid
BEFORE = {"smollm2-135m": ("e0ebde32f20d9e77", "2cf8eeed532589a0", "be120143c3f71f10"),
          "gemma3-270m": ("fce90dc98c4817dd", "eef7197180561662", "60ddc409700eca6f")}
BEFORE_TRAIN_PARAMS = {"vl": "4d6046d0a236f7ad", "text_only": "74125ccf66fe5f3e"}


def _tiny_qwen2(seed: int = 0) -> nn.Module:
    """A tiny Qwen2 (the architecture of Qwen2.5-Coder: biases on q, k, v), not among `tiny_model`'s archs."""
    import transformers as tf

    torch.manual_seed(seed)
    cfg = tf.Qwen2Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True, use_sliding_window=False)
    return tf.AutoModelForCausalLM.from_config(cfg).eval()


def _model(arch: str) -> nn.Module:
    return _tiny_qwen2() if arch == "qwen2" else tiny_model(arch, seed=0).model


def _randomise_adapters(model: nn.Module) -> None:
    g = torch.Generator().manual_seed(5)
    for m in model.modules():
        if isinstance(m, lora.LoRALinear):
            m.lora_B.data.copy_(torch.randn(m.lora_B.shape, generator=g) * 0.1)


def _spy_runs(monkeypatch) -> list[dict]:
    """Record, for each `train.run` call, its parameter groups and which parameters have a gradient after it."""
    runs: list[dict] = []
    real = core_train.run

    def spy(param_groups, *a, **k):
        sec = real(param_groups, *a, **k)
        runs.append({"groups": [list(g["params"]) for g in param_groups]})
        return sec
    monkeypatch.setattr(core_train, "run", spy)
    return runs


# ---------------------------------------------------------------------------------------
# (a) only the adapters and the projector are trained; the LM's weights stay as they were until the merge

def test_lora_trains_only_adapters_and_projector(monkeypatch):
    model = tiny_model("llama", seed=0).model
    base = vl.clone_state_dict(model)
    lm_ids = {id(p) for p in model.parameters()}
    method = vl.check_lm_method("lora", lora_rank=2)
    seen: dict = {}
    real_merge = lora.merge

    def check_before_merge(m):  # stage 2 is over: the base weights are untouched and got no gradient
        seen["unchanged"] = all(torch.equal(base[k], v) for k, v in
                                {n.replace(".base.", "."): p for n, p in m.named_parameters()}.items() if k in base)
        seen["no_grad"] = all(p.grad is None for p in m.parameters() if id(p) in lm_ids)
        seen["adapters_grad"] = all(w.lora_A.grad is not None for w in m.modules() if isinstance(w, lora.LoRALinear))
        return real_merge(m)
    monkeypatch.setattr(lora, "merge", check_before_merge)
    runs = _spy_runs(monkeypatch)
    r = vl.train_vl(model, TOK, stage1_steps=1, stage2_steps=2, batch_size=2, lr_lm=1e-2, seed=0, progress=False,
                    lm_method="lora", lora_rank=2)
    assert seen == {"unchanged": True, "no_grad": True, "adapters_grad": True}
    stage2 = runs[1]["groups"]
    assert not any(id(p) in lm_ids for p in stage2[0])  # the LM group: adapters only, no base weight
    assert [id(p) for p in stage2[1]] == [id(p) for p in r.projector.parameters()]
    n_adapter = sum(p.numel() for p in stage2[0])
    assert n_adapter == lora.adapter_parameters(model, method) == 4 * 2 * (128 + 96 + 96 + 128 + 192 + 192 + 192)
    assert all(p.requires_grad for p in model.parameters())  # the caller's flags restored


def test_full_trains_every_lm_parameter_in_model_order(monkeypatch):
    """The default keeps the old optimiser groups exactly (every LM parameter, model order): the same numbers."""
    model = tiny_model("llama", seed=0).model
    runs = _spy_runs(monkeypatch)
    vl.train_vl(model, TOK, stage1_steps=1, stage2_steps=1, batch_size=2, progress=False)
    vl.train_text_only(model, TOK, steps=1, batch_size=2, progress=False)
    want = [id(p) for p in model.parameters()]
    assert [id(p) for p in runs[1]["groups"][0]] == want and [id(p) for p in runs[2]["groups"][0]] == want


# ---------------------------------------------------------------------------------------
# (b) the merge gives back a plain model of the original class with the wrapped model's outputs

@pytest.mark.parametrize("arch", ["llama", "gemma3", "qwen2"])
def test_merge_restores_a_plain_model_with_the_same_outputs(arch):
    model = _model(arch)
    cls, keys = type(model), list(model.state_dict())
    before = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    method = vl.check_lm_method("lora", lora_rank=4, lora_alpha=8)
    adapters = lora.attach(model, method, seed=3)
    assert len(adapters) == 2 * len(lora.DEFAULT_TARGETS) * n_layers(model)  # A and B per projection and layer
    _randomise_adapters(model)
    ids = torch.randint(3, 128, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        wrapped = model(input_ids=ids).logits
        with lora.plain_view(model):  # what a training callback sees: original keys, merged weights
            assert list(model.state_dict()) == keys
            viewed = model(input_ids=ids).logits
        assert any(isinstance(m, lora.LoRALinear) for m in model.modules())  # adapters back after the view
        assert lora.merge(model) == len(adapters) // 2
        merged = model(input_ids=ids).logits
    assert type(model) is cls and not any(isinstance(m, lora.LoRALinear) for m in model.modules())
    assert list(model.state_dict()) == keys
    after = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    assert after.keys() == before.keys() and all(after[n] is before[n] for n in before)  # the same modules
    assert torch.allclose(merged, wrapped, atol=1e-5, rtol=1e-4)
    assert torch.allclose(viewed, wrapped, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(merged, _model(arch)(input_ids=ids).logits, atol=1e-3)  # the adapters did change it


def test_attach_is_seeded_per_module_and_starts_at_the_base_model():
    a = tiny_model("llama", seed=0).model
    b = tiny_model("llama", seed=0).model
    method = vl.check_lm_method("lora", lora_rank=2)
    pa, pb = lora.attach(a, method, seed=1), lora.attach(b, method, seed=1)
    assert all(torch.equal(x, y) for x, y in zip(pa, pb))
    assert not torch.equal(pa[0], pa[2])  # q_proj and k_proj of one layer draw different A
    assert all(int(torch.count_nonzero(p.detach())) == 0 for p in pa[1::2])  # every B starts at zero
    other = lora.attach(tiny_model("llama", seed=0).model, method, seed=2)
    assert not torch.equal(pa[0], other[0])


# ---------------------------------------------------------------------------------------
# (c) a short LoRA adaptation changes the targeted LM weights (merged), with far fewer trainable parameters

def test_short_lora_training_changes_only_the_targeted_weights(monkeypatch):
    model = tiny_model("llama", seed=0).model
    base, keys = vl.clone_state_dict(model), list(model.state_dict())
    views = []
    runs = _spy_runs(monkeypatch)
    r = vl.train_vl(model, TOK, stage1_steps=1, stage2_steps=3, batch_size=2, lr_lm=1e-2, seed=0, progress=False,
                    lm_method="lora", lora_rank=2, lora_targets=["q_proj", "v_proj", "down_proj"],
                    callback=lambda step, m: views.append(list(m.state_dict()) == keys), callback_every=1)
    assert views and all(views)  # every callback saw the plain model
    assert type(model).__name__ == "LlamaForCausalLM" and list(model.state_dict()) == keys
    changed = {k for k, v in model.state_dict().items() if not torch.equal(base[k], v)}
    assert changed == {f"model.layers.{i}.{m}.weight" for i in range(4)
                       for m in ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj")}
    assert r.params["lm_method"] == "lora" and r.params["lora_rank"] == 2
    assert r.params["lora_targets"] == ["q_proj", "v_proj", "down_proj"]
    n_lora = sum(p.numel() for p in runs[1]["groups"][0])
    n_full = sum(p.numel() for p in model.parameters())
    assert n_lora == 4 * 2 * ((64 + 64) + (64 + 32) + (128 + 64)) and n_lora < 0.05 * n_full
    txt = tiny_model("llama", seed=0).model
    t = vl.train_text_only(txt, TOK, steps=2, batch_size=2, lr=1e-2, seed=0, progress=False, lm_method="lora",
                           lora_rank=2)
    assert t.params["lm_method"] == "lora" and not any(isinstance(m, lora.LoRALinear) for m in txt.modules())
    assert not torch.equal(txt.model.layers[0].mlp.up_proj.weight, base["model.layers.0.mlp.up_proj.weight"])
    assert torch.equal(txt.model.embed_tokens.weight, base["model.embed_tokens.weight"])


def test_lora_pair_is_built_cached_and_keyed_apart(tmp_path, monkeypatch):
    monkeypatch.setenv("SINKBOOK_CACHE", str(tmp_path))
    lm = tiny_model("llama", seed=0)
    lm.tokenizer = TOK
    full = pairs.pair_params("tiny-llama", seed=1, stage1_steps=1, stage2_steps=1, batch_size=2, weights="r")
    p = pairs.pair_params("tiny-llama", seed=1, stage1_steps=1, stage2_steps=1, batch_size=2, weights="r",
                          lm_method="lora", lora_rank=2)
    assert pairs.condition_dir(p, "vl") != pairs.condition_dir(full, "vl")
    built = pairs.build_pair(lm, p, progress=False)
    for cond in ("vl", "text_only"):
        assert built.logs[cond]["params"]["lm_method"] == "lora"
        assert set(built.states[cond]) == set(built.states["base"])
    assert pairs.load_pair(lm, p).trained_now == {"vl": False, "text_only": False}


def test_dose_series_and_sweep_point_reproduce_a_lora_pair(tmp_path, monkeypatch):
    """The dose-response snapshots (saved by a training callback) and a sweep point retrain with the pair's LoRA
    options: their last state is the pair's own, bit for bit."""
    from sinklib.adapt import dose, sweep

    monkeypatch.setenv("SINKBOOK_CACHE", str(tmp_path))
    lm = tiny_model("llama", seed=0)
    lm.tokenizer = TOK
    p = pairs.pair_params("tiny-llama", seed=1, stage1_steps=1, stage2_steps=2, batch_size=2, lr_lm=1e-2,
                          weights="r", lm_method="lora", lora_rank=2)
    built = pairs.build_pair(lm, p, progress=False)
    for kind in dose.KINDS:
        dose.train_series(lm, p, kind, [1, 2])
        assert dose.final_matches(lm, p, kind, built.states[kind]) == 0.0
    sweep.train_point(lm, p)
    assert sweep.point_matches(lm, p, built.states["vl"]) == 0.0


# ---------------------------------------------------------------------------------------
# (d) the default recipe's keys are those of before the option

def test_default_keys_are_unchanged():
    for model, (pair, vl_key, text_key) in BEFORE.items():
        p = pairs.pair_params(model, weights="w")
        assert not set(vl.LORA_KEYS) & set(p)
        assert (cache.key(p), cache.key({**p, "kind": "vl"}), cache.key({**p, "kind": "text_only"})) == \
            (pair, vl_key, text_key)
        assert pairs.pair_params(model, weights="w", lm_method="full") == p
    r = vl.train_vl(tiny_model("llama", seed=0).model, TOK, stage1_steps=0, stage2_steps=0, progress=False)
    t = vl.train_text_only(tiny_model("llama", seed=0).model, TOK, steps=0, progress=False)
    assert (cache.key(r.params), cache.key(t.params)) == (BEFORE_TRAIN_PARAMS["vl"], BEFORE_TRAIN_PARAMS["text_only"])
    lo = pairs.pair_params("smollm2-135m", weights="w", lm_method="lora")
    assert lo == {**pairs.pair_params("smollm2-135m", weights="w"), "lm_method": "lora", "lora_rank": 16,
                  "lora_alpha": 32.0, "lora_targets": list(lora.DEFAULT_TARGETS)}
    assert vl.lm_method_of(lo) == vl.check_lm_method("lora") and vl.lm_method_of(p).name == "full"
    nb = {"seed": 0, "image_size": 48, "stage1_steps": 1, "stage2_steps": 1, "batch_size": 2, "lr_projector": 1e-2,
          "lr_lm": "recipe", "lr_projector_stage2": "recipe", "schedule": "constant"}
    assert "lm_method" not in pairs.pair_params_of("smollm2-135m", nb, weights="w")
    assert pairs.pair_params_of("smollm2-135m", {**nb, "lm_method": "lora", "lora_rank": 8}, "w")["lora_rank"] == 8


def test_memory_rule_of_thumb():
    assert lora.training_bytes(10**9) == 16 * 10**9
    assert lora.training_bytes(10**9, 10**7) == 4 * 10**9 + 16 * 10**7


# ---------------------------------------------------------------------------------------
# (e) clear errors

def test_bad_lora_options_raise_clear_errors():
    with pytest.raises(ParameterError, match="lm_method.*'full', 'lora'"):
        vl.check_lm_method("qlora")
    with pytest.raises(ParameterError, match="lora_rank"):
        vl.check_lm_method("lora", lora_rank=0)
    with pytest.raises(ParameterError, match="lora_alpha"):
        vl.check_lm_method("lora", lora_alpha=0)
    with pytest.raises(ParameterError, match="repeats"):
        vl.check_lm_method("lora", lora_targets=["q_proj", "q_proj"])
    with pytest.raises(ParameterError, match="'lora_rank' apply only with lm_method='lora'"):
        pairs.pair_params("m", lora_rank=8)
    model = tiny_model("llama", seed=0).model
    base = vl.clone_state_dict(model)
    with pytest.raises(ParameterError, match=r"\['qkv_proj'\].*match no linear layer.*allowed: down_proj, gate_proj"):
        vl.train_vl(model, TOK, stage1_steps=1, stage2_steps=1, batch_size=2, progress=False, lm_method="lora",
                    lora_targets=["q_proj", "qkv_proj"])
    with pytest.raises(ParameterError, match="match no linear layer"):
        vl.train_text_only(model, TOK, steps=1, batch_size=2, progress=False, lm_method="lora", lora_targets="lm_head")
    assert all(torch.equal(base[k], v) for k, v in model.state_dict().items())  # nothing trained, nothing wrapped
    lora.attach(model, vl.check_lm_method("lora"))
    with pytest.raises(ParameterError, match="already carries LoRA adapters"):
        lora.attach(model, vl.check_lm_method("lora"))
