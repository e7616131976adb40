"""`make book` (stale chapters only), `make reproduce` (progress, resume, verdict) and publishing: the rules on
synthetic notebooks in temporary folders; no notebook is executed and nothing is timed."""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import nbformat
import pytest
import yaml
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from sinklib.book import compare, contracts, record, reproduce, runner, stale
from sinklib.core import progress

ROOT = Path(__file__).resolve().parent.parent
READER, DEP = "98_reader", "97_dep"


def _source(body: str = "from sinklib.a import A\ny = x + A", url: str = "https://github.com/a/b") -> nbformat.NotebookNode:
    params = new_code_cell('x = 1\nprofile = "quick"', metadata={"tags": ["parameters", "remove-cell"]})
    return new_notebook(cells=[new_markdown_cell("# demo"), new_code_cell(runner.bootstrap_source(url)), params,
                               new_code_cell(body)])


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()


class Book:
    """A tiny checkout: two notebooks (the reader reads the dep's results), profiles, git, and a sinklib whose
    module `a` (imported by both notebooks) imports `c`, and whose module `b` no notebook imports."""

    def __init__(self, root: Path, monkeypatch):
        self.root = root
        for d in ("notebooks", "book/chapters", "data/results", "data/profiles", "sinklib"):
            (root / d).mkdir(parents=True)
        (root / "sinklib" / "a.py").write_text("A = 1\n\n\ndef f():\n    from sinklib.c import C\n    return C\n")
        (root / "sinklib" / "b.py").write_text("B = 1\n")
        (root / "sinklib" / "c.py").write_text("C = 1\n")
        monkeypatch.setattr(runner, "PROFILES", root / "data" / "profiles")
        monkeypatch.setattr(runner, "NOTEBOOKS", root / "notebooks")
        monkeypatch.setattr(runner, "REPO", root)
        monkeypatch.setattr(contracts, "READS_RESULTS_OF", {READER: (DEP,)})
        monkeypatch.setattr(runner, "results_dir", lambda create=True: root / "data" / "results")
        for name in (DEP, READER):
            nbformat.write(_source(), root / "notebooks" / f"{name}.ipynb")
            self.profile(name, x=2)
            (root / "data" / "results" / f"{name}.json").write_text(json.dumps({"results": {"v": 1}}))
        _git(root, "init", "-q")
        _git(root, "-c", "user.email=t@t", "-c", "user.name=t", "add", "-A")
        _git(root, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init")

    def profile(self, name: str, **full) -> None:
        (self.root / "data" / "profiles" / f"{name}.yml").write_text(yaml.safe_dump({"full": full}))

    def execute(self, name: str, with_record: bool | str = True, commit: str | None = None) -> None:
        """What the runner leaves: the parameters folded in, papermill's record and (optionally) ours;
        ``with_record="v1"``: a record as written before per-chapter dependencies (a hash of all of sinklib and
        the commit at HEAD)."""
        nb = nbformat.read(self.root / "notebooks" / f"{name}.ipynb", as_version=4)
        params = runner.load_profile(name, "full")
        cell = runner.parameters_cell(nb)
        cell.source = runner.fold_parameters(cell.source, params)
        nb.metadata["papermill"] = {"parameters": params, "duration": 12.5}
        if with_record:
            nb.metadata[record.KEY] = record.make(runner.code_fingerprint(nb), params, runner.reads_fingerprint(name),
                                                  runner.sinklib_dependencies(nb, self.root), "abc", 12.5)
        if with_record == "v1":
            rec = {k: v for k, v in nb.metadata[record.KEY].items() if not k.startswith("sinklib_deps")}
            nb.metadata[record.KEY] = {**rec, "version": 1, "sinklib_sha256": "0" * 64,
                                       "git_commit": _git(self.root, "rev-parse", "HEAD")}
        nbformat.write(nb, self.root / "book" / "chapters" / f"{name}.ipynb")
        if commit is not None:
            doc = {"results": {"v": 1}, "provenance": {"git_commit": commit, "seconds": 10.0}}
            (self.root / "data" / "results" / f"{name}.json").write_text(json.dumps(doc))

    def commit(self, msg: str = "change") -> str:
        _git(self.root, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qam", msg)
        return _git(self.root, "rev-parse", "HEAD")

    def state(self, name: str) -> stale.ChapterState:
        return stale.chapter_state(name, "full", root=self.root)


@pytest.fixture
def tiny_book(tmp_path, monkeypatch):
    return Book(tmp_path, monkeypatch)


def test_a_copy_run_as_recorded_is_current(tiny_book):
    tiny_book.execute(DEP), tiny_book.execute(READER)
    assert [tiny_book.state(n).state for n in (DEP, READER)] == [stale.CURRENT, stale.CURRENT]
    assert tiny_book.state(DEP).seconds == 12.5 and tiny_book.state(DEP).command == ""


def test_a_new_contract_entry_stales_its_reader_and_no_other_chapter(tiny_book, monkeypatch):
    """The contract lives in a tooling module (`contracts`, in `record.TOOLING`): an entry added for one chapter
    stales that chapter, whose run did not read the file, and leaves every other chapter current."""
    monkeypatch.setattr(contracts, "READS_RESULTS_OF", {})
    tiny_book.execute(DEP), tiny_book.execute(READER)
    assert [tiny_book.state(n).state for n in (DEP, READER)] == [stale.CURRENT, stale.CURRENT]
    monkeypatch.setattr(contracts, "READS_RESULTS_OF", {READER: (DEP,)})
    assert tiny_book.state(DEP).state == stale.CURRENT
    assert tiny_book.state(READER).state == stale.STALE
    assert any("which its run did not" in r for r in tiny_book.state(READER).why)
    assert "book/contracts.py" in record.TOOLING


def test_code_change_makes_it_stale_but_set_repo_does_not(tiny_book):
    tiny_book.execute(DEP)
    nbformat.write(_source(url="https://github.com/fork/b"), tiny_book.root / "notebooks" / f"{DEP}.ipynb")
    assert tiny_book.state(DEP).state == stale.CURRENT   # the Colab cell does nothing off Colab
    nbformat.write(_source("y = x + 2"), tiny_book.root / "notebooks" / f"{DEP}.ipynb")
    st = tiny_book.state(DEP)
    assert st.state == stale.STALE and st.why == ["code changed (record)"]
    assert st.command == f"make reproduce ONLY={DEP[:2]}"


def test_profile_parameter_change_makes_it_stale(tiny_book):
    tiny_book.execute(DEP)
    tiny_book.profile(DEP, x=3)
    st = tiny_book.state(DEP)
    assert st.state == stale.STALE and st.why == ["parameters changed: x"]


def test_a_changed_results_file_read_makes_the_reader_stale(tiny_book):
    tiny_book.execute(DEP), tiny_book.execute(READER)
    (tiny_book.root / "data" / "results" / f"{DEP}.json").write_text(json.dumps({"results": {"v": 2}}))
    assert tiny_book.state(DEP).state == stale.CURRENT
    st = tiny_book.state(READER)
    assert st.state == stale.STALE and st.why == [f"{DEP[:2]}'s results changed (sha256)"]


def test_a_dep_rerun_with_the_same_numbers_leaves_the_reader_current(tiny_book):
    tiny_book.execute(DEP), tiny_book.execute(READER)
    path = tiny_book.root / "data" / "results" / f"{DEP}.json"
    path.write_text(json.dumps({"results": {"v": 1}, "provenance": {"seconds": 3.0, "git_commit": "x"}}))
    st = tiny_book.state(READER)   # the version it read is in git history (the fixture's first commit)
    assert st.state == stale.CURRENT and st.why == [f"{DEP[:2]} rerun since, with the same numbers"]
    path.write_text(json.dumps({"results": {"v": 1.000002}, "provenance": {"seconds": 3.0}}))
    assert tiny_book.state(READER).state == stale.CURRENT  # another CPU's rounding (below stale.SAME_TOL)
    path.write_text(json.dumps({"results": {"v": 1.0001}, "provenance": {"seconds": 3.0}}))
    assert tiny_book.state(READER).state == stale.STALE   # a change a page could print
    path.write_text(json.dumps({"results": {"v": 1, "interval": [1, 0, 2]}, "provenance": {"seconds": 3.0}}))
    assert tiny_book.state(READER).state == stale.CURRENT  # a key added: nothing the reader read has moved
    path.write_text(json.dumps({"results": {}, "provenance": {"seconds": 3.0}}))
    assert tiny_book.state(READER).state == stale.STALE   # a key removed is a change
    path.write_text(json.dumps({"results": {"v": 1}, "provenance": {"seconds": 4.0}}))
    assert stale.same_numbers(tiny_book.root, path, "0" * 64) is None    # no version with that sha: cannot judge
    rec_path = tiny_book.root / "book" / "chapters" / f"{READER}.ipynb"
    nb = nbformat.read(rec_path, as_version=4)
    nb.metadata[record.KEY]["reads"][DEP] = "0" * 64
    nbformat.write(nb, rec_path)
    st = tiny_book.state(READER)
    assert st.state == stale.UNKNOWN and "not in this clone's history" in st.why[0]


def test_sinklib_change_is_listed_not_rerun(tiny_book, monkeypatch, capsys):
    tiny_book.execute(DEP), tiny_book.execute(READER)
    (tiny_book.root / "sinklib" / "a.py").write_text("A = 2\n")
    nbformat.write(_source("y = 0"), tiny_book.root / "notebooks" / f"{READER}.ipynb")
    assert tiny_book.state(DEP).state == stale.SINKLIB
    ran = []
    monkeypatch.setattr(runner, "execute", lambda name, profile, *a, **k: ran.append(name))
    states = stale.update("full")
    assert ran == [READER]   # stale for its code; the dep only listed
    out = capsys.readouterr().out
    assert "sinklib changed" in out and f"make reproduce ONLY={DEP[:2]}" in out and "not rerun by `make book`" in out
    assert {s.name: s.state for s in states}[DEP] == stale.SINKLIB


def test_without_a_record_git_history_decides(tiny_book):
    first = _git(tiny_book.root, "rev-parse", "HEAD")
    tiny_book.execute(DEP, with_record=False, commit=first + "+dirty")
    base = tiny_book.commit("dep executed")
    tiny_book.execute(READER, with_record=False, commit=base)
    tiny_book.commit("reader executed")
    assert tiny_book.state(READER).state == stale.CURRENT   # the dep's results unchanged since `base`
    (tiny_book.root / "sinklib" / "a.py").write_text("A = 3\n")
    tiny_book.commit("library")
    st = tiny_book.state(DEP)
    assert st.state == stale.SINKLIB and "(+dirty stripped)" in st.why[-1] and st.seconds == 12.5
    assert tiny_book.state(READER).why == [f"sinklib changed since {base[:8]} (git diff): sinklib.a"]
    (tiny_book.root / "data" / "results" / f"{DEP}.json").write_text(json.dumps({"results": {"v": 3}}))
    st = tiny_book.state(READER)   # uncommitted counts too (git diff against the working tree)
    assert st.state == stale.STALE and st.why == [f"{DEP[:2]}'s results changed since {base[:8]} (git history)"]
    tiny_book.commit("dep rerun")
    assert tiny_book.state(READER).state == stale.STALE


def test_only_the_modules_a_chapter_imports_count(tiny_book):
    tiny_book.execute(DEP)
    (tiny_book.root / "sinklib" / "b.py").write_text("B = 2\n")   # no notebook imports b
    (tiny_book.root / "sinklib" / "new.py").write_text("N = 1\n")
    assert tiny_book.state(DEP).state == stale.CURRENT
    (tiny_book.root / "sinklib" / "c.py").write_text("C = 2\n")   # imported by a, lazily, inside a function
    st = tiny_book.state(DEP)
    assert st.state == stale.SINKLIB and st.why == ["sinklib changed (record): sinklib.c"]
    (tiny_book.root / "sinklib" / "a.py").write_text("A = 5\n")   # a no longer imports c: both count
    assert tiny_book.state(DEP).why == ["sinklib changed (record): sinklib.a, sinklib.c"]


def test_an_old_record_is_judged_by_git_on_the_chapter_modules_only(tiny_book):
    tiny_book.execute(DEP, with_record="v1")
    assert record.read(nbformat.read(tiny_book.root / "book/chapters" / f"{DEP}.ipynb", 4))["version"] == 1
    assert tiny_book.state(DEP).state == stale.CURRENT   # its whole-sinklib hash is not compared any more
    (tiny_book.root / "sinklib" / "b.py").write_text("B = 2\n")
    tiny_book.commit("b")
    assert tiny_book.state(DEP).state == stale.CURRENT
    (tiny_book.root / "sinklib" / "c.py").write_text("C = 2\n")   # uncommitted counts too
    st = tiny_book.state(DEP)
    commit = record.read(nbformat.read(tiny_book.root / "book/chapters" / f"{DEP}.ipynb", 4))["git_commit"]
    assert st.state == stale.SINKLIB and st.why == [f"sinklib changed since {commit[:8]} (git diff): sinklib.c"]


def test_the_runner_records_the_chapter_dependencies(tiny_book, monkeypatch):
    import papermill as pm

    from sinklib.book import results

    def fake_papermill(src, out, parameters, **_):   # what papermill leaves, without a kernel
        nb = nbformat.read(src, as_version=4)
        nb.metadata["papermill"] = {"parameters": parameters}
        nbformat.write(nb, out)

    monkeypatch.setattr(pm, "execute_notebook", fake_papermill)
    monkeypatch.setattr(results, "_git_commit", lambda: "abc")
    runner.execute(DEP, "full", out=tiny_book.root / "book" / "chapters")
    rec = record.read(nbformat.read(tiny_book.root / "book" / "chapters" / f"{DEP}.ipynb", as_version=4))
    assert rec["version"] == record.VERSION == 2 and "sinklib_sha256" not in rec
    assert sorted(rec["sinklib_deps"]) == ["sinklib/a.py", "sinklib/c.py"]
    assert rec["sinklib_deps_sha256"] == record.set_sha256(rec["sinklib_deps"])
    assert tiny_book.state(DEP).state == stale.CURRENT


def test_a_commit_missing_from_history_cannot_be_judged(tiny_book):
    tiny_book.execute(DEP, with_record=False, commit="f" * 40)
    st = tiny_book.state(DEP)
    assert st.state == stale.UNKNOWN and "not in this clone's history" in st.why[0]


def test_missing_copy_is_rerun_and_table_lists_every_chapter(tiny_book):
    tiny_book.execute(DEP)
    states = [tiny_book.state(n) for n in (DEP, READER)]
    assert states[1].state == stale.MISSING and stale.MISSING in stale.RERUN
    text = stale.table(states)
    assert text.splitlines()[0].split() == ["chapter", "state", "why", "est.", "time", "command"]
    assert DEP in text and READER in text


def test_durations_read_as_a_person_says_them():
    assert [stale.duration(s) for s in (None, 40, 600, 3 * 3600)] == ["?", "40 s", "10 min", "3.0 h"]


def test_time_left_and_progress_line():
    order, est = ["01", "02", "03"], {"01": 40.0, "02": 100.0, "03": 60.0}
    assert reproduce.time_left(order, est, 0, 0.0) == 200.0
    assert reproduce.time_left(order, est, 1, 30.0) == 130.0
    assert reproduce.time_left(order, est, 1, 500.0) == 60.0   # over its estimate: what is left of the others
    assert reproduce.time_left(order, {**est, "03": None}, 1, 0.0) is None
    assert reproduce.clock(3725) == "1:02:05" and reproduce.clock(None) == "?"
    line = reproduce.progress_line(2, 3, "02_x", 95.0, 130.0, "training 12/40")
    assert line == "[2/3] 02_x  elapsed 0:01:35  left ~0:02:10  (training 12/40)"
    assert reproduce.progress_line(1, 3, "01_x", 0, None, "").endswith("left ~?")
    over = reproduce.progress_line(1, 3, "04_x", 3600.0, 60.0, "VL stage 1 5/200", overrun=48.0)
    assert "past its saved run time of 0:00:48" in over and "then ~0:01:00 for the chapters after it" in over
    assert "empty cache" not in over
    cold = reproduce.progress_line(1, 3, "04_x", 3600.0, 60.0, "", overrun=48.0, cold=5 * 3600 + 7)
    assert "from an empty cache it computes at least 5:00:07" in cold


def test_a_chapter_s_compute_from_an_empty_cache_is_what_its_results_record(tmp_path):
    """`costs.compute_seconds`: trainings, each evaluated suite once per condition, chapter 11's jobs."""
    import json

    from sinklib.book import costs

    doc = {"results": {"runtime": [{"stage": "stage1", "seconds": 100}],
                       "scores": [{"model": "m", "condition": "vl", "suite": "math", "metric": "strict", "seconds": 20},
                                  {"model": "m", "condition": "vl", "suite": "math", "metric": "lenient", "seconds": 20}],
                       "job_seconds": {"m seed 0 vl": 30.0}}}
    (tmp_path / "04_x.json").write_text(json.dumps(doc))
    (tmp_path / "05_x.json").write_text(json.dumps({"results": {"S": 1}}))
    assert costs.compute_seconds("04_x", tmp_path) == 150.0
    assert costs.compute_seconds("05_x", tmp_path) is None and costs.compute_seconds("06_x", tmp_path) is None


def test_progress_side_channel(tmp_path, monkeypatch):
    f = tmp_path / "p.json"
    progress.report("training", 1, 10)   # no variable: nothing written anywhere
    monkeypatch.setenv(progress.ENV, str(f))
    monkeypatch.setattr(progress, "_last", {"t": 0.0, "what": None, "total": None})
    progress.advance(1, 2)                # before any report: nothing to move on
    assert progress.read(f) is None
    progress.report("training", 1, 10)
    progress.report("training", 2, 10)   # within a second of the last write: skipped
    assert progress.describe(progress.read(f)) == "training 1/10"
    progress.report("training", 10, 10)  # the last step is always written
    assert progress.describe(progress.read(f)) == "training 10/10"
    progress.report("evaluating math", 0, 300)
    assert progress.describe(progress.read(f)) == "evaluating math 0/300"
    progress._last["t"] = 0.0             # a second later: the suite's batches move it on, on its own scale
    progress.advance(600, 1200)           # 600 of 1200 answer choices
    assert progress.describe(progress.read(f)) == "evaluating math 150/300"
    progress.advance(1200, 1200)          # the end is always written
    assert progress.describe(progress.read(f)) == "evaluating math 300/300"
    assert progress.read(tmp_path / "none.json") is None and progress.describe(None) == ""


def test_resume_skips_what_finished_with_the_same_fingerprint(tmp_path):
    path = tmp_path / "state.json"
    state = reproduce.load_state(path, "full")
    assert state == {"profile": "full", "done": {}}
    fps = {"01": "a", "02": "b", "03": "c"}
    reproduce.mark_done(path, state, "01", "a", 40.0)
    reproduce.mark_done(path, state, "02", "old", 90.0)
    state = reproduce.load_state(path, "full")
    assert reproduce.pending(["01", "02", "03"], state, fps) == ["02", "03"]
    assert reproduce.load_state(path, "quick")["done"] == {}           # another profile starts over
    assert reproduce.load_state(path, "full", restart=True)["done"] == {}
    path.write_text("{not json")
    assert reproduce.load_state(path, "full")["done"] == {}


def test_verdict_and_exit_status(tmp_path):
    before, after = tmp_path / "before", tmp_path / "after"
    before.mkdir(), after.mkdir()
    doc = {"results": {"rho": 0.5, "n": 12}, "provenance": {"seconds": 3.0}}
    for d in (before, after):
        (d / "01_a.json").write_text(json.dumps(doc))
    (before / "02_b.json").write_text(json.dumps(doc))
    (after / "02_b.json").write_text(json.dumps({**doc, "results": {"rho": 0.5 + 1e-4, "n": 12},
                                                 "provenance": {"seconds": 9.0}}))
    diffs = reproduce.compare_chapters(["01_a", "02_b"], before, after, 1e-6)
    assert not diffs["01_a"] and len(diffs["02_b"]) == 1 and diffs["02_b"][0].path == "/results/rho"
    assert reproduce.exit_status(diffs, None) == reproduce.DIFFERENT
    assert reproduce.exit_status(reproduce.compare_chapters(["02_b"], before, after, 1e-3), None) == reproduce.OK
    assert reproduce.exit_status({"01_a": []}, "02_b") == reproduce.FAILED
    text = reproduce.verdict_table(diffs, 1e-6, failed="03_c")
    assert "01_a" in text and "reproduced" in text and "1 difference(s)" in text and "FAILED" in text
    missing = reproduce.compare_chapters(["03_c"], before, after, 1e-6)["03_c"]
    assert missing[0].kind == "file" and missing[0].before == compare.MISSING


def test_device_goes_only_to_chapters_that_take_it(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "NOTEBOOKS", tmp_path)
    nbformat.write(_source(), tmp_path / "01_a.ipynb")
    nb = _source()
    runner.parameters_cell(nb).source += '\ndevice = "cpu"'
    nbformat.write(nb, tmp_path / "02_b.ipynb")
    assert reproduce.device_params("01_a", "auto") == {}
    assert reproduce.device_params("02_b", "auto") == {"device": "auto"}
    assert reproduce.device_params("02_b", None) == {}


def test_reproduce_fills_a_chapters_cache_with_workers_before_it_runs(tmp_path, monkeypatch):
    """Chapter 9's independent trainings run in a pool of worker processes first (on CPU, with 2 or more), then
    the chapter reads them from the cache; a GPU run, one core or another chapter skips the step."""
    import importlib
    import inspect
    import sys
    import types

    for name, module in reproduce.PREPARE.items():                      # the real steps name real chapters
        mod = importlib.import_module(module)
        assert (ROOT / "notebooks" / f"{name}.ipynb").exists() and callable(mod.chapter_params)
        assert {"jobs", "log"} <= set(inspect.signature(mod.prepare).parameters)
    calls = []
    fake = types.SimpleNamespace(chapter_params=lambda profile: {"profile": profile},
                                 prepare=lambda p, jobs, log: calls.append(("prepare", p["profile"], jobs)))
    monkeypatch.setitem(sys.modules, "fake_prep", fake)
    monkeypatch.setattr(reproduce, "PREPARE", {"09_x": "fake_prep"})
    monkeypatch.setattr(reproduce, "fingerprint", lambda *a: "fp")
    monkeypatch.setattr(runner, "execute", lambda name, profile, params=None: calls.append(("execute", name)) or 5.0)
    monkeypatch.setenv("SINKBOOK_JOBS", "2")
    order, state = ["01_y", "09_x"], {"profile": "quick", "done": {}}
    failed = reproduce._each_chapter(order, order, "quick", None, state, tmp_path / "state.json",
                                     dict.fromkeys(order, 1.0), {}, tmp_path / "p.json")
    assert failed is None
    assert calls == [("execute", "01_y"), ("prepare", "quick", 2), ("execute", "09_x")]
    assert reproduce.prepare("09_x", "full", "cuda") is None and reproduce.prepare("09_x", "full", None, jobs=1) is None
    assert reproduce.prepare("01_y", "full", None, jobs=4) is None and len(calls) == 3
    monkeypatch.setenv("SINKBOOK_JOBS", "3")
    assert reproduce.prepare_jobs(None) == 3 and reproduce.prepare_jobs("cpu") == 3 and reproduce.prepare_jobs("auto") == 0

def test_makefile_book_reruns_only_stale_chapters():
    make = (ROOT / "Makefile").read_text()
    notebooks = make.split("\nnotebooks:")[1].split("\n\n")[0]
    assert "sinklib.book update" in notebooks and "sinklib.book run" not in notebooks
    assert re.search(r"^book: notebooks html$", make, re.M)
    assert "sinklib.book reproduce" in make and "$(ONLY)" in make and "$(DEVICE)" in make


def _readme_block(title: str) -> list[str]:
    """Commands of the first bash block after the README heading or bold paragraph `title`."""
    text = (ROOT / "README.md").read_text()
    block = text[text.index(title):].split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("#")[0].strip() for line in block.splitlines() if line.split("#")[0].strip()]


def test_publishing_workflow_runs_the_readme_commands():
    wf = yaml.safe_load((ROOT / ".github" / "workflows" / "book.yml").read_text())
    steps = [s for job in wf["jobs"].values() for s in job["steps"]]
    runs = [s["run"] for s in steps if "run" in s]
    commands = _readme_block("**Publishing.**")
    assert commands == ["make render"]
    for c in commands:
        assert any(c in r for r in runs), f"the workflow does not run the README's `{c}`"
    uses = [s.get("uses", "") for s in steps]
    assert any(u.startswith("actions/upload-pages-artifact") for u in uses)
    assert any(u.startswith("actions/deploy-pages") for u in uses)
    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-pages-artifact"))
    assert upload["with"]["path"] == "_build/html"
    assert wf["permissions"]["pages"] == "write" and wf["permissions"]["id-token"] == "write"
    assert not any("install models" in r or "sinklib.book run" in r or "reproduce" in r for r in runs)
    make = (ROOT / "Makefile").read_text()
    assert "render: setup-render" in make and "SINKBOOK_SETUP=render" in make
    assert "SINKBOOK_SETUP:-full}\" = render" in (ROOT / "scripts" / "setup.sh").read_text()


def test_readme_links_the_published_book_of_the_configured_repository(tmp_path, monkeypatch):
    import shutil

    url = runner.repository_url()
    assert runner.pages_url("https://github.com/Some-One/my.book") == "https://some-one.github.io/my.book/"
    readme = (ROOT / "README.md").read_text()
    assert runner.pages_url(url) in readme and f"{url}/actions/workflows/book.yml/badge.svg" in readme
    for name in ("_config.yml", "README.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / "notebooks").mkdir(), (tmp_path / "book").mkdir()
    monkeypatch.setattr(runner, "checkout_root", lambda: tmp_path)
    runner.set_repo("https://github.com/someone/fork")
    text = (tmp_path / "README.md").read_text()
    assert "https://someone.github.io/fork/" in text and runner.pages_url(url) not in text


def test_the_rerun_tooling_is_not_a_sinklib_change(tiny_book):
    tiny_book.execute(DEP)
    for t in record.TOOLING:
        (tiny_book.root / "sinklib" / t).parent.mkdir(parents=True, exist_ok=True)
        (tiny_book.root / "sinklib" / t).write_text("# edited\n")
    assert tiny_book.state(DEP).state == stale.CURRENT
    for t in record.TOOLING:   # the names are real modules that no notebook imports
        assert (ROOT / "sinklib" / t).exists()
    for nb in (ROOT / "notebooks").glob("*.ipynb"):
        text = nb.read_text()
        assert not any(f"sinklib.book.{Path(t).stem}" in text for t in record.TOOLING), nb.name


def test_what_the_runner_writes_does_not_make_the_code_dirty(tmp_path, monkeypatch):
    """Chapters run one after another in one call: the first one's executed copy, results and exported README figure
    must not mark the next one's provenance '+dirty' (chapter 1 exports book/_static/01_sink_definition.png)."""
    from sinklib.book import results

    git = lambda *a: subprocess.run(["git", *a], cwd=tmp_path, check=True, capture_output=True)  # noqa: E731
    git("init", "-q")
    files = ["book/chapters/01_x.ipynb", "data/results/01_x.json", "book/_generated/t.md",
             "book/_static/01_x.png", "book/_static/offline.css", "sinklib/m.py"]
    for f in files:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("a\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "c")
    monkeypatch.setattr(results, "checkout_root", lambda: tmp_path)
    for f in files[:4]:
        (tmp_path / f).write_text("b\n")
    assert not results._git_commit().endswith("+dirty")
    for f in files[4:]:
        (tmp_path / f).write_text("c\n")
        assert results._git_commit().endswith("+dirty"), f
        git("checkout", "--", f)
