"""Tests of sinklib.controls.merge: the seven merging settings and QK-RMSNorm injection (fast, tiny tensors)."""
from __future__ import annotations

import math

import pytest
import torch
from mergekit.merge_methods import merge_state_dicts, merge_tensors
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

from sinklib.errors import ParameterError
from sinklib.controls.inject import AlreadyHasQKNorm, inject_qk_norm, injection_error, recovery_finetune
from sinklib.controls.merge import (METHODS, SEVEN_SETTINGS, merge, merge_method, split_keys, star_truncate,
    task_vector_rank_truncate, tensor_seed)

torch.set_num_threads(1)


def _pair(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    base = {
        "w": torch.randn(12, 8, generator=g),
        "v": torch.randn(6, 10, generator=g),
        "gain": torch.randn(8, generator=g),
    }
    adapted = {k: t + 0.3 * torch.randn(t.shape, generator=g) for k, t in base.items()}
    return base, adapted


def _maxdiff(x: dict, y: dict) -> float:
    return max(float((x[k] - y[k]).abs().max()) for k in x)


# ------------------------------------------------------------------ mergekit equivalence

MERGEKIT_CASES = [
    # sinklib name, sinklib params, mergekit method, mergekit params, uses base
    ("task_arithmetic", {"lam": 0.3}, "task_arithmetic", {"weight": 1.0, "lambda": 0.3}, True),
    ("uniform", {}, "linear", {"weight": {"base": 0.5, "adapted": 0.5}}, False),
    ("mix_95_5", {}, "linear", {"weight": {"base": 0.05, "adapted": 0.95}}, False),
    ("linear", {"adapted_weight": 0.8}, "linear", {"weight": {"base": 0.2, "adapted": 0.8}}, False),
    ("ties", {"density": 0.3, "lam": 0.6}, "ties", {"weight": 1.0, "density": 0.3, "lambda": 0.6}, True),
]


@pytest.mark.parametrize("name,params,mk_method,mk_params,uses_base", MERGEKIT_CASES)
def test_deterministic_methods_equal_mergekit_state_dict_merge(name, params, mk_method, mk_params, uses_base):
    base, adapted = _pair(1)
    ours = merge(base, adapted, name, **params)
    ref = merge_state_dicts({"base": base, "adapted": adapted}, mk_method, parameters=mk_params,
                            base="base" if uses_base else None)
    diff = _maxdiff(ours, ref)
    print(f"\n{name} vs mergekit {mk_method}: max abs diff {diff:.3g}")
    assert diff <= 1e-6


def test_mixes_are_the_stated_convex_combinations():
    base, adapted = _pair(2)
    for name, w in (("uniform", 0.5), ("mix_95_5", 0.95)):
        out = merge(base, adapted, name)
        for k in base:  # 95/5 keeps 95 % of the ADAPTED model
            torch.testing.assert_close(out[k], (1 - w) * base[k] + w * adapted[k], atol=1e-6, rtol=0)


def test_ties_single_task_is_magnitude_trim_of_tau():
    base, adapted = _pair(3)
    out = merge(base, adapted, "ties", density=0.25, lam=0.5)
    for k in base:
        tau = adapted[k] - base[k]
        n_keep = max(1, int(0.25 * tau.numel()))
        keep = torch.zeros(tau.numel())
        keep[tau.abs().flatten().argsort(descending=True)[:n_keep]] = 1
        expected = base[k] + 0.5 * tau * keep.view_as(tau)
        torch.testing.assert_close(out[k], expected, atol=1e-6, rtol=0)
        changed = (out[k] != base[k]).sum().item()
        assert changed == n_keep


def test_dare_equals_mergekit_with_per_tensor_seed_and_l1_rescale():
    base, adapted = _pair(4)
    density, lam, seed = 0.4, 0.7, 11
    ours = merge(base, adapted, "dare", density=density, lam=lam, seed=seed)
    worst_mk, worst_formula = 0.0, 0.0
    for k in base:
        torch.manual_seed(tensor_seed(seed, k))
        ref = merge_tensors([base[k], adapted[k]], "dare_linear",
                            parameters={"weight": 1.0, "density": density, "lambda": lam}, base_index=0)
        worst_mk = max(worst_mk, float((ours[k] - ref).abs().max()))
        # the DARE rule by hand: Bernoulli(density) mask, rescaled to tau's L1 norm (mergekit's choice)
        torch.manual_seed(tensor_seed(seed, k))
        tau = adapted[k] - base[k]
        mask = torch.bernoulli(torch.full_like(tau, density))
        kept = tau * mask
        expected = base[k] + lam * kept * (tau.abs().sum() / kept.abs().sum())
        worst_formula = max(worst_formula, float((ours[k] - expected).abs().max()))
    print(f"\ndare vs mergekit dare_linear: max abs diff {worst_mk:.3g}; vs hand formula {worst_formula:.3g}")
    assert worst_mk == 0.0
    assert worst_formula <= 1e-5
    # seeded: same seed same result, another seed another mask; global RNG untouched
    torch.manual_seed(123)
    state = torch.random.get_rng_state()
    again = merge(base, adapted, "dare", density=density, lam=lam, seed=seed)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(again[k], ours[k]) for k in base)
    other = merge(base, adapted, "dare", density=density, lam=lam, seed=seed + 1)
    assert any(not torch.equal(other[k], ours[k]) for k in base)


# ------------------------------------------------------------------ endpoints lambda = 0 / 1

ENDPOINTS = [
    ("task_arithmetic", {"lam": 0.0}, {"lam": 1.0}),
    ("linear", {"adapted_weight": 0.0}, {"adapted_weight": 1.0}),
    ("tsv", {"lam": 0.0}, {"lam": 1.0, "rank_fraction": 1.0}),
    ("star", {"lam": 0.0}, {"lam": 1.0, "eta": 1.0}),
    ("ties", {"lam": 0.0}, {"lam": 1.0, "density": 1.0}),
    ("dare", {"lam": 0.0}, {"lam": 1.0, "density": 1.0}),
]


@pytest.mark.parametrize("name,at_base,at_adapted", ENDPOINTS)
def test_endpoints_give_base_and_adapted(name, at_base, at_adapted):
    base, adapted = _pair(5)
    lo = merge(base, adapted, name, **at_base)
    hi = merge(base, adapted, name, **at_adapted)
    for k in base:
        torch.testing.assert_close(lo[k], base[k], atol=1e-6, rtol=0)
        torch.testing.assert_close(hi[k], adapted[k], atol=1e-6, rtol=0)


def test_seven_settings_registered_with_defaults_and_their_norm_rules():
    """With default parameters: the five shrinking settings move each tensor towards the
    base (Frobenius); STAR keeps lam x the nuclear norm of tau and DARE lam x its L1 norm,
    so those two can move a matrix FURTHER from the base in Frobenius norm."""
    assert len(SEVEN_SETTINGS) == 7 and set(SEVEN_SETTINGS) <= set(METHODS)
    base, adapted = _pair(6)
    for name in SEVEN_SETTINGS:
        out = merge(base, adapted, name)
        for k in base:
            upd, tau = out[k] - base[k], adapted[k] - base[k]
            assert out[k].shape == adapted[k].shape and out[k].dtype == adapted[k].dtype
            if name == "star":
                if tau.dim() == 2:
                    nuc = float(torch.linalg.svdvals(upd).sum()) / float(torch.linalg.svdvals(tau).sum())
                    assert math.isclose(nuc, 1.0, rel_tol=1e-5), (name, k)
            elif name == "dare":
                # L1 rescale, unless the Bernoulli mask dropped every entry (possible for
                # small tensors: mergekit then leaves the tensor at the base)
                l1 = float(upd.abs().sum())
                assert l1 == 0.0 or math.isclose(l1, float(tau.abs().sum()), rel_tol=1e-5), (name, k)
            else:
                assert upd.norm() <= tau.norm() + 1e-6, (name, k)
                if name != "tsv" or tau.dim() == 2:
                    assert upd.norm() < 0.99 * tau.norm(), (name, k)


# ------------------------------------------------------------------ TSV and STAR properties


def test_tsv_rank_and_best_approximation():
    g = torch.Generator().manual_seed(7)
    tau = torch.randn(20, 12, generator=g, dtype=torch.float64)
    s = torch.linalg.svdvals(tau)
    for frac in (0.05, 0.25, 0.5, 0.9):
        k = max(1, math.ceil(frac * 12))
        t = task_vector_rank_truncate(tau, frac)
        assert torch.linalg.matrix_rank(t).item() == k
        # Eckart-Young: the residual holds exactly the discarded singular values
        assert math.isclose(float((tau - t).norm() ** 2), float((s[k:] ** 2).sum()), rel_tol=1e-9, abs_tol=1e-9)
        torch.testing.assert_close(torch.linalg.svdvals(t)[:k], s[:k])
    assert task_vector_rank_truncate(tau, 1.0) is tau  # full rank returns tau exactly


def test_tsv_merge_matrices_low_rank_vectors_linear():
    base, adapted = _pair(8)
    out = merge(base, adapted, "tsv", rank_fraction=0.25, lam=0.5)
    assert torch.linalg.matrix_rank(out["w"] - base["w"]).item() == 2  # ceil(0.25 * 8)
    assert torch.linalg.matrix_rank(out["v"] - base["v"]).item() == 2  # ceil(0.25 * 6)
    torch.testing.assert_close(out["gain"], base["gain"] + 0.5 * (adapted["gain"] - base["gain"]))


def test_star_preserves_nuclear_norm_and_truncates_minimally():
    g = torch.Generator().manual_seed(9)
    tau = torch.randn(16, 10, generator=g, dtype=torch.float64) @ torch.diag(torch.linspace(3, 0.1, 10, dtype=torch.float64))
    s = torch.linalg.svdvals(tau)
    total = float(s.sum())
    for eta in (0.2, 0.4, 0.7, 0.95):
        t = star_truncate(tau, eta)
        r = int(torch.linalg.matrix_rank(t))
        assert float(s[: r - 1].sum()) < eta * total <= float(s[:r].sum()) + 1e-12  # smallest r holding eta
        st = torch.linalg.svdvals(t)
        assert math.isclose(float(st.sum()), total, rel_tol=1e-9)  # nuclear norm preserved
        torch.testing.assert_close(st[:r], s[:r] * total / float(s[:r].sum()))  # uniform rescale of kept values
        assert r < 10
    assert star_truncate(tau, 1.0) is tau
    assert torch.equal(star_truncate(torch.zeros(4, 3), 0.5), torch.zeros(4, 3))


# ------------------------------------------------------------------ keys, dtypes, errors


def test_mismatched_and_extra_keys_are_left_untouched():
    base, adapted = _pair(10)
    adapted = dict(adapted)
    adapted["embed"] = torch.randn(14, 8)  # resized for image tokens
    base["embed"] = torch.randn(12, 8)
    adapted["projector"] = torch.randn(8, 4)  # adapted-only
    adapted["count"] = torch.tensor([3, 4])
    base["count"] = torch.tensor([1, 2])
    base["only_in_base"] = torch.randn(3)
    parts = split_keys(base, adapted)
    assert parts == {"merged": ["w", "v", "gain"], "adapted_only": ["projector"],
                     "shape_mismatch": ["embed"], "not_float": ["count"]}
    out = merge(base, adapted, "uniform")
    assert set(out) == set(adapted)
    for k in ("embed", "projector", "count"):
        assert out[k] is adapted[k]
    assert not torch.equal(out["w"], adapted["w"])


def test_half_precision_and_tied_tensors():
    g = torch.Generator().manual_seed(12)
    b = torch.randn(10, 6, generator=g).to(torch.bfloat16)
    a = (b.float() + 0.2 * torch.randn(10, 6, generator=g)).to(torch.bfloat16)
    base = {"embed": b, "lm_head": b}  # tied: the same tensor twice
    adapted = {"embed": a, "lm_head": a}
    out = merge(base, adapted, "dare", density=0.5, seed=3)
    assert out["embed"].dtype == torch.bfloat16
    assert out["embed"] is out["lm_head"]


def test_parameter_errors_are_clear():
    base, adapted = _pair(13)
    with pytest.raises(ParameterError, match="method"):
        merge(base, adapted, "slerp")
    with pytest.raises(ParameterError, match="unknown parameter.*density"):
        merge(base, adapted, "task_arithmetic", density=0.5)
    with pytest.raises(ParameterError, match="'density'"):
        merge(base, adapted, "ties", density=0.0)
    with pytest.raises(ParameterError, match="'lam'"):
        merge(base, adapted, "tsv", lam=1.5)


def test_merge_methods_are_self_describing_records():
    for name, m in METHODS.items():
        assert m.name == name and m.reference and set(m.defaults) == set(m.ranges)
        assert merge(*_pair(2), name) is not None  # defaults from the signature are valid
    assert METHODS["task_arithmetic"].defaults == {"lam": 0.7}
    assert METHODS["tsv"].defaults == {"rank_fraction": 0.1, "lam": 1.0}
    with pytest.raises(TypeError, match="ranges"):
        merge_method("broken", "nowhere")(lambda base, adapted, *, lam=0.5, seed=0: base)
    assert "broken" not in METHODS


# ------------------------------------------------------------------ backbone merge in a VLM-like wrapper


def _tiny_llama(seed: int = 0, vocab: int = 96, qk_scale: float = 1.0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      bos_token_id=1, eos_token_id=2)
    m = LlamaForCausalLM(cfg).eval()
    if qk_scale != 1.0:
        with torch.no_grad():
            for layer in m.model.layers:
                layer.self_attn.q_proj.weight.mul_(qk_scale)
                layer.self_attn.k_proj.weight.mul_(qk_scale)
    return m


class _TinyVLM(torch.nn.Module):
    def __init__(self, lm: torch.nn.Module):
        super().__init__()
        self.language_model = lm
        self.projector = torch.nn.Linear(5, 64)


def _ids(seed: int, vocab: int = 96, shape=(4, 24)) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


def test_injection_builds_qwen3_with_identical_weights():
    m = _tiny_llama(0)
    new = inject_qk_norm(m, _ids(1))
    assert isinstance(new, Qwen3ForCausalLM)
    sd_old, sd_new = m.state_dict(), new.state_dict()
    extra = sorted(set(sd_new) - set(sd_old))
    assert extra == sorted(f"model.layers.{i}.self_attn.{n}.weight" for i in range(2) for n in ("q_norm", "k_norm"))
    assert all(torch.equal(sd_old[k], sd_new[k]) for k in sd_old)
    assert sd_new["model.layers.0.self_attn.q_norm.weight"].shape == (16,)  # [head_dim], shared across heads


def test_injection_without_the_norms_is_the_original_model():
    """Replacing the injected norms by identities must give back the Llama's outputs: the
    conversion changes nothing else (RoPE, GQA, scaling, MLP, tied head)."""
    m = _tiny_llama(0, qk_scale=5.0)
    new = inject_qk_norm(m, _ids(1))
    for layer in new.model.layers:
        layer.self_attn.q_norm = torch.nn.Identity()
        layer.self_attn.k_norm = torch.nn.Identity()
    err = injection_error(m, new, _ids(2))
    assert err["max_abs_logit_diff"] <= 1e-5


def test_match_rms_gains_are_the_measured_mean_head_rms():
    m = _tiny_llama(0)
    ids = _ids(1)
    mask = torch.ones_like(ids)
    mask[0, 18:] = 0
    new = inject_qk_norm(m, ids, attention_mask=mask)
    store = {}
    h = m.model.layers[1].self_attn.k_proj.register_forward_hook(lambda mod, i, o: store.setdefault("k", o))
    with torch.no_grad():
        m(input_ids=ids, attention_mask=mask)
    h.remove()
    k = store["k"].view(4, 24, 2, 16)  # [B, T, H_kv, head_dim]
    expected = k.pow(2).mean(-1).sqrt()[mask.bool()].mean()
    gain = new.model.layers[1].self_attn.k_norm.weight
    torch.testing.assert_close(gain, expected.expand(16), rtol=1e-5, atol=0)


def test_injected_outputs_close_to_original_and_closer_than_unit_gains():
    """Tolerances measured on these tiny models (rel. logit error, held-out inputs):
    default init: match_rms 2.9e-3 vs ones 0.39; q/k weights x5: 0.081 vs 0.17."""
    for scale, bound in ((1.0, 1e-2), (5.0, 0.15)):
        m = _tiny_llama(0, qk_scale=scale)
        calib, held_out = _ids(1), _ids(2)
        e_match = injection_error(m, inject_qk_norm(m, calib, gain_rule="match_rms"), held_out)
        e_ones = injection_error(m, inject_qk_norm(m, gain_rule="ones"), held_out)
        print(f"\nqk_scale={scale}: match_rms {e_match}\n             ones {e_ones}")
        assert e_match["rel_logit_error"] < bound
        assert e_match["rel_logit_error"] < 0.7 * e_ones["rel_logit_error"]
        assert e_match["mean_kl"] < e_ones["mean_kl"]


def test_injection_errors():
    qcfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    with pytest.raises(AlreadyHasQKNorm, match="already has QK-norm"):
        inject_qk_norm(Qwen3ForCausalLM(qcfg), _ids(0, 64))
    q2 = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1))
    with pytest.raises(ParameterError, match="LlamaForCausalLM"):
        inject_qk_norm(q2, _ids(0, 64))
    with pytest.raises(ParameterError, match="calib_input_ids"):
        inject_qk_norm(_tiny_llama(0))
    with pytest.raises(ParameterError, match="gain_rule"):
        inject_qk_norm(_tiny_llama(0), _ids(0), gain_rule="median")


# ------------------------------------------------------------------ recovery fine-tune


def test_recovery_finetune_reduces_loss_is_seeded_and_can_train_only_gains():
    texts = [list(range(i, i + 12)) for i in range(0, 40, 4)]  # learnable: next id = id + 1
    runs = []
    for _ in range(2):
        new = inject_qk_norm(_tiny_llama(0), _ids(1))
        runs.append(recovery_finetune(new, None, texts, steps=12, lr=3e-3, batch_size=4, seed=5, show_progress=False))
    assert runs[0] == runs[1]
    assert sum(runs[0][-3:]) / 3 < sum(runs[0][:3]) / 3 - 0.1
    new = inject_qk_norm(_tiny_llama(0), _ids(1))
    before = {k: v.clone() for k, v in new.state_dict().items()}
    recovery_finetune(new, None, texts, steps=3, lr=1e-2, batch_size=2, seed=0, train_params="qk_norm", show_progress=False)
    changed = {k for k, v in new.state_dict().items() if not torch.equal(v, before[k])}
    assert changed and all(k.endswith(("q_norm.weight", "k_norm.weight")) for k in changed)
    assert all(p.requires_grad for p in new.parameters())  # restored
    with pytest.raises(ParameterError, match="qk_norm"):
        recovery_finetune(_tiny_llama(0), None, texts, steps=1, train_params="qk_norm", show_progress=False)
    with pytest.raises(ParameterError, match="steps"):
        recovery_finetune(new, None, texts, steps=0)


def test_recovery_texts_are_disjoint_from_the_s_prompts():
    from sinklib.controls import inject
    from sinklib.core.data import load_prompts
    from sinklib.errors import ParameterError

    s_prompts, held = load_prompts(15, seed=0), load_prompts(16, seed=8)
    texts = inject.recovery_texts(s_prompts + held)
    assert texts and not set(texts) & set(s_prompts + held)
    assert set(texts) | set(s_prompts + held) == set(load_prompts())
    assert texts == inject.recovery_texts(held + s_prompts)  # order of the excluded prompts does not matter
    with pytest.raises(ParameterError, match="every calibration prompt"):
        inject.recovery_texts(load_prompts())


def test_scores_by_condition_feed_the_strict_mean():
    from sinklib.controls import inject
    from sinklib.adapt.pairs import STRICT_METRICS, strict_mean

    rows = {"a": {"scores": [{"suite": k.split()[0], "metric": k.split()[1], "score": 10.0 * (i + 1)}
                             for i, k in enumerate(STRICT_METRICS)] + [{"suite": "knowledge", "metric": "acc", "score": 99.0}]}}
    scores = inject.scores_by_condition(rows)
    assert scores["a"]["knowledge acc"] == 99.0
    assert strict_mean(scores["a"]) == pytest.approx(10.0 * (len(STRICT_METRICS) + 1) / 2)


def test_injection_evaluate_builds_the_model_only_on_a_cache_miss(monkeypatch, tmp_path):
    """A recovery fine-tune passed as a builder runs once; the cached result carries its extra record."""
    import types

    from sinklib import evals
    from sinklib.controls import inject
    from sinklib.core import sink

    monkeypatch.setenv("SINKBOOK_CACHE", str(tmp_path))
    monkeypatch.setattr(evals, "run_suites", lambda *a, **k: "res")
    monkeypatch.setattr(evals, "results_table", lambda res: [{"suite": "math", "metric": "strict", "score": 50.0}])
    monkeypatch.setattr(sink, "sink_strength", lambda *a, **k: types.SimpleNamespace(S=0.5))
    calls = []

    def build():
        calls.append(1)
        return torch.nn.Linear(1, 1), {"recovery_loss": [2.0, 1.0]}

    key = {"tag": "t", "eval_n": {"math": 2}, "seed": 0, "prompts": ["a"], "K": 1}
    first = inject.evaluate(build, None, key, max_tokens=8, eval_batch_size=1)
    again = inject.evaluate(build, None, key, max_tokens=8, eval_batch_size=1)
    assert calls == [1] and first == again
    assert first["recovery_loss"] == [2.0, 1.0] and first["S"] == 0.5
    plain = inject.evaluate(torch.nn.Linear(1, 1), None, {**key, "tag": "u"}, max_tokens=8, eval_batch_size=1)
    assert set(plain) == {"scores", "outcomes", "S"}


def test_run_conditions_injects_fine_tunes_both_arms_once_and_keeps_the_original(monkeypatch, tmp_path):
    """Chapter 6's experiment: four conditions; the control arm fine-tunes a copy (the original is untouched);
    a second call reads every condition from the cache and fine-tunes nothing."""
    import types

    from sinklib import evals
    from sinklib.controls import inject
    from sinklib.core import sink
    from sinklib.core.data import load_prompts
    from sinklib.core.models import tiny_model

    class CharTokenizer:  # enough of a tokenizer for prompt_batch and recovery_finetune
        pad_token_id = 0

        def __call__(self, text, add_special_tokens=True, truncation=False, max_length=None):
            ids = [1] * add_special_tokens + [3 + ord(c) % 120 for c in text]
            return {"input_ids": ids[:max_length] if truncation and max_length else ids}

    monkeypatch.setenv("SINKBOOK_CACHE", str(tmp_path))
    seen = []
    monkeypatch.setattr(evals, "run_suites", lambda m, *a, **k: seen.append(m) or "res")
    monkeypatch.setattr(evals, "results_table", lambda res: [{"suite": "math", "metric": "strict", "score": 50.0}])
    monkeypatch.setattr(sink, "sink_strength", lambda *a, **k: types.SimpleNamespace(S=0.5))
    tuned = []
    real_finetune = inject.recovery_finetune
    monkeypatch.setattr(inject, "recovery_finetune", lambda m, *a, **k: tuned.append(m) or real_finetune(m, *a, **k))
    lm = tiny_model("llama", seed=0, vocab_size=128)
    lm.tokenizer = CharTokenizer()
    before = {k: v.clone() for k, v in lm.model.state_dict().items()}
    kw = dict(prompts=load_prompts(4, seed=0), K=2, eval_n={"math": 2}, seed=0, calib_prompts=4, gain_rule="match_rms",
              recovery_steps=2, recovery_lr=1e-3, recovery_batch_size=2, max_tokens=32, eval_batch_size=2,
              show_progress=False)
    rows, err = inject.run_conditions(lm, **kw)
    assert list(rows) == ["original", "injected", "injected + recovery", "original + recovery"]
    assert set(err) >= {"top1_agreement"} and len(tuned) == 2 and len(seen) == 4
    assert type(tuned[0]).__name__ == "Qwen3ForCausalLM" and type(tuned[1]).__name__ == "LlamaForCausalLM"
    assert tuned[1] is not lm.model and all(torch.equal(before[k], v) for k, v in lm.model.state_dict().items())
    assert all(len(rows[c]["recovery_loss"]) == 2 for c in ("injected + recovery", "original + recovery"))
    again, _ = inject.run_conditions(lm, **kw)
    assert again == rows and len(tuned) == 2 and len(seen) == 4  # everything from the cache
    only, _ = inject.run_conditions(lm, **{**kw, "recovery_steps": 0})
    assert list(only) == ["original", "injected"]


def _suite_rows(strict: float, lenient: float) -> list[dict]:
    """evals.results_table rows of one condition whose every instruction item carries one instruction, so that the
    instruction-level scores equal the prompt-level ones (as in chapter 6's 24 sampled items)."""
    rows = []
    for suite, metric, v in [("instructions", "strict", strict), ("instructions", "lenient", lenient),
                             ("instructions", "inst_strict", strict), ("instructions", "inst_lenient", lenient),
                             ("math", "strict", 40.0), ("math", "lenient", 43.3), ("knowledge", "acc", 74.0),
                             ("knowledge", "acc_norm", 67.0), ("perplexity", "ppl", 30.0),
                             ("perplexity", "bits_per_byte", 1.0)]:
        rows.append({"suite": suite, "metric": metric, "score": v, "lo": v - 5, "hi": v + 5, "n": 24, "seconds": 1.0})
    return rows


def test_injection_table_shows_each_quantity_once():
    """Chapter 6's injection table repeated rows: instruction-level scores equal to the prompt-level ones (every
    sampled item had one instruction) beside them; it shows chapter 4's main metrics and S, each once."""
    from sinklib.adapt.scores import MAIN_METRICS
    from sinklib.controls import inject

    rows = {"original": {"scores": _suite_rows(29.2, 33.3), "S": 0.725},
            "injected": {"scores": _suite_rows(12.5, 20.8), "S": 3.563}}
    t = inject.score_table(rows)
    assert list(t.columns) == ["original", "injected"]
    assert list(t.index) == list(MAIN_METRICS) + [("sink", "S")]
    assert not t.duplicated().any()
    assert ("instructions", "inst_strict") not in t.index and ("knowledge", "acc_norm") not in t.index
    assert t.loc[("sink", "S"), "injected"] == "3.563"
    assert t.loc[("instructions", "strict"), "original"] == "29.2 [24.2, 34.2]"


def test_chapter_6_builds_its_tables_through_sinklib():
    """The notebook's injection table comes from `inject.score_table` (its own pivot of every suite metric showed
    the repeated instruction rows) and Figure 6.1 from `merge.recovery_figure`."""
    import json
    from pathlib import Path

    nb = json.loads((Path(__file__).parents[1] / "notebooks" / "06_negative_controls.ipynb").read_text())
    code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    assert "inject.score_table(inj_rows)" in code and "pivot_table" not in code
    assert "merge.recovery_figure(merged, models)" in code and "ax.annotate" not in code
