"""Power of the paired and unpaired comparisons (#13)."""
import math

import numpy as np
import pytest
from scipy import stats

from sinklib.evals import power
from sinklib.errors import ParameterError


def test_one_way_mcnemar_power_is_a_binomial_tail():
    """With every change one way, McNemar rejects at 5 % once 6 items flipped (2 / 2^6 < 0.05 <= 2 / 2^5)."""
    for n, d in ((24, 0.3), (100, 0.07), (30, 0.0)):
        expect = float(stats.binom.sf(5, n, d)) if d else 0.0
        assert power.mcnemar_power(n, d) == pytest.approx(expect, abs=1e-12)


def test_power_by_simulation_with_churn():
    rng = np.random.default_rng(0)
    n, delta, flip, sims = 40, 0.2, 0.1, 4000
    # the discordant counts of a multinomial: down with p10 = delta + flip, up with p01 = flip
    b = rng.binomial(n, delta + flip, sims)
    c = np.array([rng.binomial(n - bb, flip / (1 - delta - flip)) for bb in b])
    p = np.array([1.0 if bb + cc == 0 else stats.binomtest(int(cc), int(bb + cc)).pvalue for bb, cc in zip(b, c)])
    sim = float((p <= 0.05).mean())
    assert power.mcnemar_power(n, delta, flip) == pytest.approx(sim, abs=0.05)


def test_min_detectable_drop_and_table():
    mde = power.min_detectable_drop(24, 0.5)
    assert power.mcnemar_power(24, mde / 100) >= 0.8 > power.mcnemar_power(24, mde / 100 - 0.005)
    assert power.min_detectable_drop(300, 0.5) < mde < power.min_detectable_drop(24, 0.5, flip=0.05)
    assert power.min_detectable_drop(24, 0.5, paired=False) > mde  # pairing helps
    assert math.isnan(power.min_detectable_drop(10, 0.2))  # losing 2 items of 10 is never significant
    t = power.power_table({"math": (30, 0.4), "knowledge": (100, 0.7)})
    assert list(t.columns) == ["suite", "items", "base (%)", "paired, flip 0", "paired, flip 0.05", "unpaired"]
    assert t.loc[1, "paired, flip 0"] < t.loc[0, "paired, flip 0"]
    with pytest.raises(ParameterError, match="exceeds 1"):
        power.mcnemar_power(10, 0.9, flip=0.1)
    with pytest.raises(ParameterError, match="outside"):
        power.unpaired_power(10, 0.2, 0.5)


def test_base_power_table_reads_outcomes():
    from sinklib.evals.paired import pack

    out = {"m": pack({"math strict": [True] * 150 + [False] * 150, "knowledge acc": [True] * 3 + [False] * 7,
                      "perplexity": {"nll": [1.0], "n_tokens": [1]}})}
    t = power.base_power_table(out, flips=(0.0,))
    assert list(t.suite) == ["m: math strict", "m: knowledge acc"] and list(t["items"]) == [300, 10]
    assert t["base (%)"].tolist() == [50.0, 30.0]
    assert t.loc[0, "paired, flip 0"] == power.min_detectable_drop(300, 0.5)
    assert t.loc[0, "paired, flip 0"] < t.loc[0, "unpaired"]  # pairing detects smaller falls


def test_sentence_names_undetectable_falls():
    import pandas as pd

    t = pd.DataFrame([{"suite": "m: math strict", "items": 300, "base (%)": 50.0, "paired, flip 0.05": 9.5,
                       "unpaired": 11.0}, {"suite": "m: x", "items": 2, "base (%)": 0.0,
                                           "paired, flip 0.05": float("nan"), "unpaired": float("nan")}])
    assert power.sentence(t) == ("m: math strict 9.5 points paired (unpaired 11.0 points) at a base accuracy of 50 % "
                                 "on 300 items; m: x no fall of any size paired (unpaired no fall of any size) at a "
                                 "base accuracy of 0 % on 2 items")
