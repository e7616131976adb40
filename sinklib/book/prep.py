"""What a chapter's prepare command needs of the chapter itself (chapter 9's `sinklib.tiny.sinkprep`, chapter 11's
`sinklib.adapt.panelprep`): its parameters on a profile, exactly as papermill runs it. No chapter imports this
module, so changing it changes no chapter's dependencies."""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sinklib.errors import ParameterError


def notebook_params(chapter: str, profile: str, spec: Mapping[str, Any], root: Path | None = None) -> dict:
    """The parameters of `notebooks/<chapter>.ipynb` on `profile`: its parameters cell with the profile's values
    over it (what papermill runs it with), checked by `spec` (`sinklib.core.params.validate`)."""
    import nbformat

    from sinklib.book import runner
    from sinklib.core.params import validate

    path = (root or Path(__file__).resolve().parents[2]) / "notebooks" / f"{chapter}.ipynb"
    if not path.exists():
        raise ParameterError(f"{path} not found: run this from a checkout of sinkbook (it reads the notebook's "
                             "parameters cell)")
    ns: dict = {}
    exec(compile(runner.parameters_cell(nbformat.read(path, as_version=4)).source, str(path), "exec"), ns)
    ns = {k: v for k, v in ns.items() if not k.startswith("__")}
    ns.update(runner.load_profile(chapter, profile))
    return validate(spec, ns)
