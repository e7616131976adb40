"""The book's page on where the embedded models' weights come from (#29): ``book/_generated/models_table.md``,
included by ``book/models.md``, written from the registry (`sinklib.core.models.MODELS`) and, for the models
whose GGUF file is not pinned in sinklib, the weights checksum that the chapters' runs recorded in their
results' provenance. No value on the page is typed by hand.

    python -m sinklib.book.models_page      # rewrite book/_generated/models_table.md (make book runs it)
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from sinklib.core.models import MODELS, ModelSpec
from sinklib.core.resources import results_dir

#: the results whose provenance records the checksum of each loaded model (chapters 1-3 load every model)
RESULTS_WITH_MODELS = ("01_sink_definition", "02_sink_strength", "03_perturbation_bound")


def recorded_checksums(folder: Path | None = None) -> dict[str, tuple[str, str]]:
    """{model name: (weights sha256, the results file that recorded it)} from chapters 1-3's provenance."""
    out: dict[str, tuple[str, str]] = {}
    for nb in RESULTS_WITH_MODELS:
        path = Path(folder or results_dir()) / f"{nb}.json"
        if not path.is_file():
            continue
        for m in json.loads(path.read_text()).get("provenance", {}).get("models", []):
            if m.get("name") in MODELS and len(str(m.get("weights_sha256", ""))) == 64:
                out.setdefault(m["name"], (m["weights_sha256"], nb))
    return out


def _checksum(spec: ModelSpec, recorded: dict[str, tuple[str, str]]) -> str:
    if spec.parts is not None:
        return f"`{spec.parts.sha256}` (pinned in sinklib; checked when the parts are joined)"
    if spec.name in recorded:
        sha, nb = recorded[spec.name]
        return f"`{sha}` (recorded by {{doc}}`chapters/{nb}` when it loaded the file)"
    return "not recorded yet (run chapter 1)"


def _size(spec: ModelSpec) -> str:
    return f"{spec.parts.size / 1e6:.0f} MB, joined from {len(spec.parts.packages)} parts" if spec.parts else ""


def markdown(folder: Path | None = None) -> str:
    """A short table (one row per embedded model: what it is), then each model's files, packages and checksum as a
    list under its name (long hashes and package names do not fit a table in the book's column)."""
    recorded = recorded_checksums(folder)
    rows = ["| name | what it is | QK-norm | quantisation | licence |", "| --- | --- | --- | --- | --- |"]
    files = []
    for spec in MODELS.values():
        if spec.parts is not None:
            pk = (f"`{spec.parts.packages[0]}` ... `{spec.parts.packages[-1]}` =={spec.parts.version} "
                  f"(extra `{spec.extra}`)")
        else:
            pk = ", ".join(f"`{p}`" for p in spec.packages) + f" (extra `{spec.extra}`)"
        file = f"`{spec.gguf_file}`" + (f", {_size(spec)}" if spec.parts else "")
        rows.append(f"| `{spec.name}` | {spec.tuning} | {spec.qk_norm} | {spec.quantisation} | {spec.license} |")
        files.append(f"`{spec.name}`\n: upstream model `{spec.hub_id}`; GGUF file {file}; packages {pk}; sha256 of the GGUF file "
                     f"{_checksum(spec, recorded)}\n")
    return "\n".join(rows) + "\n\n" + "\n".join(files)


def write(out: Path | None = None) -> Path:
    from sinklib.book import runner as book

    root = book._need_checkout("python -m sinklib.book.models_page")
    out = Path(out) if out else root / "book" / "_generated" / "models_table.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(markdown(root / "data" / "results"))
    return out


if __name__ == "__main__":
    print("wrote", write())
    sys.exit(0)
