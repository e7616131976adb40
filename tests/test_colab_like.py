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
