"""Notebook hygiene, freshness of the executed copies, quick-profile runs, and the book build."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from sinklib.book import record, stale
from sinklib.book import runner as book

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
NAMES = [p.stem for p in SOURCES]
RUN_NAMES = book.run_order(NAMES)  # a notebook after those whose results it reads




@pytest.mark.parametrize("path", SOURCES, ids=NAMES)
def test_source_has_no_outputs_and_one_parameters_cell(path):
    nb = nbformat.read(path, as_version=4)
    for c in nb.cells:
        if c.cell_type == "code":
            assert not c.outputs and not c.execution_count, f"{path.name}: strip outputs"
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, f"{path.name}: {len(tagged)} cells tagged 'parameters'"
    assert "remove-cell" in tagged[0].metadata["tags"]
    assert "profile" in tagged[0].source, "every notebook takes the `profile` parameter"
    first_code = next(c for c in nb.cells if c.cell_type == "code")
    assert "google.colab" in first_code.source, "first code cell installs sinklib on Colab only"


@pytest.mark.parametrize("path", SOURCES, ids=NAMES)
def test_executed_copy_is_fresh(path):
    executed = ROOT / "book" / "chapters" / path.name
    assert executed.exists(), f"run `python -m sinklib.book run --profile full --only {path.stem[:2]}`"
    src, ex = nbformat.read(path, as_version=4), nbformat.read(executed, as_version=4)
    ran_with = book.executed_parameters(ex)
    assert ran_with.get("profile") in book.PROFILE_NAMES, f"{executed}: no papermill parameters recorded"
    assert book.code_sources(src, fold=ran_with) == book.code_sources(ex), f"{executed} is stale: re-execute {path.name}"
    profile = json.loads(json.dumps(book.load_profile(path.stem, ran_with["profile"])))
    assert json.loads(json.dumps(ran_with)) == profile, (
        f"{executed} ran with other parameters than data/profiles/{path.stem}.yml[{ran_with['profile']}]: re-execute it")
    rec = record.read(ex)   # the run record (copies executed before it existed have none)
    if rec is not None:
        assert rec["parameters"] == json.loads(json.dumps(ran_with)), f"{executed}: record and papermill disagree"
        assert rec["code_sha256"] == book.code_fingerprint(ex) == book.code_fingerprint(src, fold=ran_with), (
            f"{executed}: code differs from its run record; re-execute {path.name}")
        for dep, sha in rec["reads"].items():   # or its chapter rerun since with the same numbers (stale.py's rule)
            now = ROOT / "data" / "results" / f"{dep}.json"
            same = sha == record.file_sha256(now) or stale.same_numbers(ROOT, now, sha)
            assert same is not None, f"{executed}: the version of {dep}.json it read is not in this clone's history"
            assert same, f"{executed} read data/results/{dep}.json before it changed: re-execute {path.name}"
    md = lambda nb: [c.source for c in nb.cells if c.cell_type == "markdown"]  # noqa: E731
    assert md(src) == md(ex), f"{executed}: prose differs from the source; run `python -m sinklib.book sync-text`"
    errors = [o for c in ex.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, f"{executed} contains errors"
    # what the reader edits is what runs: no separate injected cell; the parameters cell is shown folded
    assert not [c for c in ex.cells if "injected-parameters" in c.metadata.get("tags", [])]
    tags = book.parameters_cell(ex).metadata["tags"]
    assert "hide-input" in tags and "remove-cell" not in tags


@pytest.mark.parametrize("path", SOURCES, ids=NAMES)
def test_profiles_name_only_known_parameters(path):
    nb = nbformat.read(path, as_version=4)
    src = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", [])).source
    names = {line.split("=")[0].strip() for line in src.splitlines() if "=" in line and not line.startswith("#")}
    for prof in book.PROFILE_NAMES:
        unknown = set(book.load_profile(path.stem, prof)) - names
        assert not unknown, f"data/profiles/{path.stem}.yml[{prof}] sets unknown parameters {unknown}"


def test_run_order_puts_a_reader_after_what_it_reads():
    names = ["08_causal_tests", "07_controlled_panel", "05_panel_correlations", "04_vl_adaptation", "01_sink_definition"]
    order = book.run_order(names)
    assert order == ["01_sink_definition", "04_vl_adaptation", "07_controlled_panel", "05_panel_correlations",
                     "08_causal_tests"]
    assert book.run_order(["05_panel_correlations", "02_sink_strength"]) == ["02_sink_strength", "05_panel_correlations"]
    for reader, read in book.READS_RESULTS_OF.items():  # the contract names real notebooks
        assert {reader, *read} <= set(NAMES), f"READS_RESULTS_OF names a notebook that does not exist: {reader}, {read}"


def test_every_results_file_a_notebook_loads_is_declared():
    """A chapter that calls load_results("NN_name") runs after NN and goes stale when NN's results change only if
    READS_RESULTS_OF says so (chapter 6 read chapter 4's VQA majority without it)."""
    import re

    for n in NAMES:
        code = "\n".join("".join(c["source"]) for c in json.loads((ROOT / "notebooks" / f"{n}.ipynb").read_text())["cells"]
                         if c["cell_type"] == "code")
        read = set(re.findall(r"load_results\(\s*[\"'](\d\d_[a-z0-9_]+)[\"']", code))
        missing = read - set(book.READS_RESULTS_OF.get(n, ()))
        assert not missing, f"{n} loads the results of {sorted(missing)}: add them to READS_RESULTS_OF[{n!r}]"


def test_toc_lists_every_chapter():
    toc = (ROOT / "_toc.yml").read_text()
    for n in NAMES:
        assert f"book/chapters/{n}" in toc


@pytest.mark.slow
@pytest.mark.parametrize("name", RUN_NAMES)
def test_notebook_runs_quick_profile(name, results_tmp, tmp_path_factory):
    """Each notebook executes end to end with the quick profile (in run order: chapter 5 after 4 and 7, whose
    results it reads)."""
    out = tmp_path_factory.mktemp("chapters")
    times = book.run("quick", only=[name], out=out)
    assert (out / f"{name}.ipynb").exists()
    doc = json.loads((results_tmp / f"{name}.json").read_text())
    assert doc["provenance"]["profile"] == "quick" and doc["results"]


def test_wrong_parameter_type_is_a_clear_error(tmp_path, results_tmp):
    """A parameter of the wrong type from papermill stops at the check with the parameter's name."""
    import papermill as pm

    src = ROOT / "notebooks" / "01_sink_definition.ipynb"
    with pytest.raises(pm.PapermillExecutionError, match="n_prompts"):
        pm.execute_notebook(str(src), str(tmp_path / "bad.ipynb"), parameters={"n_prompts": "many"},
                            kernel_name="python3", language="python", progress_bar=False)


def test_sync_text_copies_prose_and_refuses_code_changes(tmp_path, monkeypatch):
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

    src_dir, out = tmp_path / "notebooks", tmp_path / "chapters"
    src_dir.mkdir(), out.mkdir()
    monkeypatch.setattr(book, "NOTEBOOKS", src_dir)
    executed = new_notebook(cells=[new_markdown_cell("old prose"), new_code_cell("x = 1")])
    executed.cells[1].outputs = [nbformat.v4.new_output("stream", text="kept\n")]
    nbformat.write(executed, out / "99_demo.ipynb")
    nbformat.write(new_notebook(cells=[new_markdown_cell("new prose"), new_code_cell("x = 1")]),
                   src_dir / "99_demo.ipynb")
    assert book.sync_text(["99_demo"], out) == ["99_demo"]
    ex = nbformat.read(out / "99_demo.ipynb", as_version=4)
    assert ex.cells[0].source == "new prose" and ex.cells[1].outputs[0].text == "kept\n"
    assert book.sync_text(["99_demo"], out) == []
    nbformat.write(new_notebook(cells=[new_markdown_cell("p"), new_code_cell("x = 2")]), src_dir / "99_demo.ipynb")
    with pytest.raises(book.ParameterError, match="re-execute"):
        book.sync_text(["99_demo"], out)
    nbformat.write(new_notebook(cells=[new_code_cell("x = 1"), new_markdown_cell("p")]), src_dir / "99_demo.ipynb")
    with pytest.raises(book.ParameterError, match="moved"):
        book.sync_text(["99_demo"], out)


def test_unknown_profile_is_rejected():
    from sinklib.errors import ParameterError

    with pytest.raises(ParameterError, match="profile"):
        book.load_profile(NAMES[0], "fast")


def test_exercises_page_lists_every_exercise_in_chapter_order():
    """book/exercises.md names each chapter's exercises in the order the chapter has them."""
    import re

    page = (ROOT / "book" / "exercises.md").read_text()
    for path in SOURCES:
        nb = nbformat.read(path, as_version=4)
        labels = [l for c in nb.cells if c.cell_type == "markdown"
                  for l in re.findall(r"```\{exercise\}[^\n]*\n:label: ([\w-]+)", c.source)]
        row = next(l for l in page.splitlines() if f"chapters/{path.stem}" in l)
        assert re.findall(r"\{ref\}`([\w-]+)`", row) == labels, f"{path.stem}: exercises page order or list is wrong"


@pytest.mark.parametrize("reader", ["06_negative_controls", "08_causal_tests"])
def test_chapters_that_reuse_chapter_4s_pairs_name_its_models_in_every_profile(reader):
    """Chapters 6 and 8 read chapter 4's trained pairs (`pairs.chapter4_pairs`), which raises for a model chapter 4
    did not adapt: in every profile their models must be among chapter 4's (the colab profile named the embedded
    models while chapter 4's colab profile adapts Qwen)."""
    default = ["smollm2-135m", "gemma3-270m"]   # the notebooks' own default (checked below)
    for n in (reader, "04_vl_adaptation"):
        assert f'models = {json.dumps(default)}' in (ROOT / "notebooks" / f"{n}.ipynb").read_text().replace('\\"', '"')
    for prof in book.PROFILE_NAMES:
        ch4 = book.load_profile("04_vl_adaptation", prof).get("models", default)
        mine = book.load_profile(reader, prof).get("models", default)
        assert set(mine) <= set(ch4), f"{reader}[{prof}] names {sorted(set(mine) - set(ch4))}, not adapted by chapter 4 there"
