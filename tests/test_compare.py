"""scripts/compare_results.py and sinklib.book.compare: every number of two results folders, timings ignored."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sinklib.book.compare import compare_results, diff_values

ROOT = Path(__file__).resolve().parents[1]


def _write(d: Path, name: str, doc: dict) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_text(json.dumps(doc))


def test_numbers_beyond_tolerance_are_listed_timings_and_provenance_are_not(tmp_path):
    a = {"results": {"S": 1.0, "rows": [{"x": 2.0, "seconds": 3.0}], "train_seconds": {"vl": 1}, "note": "same",
                     "checkpoints": {"m": "/tmp/a"}}, "provenance": {"utc": "then", "git_commit": "abc"}}
    b = {"results": {"S": 1.0 + 1e-12, "rows": [{"x": 2.5, "seconds": 9.0}], "train_seconds": {"vl": 7},
                     "note": "same", "checkpoints": {"m": "/tmp/b"}}, "provenance": {"utc": "now", "git_commit": "def"}}
    _write(tmp_path / "before", "01_x.json", a)
    _write(tmp_path / "after", "01_x.json", b)
    diffs = compare_results(tmp_path / "before", tmp_path / "after")
    assert [(d.path, d.kind) for d in diffs] == [("/results/rows[0]/x", "number")]
    assert [d.path for d in diff_values({"S": 1.0, "load s": 1}, {"S": 2.0, "load s": 2})] == ["/S"]  # S is no timing
    # "utc" is a timestamp only as a word of its own: per-item outcomes are results
    got = diff_values({"outcomes": [1, 0], "outcome": "as predicted", "started_utc": "a"},
                      {"outcomes": [1, 1], "outcome": "not as predicted", "started_utc": "b"})
    assert [d.path for d in got] == ["/outcomes[1]", "/outcome"]


def test_structure_text_nan_and_missing_files(tmp_path):
    assert list(diff_values({"a": float("nan")}, {"a": float("nan")})) == []
    kinds = [d.kind for d in diff_values({"a": 1, "b": "x", "c": [1]}, {"a": 1, "b": "y", "c": [1, 2], "d": 0})]
    assert kinds == ["text", "missing", "missing"]
    _write(tmp_path / "before", "only.json", {})
    (tmp_path / "after").mkdir()
    assert [d.kind for d in compare_results(tmp_path / "before", tmp_path / "after")] == ["file"]


def test_script_reports_zero_differences(tmp_path):
    for side in ("before", "after"):
        _write(tmp_path / side, "02_y.json", {"results": {"S": [1.0, 2.0]}, "provenance": {"seconds": 1}})
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "compare_results.py"), str(tmp_path / "before"),
                          str(tmp_path / "after")], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("0 differences"), out.stdout + out.stderr
    _write(tmp_path / "after", "02_y.json", {"results": {"S": [1.0, 2.1]}})
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "compare_results.py"), str(tmp_path / "before"),
                          str(tmp_path / "after")], capture_output=True, text=True)
    assert out.returncode == 1 and "/results/S[1]" in out.stdout
