"""Which chapter reads which chapter's results: the one contract between chapters, and the run order it implies.

A notebook that reads another notebook's results (``data/results/<name>.json``) runs after it when both are
executed together (`run_order`), and goes stale when those results change (`sinklib.book.stale`, through the
sha256 of each file read that the run record keeps). The table lives here, in a module of `record.TOOLING`, not
in the runner that every chapter imports: the files a chapter read are judged on their own, so adding or changing
one chapter's entry stales that chapter (its reads differ from its record) and no other.
"""
from __future__ import annotations

from sinklib.errors import ParameterError

#: notebooks that read another notebook's results, each with what it reads (one line per reader, so that a change
#: to one reader's entry touches one line)
READS_RESULTS_OF: dict[str, tuple[str, ...]] = {
    # chapter 4's pairs, chapter 7's controlled panel (`panel_schema.PANEL_KEYS`), chapter 11's four-model panel
    "05_panel_correlations": ("04_vl_adaptation", "07_controlled_panel", "11_four_panel"),
    "06_negative_controls": ("04_vl_adaptation",),  # chapter 4's VQA majority baseline
    "08_causal_tests": ("04_vl_adaptation",),  # chapter 4's pairs
    "09_sink_panel": ("07_controlled_panel",),  # chapter 7's panel, re-read
    "11_four_panel": ("02_sink_strength", "10_calibration"),  # chapter 2's S, chapter 10's frozen recipe
}


def reads(name: str) -> tuple[str, ...]:
    """The notebooks whose results `name` reads (none for most chapters)."""
    return READS_RESULTS_OF.get(name, ())


def run_order(names: list[str]) -> list[str]:
    """`names` in chapter order, except that a notebook comes after every notebook of `READS_RESULTS_OF`
    it reads that is also in `names` (chapter 5 after chapter 7 in a whole-book run)."""
    todo, done = sorted(names), []
    while todo:
        ready = next((n for n in todo if not any(d in todo for d in reads(n))), None)
        if ready is None:
            raise ParameterError(f"READS_RESULTS_OF has a cycle among {todo}")
        todo.remove(ready)
        done.append(ready)
    return done
