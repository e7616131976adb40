"""Chapter 8's H2 contrasts (sinklib.causal.specific): sink minus control, paired on the items."""
import pandas as pd

from sinklib.causal import specific


def _ev(strict, know):
    return {"outcomes": {"instructions strict": strict, "knowledge acc": know}}


def _table(rows):
    return pd.DataFrame([{"dose": d, "control": c, "mass_removed": m, "matched_ok": ok} for d, c, m, ok in rows])


def test_sink_minus_control_is_paired_on_the_items_and_skips_dose_one_and_untested_matches():
    n = 60
    base = [True] * 40 + [False] * 20
    sink = [False] * 30 + [True] * 10 + [False] * 20      # 30 of 40 passes lost
    rand = base                                              # nothing lost
    results = {(0.0, "none"): _ev(base, base), (0.5, "sink"): _ev(sink, base), (0.5, "random"): _ev(rand, base),
               (0.5, "matched"): _ev(sink, base), (1.0, "sink"): _ev(sink, base), (1.0, "random"): _ev(sink, base)}
    table = _table([(0.5, "sink", 0.7, True), (0.5, "random", 0.2, True), (0.5, "matched", 0.4, False),
                    (1.0, "sink", 1.0, True), (1.0, "random", 1.0, True)])
    rows = specific.contrasts(results, table, model="m")
    assert set(rows.dose) == {0.5} and set(rows.against) == {"random", "matched"}
    r = rows[(rows.against == "random") & (rows.metric == "instructions strict")].iloc[0]
    assert abs(r["sink minus control"] - (-100 * 30 / n)) < 1e-9 and r.hi < 0 and r.tested
    assert (r["mass removed, sink"], r["mass removed, control"]) == (0.7, 0.2)
    m = rows[(rows.against == "matched") & (rows.metric == "instructions strict")].iloc[0]
    assert m["sink minus control"] == 0 and not m.tested
    s = specific.sentence(rows)
    assert "against the random heads the sink ablation cost more strict format outside the noise in 1 of 1" in s
    assert "1 not tested (mass outside the tolerance)" in s and "This is 1 contrast, each" in s
    shown = specific.display(rows)
    assert shown.loc[("m", "instructions strict", 0.5), "matched"] == "not tested"


def test_no_control_below_dose_one_says_untested():
    rows = specific.contrasts({(1.0, "sink"): _ev([True], [True])}, _table([(1.0, "sink", 1.0, True)]), model="m")
    assert specific.sentence(rows) == "no dose below 1 has both the sink heads and a control, so H2 was not tested"
