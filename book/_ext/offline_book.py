"""Sphinx extension for a book read offline, from disk.

1. MathJax is served from the built book, so the static book renders math without a network.
2. Each page loads every script once: Jupyter Book 1.x adds sphinx-thebe's inline configuration script twice,
   which makes the browser report "Identifier 'THEBE_JS_URL' has already been declared" on every page.
3. A figure drawn by a code cell gets an alt text: myst-nb leaves an output image's alt as its file name (a hash),
   which is what a screen reader reads and what shows when the image fails; it becomes "Figure N.k (its caption
   follows the figure)" from the caption paragraph the book puts under every figure (the browser check requires
   one), the first sentence of a {figure} directive's caption, or says that the figure's numbers are in the text
   around it.

MathJax 3 (es5 build) comes from the PyPI package ``django-static-mathjax`` (installed by the project's
setup; it has no dependencies and is imported as ``mathjax``). At build time the files the TeX-to-CHTML
component needs are copied into ``_build/html/_static/mathjax`` and ``mathjax_path`` points there.
"""
from __future__ import annotations

import re
import shutil
from importlib import util
from pathlib import Path

COMPONENT = "tex-chtml.js"
NEEDED = (COMPONENT, "input", "output/chtml", "ui", "a11y", "adaptors")


def mathjax_es5() -> Path:
    spec = util.find_spec("mathjax")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("offline MathJax needs the package django-static-mathjax: run `make setup` "
                           "(or pip install django-static-mathjax==3.2.2.1)")
    es5 = Path(list(spec.submodule_search_locations)[0]) / "static" / "mathjax" / "es5"
    if not (es5 / COMPONENT).is_file():
        raise RuntimeError(f"the installed package 'mathjax' has no es5/{COMPONENT}: reinstall django-static-mathjax")
    return es5


def _copy(app, exception) -> None:
    if exception is not None or app.builder.format != "html":
        return
    src, dst = mathjax_es5(), Path(app.outdir) / "_static" / "mathjax"
    for rel in NEEDED:
        s, d = src / rel, dst / rel
        if s.is_dir():
            shutil.copytree(s, d, dirs_exist_ok=True)
        elif s.is_file():
            d.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(s, d)


def _configure(app, config) -> None:
    mathjax_es5()  # fail early, with the fix, when the package is missing
    config.mathjax_path = f"mathjax/{COMPONENT}"


def _dedupe_scripts(app, pagename, templatename, context, doctree) -> None:
    seen, kept = set(), []
    for js in context.get("script_files", []):
        key = (str(getattr(js, "filename", js) or ""), tuple(sorted((k, str(v)) for k, v in getattr(js, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            kept.append(js)
    context["script_files"][:] = kept  # in place: later handlers (MathJax) append to the same list


#: the start of the caption paragraph under a figure ("Figure 8.1. ...")
CAPTION = re.compile(r"^Figure\s+(\d+\.\d+)\b")
#: the alt text of a figure with no caption under it
NO_CAPTION = "A figure drawn by the code cell above; the text around it gives its numbers"


def _file_alt(img) -> bool:
    """Whether an image's alt is missing or only its file name (myst-nb's default for a cell output)."""
    alt = img.get("alt", "")
    return not alt or alt == img.get("uri", "") or bool(re.search(r"\.(png|jpe?g|svg|gif)$", alt))


def _alt_texts(app, doctree, docname) -> None:
    from docutils import nodes

    for img in list(doctree.findall(nodes.image)):
        if not _file_alt(img):
            continue
        if isinstance(img.parent, nodes.figure):  # a {figure} directive: its own caption, first sentence
            cap = next(iter(img.parent.findall(nodes.caption)), None)
            if cap is not None:
                img["alt"] = re.split(r"(?<=[.:])\s", cap.astext().strip(), maxsplit=1)[0][:160]
                continue
        cell = img
        while cell.parent is not None and "cell" not in cell.get("classes", []):
            cell = cell.parent
        follow = cell.next_node(descend=False, siblings=True) if cell.parent is not None else None
        m = CAPTION.match(follow.astext()) if isinstance(follow, nodes.paragraph) else None
        img["alt"] = f"Figure {m.group(1)} (its caption follows the figure)" if m else NO_CAPTION


def setup(app):
    app.connect("doctree-resolved", _alt_texts)
    app.connect("config-inited", _configure, priority=900)
    app.connect("html-page-context", _dedupe_scripts, priority=100)  # before any handler that returns a template
    app.connect("build-finished", _copy)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
