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
