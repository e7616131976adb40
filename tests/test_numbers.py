"""Signed numbers and intervals in prose: no signed zeros."""
from sinklib.core.numbers import endpoint, interval, signed


def test_signed_zero_reads_unsigned():
    assert signed(-0.04) == "0.0" and signed(0.04) == "0.0" and signed(0.0) == "0.0"
    assert signed(-0.05) == "-0.1" and signed(1.26) == "+1.3" and signed(-0.004, 2) == "0.00"


def test_interval_formats_each_bound():
    assert interval(1.3, -0.02, 3.0) == "+1.3 [-0.02, +3.0]"   # its sign decides: one more decimal
    assert interval(-12.0, -27.8, 0.035) == "-12.0 [-27.8, +0.04]" and interval(0.0, 0.0, 0.0) == "0.0 [0.0, 0.0]"
    assert interval(0.001, -0.004, 0.004) == "0.0 [-0.004, +0.004]" and endpoint(1e-6) == "0.0"  # zero to 4 places
    assert interval(-1.0, -2.0, 0.04, minus="−") == "−1.0 [−2.0, +0.04]" and endpoint(-0.04, minus="−") == "−0.04"
    assert interval(-5.0, -9.24, -0.76) == "-5.0 [-9.2, -0.8]"


def test_typographic_minus_for_the_claims_page():
    from sinklib.stats.verdicts import num

    assert signed(-0.4, 2, minus="−") == "−0.40" and num(-0.004, 2) == "0.00" and num(-0.4, 2) == "−0.40"


def test_direction_is_one_rule_for_every_generated_direction():
    from sinklib.core.numbers import direction

    assert direction(-3.0, -0.1) == "fell" and direction(0.1, 2.0) == "rose"
    assert direction(-1.0, 1.0) == "did not move outside the noise" and direction(-1.0, 1.0, "within noise") == "within noise"
