"""Pinned cache keys and per-key seeds: the caches in ~/.cache/sinkbook (trained checkpoints, cached
evaluations) are found by these keys, so they must never change. The expected values were computed
by the code before the sinklib redesign (issue #11) on the same reference parameters."""
from __future__ import annotations

import torch

from sinklib.core import cache
from sinklib.controls import inject, merge
from sinklib.adapt import pairs
from sinklib import vl
from sinklib.vl.scenes import _stream_seed

EVAL_N = {"instructions": 2, "math": 2, "knowledge": 8, "perplexity": 2}
PROMPTS = ["Hello there.", "Why?"]


def _pair_params() -> dict:
    return pairs.pair_params("smollm2-135m", weights="0123abcd")


def test_pair_params_of_the_reference_recipe():
    assert _pair_params() == {"model": "smollm2-135m", "weights": "0123abcd", "seed": 0, "image_size": 48,
                              "stage1_steps": 200, "stage2_steps": 60, "batch_size": 32, "lr_projector": 0.01,
                              "lr_lm": 5e-05, "lr_projector_stage2": 5e-05, "schedule": "constant"}


def test_checkpoint_keys_are_pinned():
    pp = _pair_params()
    assert cache.key({**pp, "kind": "vl"}) == "85e9dd50e0bca48b"
    assert cache.key({**pp, "kind": "text_only"}) == "577b3d044890991f"
    assert pairs.condition_dir(pp, "vl").parts[-2:] == ("vl", "85e9dd50e0bca48b")
    assert pairs.condition_dir(pp, "text_only").parts[-2:] == ("vl", "577b3d044890991f")


def test_evaluation_keys_are_pinned():
    common = dict(eval_n=EVAL_N, seed=0, prompts=PROMPTS, sink_kwargs={"max_tokens": 32, "last_k_layers": 10},
                  vqa_n=16, eval_batch_size=8)
    assert cache.key(pairs.evaluation_key(_pair_params(), "vl", **common)) == "1847c54e2fa6104e"  # outcomes, item files
    key = pairs.evaluation_key(_pair_params(), "merge:tsv", **common, key_extra=merge.evaluation_extra("tsv"))
    assert cache.key(key) == "e17aee59f16a3bee"


def test_merge_defaults_in_keys_are_pinned():
    assert {m: merge.METHODS[m].defaults for m in merge.METHODS} == {
        "task_arithmetic": {"lam": 0.7}, "uniform": {}, "mix_95_5": {}, "tsv": {"rank_fraction": 0.1, "lam": 1.0},
        "star": {"eta": 0.4, "lam": 1.0}, "ties": {"density": 0.2, "lam": 1.0}, "dare": {"density": 0.1, "lam": 1.0},
        "linear": {"adapted_weight": 0.5}}


def test_injection_key_is_pinned():
    key = inject.injection_key("injected+recovery", model="smollm2-135m", weights="0123abcd", eval_n=EVAL_N, seed=0,
                               prompts=PROMPTS, K=10, gain_rule="match_rms", calib=4, recovery=[2, 0.0001, 2])
    assert cache.key(key) == "828be7dbf968b7f2"  # with the item files' fingerprint


def test_seeds_per_key_keep_each_call_sites_modulus():
    assert [merge.tensor_seed(0, "model.layers.0.self_attn.q_proj.weight"), merge.tensor_seed(7, "lm_head.weight")] \
        == [2860660309, 2612591911]
    assert cache.key_seed(5, "x", cache.RANDOM_SEED_MODULUS) == (5 * 1_000_003 + __import__("zlib").crc32(b"x")) % 2**63
    big = 2**63  # the moduli differ only for seeds this large: each site keeps its own
    assert cache.key_seed(big, "k", cache.MERGE_SEED_MODULUS) != cache.key_seed(big, "k", cache.RANDOM_SEED_MODULUS)
    assert [_stream_seed(0, "lm", 3), _stream_seed(5, "eval", 0)] == [3921312021, 2777962618]


def test_random_direction_values_are_pinned():
    g = torch.Generator().manual_seed(0)
    base = {"a.weight": torch.randn(4, 3, generator=g), "b.bias": torch.randn(5, generator=g)}
    adapted = {k: v + 0.1 * torch.randn(v.shape, generator=g) for k, v in base.items()}
    rd = vl.random_direction_like(base, adapted, seed=3)
    want = {"a.weight": [1.700103759765625, -0.2991684377193451, -2.0250799655914307, 0.7514171004295349,
                         -1.0631625652313232, -1.427270531654358, 0.3195570111274719, 0.9218685030937195,
                         -0.6440601944923401, -0.46741214394569397, -0.6303555965423584, 0.1928129941225052],
            "b.bias": [-0.8349927663803101, 0.9645815491676331, -1.1097171306610107, 0.20377565920352936,
                       -0.6032480597496033]}
    assert {k: v.double().flatten().tolist() for k, v in rd.items()} == want


def test_cached_json_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("SINKBOOK_CACHE", str(tmp_path))
    calls = []

    def compute():
        calls.append(1)
        return {"x": 1.5}

    assert cache.cached_json({"a": 1}, compute, folder="t") == {"x": 1.5}
    assert cache.cached_json({"a": 1}, compute, folder="t") == {"x": 1.5} and len(calls) == 1
    assert (tmp_path / "t" / f"{cache.key({'a': 1})}.json").exists()


def test_empty_cache_variable_means_the_default(monkeypatch, tmp_path):
    """SINKBOOK_CACHE="" (an unset-looking variable) must not turn the working directory into the cache."""
    from pathlib import Path

    from sinklib.core.models import cache_dir

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SINKBOOK_CACHE", "")
    assert cache_dir() == tmp_path / ".cache" / "sinkbook"
    monkeypatch.setenv("SINKBOOK_CACHE", str(tmp_path / "c"))
    assert cache_dir() == Path(tmp_path / "c")
