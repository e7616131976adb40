"""The executed pages print no machine paths and no warnings (#10)."""
import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
EXECUTED = sorted((ROOT / "book" / "chapters").glob("[0-9][0-9]_*.ipynb"))
MACHINE_PATH = re.compile(r"(?<![\w.])/(root|home|tmp|work|Users|var/folders|content)/|site-packages|PosixPath\(|WindowsPath\(")
WARNING = re.compile(r"\b\w*Warning\b|\bWARNING\b|warnings\.warn")


def _texts(cell):
    for o in cell.get("outputs", []):
        if o.output_type == "stream":
            yield o.name, o.text
        elif o.output_type in ("execute_result", "display_data"):
            for mime, data in o.get("data", {}).items():
                if mime.startswith("text/") and mime != "text/html" or mime == "text/html":
                    yield mime, data if isinstance(data, str) else "".join(data)
        elif o.output_type == "error":
            yield "error", "\n".join(o.traceback)


@pytest.mark.parametrize("path", EXECUTED, ids=[p.stem for p in EXECUTED])
def test_no_machine_paths_or_warnings_in_outputs(path):
    nb = nbformat.read(path, as_version=4)
    for i, c in enumerate(nb.cells):
        for kind, text in _texts(c):
            m = MACHINE_PATH.search(text)
            assert not m, f"{path.name} cell {i} ({kind}) prints a machine path: ...{text[max(0, m.start() - 80):m.end() + 80]}..."
            w = WARNING.search(text) if kind in ("stderr", "stdout") else None
            assert not w, f"{path.name} cell {i} ({kind}) prints a warning: ...{text[max(0, w.start() - 80):w.end() + 120]}..."
        if c.cell_type == "code":
            assert not c.outputs or all(o.get("name") != "stderr" for o in c.outputs), \
                f"{path.name} cell {i} writes to stderr: {[o.get('text', '')[:200] for o in c.outputs if o.get('name') == 'stderr']}"


def test_the_pattern_catches_what_it_should():
    for bad in ("PosixPath('/x/data/results/01.json')", "/root/.cache/x", "/tmp/pytest-1/r", "/work/main/data",
                ".venv/lib/python3.11/site-packages/tqdm/auto.py"):
        assert MACHINE_PATH.search(bad), bad
    for ok in ("data/results/01.json", "$SINKBOOK_RESULTS/01.json", "a/tmp/b", "2/3 of heads"):
        assert not MACHINE_PATH.search(ok), ok
    assert WARNING.search("UserWarning: IProgress not found")


@pytest.mark.parametrize("path", EXECUTED, ids=[p.stem for p in EXECUTED])
def test_no_figure_with_overlapping_text(path):
    """Every figure measured when its chapter ran (`sinklib.plots.overlap`, installed by `plots.set_theme`) has no
    overlapping text; a copy executed before the check existed has figures without a stored check, which pass."""
    import json

    from sinklib.plots import OVERLAP_MARK, figure_checks_in_notebook

    nb = json.loads(path.read_text())
    for i, check in figure_checks_in_notebook(nb):
        assert not (check or {}).get("overlaps"), f"{path.name} cell {i}: a figure's texts overlap: {check['overlaps']}"
    for i, c in enumerate(nb["cells"]):
        for o in c.get("outputs", []):
            text = "".join(o.get("text", "")) if o.get("output_type") == "stream" else ""
            assert OVERLAP_MARK not in text, f"{path.name} cell {i} warns of overlapping figure text: {text[:300]}"


@pytest.mark.parametrize("path", EXECUTED, ids=[p.stem for p in EXECUTED])
def test_no_machine_paths_in_metadata(path):
    """The copy's metadata (papermill's paths, the run record) names no machine's folders (session 63's review)."""
    import json

    meta = json.dumps(nbformat.read(path, as_version=4).metadata)
    m = MACHINE_PATH.search(meta)
    assert not m, f"{path.name}'s metadata holds a machine path: ...{meta[max(0, m.start() - 80):m.end() + 80]}..."


def test_record_write_makes_papermill_paths_relative(tmp_path):
    from nbformat.v4 import new_notebook

    from sinklib.book import record

    root = tmp_path / "checkout"
    (root / "book" / "chapters").mkdir(parents=True)
    nb = new_notebook()
    nb.metadata["papermill"] = {"input_path": str(root / "notebooks" / "01_x.ipynb"),
                                "output_path": str(tmp_path / "elsewhere" / "01_x.ipynb"), "parameters": {"a": 1}}
    path = root / "book" / "chapters" / "01_x.ipynb"
    nbformat.write(nb, path)
    record.write(path, {"version": record.VERSION}, root=root)
    meta = nbformat.read(path, as_version=4).metadata
    assert meta["papermill"] == {"input_path": "notebooks/01_x.ipynb", "output_path": "01_x.ipynb",
                                 "parameters": {"a": 1}}
    assert meta[record.KEY] == {"version": record.VERSION}
