"""sinklib.adapt.yardstick: KL of a changed model's next-token distribution from the base model's, on a tiny
random model (against a direct computation, padding excluded, zero for the base itself, growing with the size of
a random change), and the size at which the random control matches VL on that yardstick."""
import numpy as np
import pytest
import torch

from sinklib.adapt.yardstick import match_scale, next_token_kl, yardstick_rows
from sinklib.core.models import tiny_model
from sinklib.errors import ParameterError
from sinklib.vl import clone_state_dict, random_direction_like, scaled_change


@pytest.fixture(scope="module")
def setup():
    lm = tiny_model("llama", seed=0)
    base = clone_state_dict(lm.model)
    g = torch.Generator().manual_seed(0)
    other = {k: v + 0.02 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v for k, v in base.items()}
    seqs = [torch.randint(3, 128, (n,), generator=g).tolist() for n in (5, 9, 12)]
    return lm, base, other, seqs


def _direct(model, a, b, seq):
    ids = torch.tensor([seq])
    model.load_state_dict(a)
    with torch.no_grad():
        pa = torch.log_softmax(model(input_ids=ids).logits.double(), -1)
    model.load_state_dict(b)
    with torch.no_grad():
        pb = torch.log_softmax(model(input_ids=ids).logits.double(), -1)
    return float((pa.exp() * (pa - pb)).sum(-1).mean())


def test_kl_matches_a_direct_computation_and_excludes_padding(setup):
    lm, base, other, seqs = setup
    r = next_token_kl(lm.model, {"base": base, "changed": other, "same": base}, seqs, batch_size=3)
    want = [_direct(lm.model, base, other, s) for s in seqs]
    assert r["changed"]["per_seq"] == pytest.approx(want, rel=1e-6)          # one padded batch = unpadded, alone
    assert r["changed"]["kl"] == pytest.approx(np.average(want, weights=[5, 9, 12]), rel=1e-6)
    assert r["changed"]["n_tokens"] == 26 and r["changed"]["kl"] > 0
    assert r["same"]["kl"] == pytest.approx(0.0, abs=1e-12)
    one = next_token_kl(lm.model, {"base": base, "changed": other}, seqs, batch_size=1)
    assert one["changed"]["per_seq"] == pytest.approx(r["changed"]["per_seq"], rel=1e-6)
    assert all(torch.equal(v, lm.model.state_dict()[k]) for k, v in base.items())   # left holding the reference


def test_kl_grows_with_the_size_of_a_random_change(setup):
    lm, base, _, seqs = setup
    adapted = {k: v + 0.01 * torch.ones_like(v) if v.is_floating_point() else v for k, v in base.items()}
    rnd = random_direction_like(base, adapted, seed=0)
    sizes = [0.5, 1.0, 2.0, 4.0]
    states = {"base": base, **{f"x{k:g}": scaled_change(base, rnd, k) for k in sizes}}
    kls = next_token_kl(lm.model, states, seqs)
    values = [kls[f"x{k:g}"]["kl"] for k in sizes]
    assert all(a < b for a, b in zip(values, values[1:]))
    mid = float(np.sqrt(values[1] * values[2]))
    assert 1.0 < match_scale(sizes, values, mid) < 2.0
    rows = yardstick_rows(kls, {f"x{k:g}": k for k in sizes})
    assert [r["size"] for r in rows] == sizes and all(r["per-sequence min"] <= r["KL (nats/position)"] for r in rows)


def test_match_scale_interpolates_in_log_log_and_says_when_out_of_range():
    assert match_scale([1, 2, 4], [0.01, 0.04, 0.16], 0.04) == 2.0
    assert match_scale([4, 1, 2], [0.16, 0.01, 0.04], 0.02) == pytest.approx(2 ** 0.5)   # KL ~ size^2
    assert match_scale([1, 2, 4], [0.01, 0.04, 0.16], 0.5) is None
    assert match_scale([1, 2, 4], [0.01, 0.04, 0.16], 0.001) is None
    with pytest.raises(ParameterError, match="one value per size"):
        match_scale([1, 2], [0.1], 0.1)
    with pytest.raises(ParameterError, match="positive"):
        match_scale([1, 2], [0.0, 0.1], 0.05)


def test_bad_input_is_a_clear_error(setup):
    lm, base, other, seqs = setup
    with pytest.raises(ParameterError, match="reference state 'base'"):
        next_token_kl(lm.model, {"vl": other}, seqs)
    with pytest.raises(ParameterError, match="non-empty"):
        next_token_kl(lm.model, {"base": base, "vl": other}, [[]])


class _Pair:
    """What `pair_kl` reads of a chapter-4 pair: its parameters and its condition -> state mapping."""

    def __init__(self, states, params):
        self.states, self.params = states, params


def test_pair_kl_measures_each_condition_and_size_and_caches_it(setup, tmp_path, monkeypatch):
    from sinklib.adapt.yardstick import kl_sentence, matched_size, pair_kl, round_size

    monkeypatch.setenv("SINKBOOK_CACHE", str(tmp_path))
    lm, base, other, seqs = setup
    lm.tokenizer = None  # a pair_kl without tokenizer pads with 0
    rnd = random_direction_like(base, other, seed=1)
    pair = _Pair({"base": base, "vl": other, "random": rnd}, {"model": "tiny", "seed": 0})
    kls = pair_kl(lm, pair, ["vl"], [2.0, 4.0], seqs=seqs)
    assert set(kls) == {"vl", "random x2", "random x4"}
    assert kls["vl"]["kl"] == pytest.approx(next_token_kl(lm.model, {"base": base, "v": other}, seqs)["v"]["kl"])
    assert kls["random x2"]["kl"] < kls["random x4"]["kl"]
    # a second call reads the cache: no state is touched (a pair whose states would fail if read)
    class Boom(dict):
        def __getitem__(self, k):
            raise AssertionError("read a state")
    cached = pair_kl(lm, _Pair(Boom(base=1, vl=1, random=1), pair.params), ["vl"], [2.0, 4.0], seqs=seqs)
    assert cached == kls
    one = pair_kl(lm, pair, ["random"], seqs=seqs)["random"]["kl"]
    both = {**kls, "random": {"kl": one}}
    k = matched_size(both, [2.0, 4.0])
    assert (k is None) == (not min(one, kls["random x4"]["kl"]) <= kls["vl"]["kl"] <= kls["random x4"]["kl"])
    assert matched_size({"vl": {"kl": kls["random x2"]["kl"]}, "random x2": kls["random x2"],
                         "random x4": kls["random x4"]}, [2.0, 4.0]) == 2.0
    assert round_size(6.349) == 6.3 and round_size(0.01234) == 0.012
    assert "at no size" not in kl_sentence({"tiny": kls}, [2.0, 4.0]) and "tiny: VL moves" in kl_sentence({"tiny": kls}, [2.0, 4.0])
    with pytest.raises(ParameterError, match="no condition 'text_only'"):
        pair_kl(lm, pair, ["text_only"], seqs=seqs)
    with pytest.raises(ParameterError, match="random control"):
        pair_kl(lm, _Pair({"base": base, "vl": other}, {"model": "t2"}), ["vl"], [2.0], seqs=seqs)
    with pytest.raises(ParameterError, match="positive finite"):
        round_size(0.0)


def test_kl_frame_shows_sizes_and_three_digits():
    from sinklib.adapt.yardstick import kl_frame

    kls = {"vl": {"kl": 0.0030124, "per_seq": [0.0043, 0.0016], "n_tokens": 10},
           "random": {"kl": 1.8037e-05, "per_seq": [1.9e-05, 1.7e-05], "n_tokens": 10},
           "random x4": {"kl": 2.8759e-4, "per_seq": [3.0e-4, 2.7e-4], "n_tokens": 10}}
    t = kl_frame({"m": kls}, [4])
    assert list(t["size (x VL's norm)"]) == ["-", "1x", "4x"]
    assert list(t["KL (nats/position)"]) == ["0.00301", "1.8e-05", "0.000288"] and set(t.model) == {"m"}
