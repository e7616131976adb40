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
    assert shown.loc[("m", "instructions strict", 0.5), "matched"] == "not tested (mass)"
    k = specific.sentence(rows, ["knowledge acc"], what="knowledge")
    assert k.startswith("against the random heads the sink ablation cost more knowledge outside the noise in 0 of 1")


def test_contrasts_the_other_way_are_named_too():
    base = [True] * 40 + [False] * 20
    lost = [False] * 30 + [True] * 10 + [False] * 20
    results = {(0.0, "none"): _ev(base, base), (0.3, "sink"): _ev(base, base), (0.3, "random"): _ev(lost, base)}
    rows = specific.contrasts(results, _table([(0.3, "sink", 0.7, True), (0.3, "random", 0.5, True)]), model="g")
    s = specific.sentence(rows)
    assert "in 0 of 1 tested contrasts and less in 1 (g instructions strict at 0.3)" in s


def test_no_control_below_dose_one_says_untested():
    rows = specific.contrasts({(1.0, "sink"): _ev([True], [True])}, _table([(1.0, "sink", 1.0, True)]), model="m")
    assert specific.sentence(rows) == "no dose below 1 has both the sink heads and a control, so H2 was not tested"


def test_random_draws_are_pooled_with_the_draws_spread_in_the_interval():
    import numpy as np

    n = 60
    base = [True] * 40 + [False] * 20
    sink = [False] * 30 + [True] * 10 + [False] * 20                  # 30 of 40 passes lost
    draws = {"random": base, "random 2": [False] * 10 + [True] * 30 + [False] * 20,   # 0 and 10 lost
             "random 3": [False] * 20 + [True] * 20 + [False] * 20}                    # 20 lost
    results = {(0.0, "none"): _ev(base, base), (0.5, "sink"): _ev(sink, base),
               **{(0.5, c): _ev(o, base) for c, o in draws.items()}}
    table = _table([(0.5, "sink", 0.7, True), (0.5, "random", 0.2, True), (0.5, "random 2", 0.3, True),
                    (0.5, "random 3", 0.4, True)])
    rows = specific.contrasts(results, table, model="m")
    assert set(rows.against) == {"random", specific.POOLED}       # 'random 2', 'random 3' only pooled
    p = rows[(rows.against == specific.POOLED) & (rows.metric == "instructions strict")].iloc[0]
    each = [-100 * (30 - lost) / n for lost in (0, 10, 20)]
    assert abs(p["sink minus control"] - np.mean(each)) < 1e-9 and p.draws == 3
    assert abs(p["mass removed, control"] - 0.3) < 1e-9 and p.tested
    one = rows[(rows.against == "random") & (rows.metric == "instructions strict")].iloc[0]
    assert abs(one["sink minus control"] - each[0]) < 1e-9
    assert p.hi - p.lo > one.hi - one.lo  # the spread between the sets widens the pooled interval
    s = specific.sentence(rows)
    assert "against the random heads (the first draw)" in s and "against 3 random head sets pooled" in s
    assert "This is 1 contrast (besides 1 pooled re-estimate of the random ones)" in s
    assert specific.contrasts(results, table, model="m", against=("matched",)).empty  # no pooled rows either
    assert specific.POOLED in set(specific.display(rows).columns)


def test_one_random_draw_is_not_pooled():
    base = [True] * 10
    results = {(0.5, "sink"): _ev(base, base), (0.5, "random"): _ev(base, base)}
    rows = specific.contrasts(results, _table([(0.5, "sink", 0.5, True), (0.5, "random", 0.5, True)]), model="m")
    assert set(rows.against) == {"random"}


def test_outside_splits_by_the_one_rule():
    import pandas as pd

    from sinklib.causal.specific import outside

    rows = pd.DataFrame({"lo": [-3.0, 1.0, -1.0], "hi": [-1.0, 4.0, 2.0]})
    more, less = outside(rows)
    assert list(more.index) == [0] and list(less.index) == [1]
