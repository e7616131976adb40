"""Reproduce the book: re-execute chapters in `run_order` with progress, resumably, then compare the new results
with the committed ones (``make reproduce [ONLY=04] [PROFILE=full] [DEVICE=auto] [TOL=1e-6]``).

- Progress: one line per interval on stderr, never in a page: chapter i of n, elapsed, the estimated time left
  (the saved run times of the chapters still to run, less what the current one has used) and the current
  training or evaluation step, which sinklib's loops write into ``$SINKBOOK_PROGRESS`` (`sinklib.core.progress`).
- Resumable: ``_build/reproduce/state.json`` lists the chapters this reproduction finished, each with the
  fingerprint it ran with (code, parameters, results read, sinklib); after an interruption or a failed chapter
  the same call skips those whose fingerprint still holds (``--restart`` forgets them); a reproduction that
  finishes removes the file, so the next call starts a new one. A chapter interrupted half-way runs again, and sinklib's cache
  (``~/.cache/sinkbook``: every finished training and evaluation) makes that rerun cheap.
- Verdict: each chapter's ``data/results`` file against the committed one (``git show HEAD:...``) with
  `sinklib.book.compare` (provenance, timings and paths ignored); exit status 0 when every chapter ran and
  nothing differs beyond the tolerance, 1 when something differs, 2 when a chapter failed."""
from __future__ import annotations

import ast
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

from sinklib.book import compare, costs, record, runner, stale
from sinklib.core import progress

STATE_DIR = runner.REPO / "_build" / "reproduce"
PRINT_EVERY_S = 30.0
DEFAULT_TOL = 1e-6
OK, DIFFERENT, FAILED = 0, 1, 2


def estimates(names: list[str], chapters: Path = runner.CHAPTERS) -> dict[str, float | None]:
    """Saved run seconds of each chapter (its executed copy's record, papermill's duration or its results)."""
    import nbformat

    out = {}
    for n in names:
        p = chapters / f"{n}.ipynb"
        nb = nbformat.read(p, as_version=4) if p.exists() else nbformat.v4.new_notebook()
        out[n] = stale.run_seconds(n, nb, record.read(nb), runner.results_dir())
    return out


def time_left(order: list[str], est: dict[str, float | None], i: int, chapter_elapsed: float) -> float | None:
    """Estimated seconds left while chapter `order[i]` has run `chapter_elapsed` s: what remains of its saved
    time (never below zero) plus the saved times of the chapters after it; None when one of them is unknown."""
    rest = [est.get(n) for n in order[i:]]
    if any(s is None for s in rest):
        return None
    return max(rest[0] - chapter_elapsed, 0.0) + sum(rest[1:])


def clock(seconds: float | None) -> str:
    """``h:mm:ss`` (``?`` when unknown)."""
    if seconds is None:
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def progress_line(i: int, n: int, name: str, elapsed: float, left: float | None, step: str,
                  overrun: float | None = None, cold: float | None = None) -> str:
    """``[2/8] 02_sink_strength  elapsed 0:03:10  left ~0:05:00  (training 12/40)``; with `overrun` (the chapter's
    saved run time, when the chapter has run longer than that) the estimate says it no longer counts this chapter,
    and with `cold` (`costs.compute_seconds`: what the chapter records of its trainings and evaluations) how long
    the chapter takes from an empty cache."""
    tail = f"  ({step})" if step else ""
    if overrun is not None:
        empty = f"; from an empty cache it computes at least {clock(cold)}" if cold else ""
        return (f"[{i}/{n}] {name}  elapsed {clock(elapsed)}  past its saved run time of {clock(overrun)} (measured "
                f"with what that run found cached{empty}), then ~{clock(left)} for the chapters after it{tail}")
    return f"[{i}/{n}] {name}  elapsed {clock(elapsed)}  left ~{clock(left)}{tail}"


class Ticker:
    """Prints `progress_line` every `every` seconds from a thread while a chapter runs."""

    def __init__(self, order, est, i, t_run, progress_file, every=PRINT_EVERY_S, out=sys.stderr):
        self.args, self.every, self.out, self.stop_event = (order, est, i, t_run, progress_file), every, out, threading.Event()
        self.t_chapter = time.time()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def line(self) -> str:
        order, est, i, t_run, pfile = self.args
        ran = time.time() - self.t_chapter
        left, saved = time_left(order, est, i, ran), est.get(order[i])
        return progress_line(i + 1, len(order), order[i], time.time() - t_run, left, progress.describe(progress.read(pfile)),
                             overrun=saved if saved is not None and ran > saved else None,
                             cold=costs.compute_seconds(order[i], runner.results_dir()))

    def _loop(self):
        while not self.stop_event.wait(self.every):
            print(self.line(), file=self.out, flush=True)

    def __enter__(self):
        print(self.line(), file=self.out, flush=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop_event.set()
        self.thread.join(timeout=5)


def device_params(name: str, device: str | None) -> dict:
    """``{"device": device}`` for a chapter whose parameters cell assigns ``device`` (else nothing)."""
    import nbformat

    if not device:
        return {}
    cell = runner.parameters_cell(nbformat.read(runner.NOTEBOOKS / f"{name}.ipynb", as_version=4))
    names = {t.id for node in ast.parse(cell.source).body if isinstance(node, ast.Assign)
             for t in node.targets if isinstance(t, ast.Name)}
    return {"device": device} if "device" in names else {}


#: chapters whose cache a pool of worker processes fills before the chapter runs: {chapter: module with
#: `chapter_params(profile)` and `prepare(params, jobs=..., log=...)`}; chapter 9 trains 22 independent tiny models
PREPARE = {"09_sink_panel": "sinklib.tiny.sinkprep"}


def prepare_jobs(device: str | None, jobs: int | None = None) -> int:
    """Worker processes for a chapter's `PREPARE` step: `jobs`, else $SINKBOOK_JOBS, else the CPU count; 0 (no
    step) on a GPU run (`device` other than cpu) or with fewer than 2."""
    if device and device != "cpu":
        return 0
    n = jobs if jobs is not None else int(os.environ.get("SINKBOOK_JOBS") or os.cpu_count() or 1)
    return n if n >= 2 else 0


def prepare(name: str, profile: str, device: str | None, jobs: int | None = None, log=print) -> float | None:
    """Run chapter `name`'s `PREPARE` step (when it has one and `prepare_jobs` allows); returns its seconds
    (None: no step). What it caches is what the chapter then reads, so the chapter itself runs from the cache."""
    import importlib

    n = prepare_jobs(device, jobs)
    if name not in PREPARE or not n:
        return None
    mod = importlib.import_module(PREPARE[name])
    t0 = time.perf_counter()
    mod.prepare(mod.chapter_params(profile), jobs=n, log=log)
    return time.perf_counter() - t0


def fingerprint(name: str, profile: str, extra: dict) -> str:
    """What a chapter would run with now: code, parameters, results read, its sinklib dependencies (one sha256)."""
    import nbformat

    params = record.normalized({**runner.load_profile(name, profile), **extra})
    src = nbformat.read(runner.NOTEBOOKS / f"{name}.ipynb", as_version=4)
    parts = [runner.code_fingerprint(src, fold=params), params, runner.reads_fingerprint(name),
             runner.sinklib_dependencies(src)]
    return record.sha256_bytes(json.dumps(parts, sort_keys=True).encode())


def load_state(path: Path, profile: str, restart: bool = False) -> dict:
    """The state of an interrupted reproduction with the same profile (a fresh one otherwise)."""
    fresh = {"profile": profile, "done": {}}
    if restart or not path.exists():
        return fresh
    try:
        state = json.loads(path.read_text())
    except ValueError:
        return fresh
    return state if state.get("profile") == profile and isinstance(state.get("done"), dict) else fresh


def pending(order: list[str], state: dict, fingerprints: dict[str, str]) -> list[str]:
    """Chapters of `order` still to run: not finished in `state`, or finished with another fingerprint."""
    done = state.get("done", {})
    return [n for n in order if done.get(n, {}).get("fingerprint") != fingerprints[n]]


def mark_done(path: Path, state: dict, name: str, fp: str, seconds: float) -> None:
    state.setdefault("done", {})[name] = {"fingerprint": fp, "seconds": seconds}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(state, indent=1) + "\n")


def committed_results(names: list[str], dest: Path, root: Path = runner.REPO) -> list[str]:
    """Write each chapter's committed results file (``HEAD:data/results/<name>.json``) into `dest`;
    returns the chapters that have one."""
    found = []
    for n in names:
        r = stale.git(root, "show", f"HEAD:data/results/{n}.json")
        if r.returncode == 0:
            (dest / f"{n}.json").write_text(r.stdout)
            found.append(n)
    return found


def compare_chapters(names: list[str], before: Path, after: Path, tol: float) -> dict[str, list]:
    """Differences beyond `tol` per chapter (a chapter missing on one side is one difference)."""
    out = {}
    for n in names:
        fa, fb = before / f"{n}.json", after / f"{n}.json"
        if not (fa.exists() and fb.exists()):
            out[n] = [compare.Difference(f"{n}.json", "", "present" if fa.exists() else compare.MISSING,
                                         "present" if fb.exists() else compare.MISSING, "file")]
            continue
        out[n] = list(compare.diff_values(json.loads(fa.read_text()), json.loads(fb.read_text()), tol, "", f"{n}.json"))
    return out


def verdict_table(diffs: dict[str, list], tol: float, failed: str | None = None, shown: int = 3) -> str:
    """Per chapter: the number of differences beyond `tol` and the first few of them."""
    lines = [f"results against the committed ones (tolerance {tol:g}: relative above 1, absolute below; "
             "provenance, timings and paths ignored)"]
    for n, ds in diffs.items():
        lines.append(f"  {n:<24} {'reproduced' if not ds else f'{len(ds)} difference(s)'}")
        lines += [f"      {d.path or d.file}: {d.before!r} -> {d.after!r}" for d in ds[:shown]]
        if len(ds) > shown:
            lines.append(f"      ... {len(ds) - shown} more (scripts/compare_results.py lists all)")
    if failed:
        lines.append(f"  {failed:<24} FAILED (see the error above); fix it and run the same command again to resume")
    return "\n".join(lines)


def exit_status(diffs: dict[str, list], failed: str | None) -> int:
    """0: every chapter ran and reproduced; 1: some result differs beyond the tolerance; 2: a chapter failed."""
    if failed:
        return FAILED
    return DIFFERENT if any(diffs.values()) else OK


def _run_chapters(order, todo, profile, device, state, state_path) -> str | None:
    """Execute the chapters of `todo` (a part of `order`) with progress; returns the one that failed, if any."""
    est = estimates(order)
    saved = dict(est)
    pfile = state_path.parent / "progress.json"
    pfile.parent.mkdir(parents=True, exist_ok=True)
    os.environ[progress.ENV] = str(pfile)
    try:
        return _each_chapter(order, todo, profile, device, state, state_path, est, saved, pfile)
    finally:
        os.environ.pop(progress.ENV, None)


def _each_chapter(order, todo, profile, device, state, state_path, est, saved, pfile) -> str | None:
    t_run = time.time()
    for i, name in enumerate(order):
        if name not in todo:
            print(f"[{i + 1}/{len(order)}] {name}  done in an earlier attempt (resumed; --restart reruns it)", flush=True)
            est[name] = 0.0
            continue
        extra = device_params(name, device)
        fp = fingerprint(name, profile, extra)
        try:
            with Ticker(order, est, i, t_run, pfile):
                pre = prepare(name, profile, device, log=lambda m: print(f"  {name} prepare: {m}", flush=True))
                seconds = runner.execute(name, profile, params=extra) + (pre or 0.0)
        except Exception as e:  # noqa: BLE001 (papermill's errors and a missing model alike: report, keep the state)
            print(f"[{i + 1}/{len(order)}] {name} failed: {type(e).__name__}: {str(e)[:2000]}", file=sys.stderr)
            return name
        est[name] = 0.0
        mark_done(state_path, state, name, fp, seconds)
        print(f"[{i + 1}/{len(order)}] {name}  done in {clock(seconds)} (saved estimate {clock(saved.get(name))})",
              flush=True)
    return None


def reproduce(only: list[str] | None = None, profile: str = "full", device: str | None = None,
              tol: float = DEFAULT_TOL, restart: bool = False, state_dir: Path = STATE_DIR) -> int:
    """Re-execute the selected chapters (all by default) in `run_order`, then compare; returns the exit status."""
    order = runner.select(only)
    state_path = Path(state_dir) / "state.json"
    state = load_state(state_path, profile, restart)
    fps = {n: fingerprint(n, profile, device_params(n, device)) for n in order}
    todo = pending(order, state, fps)
    est = estimates(order)
    cold = sum(costs.compute_seconds(n, runner.results_dir()) or 0 for n in todo)
    print(f"reproduce: {len(order)} chapter(s), profile={profile}, device={device or 'as the profile says'}; "
          f"{len(order) - len(todo)} already done in this reproduction; estimated "
          f"{clock(sum(est[n] or 0 for n in todo))} by the saved run times (with what those runs found cached)"
          + (f", at least {clock(cold)} of training and evaluation from an empty cache" if cold else ""), flush=True)
    failed = _run_chapters(order, todo, profile, device, state, state_path)
    if failed is None:
        state_path.unlink(missing_ok=True)   # finished: the next call is a new reproduction, not a resume
    with tempfile.TemporaryDirectory() as before:
        committed_results(order, Path(before))
        done = [n for n in order if n != failed and (n not in todo or n in state.get("done", {}))]
        diffs = compare_chapters(done, Path(before), runner.results_dir(), tol)
    print(verdict_table(diffs, tol, failed), flush=True)
    status = exit_status(diffs, failed)
    print({OK: "the book reproduced", DIFFERENT: "the book did NOT reproduce within the tolerance",
           FAILED: "a chapter failed"}[status], flush=True)
    return status
