"""The book builds in place with warnings as errors, after every other test has run (file named to run last).

The tests leave tool caches in the book root (.pytest_cache, .hypothesis, ...); `make test` followed by
`make book` must still build, so this builds the real checkout, not a copy.
"""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_book_builds_in_place_without_warnings():
    (ROOT / ".pytest_cache").mkdir(exist_ok=True)   # as left by pytest itself, whatever its cache settings
    jb = Path(sys.executable).parent / "jupyter-book"
    r = subprocess.run([str(jb), "build", str(ROOT), "-W", "-n", "--keep-going"], capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    html = ROOT / "_build" / "html"
    assert (html / "index.html").exists()
    toc = (ROOT / "_toc.yml").read_text()
    for line in toc.splitlines():
        if "file:" in line:
            page = line.split("file:")[1].strip()
            assert (html / f"{page}.html").exists(), f"{page} was not built"
