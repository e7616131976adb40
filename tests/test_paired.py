"""Paired comparisons on per-item outcomes (sinklib.evals.paired) and the item fingerprint of cached evaluations."""
import numpy as np
import pytest

from sinklib.adapt import pairs
from sinklib.errors import ParameterError
from sinklib.evals import items, paired


def _out(strict, knowledge, nll=(2.0, 3.0, 1.0), ntok=(2, 3, 1)):
    return {"math strict": [bool(x) for x in strict], "knowledge acc": [bool(x) for x in knowledge],
            "perplexity": {"nll": list(nll), "n_tokens": list(ntok)}}


def test_pack_round_trip():
    o = _out([1, 0, 1], [0, 0, 1])
    packed = paired.pack(o)
    assert packed["math strict"] == "101" and packed["perplexity"] == o["perplexity"]
    assert paired.unpack(packed) == o and paired.unpack(o) == o


def test_resample_index_is_shared_per_suite():
    a = paired.resample_index(7, "math", n_boot=50, seed=1)
    assert a.shape == (50, 7) and (a == paired.resample_index(7, "math", n_boot=50, seed=1)).all()
    assert not (a == paired.resample_index(7, "knowledge", n_boot=50, seed=1)).all()
    with pytest.raises(ParameterError, match="no items"):
        paired.resample_index(0, "math")


def test_change_is_paired_and_means_suites():
    base = _out([1] * 10 + [0] * 10, [1] * 10 + [0] * 10)
    same_shift = _out([0] * 2 + [1] * 8 + [0] * 10, [1] * 10 + [0] * 10)  # two items lost, nothing else moves
    v, d = paired.change(base, same_shift, "math strict", n_boot=500)
    assert v == pytest.approx(-10.0)
    e = paired.estimate(v, d)
    assert e.hi <= 0 and e.lo >= -25  # every draw loses 0 to 20 % of the items, never gains
    # unpaired scores 50 % vs 40 % on 20 items would give an interval of about +-30 points
    v2, d2 = paired.change(base, same_shift, ["math strict", "knowledge acc"], n_boot=500)
    assert v2 == pytest.approx(-5.0) and np.allclose(d2, (d + 0) / 2)  # knowledge unchanged: mean halves
    # the same suite's draws are shared: the difference of two changes of one suite is paired too
    _, dv = paired.change(base, same_shift, "math strict", n_boot=500)
    assert np.array_equal(d, dv)
    with pytest.raises(ParameterError, match="same items"):
        paired.change(base, _out([1, 0], [1, 0]), "math strict")


def test_perplexity_change_and_score():
    base, other = _out([1], [1]), _out([1], [1], nll=(4.0, 3.0, 1.0))
    assert paired.score(base, "perplexity ppl") == pytest.approx(np.exp(1.0))
    v, d = paired.change(base, other, "perplexity ppl", n_boot=300)
    assert v == pytest.approx(np.exp(8 / 6) - np.exp(1.0)) and (d >= 0).all()


def test_p_two_sided():
    assert paired.p_two_sided(np.array([1.0, 2, 3, 4])) == pytest.approx(0.25)  # floor 1 / n_boot
    assert paired.p_two_sided(np.array([-1.0, 1, -2, 2])) == 1.0
    assert paired.p_two_sided(np.array([-1.0, 1, 2, 3])) == pytest.approx(0.5)


def test_paired_changes_counts_discordant_items():
    rows = {r["metric"]: r for r in paired.paired_changes({"outcomes": paired.pack(_out([1, 1, 0], [1, 1, 1]))},
                                                          {"outcomes": _out([0, 1, 1], [1, 1, 1])})}
    assert (rows["math strict"]["lost"], rows["math strict"]["gained"]) == (1, 1)
    assert rows["math strict"]["change"] == 0 and rows["knowledge acc"]["p"] == 1.0


def test_fingerprint_follows_the_item_files(tmp_path, monkeypatch):
    f = items.fingerprint(["math", "knowledge"])
    assert f == items.fingerprint(["knowledge", "math"]) and len(f) == 16
    assert f != items.fingerprint(["math"]) and items.fingerprint(["format"]) == items.fingerprint([])
    assert items.fingerprint({"math": 3, "knowledge": 0, "format": 5}) == items.fingerprint(["math"])
    k1 = pairs.evaluation_key({"model": "m"}, "vl", eval_n={"math": 3, "knowledge": 0}, seed=0, prompts=[],
                              sink_kwargs={}, vqa_n=0, eval_batch_size=1)
    assert k1["items"] == items.fingerprint(["math"])
    copy = tmp_path / "math.jsonl"
    copy.write_text(items.FILES["math"].read_text() + "\n")
    monkeypatch.setitem(items.FILES, "math", copy)
    assert items.fingerprint(["math"]) != k1["items"]  # an edited file changes every key that uses it


def test_one_interval_per_change_wherever_it_is_computed():
    """The paired table (paired_changes) and the claims page (claims.delta) give a change the same interval."""
    from sinklib import claims

    base = _out([1] * 12 + [0] * 8, [1, 0] * 10)
    other = _out([1] * 7 + [0] * 13, [1, 1] * 10, nll=(2.5, 3.0, 1.5))
    rows = {r["metric"]: r for r in paired.paired_changes({"outcomes": base}, {"outcomes": paired.pack(other)})}
    doc = {"results": {"outcomes": {"m": {"base": paired.pack(base), "vl": paired.pack(other)}}}}
    for metric in ("math strict", "knowledge acc", "perplexity ppl"):
        e = claims.delta(doc, "m", "vl", "base", (metric,))
        r = rows[metric]
        assert (r["change"], r["lo"], r["hi"]) == pytest.approx((e.v, e.lo, e.hi)), metric
