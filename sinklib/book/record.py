"""The run record of an executed copy: what a chapter ran with, written by the runner into the copy's notebook
metadata (``metadata.sinkbook``) so that ``python -m sinklib.book status`` can tell later whether the copy is
still current. Fields: ``code_sha256`` (the code cells, the Colab bootstrap cell left out: ``set-repo`` rewrites
it and it does nothing off Colab), ``parameters`` (the values it ran with), ``reads`` (sha256 of each results
file of ``READS_RESULTS_OF`` as it was when the chapter started), ``sinklib_sha256`` (the package's source),
``git_commit`` (``+dirty`` when the tree had uncommitted changes), ``seconds`` and ``utc``.

This module only hashes and stores; deciding what is stale is `sinklib.book.stale`."""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
from pathlib import Path
from typing import Any

KEY = "sinkbook"
VERSION = 1


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: str | Path) -> str | None:
    """sha256 of a file's bytes, or None when it does not exist."""
    path = Path(path)
    return sha256_bytes(path.read_bytes()) if path.exists() else None


def code_sha256(sources: list[str], skip_prefix: str | None = None) -> str:
    """sha256 of a notebook's code cells (as `runner.code_sources` gives them), cells starting with
    `skip_prefix` left out."""
    kept = [s for s in sources if not (skip_prefix and s.startswith(skip_prefix))]
    return sha256_bytes(json.dumps(kept, ensure_ascii=False).encode())


def normalized(params: dict[str, Any]) -> dict[str, Any]:
    """Parameters as JSON gives them back (tuples as lists), so a profile and a record compare equal."""
    return json.loads(json.dumps(params, sort_keys=True))


#: sinklib files that decide what to rerun and drive a reproduction; no chapter's results depend on them, so a
#: change to them does not count as a sinklib change (paths relative to sinklib/, as git writes them)
TOOLING = ("book/cli.py", "book/record.py", "book/reproduce.py", "book/stale.py")


def tree_sha256(folder: str | Path, pattern: str = "*.py", skip: tuple[str, ...] = TOOLING) -> str:
    """sha256 over the relative paths and contents of the files matching `pattern` under `folder`
    (``__pycache__`` and `skip` left out): changes whenever a source file of the package changes, committed or not."""
    folder = Path(folder)
    h = hashlib.sha256()
    for p in sorted(folder.rglob(pattern)):
        if "__pycache__" in p.parts or p.relative_to(folder).as_posix() in skip:
            continue
        h.update(str(p.relative_to(folder)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def make(code: str, parameters: dict, reads: dict[str, str | None], sinklib: str, git_commit: str,
         seconds: float | None = None) -> dict:
    """A record (see the module docstring)."""
    return {"version": VERSION, "code_sha256": code, "parameters": normalized(parameters), "reads": dict(reads),
            "sinklib_sha256": sinklib, "git_commit": git_commit,
            "seconds": None if seconds is None else round(float(seconds), 1),
            "utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}


def read(nb) -> dict | None:
    """The record of an executed notebook (nbformat node), or None for a copy executed before records existed."""
    rec = nb.metadata.get(KEY)
    return dict(rec) if rec else None


def write(path: str | Path, record: dict) -> None:
    """Store `record` in the metadata of the executed copy at `path`."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    nb.metadata[KEY] = record
    nbformat.write(nb, path)
