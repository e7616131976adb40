"""The run record of an executed copy: what a chapter ran with, written by the runner into the copy's notebook
metadata (``metadata.sinkbook``) so that ``python -m sinklib.book status`` can tell later whether the copy is
still current. Fields: ``code_sha256`` (the code cells, the Colab bootstrap cell left out: ``set-repo`` rewrites
it and it does nothing off Colab), ``parameters`` (the values it ran with), ``reads`` (sha256 of each results
file of ``READS_RESULTS_OF`` as it was when the chapter started), ``sinklib_deps`` (a short sha256 of each file
the chapter depends on: the sinklib modules its code imports, transitively, and the package data they open, as
`sinklib.book.deps` finds them) with ``sinklib_deps_sha256`` (one sha256 over them), ``git_commit`` (``+dirty``
when the tree had uncommitted changes), ``seconds`` and ``utc``. Version 1 records (before per-chapter
dependencies) held ``sinklib_sha256``, a hash of all of sinklib's source, instead; `sinklib.book.stale` judges
those by git, from their commit.

This module only hashes and stores (and strips the machine from papermill's paths); deciding what is stale is
`sinklib.book.stale`."""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
from pathlib import Path
from typing import Any

KEY = "sinkbook"
VERSION = 2


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: str | Path) -> str | None:
    """sha256 of a file's bytes (read in blocks: `sinklib.core.cache.file_sha256`), or None when it does not exist."""
    from sinklib.core.cache import file_sha256 as streamed

    path = Path(path)
    return streamed(path) if path.exists() else None


def code_sha256(sources: list[str], skip_prefix: str | None = None) -> str:
    """sha256 of a notebook's code cells (as `runner.code_sources` gives them), cells starting with
    `skip_prefix` left out."""
    kept = [s for s in sources if not (skip_prefix and s.startswith(skip_prefix))]
    return sha256_bytes(json.dumps(kept, ensure_ascii=False).encode())


def normalized(params: dict[str, Any]) -> dict[str, Any]:
    """Parameters as JSON gives them back (tuples as lists), so a profile and a record compare equal."""
    return json.loads(json.dumps(params, sort_keys=True))


#: sinklib files that decide what to rerun and drive a reproduction; no chapter's results depend on them, so they
#: are never a chapter's dependency (paths relative to sinklib/)
TOOLING = ("book/cli.py", "book/contracts.py", "book/deps.py", "book/record.py", "book/reproduce.py", "book/stale.py")


def set_sha256(file_hashes: dict[str, str | None]) -> str:
    """One sha256 over a set of files: their paths and hashes (`sinklib.book.deps.hashes`)."""
    return sha256_bytes(json.dumps(sorted(file_hashes.items())).encode())


def make(code: str, parameters: dict, reads: dict[str, str | None], sinklib_deps: dict[str, str | None],
         git_commit: str, seconds: float | None = None) -> dict:
    """A record (see the module docstring); `sinklib_deps`: file -> short sha256 (`sinklib.book.deps.hashes`)."""
    return {"version": VERSION, "code_sha256": code, "parameters": normalized(parameters), "reads": dict(reads),
            "sinklib_deps": dict(sorted(sinklib_deps.items())), "sinklib_deps_sha256": set_sha256(sinklib_deps),
            "git_commit": git_commit,
            "seconds": None if seconds is None else round(float(seconds), 1),
            "utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}


def read(nb) -> dict | None:
    """The record of an executed notebook (nbformat node), or None for a copy executed before records existed."""
    rec = nb.metadata.get(KEY)
    return dict(rec) if rec else None


def relative_papermill_paths(nb, root: str | Path | None = None) -> None:
    """Make papermill's ``input_path`` and ``output_path`` in a notebook's metadata relative to `root` (the
    checkout; `checkout_root` when None), so that no executed copy keeps the paths of the machine it ran on; a path
    outside `root` keeps only its file name."""
    from sinklib.core.resources import checkout_root

    root = Path(root) if root is not None else checkout_root()
    meta = nb.metadata.get("papermill", {})
    for key in ("input_path", "output_path"):
        if meta.get(key):
            p = Path(meta[key]).resolve()
            inside = root is not None and p.is_relative_to(root.resolve())
            meta[key] = p.relative_to(root.resolve()).as_posix() if inside else p.name


def write(path: str | Path, record: dict, root: str | Path | None = None) -> None:
    """Store `record` in the metadata of the executed copy at `path`, with papermill's paths made relative to the
    checkout `root` (`relative_papermill_paths`)."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    nb.metadata[KEY] = record
    relative_papermill_paths(nb, root)
    nbformat.write(nb, path)
