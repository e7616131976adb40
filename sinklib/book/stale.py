"""Which executed copies are current (``python -m sinklib.book status``; ``make book`` re-executes the stale ones).

A chapter is **stale** when its source notebook's code, its profile's parameters or a results file it reads
(`contracts.READS_RESULTS_OF`) differ from what its executed copy ran with. With a run record (`sinklib.book.record`) each
is a comparison of hashes. For a copy executed before records existed: code and parameters come from the copy
itself (its code cells against the source's, the parameters papermill recorded against the profile), and a
results file read counts as changed when git says it changed since the reader's commit (its results file's
``provenance.git_commit``, a ``+dirty`` suffix stripped: uncommitted changes at run time are not known).
A results file read whose bytes changed but whose numbers and texts did not (its chapter rerun: only the
provenance, timings or paths moved, or keys were added to its objects, `same_numbers`, judged against the
version the reader ran with, found in git history by its sha256; where that version is not in the clone's
history, the reader is "unknown", not stale)
leaves the reader current, with a note: a rerun of chapter 2 does not send chapter 11's
nine hours of jobs back to the queue for a new wall-clock time.

A chapter that is not stale but whose **sinklib** changed since it ran is listed with its estimated rerun time
and the command that reruns it, never rerun silently: its full run can take hours. Only the chapter's own
dependencies count (`sinklib.book.deps`: the sinklib modules its code imports, transitively, and the package data
they open; never `record.TOOLING`, the modules that decide what to rerun): the record's hash of each against
the files now, or, for a copy whose record predates per-chapter dependencies (a hash of all of sinklib) or that
has none, ``git diff --name-only <commit> -- <those files>``. The reason names the files that changed."""
from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from sinklib.book import contracts, deps, record, runner

CURRENT, STALE, SINKLIB, UNKNOWN, MISSING = "current", "stale", "sinklib changed", "unknown", "missing"
RERUN = {STALE, MISSING}   # the states `make book` re-executes


@dataclass
class ChapterState:
    """One row of the status table."""

    name: str
    state: str
    why: list[str] = field(default_factory=list)
    seconds: float | None = None

    @property
    def command(self) -> str:
        return "" if self.state == CURRENT else f"make reproduce ONLY={self.name[:2]}"


def git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30)


def changed_since(root: Path, commit: str, path: str) -> bool | None:
    """Whether `path` (a file or folder of the checkout) differs between `commit` and the working tree; None when
    `commit` is not in this clone's history (a shallow clone)."""
    try:
        if git(root, "cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
            return None
        return git(root, "diff", "--quiet", commit, "--", path).returncode != 0
    except (OSError, subprocess.SubprocessError):
        return None


def changed_files(root: Path, commit: str, paths: list[str]) -> list[str] | None:
    """Which of `paths` differ between `commit` and the working tree (sorted); None when `commit` is not in this
    clone's history."""
    if not paths:
        return []
    try:
        if git(root, "cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
            return None
        out = git(root, "diff", "--name-only", commit, "--", *paths)
    except (OSError, subprocess.SubprocessError):
        return None
    return sorted(out.stdout.splitlines()) if out.returncode == 0 else None


#: how many versions of a results file `recorded_version` looks through (newest first)
MAX_VERSIONS = 300


def recorded_version(root: Path, path: Path, sha: str | None) -> bytes | None:
    """The bytes of results file `path` in the version whose sha256 is `sha`, from git history (each commit that
    touched it, newest first, at most `MAX_VERSIONS`); None when no version has it (or no history)."""
    if not sha:
        return None
    try:
        rel = str(Path(path).resolve().relative_to(Path(root).resolve()))
        log = git(root, "log", f"-n{MAX_VERSIONS}", "--format=%H", "--", rel)
        for commit in log.stdout.split() if log.returncode == 0 else []:
            shown = subprocess.run(["git", "show", f"{commit}:{rel}"], cwd=root, capture_output=True, timeout=30)
            if shown.returncode == 0 and record.sha256_bytes(shown.stdout) == sha:
                return shown.stdout
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    return None


#: how far a rerun's number may move and still be "the same" for its readers (`compare.diff_values`' rule:
#: absolute below 1, relative above): chapter 2 rerun on other CPUs moved S by up to 2.2e-6 (session 51) and 2e-7
#: (session 56), float rounding; the pages print at most four decimals (`make reproduce` compares a whole rerun
#: with the committed results at its own, stricter TOL=1e-6: a report, not a reader's freshness)
SAME_TOL = 1e-5


def same_numbers(root: Path, path: Path, sha: str | None) -> bool | None:
    """Whether results file `path` now holds the same numbers and texts as its version with sha256 `sha` (a
    rerun of the chapter that wrote it), provenance, timings and paths aside (`sinklib.book.compare.IGNORED_KEYS`:
    no reader's result depends on them), numbers to `SAME_TOL` (another CPU's float rounding moves them in the
    sixth or seventh digit, below anything a page prints). None when that version is not in this clone's git
    history (a shallow clone, or a version never committed): it cannot be judged."""
    from sinklib.book import compare

    if not Path(path).exists():
        return False
    before = recorded_version(root, path, sha)
    if before is None:
        return None
    try:
        old, new = json.loads(before), json.loads(Path(path).read_text())
    except ValueError:
        return False
    return all(_added_key(d) for d in compare.diff_values(old, new, tol=SAME_TOL))


def _added_key(d) -> bool:
    """Whether a difference is a key the rerun added to a JSON object (none of the old numbers or texts moved):
    no reader can have read a key that did not exist, so an addition leaves what it computed as it was. An item
    appended to a list is not one (a reader may have counted or averaged the list)."""
    from sinklib.book.compare import MISSING

    return d.kind == "missing" and d.before == MISSING and not d.path.endswith("]")


def recorded_commit(name: str, rec: dict | None, results: Path) -> tuple[str | None, str]:
    """The commit the chapter ran at (the record's, else its results file's provenance) and a note when a
    ``+dirty`` suffix was stripped."""
    commit = (rec or {}).get("git_commit")
    if commit is None and (results / f"{name}.json").exists():
        commit = json.loads((results / f"{name}.json").read_text()).get("provenance", {}).get("git_commit")
    if not commit or commit in ("unknown",) or " " in commit:
        return None, ""
    if commit.endswith("+dirty"):
        return commit[: -len("+dirty")], f"ran on uncommitted changes at {commit[:8]} (+dirty stripped)"
    return commit, ""


def run_seconds(name: str, nb, rec: dict | None, results: Path) -> float | None:
    """The saved run time: the record's, else papermill's duration, else the results file's provenance."""
    if rec and rec.get("seconds") is not None:
        return float(rec["seconds"])
    duration = nb.metadata.get("papermill", {}).get("duration")
    if duration is not None:
        return float(duration)
    f = results / f"{name}.json"
    if f.exists():
        return json.loads(f.read_text()).get("provenance", {}).get("seconds")
    return None


def _code_and_params(name: str, src, ex, rec: dict | None, profile: str) -> list[str]:
    """Reasons from the code cells and the parameters."""
    why = []
    ran_with = record.normalized(rec["parameters"] if rec else runner.executed_parameters(ex))
    if rec:
        if runner.code_fingerprint(src, fold=ran_with) != rec["code_sha256"]:
            why.append("code changed (record)")
    elif runner.code_sources(src, fold=ran_with) != runner.code_sources(ex):
        why.append("code changed (source cells vs the executed copy's)")
    want = record.normalized(runner.load_profile(name, profile))
    if want != ran_with:
        keys = sorted(k for k in set(want) | set(ran_with) if want.get(k) != ran_with.get(k))
        why.append(f"parameters changed: {', '.join(keys)}")
    return why


def _reads(name: str, rec: dict | None, commit: str | None, root: Path,
           results: Path) -> tuple[list[str], list[str], list[str]]:
    """(reasons the chapter is stale, reasons it cannot be judged, notes) from the results files it reads."""
    stale, unknown, notes = [], [], []
    for dep in contracts.reads(name):
        if rec and "reads" in rec:
            if dep not in rec["reads"]:  # an entry added to the contract since: its run did not read the file
                stale.append(f"reads {dep[:2]}'s results now, which its run did not (`contracts.READS_RESULTS_OF`)")
                continue
            if rec["reads"].get(dep) == record.file_sha256(results / f"{dep}.json"):
                continue
            same = same_numbers(root, results / f"{dep}.json", rec["reads"].get(dep))
            if same:
                notes.append(f"{dep[:2]} rerun since, with the same numbers")
            elif same is None:
                unknown.append(f"{dep[:2]}'s results changed (sha256) and the version it read is not in this "
                               "clone's history to compare numbers (a shallow clone?)")
            else:
                stale.append(f"{dep[:2]}'s results changed (sha256)")
            continue
        if commit is None:
            unknown.append(f"no commit recorded to judge {dep[:2]}'s results")
            continue
        moved = changed_since(root, commit, str((results / f"{dep}.json").relative_to(root)))
        if moved is None:
            unknown.append(f"commit {commit[:8]} not in this clone's history ({dep[:2]}'s results)")
        elif moved:
            stale.append(f"{dep[:2]}'s results changed since {commit[:8]} (git history)")
    return stale, unknown, notes


def _sinklib(rec: dict | None, commit: str | None, root: Path, now: dict[str, str | None]) -> str | None:
    """Why the chapter's sinklib differs from what it ran with (None: same; '?' prefix: cannot tell); `now`: its
    dependency files with their hashes (`runner.sinklib_dependencies`)."""
    if rec and rec.get("sinklib_deps_sha256"):
        if rec["sinklib_deps_sha256"] == record.set_sha256(now):
            return None
        moved = deps.changed(rec.get("sinklib_deps") or {}, now)
        return f"sinklib changed (record): {deps.summary(moved)}" if moved else "sinklib changed (record)"
    if commit is None:
        return "?no commit recorded"
    moved = changed_files(root, commit, sorted(now))
    if moved is None:
        return f"?commit {commit[:8]} not in this clone's history"
    return f"sinklib changed since {commit[:8]} (git diff): {deps.summary(moved)}" if moved else None


def chapter_state(name: str, profile: str = "full", root: Path | None = None, chapters: Path | None = None,
                  results: Path | None = None) -> ChapterState:
    """The status of one chapter's executed copy (see the module docstring)."""
    import nbformat

    root = Path(root or runner.REPO)
    chapters = Path(chapters or root / "book" / "chapters")
    results = Path(results or runner.results_dir())
    ex_path = chapters / f"{name}.ipynb"
    if not ex_path.exists():
        return ChapterState(name, MISSING, ["no executed copy"])
    src = nbformat.read(root / "notebooks" / f"{name}.ipynb", as_version=4)
    ex = nbformat.read(ex_path, as_version=4)
    rec = record.read(ex)
    commit, note = recorded_commit(name, rec, results)
    seconds = run_seconds(name, ex, rec, results)
    why = _code_and_params(name, src, ex, rec, profile)
    stale_reads, unknown, notes = _reads(name, rec, commit, root, results)
    why += stale_reads
    if why:
        return ChapterState(name, STALE, why, seconds)
    lib = _sinklib(rec, commit, root, runner.sinklib_dependencies(src, root))
    notes += [note] if note else []
    if unknown or (lib and lib.startswith("?")):
        return ChapterState(name, UNKNOWN, unknown + ([lib[1:]] if lib and lib.startswith("?") else []) + notes, seconds)
    if lib:
        return ChapterState(name, SINKLIB, [lib] + notes, seconds)
    return ChapterState(name, CURRENT, notes, seconds)


def book_status(profile: str = "full", **where) -> list[ChapterState]:
    """`chapter_state` of every notebook, in `run_order`."""
    return [chapter_state(n, profile, **where) for n in runner.run_order(runner.notebook_names())]


def duration(seconds: float | None) -> str:
    """``"40 s"``, ``"12 min"``, ``"1.7 h"`` or ``"?"``."""
    if seconds is None:
        return "?"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def table(states: list[ChapterState]) -> str:
    """The status table: chapter, state, why, estimated time (the saved run time), command."""
    rows = [("chapter", "state", "why", "est. time", "command")]
    rows += [(s.name, s.state, "; ".join(s.why) or "-", duration(s.seconds), s.command or "-") for s in states]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4] for r in rows]
    listed = [s for s in states if s.state in (SINKLIB, UNKNOWN)]
    if listed:
        total = sum(s.seconds or 0 for s in listed)
        lines.append(f"not rerun by `make book`: {len(listed)} chapter(s) whose sinklib changed or cannot be judged, "
                     f"about {duration(total)} by their saved run times (a run with a warm cache; an empty cache "
                     f"takes far longer, see the README); rerun with the command shown")
    return "\n".join(lines)


def update(profile: str = "full", dry_run: bool = False) -> list[ChapterState]:
    """What ``make book`` does before the build: re-execute every stale or missing chapter, in `run_order`
    (a chapter's state is taken when its turn comes, so a reader of a chapter just rerun is judged on the new
    results), and print the table with what is left to rerun by hand. Returns the final states."""
    ran = []
    for name in runner.run_order(runner.notebook_names()):
        st = chapter_state(name, profile)
        if st.state in RERUN:
            print(f"book: {name} is {st.state} ({'; '.join(st.why)}); re-executing (saved time {duration(st.seconds)})",
                  flush=True)
            if not dry_run:
                print(f"book: {name} done in {duration(runner.execute(name, profile))}", flush=True)
            ran.append(name)
    states = book_status(profile)
    print(table(states), flush=True)
    verb = "would re-execute (dry run)" if dry_run else "re-executed"
    print(f"book: {verb} {', '.join(ran) if ran else 'nothing'}", flush=True)
    return states
