"""#10: the wheel works outside the repository, as on Colab (offline).

Builds the wheel, installs it into a fresh virtual environment that shares no files with the checkout
(its third-party dependencies are borrowed read-only from the project's .venv through a .pth line, because
this machine cannot download them again; sinkbook's editable install there is not activated, since a
.pth-listed folder's own .pth files are not processed), copies one chapter's notebook alone into an empty
folder and executes it there with papermill on the quick profile, reading the profile from the installed
package.
"""
import json
import os
import shutil
import site
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHAPTER = "01_sink_definition"


def _run(cmd, **kw):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{cmd}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


@pytest.mark.slow
def test_wheel_runs_a_chapter_outside_the_repository(tmp_path):
    t0 = time.perf_counter()
    wheel_dir, venv, work = tmp_path / "wheel", tmp_path / "venv", tmp_path / "work"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", wheel_dir, ROOT])
    (whl,) = wheel_dir.glob("sinkbook-*.whl")
    _run([sys.executable, "-m", "venv", venv])
    py = venv / "bin" / "python"
    purelib = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip())
    (purelib / "zz_borrowed_deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    _run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", whl])
    env = {k: v for k, v in os.environ.items() if k not in ("SINKBOOK_RESULTS", "PYTHONPATH", "VIRTUAL_ENV")}
    env["JUPYTER_PATH"] = str(venv / "share" / "jupyter")
    env["JUPYTER_DATA_DIR"] = str(tmp_path / "jupyter-data")
    # the installed sinklib is the wheel's, not the checkout's
    where = json.loads(_run([py, "-c", "import json, sinklib, sinklib.core.resources as r, sinklib.book as b; "
                             "print(json.dumps([sinklib.__file__, r.checkout_root() is None, b.load_profile('"
                             + CHAPTER + "', 'quick'), len(__import__('sinklib.core.data').data.load_prompts())]))"],
                            cwd=tmp_path, env=env))
    assert Path(where[0]).is_relative_to(venv) and where[1], where
    params, n_prompts = where[2], where[3]
    assert params["profile"] == "quick" and n_prompts > 100
    _run([py, "-m", "ipykernel", "install", "--prefix", venv, "--name", "sinkbook-wheel"], env=env)
    work.mkdir()
    shutil.copy(ROOT / "notebooks" / f"{CHAPTER}.ipynb", work / f"{CHAPTER}.ipynb")
    (work / "params.json").write_text(json.dumps(params))
    _run([py, "-c", "import json, papermill as pm; pm.execute_notebook("
          f"'{CHAPTER}.ipynb', 'out.ipynb', parameters=json.load(open('params.json')), kernel_name='sinkbook-wheel', "
          "progress_bar=False)"], cwd=work, env=env, timeout=900)
    doc = json.loads((work / "sinkbook_results" / f"{CHAPTER}.json").read_text())
    assert doc["provenance"]["profile"] == "quick" and doc["results"]["S_default"]
    assert doc["provenance"]["git_commit"].startswith("installed")
    assert sorted(p.name for p in work.iterdir()) == sorted([f"{CHAPTER}.ipynb", "out.ipynb", "params.json",
                                                             "sinkbook_results"])
    print(f"colab-like run: {time.perf_counter() - t0:.0f} s, wheel {whl.stat().st_size / 1024:.0f} KiB")


def test_results_travel_between_colab_machines_through_one_folder(monkeypatch, tmp_path):
    """#31: on Colab each notebook runs on its own machine (an installed wheel, no checkout, its own working
    directory). With SINKBOOK_RESULTS naming one folder (a mounted Drive), chapter 4's results written on one
    machine are read on another; without it, the second machine does not see them and says which chapter to run."""
    import sinklib.book.results as R
    import sinklib.core.resources as res
    from sinklib.book import load_results, save_results
    from sinklib.errors import ResultsMissing

    monkeypatch.setattr(res, "checkout_root", lambda: None)   # as from an installed wheel
    monkeypatch.setattr(R, "checkout_root", lambda: None)
    drive, a, b = tmp_path / "drive" / "sinkbook_results", tmp_path / "machine_a", tmp_path / "machine_b"
    a.mkdir(), b.mkdir()
    monkeypatch.delenv("SINKBOOK_RESULTS", raising=False)
    monkeypatch.chdir(b)
    with pytest.raises(ResultsMissing, match="04_vl_adaptation"):
        load_results("04_vl_adaptation")
    monkeypatch.setenv("SINKBOOK_RESULTS", str(drive))
    monkeypatch.chdir(a)
    save_results("04_vl_adaptation", {"answer": 42}, params={"profile": "colab"})
    monkeypatch.chdir(b)
    assert load_results("04_vl_adaptation")["results"]["answer"] == 42
    assert sorted(p.name for p in drive.iterdir()) == ["04_vl_adaptation.json"] and not list(a.iterdir())
    monkeypatch.delenv("SINKBOOK_RESULTS")
    with pytest.raises(ResultsMissing):       # machine B's own folder never held them
        load_results("04_vl_adaptation")


def test_every_chapter_says_what_to_do_on_colab():
    """Above the first code cell each chapter says what to do while the repository address is a placeholder,
    how to pick the quick or colab values in one line, and how to share results between machines."""
    for nb in sorted((ROOT / "notebooks").glob("0[1-9]_*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        first_code = next(i for i, c in enumerate(cells) if c["cell_type"] == "code")
        above = "".join("".join(c["source"]) for c in cells[:first_code] if c["cell_type"] == "markdown")
        assert "placeholder" in above and "set-repo" in above, nb.name
        assert f'load_profile("{nb.stem}", "quick")' in above, nb.name
        assert "SINKBOOK_RESULTS" in above, nb.name


def test_memory_table_is_fresh_and_reads_model_sizes():
    from sinklib.book import memory

    assert memory.size_of("Qwen/Qwen2.5-0.5B-Instruct") == 5e8 and memory.size_of("google/gemma-3-270m") == 2.7e8
    assert memory.size_of("Qwen/Qwen3-8B") == 8e9 and memory.size_of("smollm2") is None
    assert memory.main(["--check"]) == 0, "run python -m sinklib.book.memory"
    by = {r["chapter"]: r for r in memory.rows()}
    assert by["04_vl_adaptation"]["work"] == memory.FINETUNE and by["02_sink_strength"]["work"] == memory.FORWARD
    assert by["04_vl_adaptation"]["gb"] == 16 * max(map(memory.size_of, by["04_vl_adaptation"]["models"])) / 1e9
    assert "{include} _generated/memory_table.md" in (ROOT / "book" / "how_to_run.md").read_text()
