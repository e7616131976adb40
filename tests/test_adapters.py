"""A LoRA snapshot's record rebuilds its checkpoint without training (sinklib.adapt.adapters)."""
import json
import shutil

import pytest
import torch

from sinklib import vl
from sinklib.adapt import adapters, dose, pairs
from sinklib.core import cache as sk_cache
from sinklib.errors import SinkbookError
from sinklib.vl import lora
from tests.test_dose import _lm
from tests.test_pairs import cache  # noqa: F401 (the fixture: an empty cache folder)


def _params(**kw):
    return pairs.pair_params("tiny-llama", seed=1, stage1_steps=2, stage2_steps=3, batch_size=2, weights="random",
                             lm_method="lora", lora_rank=4, **kw)


def test_merged_weights_are_the_merge_itself():
    lm = _lm()
    method = vl.check_lm_method("lora", 4, None, None)
    keep = {}
    with lora.adapted(lm.model, method, seed=3, keep=keep) as trained:
        with torch.no_grad():
            for p in trained:
                p.add_(torch.randn_like(p) * 0.1)
        base = {n: m.base.weight.detach().clone() for n, m in lm.model.named_modules()
                if isinstance(m, lora.LoRALinear)}
    assert keep and all(k.endswith(("lora_A", "lora_B")) for k in keep)
    # the model now holds merge()'s weights: merged_weights from the saved base gives the same floats
    plain = _lm()
    with torch.no_grad():
        for n, w in base.items():
            plain.model.get_submodule(n).weight.copy_(w)
    merged = lora.merged_weights(plain.model, keep, method.scale)
    assert set(merged) == {f"{n}.weight" for n in base}
    assert all(torch.equal(merged[k], lm.model.get_parameter(k)) for k in merged)
    assert all(torch.equal(plain.model.get_submodule(n).weight, w) for n, w in base.items())  # not changed


@pytest.mark.parametrize("kind", dose.KINDS)
def test_a_deleted_lora_snapshot_is_rebuilt_from_its_record_without_training(cache, monkeypatch, kind):
    lm = _lm()
    base = vl.clone_state_dict(lm.model)
    d = dose.train_series(lm, _params(), kind, [1, 3])
    assert adapters.record_exists(d[3]) and not adapters.record_exists(d[1])  # the last step only
    trained = sk_cache.load_state(d[3], lm.model)
    stamp = sk_cache.checkpoint_stamp(d[3])
    shutil.rmtree(d[3])  # as on another machine, whose cache holds the carried record only
    monkeypatch.setattr(vl, "train_vl", lambda *a, **k: pytest.fail("trained again"))
    monkeypatch.setattr(vl, "train_text_only", lambda *a, **k: pytest.fail("trained again"))
    again = dose.train_series(lm, _params(), kind, [1, 3])
    assert sk_cache.checkpoint_exists(again[3]) and sk_cache.checkpoint_stamp(again[3]) == stamp
    rebuilt = sk_cache.load_state(again[3], lm.model)
    assert all(torch.equal(rebuilt[k], trained[k]) for k in trained)
    assert json.loads((again[3] / "rebuilt.json").read_text())["bit_identical"] is True
    assert all(torch.equal(lm.model.state_dict()[k], v) for k, v in base.items())  # the base again
    if kind == "vl":
        ck = vl.load_checkpoint(again[3], lm.model, weights=False)
        assert ck.projector is not None and ck.encoder is not None


def test_a_record_refuses_a_model_that_does_not_hold_its_base(cache):
    lm = _lm()
    d = dose.train_series(lm, _params(), "text_only", [3])[3]
    shutil.rmtree(d)
    with torch.no_grad():
        lm.model.get_submodule("model.layers.0.self_attn.q_proj").weight.mul_(1.5)
    with pytest.raises(SinkbookError, match="base weights the adapters were trained on"):
        adapters.rebuild(d, lm.model)
    assert not sk_cache.checkpoint_exists(d)


def test_full_fine_tunes_keep_no_record_and_rebuild_is_a_no_op_without_one(cache):
    lm = _lm()
    p = pairs.pair_params("tiny-llama", seed=1, stage1_steps=2, stage2_steps=3, batch_size=2, weights="random")
    d = dose.train_series(lm, p, "text_only", [3])[3]
    assert not adapters.record_exists(d) and adapters.rebuild(d, lm.model) is False
    with pytest.raises(SinkbookError, match="no LoRA adapters"):
        adapters.save_record(d, {}, 2.0, lm.model)
