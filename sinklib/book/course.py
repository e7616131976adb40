"""The course guide's measured run times: every chapter on the quick profile, run as a student runs it.

``python -m sinklib.book.course time`` executes every notebook with the quick profile into a temporary folder twice:
first with empty caches for everything the chapters train or evaluate (a student's first run; the de-quantised
embedded models are reused from the normal cache, their one-time conversion is measured on the performance page),
then again with those caches filled (a rerun after changing a plotting or text parameter). Results and executed
copies go to temporary folders, so nothing the book committed is touched. It saves
``data/results/course_times.json``; ``python -m sinklib.book.course report`` turns that into
``book/_generated/course_times.md``, which the course guide includes. No time on the page is typed by hand.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from sinklib.errors import ParameterError, ResultsMissing

# which chapters each 90-minute session runs (the guide's prose says why); every chapter exactly once. Sessions 1
# and 2 are the course; session 3 is an optional extension (or homework) on the controlled panel and the causal tests
SESSIONS: dict[str, list[str]] = {
    "Session 1: what a sink is and how to measure it": ["01", "02", "03"],
    "Session 2: adaptation, the panel and the repairs": ["04", "05", "06"],
    "Session 3 (optional): a controlled panel, switching the sink off, and the real-model panel": ["07", "08", "09", "10",
                                                                                                   "11"],
}
SESSION_MINUTES = 90
RESULTS_NAME = "course_times"


def session_of(chapter: str) -> str:
    """The session a chapter (``"01"`` or ``"01_sink_definition"``) belongs to."""
    for name, chapters in SESSIONS.items():
        if chapter[:2] in chapters:
            return name
    raise ParameterError(f"chapter {chapter!r} is in no session of sinklib.book.course.SESSIONS; add it to one")


def measure(profile: str = "quick", only: list[str] | None = None) -> dict:
    """Run every notebook (or the chapters `only`, by number or name) twice (cold caches, then warm) in temporary
    folders; seconds per notebook. Chapters timed alone read the committed results of the chapters they read
    (`READS_RESULTS_OF`) that are not timed with them."""
    from sinklib.book import contracts, runner as book
    from sinklib.core.models import cache_dir

    names = book.select(only) if only else book.notebook_names()
    for n in names:
        session_of(n)  # every chapter must be in a session before we spend minutes on it
    committed = book.results_dir()  # a chapter timed alone reads the committed results of the chapters it reads
    reads = {d for n in names for d in contracts.reads(n) if d not in names}
    saved = {k: os.environ.get(k) for k in ("SINKBOOK_CACHE", "SINKBOOK_RESULTS")}
    runs: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="sinkbook-course-") as tmp:
        tmp = Path(tmp)
        cache = tmp / "cache"
        cache.mkdir()
        models = cache_dir() / "models"
        if models.is_dir():  # de-quantised weights only: training and evaluation caches start empty
            (cache / "models").symlink_to(models, target_is_directory=True)
        try:
            os.environ["SINKBOOK_CACHE"] = str(cache)
            for label in ("first run", "rerun"):
                results = tmp / f"results-{label.replace(' ', '-')}"
                results.mkdir()
                for d in reads:
                    if (committed / f"{d}.json").exists():
                        shutil.copy(committed / f"{d}.json", results / f"{d}.json")
                os.environ["SINKBOOK_RESULTS"] = str(results)
                runs[label] = book.run(profile, only=names if only else None,
                                       out=tmp / f"chapters-{label.replace(' ', '-')}")
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            shutil.rmtree(tmp / "cache", ignore_errors=True)
    return {"profile": profile, "runs": runs}


def merge_retimed(old: dict, new: dict, utc: str) -> dict:
    """The saved times `old` (results of `load`) with the chapters of `new` (`measure` with `only`) replaced, and
    their names and time under 'retimed', so that the report says which chapters were timed apart."""
    if old["profile"] != new["profile"]:
        raise ParameterError(f"the saved times are for the {old['profile']!r} profile, the new ones for "
                             f"{new['profile']!r}: time every chapter again with that profile")
    runs = {label: {**old["runs"][label], **new["runs"][label]} for label in old["runs"]}
    retimed = {**old.get("retimed", {}), **{n: utc for n in new["runs"]["first run"]}}
    return {"profile": old["profile"], "runs": runs, "retimed": retimed}


def save(measured: dict) -> str:
    """Save the times with the book's provenance (`book.save_results`); the load average goes with them, since
    a busy machine makes every time an upper bound."""
    from sinklib.book import runner as book

    results = {**measured, "load_average_after": measured.get("load_average_after")
               or [round(x, 2) for x in os.getloadavg()]}
    seconds = sum(sum(run.values()) for run in measured["runs"].values())
    return book.save_results(RESULTS_NAME, results, params={"profile": measured["profile"]}, seconds=seconds)


def load() -> dict:
    from sinklib.book import runner as book

    path = book.results_dir() / f"{RESULTS_NAME}.json"
    if not path.exists():  # book.load_results would name a notebook; these times come from a command
        raise ResultsMissing(f"{book.display_path(path)} does not exist: run `python -m sinklib.book.course time` "
                             "(about twice the quick profile's run time)")
    return book.load_results(RESULTS_NAME)


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def markdown(doc: dict) -> str:
    """The guide's table: per chapter and per session, first run and rerun, with the machine that measured them."""
    runs = doc["results"]["runs"]
    first, rerun = runs["first run"], runs["rerun"]
    rows = ["| session | chapter | first run | rerun |", "| --- | --- | --- | --- |"]
    for session, chapters in SESSIONS.items():
        names = [n for n in first if n[:2] in chapters]
        for n in names:
            rows.append(f"| {session.split(':')[0]} | {{doc}}`chapters/{n}` | {_minutes(first[n])} | "
                        f"{_minutes(rerun[n])} |")
        tot1, tot2 = sum(first[n] for n in names), sum(rerun[n] for n in names)
        rows.append(f"| **{session.split(':')[0]} total** | | **{_minutes(tot1)}** | **{_minutes(tot2)}** |")
    prov, load = doc.get("provenance", {}), doc["results"].get("load_average_after")
    note = (f"\nMeasured with `python -m sinklib.book.course time` on {prov.get('device', '?')} at {prov.get('utc', '?')} "
            f"(git {str(prov.get('git_commit', '?'))[:12]}), {doc['results']['profile']} profile; "
            f"minutes of wall-clock time per notebook, including the kernel's start and imports"
            + (f"; the machine's load average over the last 1/5/15 minutes was "
               f"{'/'.join(str(x) for x in load)} at the end (above its core count means another "
               "job shared the machine and the times are upper bounds)" if load else "")
            + "." + ("" if not doc["results"].get("retimed") else " Timed apart later, on the same kind of machine: "
                     + ", ".join(f"{n} ({t[:16]})" for n, t in doc["results"]["retimed"].items()) + ".") + "\n")
    return "\n".join(rows) + "\n" + note


def write_report(out: Path | None = None) -> Path:
    from sinklib.book import runner as book

    root = book._need_checkout("python -m sinklib.book.course report")
    out = Path(out) if out else root / "book" / "_generated" / "course_times.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(markdown(load()))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sinklib.book.course", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("time", help="run every chapter's quick profile twice (cold, warm) and save the times")
    t.add_argument("--profile", default="quick")
    t.add_argument("--only", nargs="+", help="re-time these chapters only (number or name), keeping the others' times")
    sub.add_parser("report", help="write book/_generated/course_times.md from the saved times")
    a = ap.parse_args(argv)
    if a.cmd == "time" and a.only:
        from datetime import datetime, timezone

        old = load()["results"]
        new = measure(a.profile, a.only)
        print("saved", save(merge_retimed(old, new, datetime.now(timezone.utc).isoformat(timespec="minutes"))))
    elif a.cmd == "time":
        print("saved", save(measure(a.profile)))
    print("wrote", write_report())
    return 0


if __name__ == "__main__":
    sys.exit(main())
