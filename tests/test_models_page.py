"""#29: the models page says where every embedded model's weights come from; its table is generated from the
registry and the chapters' recorded checksums, and the licences it quotes agree with the GGUF headers."""
from pathlib import Path

import pytest

from sinklib.book import models_page
from sinklib.core import gguf_parts, models
from sinklib.errors import ModelNotAvailable

ROOT = Path(__file__).resolve().parent.parent


def test_generated_table_is_fresh_and_in_the_book():
    assert (ROOT / "book" / "_generated" / "models_table.md").read_text() == models_page.markdown(
        ROOT / "data" / "results"), "the models table is stale: run python -m sinklib.book.models_page"
    assert "file: book/models" in (ROOT / "_toc.yml").read_text()
    assert "_generated/models_table.md" in (ROOT / "book" / "models.md").read_text()


def test_every_model_has_a_row_with_a_licence_and_an_entry_with_its_checksum(tmp_path):
    table = models_page.markdown(ROOT / "data" / "results")
    for name, spec in models.MODELS.items():
        row = next(l for l in table.splitlines() if l.startswith(f"| `{name}` |"))
        assert spec.license and spec.tuning and spec.license in row and spec.quantisation in row
        sha = spec.parts.sha256 if spec.parts else models_page.recorded_checksums(ROOT / "data" / "results")[name][0]
        files = table.split(f"`{name}`\n: ", 1)[1].split("\n", 1)[0]   # the model's entry under the table
        assert f"`{sha}`" in files and spec.gguf_file in files
    # without recorded results the unpinned models say so instead of showing a stale value
    assert "not recorded yet (run chapter 1)" in models_page.markdown(tmp_path)
    assert "AWQ" in models.MODELS["qwen2.5-coder-0.5b"].quantisation
    assert all("code-tuned instruct" in models.MODELS[m].tuning for m in ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"))


@pytest.mark.parametrize("name", list(models.MODELS))
def test_quoted_licences_agree_with_the_gguf_header(name):
    spec = models.MODELS[name]
    try:
        path = models.gguf_path(name) if spec.parts is None else None
        if spec.parts is not None:
            gguf_parts.find_parts(spec.parts)  # present: then the assembled file is read below
            path = models.gguf_path(name)
    except ModelNotAvailable as e:
        pytest.skip(f"{name} is not installed ({str(e)[:80]})")
    lic = gguf_parts.gguf_header(path, ("general.license",)).get("general.license")
    if lic is None:
        assert "the GGUF header records none" in spec.license
    else:
        assert "general.license" in spec.license and (lic.lower() in spec.license.lower())
