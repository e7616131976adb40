"""The course guide: sessions cover every chapter once, every exercise is assigned once, the times are fresh."""
import json
import re
from pathlib import Path

import pytest

from sinklib.book import runner as book, course
from sinklib.errors import ParameterError

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "book" / "course_guide.md"


def test_every_chapter_in_exactly_one_session():
    chapters = [c for cs in course.SESSIONS.values() for c in cs]
    assert sorted(chapters) == sorted(n[:2] for n in book.notebook_names())
    assert len(chapters) == len(set(chapters))
    assert course.session_of("04_vl_adaptation") == list(course.SESSIONS)[1]
    with pytest.raises(ParameterError, match="no session"):
        course.session_of("99_missing")


def test_guide_assigns_every_exercise_once():
    listed = re.findall(r"\{ref\}`([\w-]+)`", (ROOT / "book" / "exercises.md").read_text())
    guide = re.findall(r"\{ref\}`(?:[^`<]*<)?([\w-]+)>?`", GUIDE.read_text())
    assert listed and sorted(guide) == sorted(listed)


def test_markdown_sums_sessions():
    first = {"01_a": 60.0, "02_b": 120.0, "03_c": 30.0, "04_d": 300.0, "05_e": 6.0, "06_f": 54.0}
    doc = {"results": {"profile": "quick", "runs": {"first run": first, "rerun": {k: v / 2 for k, v in first.items()}}},
           "provenance": {"device": "cpu (2 cores)", "utc": "now", "git_commit": "abc"}}
    md = course.markdown(doc)
    assert "**3.5 min**" in md and "**1.8 min**" in md  # session 1: 210 s first run, 105 s rerun
    assert "**6.0 min**" in md and "**3.0 min**" in md  # session 2: 360 s, 180 s
    assert md.count("{doc}`chapters/") == 6


def test_generated_times_are_fresh():
    """book/_generated/course_times.md is what `python -m sinklib.book.course report` makes of the saved times."""
    path = ROOT / "data" / "results" / f"{course.RESULTS_NAME}.json"  # the committed file, whatever SINKBOOK_RESULTS says
    assert path.exists(), "run `python -m sinklib.book.course time` (twice the quick profile's run time)"
    doc = json.loads(path.read_text())
    assert set(doc["results"]["runs"]["first run"]) == set(book.notebook_names()), \
        "chapters changed since the times were measured: rerun `python -m sinklib.book.course time`"
    assert (ROOT / "book" / "_generated" / "course_times.md").read_text() == course.markdown(doc), \
        "run `python -m sinklib.book.course report`"
    assert all(v > 0 for run in doc["results"]["runs"].values() for v in run.values())
    json.dumps(doc)


def test_saved_times_carry_the_books_provenance(monkeypatch, tmp_path):
    from sinklib.errors import ResultsMissing

    monkeypatch.setenv("SINKBOOK_RESULTS", str(tmp_path))
    with pytest.raises(ResultsMissing, match="sinklib.book.course time"):
        course.load()
    runs = {"first run": {"01_a": 60.0}, "rerun": {"01_a": 30.0}}
    course.save({"profile": "quick", "runs": runs})
    doc = course.load()
    assert doc["results"]["runs"] == runs and len(doc["results"]["load_average_after"]) == 3
    assert doc["provenance"]["profile"] == "quick" and doc["provenance"]["seconds"] == 90.0
    assert {"git_commit", "device", "versions", "utc"} <= set(doc["provenance"])


def test_guide_promises_the_sessions_it_plans():
    """The tagline's session count and the planned sessions agree (two, plus an optional third)."""
    text = GUIDE.read_text()
    planned = re.findall(r"^## Session (\d+)", text, re.M)
    assert len(planned) == len(course.SESSIONS)
    optional = [n for n in course.SESSIONS if "optional" in n]
    words = {1: "one", 2: "two", 3: "three"}
    tagline = text.split("\n\n")[1]
    assert f"{words[len(course.SESSIONS) - len(optional)]} 90-minute" in tagline
    assert ("optional" in tagline) == bool(optional)
    assert "{doc}`course_guide`" in (ROOT / "book" / "intro.md").read_text()   # the instructor path links it


def test_retimed_chapters_replace_only_their_times_and_are_named():
    old = {"profile": "quick", "runs": {"first run": {"01_a": 60.0, "02_b": 10.0}, "rerun": {"01_a": 30.0, "02_b": 5.0}},
           "load_average_after": [1.0, 1.0, 1.0]}
    new = {"profile": "quick", "runs": {"first run": {"02_b": 20.0}, "rerun": {"02_b": 8.0}}}
    m = course.merge_retimed(old, new, "2026-12-03T21:00+00:00")
    assert m["runs"] == {"first run": {"01_a": 60.0, "02_b": 20.0}, "rerun": {"01_a": 30.0, "02_b": 8.0}}
    assert m["retimed"] == {"02_b": "2026-12-03T21:00+00:00"}
    md = course.markdown({"results": m, "provenance": {}})
    assert "Timed apart later" in md and "02_b (2026-12-03T21:00)" in md
    with pytest.raises(ParameterError, match="profile"):
        course.merge_retimed(old, {**new, "profile": "full"}, "now")
