"""The claims page's machinery: the records (`Claim`, `Row`, `Results`, `Evaluated`), the helpers the chapters'
claims share (paired changes and their intervals, per-model rows, chapter 4's scores), and the page (`render`).

A claim is a `Claim` record made with ``@claim(...)``; its function reads the chapters' results through
``sinklib.book.runner.load_results`` and returns a `Row` (our numbers as text, the verdict, the reason). The paper's
values come from ``sinklib.book.reported`` (``data/paper_reported_values.csv``). A chapter that has not run gives a
"not run yet" row. The claims themselves live in one module per chapter's rows (``ch1_3``, ``ch4``, ``ch5_7``,
``ch6``, ``ch8``); ``sinklib.claims.registry`` lists them in the page's order.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sinklib.book import runner as _book
from sinklib.errors import ResultsMissing
from sinklib.book.reported import reported_values
from sinklib.core.resources import checkout_root
from sinklib.evals.pooling import (delta, gap, outcomes_of, paired_change, paired_delta, pooled,  # noqa: F401
                                   pooled_gap, score, seed_conditions)
from sinklib.stats.verdicts import INTERVALS, NOT_RUN, NOT_TESTED, RULES, VERDICTS, combine, wilson_pct

#: the chapters' notebook stems
CH4, CH5, CH6, CH7, CH8 = ("04_vl_adaptation", "05_panel_correlations", "06_negative_controls", "07_controlled_panel",
                           "08_causal_tests")
CH11 = "11_four_panel"
#: how the reason of a row decided on an interim look begins (its verdict may change at the confirmatory look)
INTERIM = "interim look"


@dataclass(frozen=True)
class Row:
    ours: tuple[str, ...]
    verdict: str
    reason: str
    tests: int = 1          # how many tests (one per model, or per setting) the verdict rests on


def verdict_words(row: Row) -> str:
    """A row's outcome as every page words it: the verdict, marked when it rests on an interim look (its reason
    begins with `INTERIM`), so that no page shows an interim verdict bare."""
    return row.verdict + (" (on an interim look)" if row.reason.startswith(INTERIM) else "")


@dataclass(frozen=True)
class Claim:
    id: str
    text: str
    paper_keys: tuple[str, ...]
    chapter: str                              # notebook stem, "" when no chapter tests it
    compute: Callable[["Results"], Row]
    paper: str = ""                           # format string over the reported values of paper_keys


def claim(id: str, text: str, paper_keys: tuple[str, ...] = (), chapter: str = "", paper: str = ""):
    """Make the decorated function (results -> Row) a claim row: the name now holds its `Claim` record (list it in
    ``sinklib.claims.registry.CLAIMS`` to put it on the page)."""
    def deco(fn) -> Claim:
        return Claim(id, text, tuple(paper_keys), chapter, fn, paper)
    return deco


def not_testable(id: str, text: str, paper_keys: tuple[str, ...], chapter: str, paper: str, why: str) -> Claim:
    return claim(id, text, paper_keys, chapter, paper)(lambda res: Row(("—",), NOT_TESTED, why, 0))


class Results:
    """Chapter results, loaded once each; remembers which chapters a claim read (for its models and profile)."""

    def __init__(self):
        self.docs: dict[str, dict] = {}
        self.missing = ""

    def __call__(self, notebook: str) -> dict:
        if notebook not in self.docs:
            try:
                self.docs[notebook] = _book.load_results(notebook)
            except ResultsMissing:
                self.missing = notebook
                raise
        return self.docs[notebook]


# ------------------------------------------------------------------------------------------------
# shared numbers: per-model rows, chapter scores, paired changes


def per_model(results: dict[str, tuple[str, str, str]]) -> Row:
    """{model: (ours, verdict, why)} -> one Row (verdicts combined by `combine`; one test per tested model)."""
    return Row(tuple(f"{m}: {o}. *{v}*: {w}" for m, (o, v, w) in results.items()),
               combine(v for _, v, _ in results.values()), "",
               sum(v != NOT_TESTED for _, v, _ in results.values()))


def strict_metrics() -> tuple[str, ...]:
    """The strict-format metrics ('suite metric') whose mean the format claims test."""
    from sinklib.adapt.pairs import STRICT_METRICS

    return STRICT_METRICS


def power_note(suites: dict[str, tuple[int, float]]) -> str:
    """'smallest fall these suites detect ...' for {metric: (items, base pass rate in %)}, computed with
    `sinklib.evals.power` (paired McNemar, 80 % power, 5 % level, 5 % background flips: chapter 4's power table)."""
    from sinklib.controls.sizes import points
    from sinklib.evals.power import power_table

    if not suites:
        return "smallest fall these suites detect (80 % power): "
    t = power_table({k: (n, p / 100) for k, (n, p) in suites.items()}, flips=(0.05,))
    fall = t["paired, flip 0.05"]
    parts = [f"{s} {points(v)} points ({n} items)" if v == v else f"{s}: no fall of any size ({n} items)"
             for s, v, n in zip(t.suite, fall, t["items"])]
    return "smallest fall these suites detect (80 % power): " + ", ".join(parts)


def vqa_learned(doc: dict, model: str) -> tuple[bool, str]:
    """Precondition: the VL model's VQA interval lies above the blind majority-answer baseline."""
    r = next(r for r in doc["results"]["vqa"] if r["model"] == model)
    e, maj = wilson_pct(r["VL model (%)"], r["n"]), r["majority baseline (%)"]
    return e.lo > maj, f"VQA {e.v:.0f} % [{e.lo:.0f}, {e.hi:.0f}] vs majority {maj:.0f} %"


NO_VQA = "precondition failed: the VL model did not learn the visual task"


# ------------------------------------------------------------------------------------------------
# evaluation and the page

@dataclass
class Evaluated:
    claim: Claim
    row: Row
    models: list[str] = field(default_factory=list)
    profile: str = ""
    read: list[str] = field(default_factory=list)   # the notebooks whose results decided the row, in reading order

    @property
    def decided_by(self) -> list[str]:
        """The chapters whose results decided the row when its own chapter's did not (row 7a on chapter 11's
        panel): they show it too."""
        return [] if not self.read or self.claim.chapter in self.read else self.read


def evaluate(c: Claim) -> Evaluated:
    res = Results()
    try:
        row = c.compute(res)
    except ResultsMissing:
        nb = res.missing
        row = Row(("—",), NOT_RUN, f"run notebooks/{nb}.ipynb (`python -m sinklib.book run --profile full --only {nb[:2]}`)")
    provs = [d.get("provenance") or {} for d in res.docs.values()]
    models = list(dict.fromkeys(m.get("name", "?") if isinstance(m, dict) else str(m)
                                for p in provs for m in p.get("models", [])))
    return Evaluated(c, row, models, ", ".join(sorted({str(p.get("profile", "?")) for p in provs})), list(res.docs))


def paper_text(c: Claim) -> str:
    vals = reported_values()
    text = c.paper.format(**{k: vals[k]["value"] for k in vals}) if c.paper else "—"
    return re.sub(r"(?<!\w)-(?=\d)", "−", text)


def _cell(lines) -> str:
    return "\n\n    ".join(lines)


def tally(evaluated: list[Evaluated]) -> dict[str, int]:
    """How many rows came out each way, in `VERDICTS` order (plus "not run yet")."""
    return {v: sum(e.row.verdict == v for e in evaluated) for v in VERDICTS + (NOT_RUN,)}


def tally_text(evaluated: list[Evaluated]) -> str:
    return ", ".join(f"{v} {n}" for v, n in tally(evaluated).items() if n)


def multiplicity(evaluated: list[Evaluated]) -> str:
    """The sentence on multiple comparisons, with the counts of this page."""
    tested = [e for e in evaluated if e.row.verdict not in (NOT_TESTED, NOT_RUN)]
    n = sum(e.row.tests for e in tested)
    return (f"**Multiplicity.** The {len(tested)} tested rows rest on {n} tests (one per model, or per setting, "
            f"each at the 95 % level); nothing is corrected for multiple comparisons. With {n} tests, about "
            f"{0.05 * n:.1f} would exclude zero by chance if nothing were there, and a row is \"reproduced\" when "
            "one model's test is (and no model's test says the opposite): read a single reproduced model as one "
            "test that came out, not as a confirmation. Exploratory scans (chapter 4's random sizes, chapter 8's "
            "doses) are reported, never used to pick a verdict.")


def _link(chapter: str) -> str:
    return f"{{doc}}`ch. {chapter[:2].lstrip('0')} </book/chapters/{chapter}>`"


def render(evaluated: list[Evaluated]) -> str:
    out = ["% generated by `python -m sinklib.claims` from data/results/ and data/paper_reported_values.csv: "
           "do not edit", "", "**Verdict rules** (one function, `sinklib.stats.verdicts.decide`, for every row):", ""]
    out += [f"- **{v}**: {t}." for v, t in RULES]
    out += ["", INTERVALS, "", f"**Tally**: {tally_text(evaluated)}.", "", multiplicity(evaluated), "",
            "The paper's values come from a public review of the paper ({doc}`paper_reported` says which); the "
            "column \"paper\" shows them as that review reports them.", "",
            "```{list-table}", ":header-rows: 1", ":widths: 4 12 22 14 48", ":class: full-width claims-table", "",
            "* - #", "  - verdict", "  - claim (as reported for the paper)", "  - paper", "  - ours, and why the verdict"]
    for e in evaluated:
        c, r = e.claim, e.row
        where = " · decided by ".join(", ".join(_link(ch) for ch in chs) for chs in ([c.chapter], e.decided_by) if chs)
        where = where if c.chapter else "no chapter"
        meta = " · ".join(x for x in (where, ", ".join(e.models), f"profile {e.profile}" if e.profile else "") if x)
        ours = ((f"*Not measured*: {r.reason}",) if r.ours == ("—",) and r.reason else
                r.ours + ((f"*Why*: {r.reason}",) if r.reason else ()))
        out += [f"* - {c.id}", f"  - **{verdict_words(r)}**", f"  - {_cell([c.text, meta])}",
                f"  - {paper_text(c)}", f"  - {_cell(ours)}"]
    return "\n".join(out + ["```", ""])


def default_path() -> Path:
    return (checkout_root() or Path.cwd()) / "book" / "_generated" / "claims_table.md"
