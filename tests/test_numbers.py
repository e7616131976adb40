"""Signed numbers and intervals in prose: no signed zeros."""
from sinklib.core.numbers import interval, signed


def test_signed_zero_reads_unsigned():
    assert signed(-0.04) == "0.0" and signed(0.04) == "0.0" and signed(0.0) == "0.0"
    assert signed(-0.05) == "-0.1" and signed(1.26) == "+1.3" and signed(-0.004, 2) == "0.00"


def test_interval_formats_each_bound():
    assert interval(1.3, -0.02, 3.0) == "+1.3 [0.0, +3.0]"
    assert interval(-5.0, -9.24, -0.76) == "-5.0 [-9.2, -0.8]"


def test_typographic_minus_for_the_claims_page():
    from sinklib.stats.verdicts import num

    assert signed(-0.4, 2, minus="−") == "−0.40" and num(-0.004, 2) == "0.00" and num(-0.4, 2) == "−0.40"
