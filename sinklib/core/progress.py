"""A side channel for progress: the training loop and the evaluation suites report their step into the file
named by ``$SINKBOOK_PROGRESS`` (``python -m sinklib.book reproduce`` sets it and tails the file), never into a
cell's output, so nothing of it reaches the executed pages. Without the variable every call is a no-op."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

ENV = "SINKBOOK_PROGRESS"
MIN_INTERVAL_S = 1.0   # at most one write a second (a training step can take milliseconds)
_last = {"t": 0.0, "what": None, "total": None}


def report(what: str, step: int | None = None, total: int | None = None) -> None:
    """Record that `what` (e.g. ``"training"``, ``"evaluating instructions"``) is at `step` of `total`.

    Written atomically (temporary file, then rename); throttled except when `what` changes or the last step
    is reached. Errors writing the file are ignored: progress must never stop a computation."""
    path = os.environ.get(ENV)
    if not path:
        return
    now = time.time()
    last = step is not None and total is not None and step >= total
    if what == _last["what"] and not last and now - _last["t"] < MIN_INTERVAL_S:
        return
    _last.update(t=now, what=what, total=total)
    try:
        tmp = Path(f"{path}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"what": what, "step": step, "total": total, "t": now}))
        os.replace(tmp, path)
    except OSError:
        pass


def advance(done: int, of: int) -> None:
    """Move the last `report` on to `done` of `of` units of its work (batches of prompts, of answer choices, of
    documents), shown on the reported scale: 600 of 1200 answer choices of a 300-item suite reads 150/300. A
    no-op before any report, without the variable, or when the last report had no total."""
    what, total = _last.get("what"), _last.get("total")
    if what is None or not total or of <= 0 or not os.environ.get(ENV):
        return
    report(what, min(total, int(total * done / of)), total)


def read(path: str | Path) -> dict | None:
    """The last record written to `path`, or None (no file yet, or unreadable)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def describe(record: dict | None) -> str:
    """``"training 120/400"``, ``"evaluating math"`` or ``""`` for a record of `read`."""
    if not record or not record.get("what"):
        return ""
    step, total = record.get("step"), record.get("total")
    if step is None:
        return str(record["what"])
    return f"{record['what']} {step}/{total}" if total else f"{record['what']} {step}"
