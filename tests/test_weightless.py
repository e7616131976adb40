"""Checkpoints carried without their weights (sinklib.core.cache.defer_weights): their logs, stamps and projectors
are read as usual; their weights are retrained only when read, once, and say whether they came out bit-identical."""
import json

import pytest
import torch

from sinklib import vl
from sinklib.adapt import dose, pairs, sweep
from sinklib.core import cache as sk_cache
from sinklib.errors import SinkbookError
from tests.test_dose import _lm, _params
from tests.test_pairs import cache  # noqa: F401 (the fixture: an empty cache folder)


def _strip(path):
    """What another machine holds after `carry import` of a checkpoint too large to carry."""
    sk_cache.weights_record(path)
    (path / sk_cache.WEIGHTS).unlink()
    assert sk_cache.checkpoint_exists(path) and not sk_cache.weights_present(path)


def _no_training(monkeypatch):
    calls = []
    for name in ("train_vl", "train_text_only"):
        real = getattr(vl, name)
        monkeypatch.setattr(vl, name, lambda *a, real=real, **k: calls.append(1) or real(*a, **k))
    return calls


def test_save_checkpoint_records_its_weights_and_a_weightless_one_needs_a_maker(cache):
    lm = _lm()
    d = sk_cache.checkpoint_dir("0123456789abcdef")
    sk_cache.save_checkpoint(d, lm.model, meta={"x": 1})
    rec = json.loads((d / sk_cache.WEIGHTS_RECORD).read_text())
    assert rec["sha256"] == sk_cache.file_sha256(d / sk_cache.WEIGHTS)
    stamp = sk_cache.checkpoint_stamp(d)
    _strip(d)
    assert sk_cache.checkpoint_stamp(d) == stamp                                  # meta.json stays: so does the stamp
    with pytest.raises(SinkbookError, match="carried without its weights"):
        sk_cache.load_state(d, lm.model)
    calls = []
    sk_cache.defer_weights(d, lambda: calls.append(1) or sk_cache.fill_weights(d, lm.model))
    sd = sk_cache.load_state(d, lm.model)
    assert calls == [1] and sk_cache.retrained(d)["bit_identical"] is True
    assert all(torch.equal(sd[k], v) for k, v in lm.model.state_dict().items())
    sk_cache.load_state(d, lm.model)
    assert calls == [1]                                                           # made once


def test_a_weightless_pair_trains_nothing_until_its_weights_are_read(cache, monkeypatch):
    lm = _lm()
    first = pairs.build_pair(lm, _params(), progress=False)
    vl_state = {k: v.clone() for k, v in first.states["vl"].items()}
    for kind in ("vl", "text_only"):
        _strip(pairs.condition_dir(_params(), kind))
    calls = _no_training(monkeypatch)
    again = pairs.build_pair(lm, _params(), progress=False)
    assert calls == [] and again.logs["vl"] == first.logs["vl"] and again.projector is not None
    assert not again.states.ready("vl")
    got = again.states["vl"]                                                      # read: trained once, now
    assert calls == [1] and all(torch.equal(got[k], vl_state[k]) for k in vl_state)
    assert sk_cache.retrained(pairs.condition_dir(_params(), "vl"))["bit_identical"] is True
    assert all(torch.equal(lm.model.state_dict()[k], v) for k, v in again.states["base"].items())
    assert not sk_cache.weights_present(pairs.condition_dir(_params(), "text_only"))  # never read: never trained


def test_weightless_snapshots_of_a_series_are_retrained_once_when_read(cache, monkeypatch):
    lm = _lm()
    base = vl.clone_state_dict(lm.model)
    dirs = dose.train_series(lm, _params(), "vl", [1, 3])
    want = {s: sk_cache.load_state(d, lm.model) for s, d in dirs.items()}
    for d in dirs.values():
        _strip(d)
    calls = _no_training(monkeypatch)
    dirs = dose.train_series(lm, _params(), "vl", [1, 3])
    assert calls == []
    with torch.no_grad():  # whatever the model holds when a snapshot is first read, the series starts from the base
        next(lm.model.parameters()).add_(1.0)
    got = sk_cache.load_state(dirs[3], lm.model)
    assert calls == [1] and all(torch.equal(got[k], want[3][k]) for k in got)
    assert sk_cache.weights_present(dirs[1]) and sk_cache.retrained(dirs[1])["bit_identical"] is True
    assert all(torch.equal(lm.model.state_dict()[k], v) for k, v in base.items())


def test_a_weightless_sweep_point_is_retrained_when_read(cache, monkeypatch):
    lm = _lm()
    pp = sweep.point_params(_params(), 5e-4)
    d = sweep.train_point(lm, pp)
    want = sk_cache.load_state(d, lm.model)
    _strip(d)
    assert not sk_cache.weights_present(sweep.stage1_dir(pp))  # stage 1 never stores the LM: it is the base
    calls = _no_training(monkeypatch)
    assert sweep.train_point(lm, pp) == d and calls == []
    got = sk_cache.load_state(d, lm.model)
    assert calls == [1] and all(torch.equal(got[k], want[k]) for k in got)
    assert sk_cache.retrained(d)["bit_identical"] is True


def test_a_chapter_says_which_checkpoints_it_retrained(cache, monkeypatch):
    monkeypatch.setattr(sk_cache, "_FILLED", [])
    assert "every checkpoint this run read was trained on the machine that ran it" == pairs.retrained_sentence([])
    lm = _lm()
    pairs.build_pair(lm, _params(), progress=False)
    _strip(pairs.condition_dir(_params(), "vl"))
    again = pairs.build_pair(lm, _params(), progress=False)
    again.states["vl"]
    rows = pairs.pair_records({"tiny": again})["retrained"]
    assert rows == [{"checkpoint": f"vl/{pairs.condition_dir(_params(), 'vl').name}", "bit_identical": True}]
    assert pairs.retrained_sentence(rows).startswith("1 checkpoint(s) had been trained on another machine")
    assert pairs.retrained_sentence() == pairs.retrained_sentence(rows)
    assert "1 of 1 came out bit-identical" in pairs.retrained_sentence(rows)
    assert "differ in rounding" in pairs.retrained_sentence(rows + [{"checkpoint": "vl/x", "bit_identical": False}])


def test_the_low_memory_base_is_saved_again_where_it_came_without_weights(cache):
    from sinklib.adapt import fourpanel

    lm = _lm()
    params = {"model": "tiny-llama", "weights": "random"}
    fourpanel.base_source(lm, params, low_memory=True)
    _strip(fourpanel.base_dir(params))
    base = fourpanel.base_source(lm, params, low_memory=True)
    assert sk_cache.weights_present(fourpanel.base_dir(params))
    assert all(torch.equal(base()[k], v) for k, v in lm.model.state_dict().items())


def test_an_evaluation_says_which_machine_computed_it(cache, monkeypatch):
    import types

    import numpy as np

    from sinklib import evals
    from sinklib.core import sink

    lm = _lm()
    monkeypatch.setattr(evals, "run_suites", lambda *a, **k: {})  # the suites themselves are tested elsewhere
    monkeypatch.setattr(sink, "sink_strength", lambda *a, **k: types.SimpleNamespace(S=0.5, mass=np.zeros((1, 1))))
    pair = pairs.Pair(params=_params(), states={"base": vl.clone_state_dict(lm.model)}, projector=None, encoder=None)
    ev = pairs.evaluate_condition(lm, pair, "base", eval_n={"knowledge": 2}, prompts=["a b c"], sink_kwargs={})
    assert ev["machine"] == sk_cache.machine()
    assert set(ev["machine"]) == {"boot", "cpu", "cores"} and len(ev["machine"]["boot"]) == 8
