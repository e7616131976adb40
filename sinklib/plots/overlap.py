"""Overlapping text in a figure, measured: every text a draw of the figure renders (tick labels, axis labels,
titles, annotations, legend entries, colour-bar labels), the box it covers on the canvas, and the pairs of texts
whose boxes overlap by more than a tolerance.

`text_overlaps(fig)` is the measurement; `install_display_check()` (called by `sinklib.plots.set_theme`) runs it on
every figure a notebook displays, prints a warning that starts with `OVERLAP_MARK` under an overlapping figure and
adds the result to the figure's output as the mime type `FIGURE_CHECK_MIME` (read by
`figure_checks_in_notebook`; the browser check of the built book looks for the warning's words).
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

#: how far (figure px) two text boxes must reach into each other to count as overlapping: boxes that touch, or
#: share the antialiasing pixel at their edge, do not
TOLERANCE_PX = 1.0
#: the words that start the warning printed under a figure with overlapping text (the browser check looks for them)
OVERLAP_MARK = "Figure check: overlapping text"
#: the mime type under which a displayed figure's check is stored in the notebook output
FIGURE_CHECK_MIME = "application/vnd.sinkbook.figure-check+json"


@dataclass(frozen=True)
class Overlap:
    """Two drawn texts whose boxes overlap; `depth_px` is how far one must move (figure px) to clear the other."""

    first: str
    second: str
    depth_px: float

    def __str__(self) -> str:
        return f"{self.first!r} and {self.second!r} ({self.depth_px:.0f} px)"


@contextmanager
def _recording_texts(found: list):
    """While active, every Text that draws itself (visible, non-empty) is appended to `found`."""
    from matplotlib.text import Text

    original = Text.draw

    def draw(self, renderer, *args, **kwargs):
        out = original(self, renderer, *args, **kwargs)
        if self.get_visible() and self.get_text().strip():
            found.append(self)
        return out

    Text.draw = draw
    try:
        yield
    finally:
        Text.draw = original


def drawn_texts(fig) -> list:
    """The Text artists that one draw of `fig` renders, each once, in drawing order (needs a canvas with a
    renderer, such as Agg or the notebook's inline backend)."""
    found: list = []
    with _recording_texts(found):
        fig.canvas.draw()
    return list(dict.fromkeys(found))


def _corners(text, renderer) -> np.ndarray | None:
    """The four corners [4, 2] (figure px) of the box `text` covers, turned with the text when it is rotated."""
    box = text.get_window_extent(renderer)
    if not (np.isfinite(box.bounds).all() and box.width > 0 and box.height > 0):
        return None
    angle = text.get_rotation() % 180
    if angle % 90 == 0:
        return np.array([[box.x0, box.y0], [box.x1, box.y0], [box.x1, box.y1], [box.x0, box.y1]])
    text.set_rotation(0)  # the unrotated size; the rotated box shares its centre with its axis-aligned bound
    try:
        flat = text.get_window_extent(renderer)
    finally:
        text.set_rotation(angle)
    a = math.radians(angle)
    rot = np.array([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]])
    half = np.array([[-1, -1], [1, -1], [1, 1], [-1, 1]]) * [flat.width / 2, flat.height / 2]
    return half @ rot.T + [(box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2]


def _depth(a: np.ndarray, b: np.ndarray) -> float:
    """Penetration depth of two convex quadrilaterals (separating axes): 0 when they do not overlap."""
    depth = math.inf
    for quad in (a, b):
        for i in range(2):  # a rectangle has two edge directions
            edge = quad[i + 1] - quad[i]
            normal = np.array([-edge[1], edge[0]]) / (np.hypot(*edge) or 1.0)
            pa, pb = a @ normal, b @ normal
            depth = min(depth, min(pa.max(), pb.max()) - max(pa.min(), pb.min()))
            if depth <= 0:
                return 0.0
    return float(depth)


def _measure(fig, tolerance_px: float) -> tuple[int, list[Overlap]]:
    texts = drawn_texts(fig)
    renderer = fig.canvas.get_renderer()
    boxes = [(t, c) for t in texts if (c := _corners(t, renderer)) is not None]
    out = []
    for i, (t1, c1) in enumerate(boxes):
        for t2, c2 in boxes[i + 1:]:
            d = _depth(c1, c2)
            if d > tolerance_px:
                out.append(Overlap(t1.get_text(), t2.get_text(), d))
    return len(texts), sorted(out, key=lambda o: -o.depth_px)


def text_overlaps(fig, tolerance_px: float = TOLERANCE_PX) -> list[Overlap]:
    """Pairs of drawn texts of `fig` (anywhere in the figure, across axes too) whose boxes overlap by more than
    `tolerance_px` figure pixels, deepest first. Draws the figure once."""
    return _measure(fig, tolerance_px)[1]


def overlap_warning(overlaps: list[Overlap], shown: int = 6) -> str:
    """The one-line warning printed under a figure with overlapping text ('' when there is none)."""
    if not overlaps:
        return ""
    more = f"; and {len(overlaps) - shown} more" if len(overlaps) > shown else ""
    return f"{OVERLAP_MARK} ({len(overlaps)} pair(s)): " + "; ".join(map(str, overlaps[:shown])) + more


def figure_check(fig, tolerance_px: float = TOLERANCE_PX) -> dict[str, Any]:
    """The check of one figure as stored in its output: how many texts were measured and the overlapping pairs."""
    n, overlaps = _measure(fig, tolerance_px)
    return {"texts": n, "tolerance_px": tolerance_px,
            "overlaps": [{"first": o.first, "second": o.second, "depth_px": round(o.depth_px, 1)} for o in overlaps]}


def _check_for_display(fig) -> dict[str, Any]:
    """The formatter's work: never raises (a failed measurement is stored, not shown as a traceback)."""
    try:
        result = figure_check(fig)
    except Exception as e:  # noqa: BLE001 - a figure must display even where it cannot be measured
        return {"error": f"{type(e).__name__}: {e}"[:200]}
    if result["overlaps"]:
        print(overlap_warning([Overlap(o["first"], o["second"], o["depth_px"]) for o in result["overlaps"]]))
    return result


def install_display_check(shell=None) -> bool:
    """In IPython (`shell`, default the running one), check every displayed matplotlib Figure: its output gains
    `FIGURE_CHECK_MIME` and, when texts overlap, a printed warning. False outside IPython; installing twice is
    harmless. The formatter recognises a Figure itself rather than through IPython's per-type registry, which
    the inline backend clears of Figure entries when it starts (after `set_theme` has run, at the first figure)."""
    if shell is None:
        try:
            from IPython import get_ipython
        except ImportError:
            return False
        shell = get_ipython()
    if shell is None:
        return False
    formatters = shell.display_formatter.formatters
    if FIGURE_CHECK_MIME not in formatters:
        formatters[FIGURE_CHECK_MIME] = _formatter_class()(parent=shell.display_formatter)
    return True


def _formatter_class():
    from IPython.core.formatters import BaseFormatter, catch_format_error
    from matplotlib.figure import Figure
    from traitlets import ObjectName, Unicode

    class FigureCheckFormatter(BaseFormatter):
        """IPython formatter of `FIGURE_CHECK_MIME`: the overlap check of a displayed Figure (nothing otherwise)."""

        format_type = Unicode(FIGURE_CHECK_MIME)
        _return_type = (dict,)
        print_method = ObjectName("_repr_sinkbook_figure_check_")  # no object has it: only Figures are checked

        @catch_format_error
        def __call__(self, obj):
            return _check_for_display(obj) if self.enabled and isinstance(obj, Figure) else None

    return FigureCheckFormatter


def figure_checks_in_notebook(nb: dict) -> list[tuple[int, dict | None]]:
    """Every figure output of an executed notebook (a dict as read by json): (cell index, its stored check, or
    None for a figure displayed without the check, e.g. before the check existed)."""
    out = []
    for i, cell in enumerate(nb.get("cells", [])):
        for o in cell.get("outputs", []):
            data = o.get("data", {})
            if "image/png" in data:
                out.append((i, data.get(FIGURE_CHECK_MIME)))
    return out


# --------------------------------------------------------------------------- labels that do not overlap

#: positions tried around a point, in order: (x, y) direction of the offset, horizontal and vertical alignment
LABEL_POSITIONS = ((1, 0, "left", "center"), (0, 1, "center", "bottom"), (-1, 0, "right", "center"),
                   (0, -1, "center", "top"), (1, 1, "left", "bottom"), (-1, 1, "right", "bottom"),
                   (1, -1, "left", "top"), (-1, -1, "right", "top"))


def _area(a: np.ndarray, b: np.ndarray) -> float:
    """Overlap area (px^2) of two boxes [x0, y0, x1, y1]."""
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    return float(w * h) if w > 0 and h > 0 else 0.0


def _outside(box: np.ndarray, frame: np.ndarray) -> float:
    """Area (px^2) of `box` outside `frame`."""
    return float((box[2] - box[0]) * (box[3] - box[1])) - _area(box, frame)


def _near_groups(points: np.ndarray, join_px: float) -> list[list[int]]:
    groups: list[list[int]] = []
    for i, p in enumerate(points):
        for g in groups:
            if np.hypot(*(points[g[0]] - p)) <= join_px:
                g.append(i)
                break
        else:
            groups.append([i])
    return groups


def label_points(ax, x, y, labels, *, fontsize: float | None = None, offset_pt: float = 5.0, join_px: float = 8.0,
                 marker_px: float = 5.0) -> list:
    """Label the points (x[i], y[i]) of `ax` so that no label overlaps another label, a text already drawn in the
    figure (ticks, titles, legend), a legend box or a point's marker (`marker_px` around each point), and each
    stays inside the axes where it can (keeping clear of other points by 2.5 `marker_px`, so that a label sits
    nearest its own point). Points closer than `join_px` screen px share one label ('dare, tsv');
    each label takes the first of LABEL_POSITIONS (`offset_pt` from its point, then three times as far with a
    thin line to its point) that is free, else the one that overlaps least (text on text weighs ten times more than a marker or the axes' edge). Call it once the figure's layout is final (after `tight_layout`): the labels stay out of
    the layout. Returns the annotations."""
    fig = ax.figure
    texts = drawn_texts(fig)  # draws the figure: positions below are final
    renderer = fig.canvas.get_renderer()
    pts = ax.transData.transform(np.column_stack([np.asarray(x, float), np.asarray(y, float)]))
    taken = [np.asarray(t.get_window_extent(renderer).extents) for t in texts]
    taken += [np.asarray(a.get_legend().get_window_extent(renderer).extents) for a in fig.axes if a.get_legend()]
    frame = np.asarray(ax.get_window_extent(renderer).extents)
    out = []
    groups = _near_groups(pts, join_px)
    for g in groups:
        text = ", ".join(str(labels[i]) for i in g)
        # markers are obstacles; another group's by a wider margin, so that a label sits nearest its own point
        markers = [np.array([px - r, py - r, px + r, py + r]) for i, (px, py) in enumerate(pts)
                   for r in [marker_px if i in g else 2.5 * marker_px]]
        best = None
        for dist, (dx, dy, ha, va) in [(d, p) for d in (offset_pt, 3 * offset_pt) for p in LABEL_POSITIONS]:
            far = {"arrowprops": {"arrowstyle": "-", "lw": 0.6, "color": "0.35", "shrinkA": 1, "shrinkB": 3}}
            ann = ax.annotate(text, (x[g[0]], y[g[0]]), xytext=(dx * dist, dy * dist), textcoords="offset points",
                              ha=ha, va=va, fontsize=fontsize, **(far if dist > offset_pt else {}))
            ann.set_in_layout(False)
            box = np.asarray(ann.get_window_extent(renderer).extents)
            # text on text is what must not happen; near a point or outside the axes is only worse than not
            cost = (10 * sum(_area(box, t) for t in taken) + sum(_area(box, m) for m in markers)
                    + _outside(box, frame))
            if best is None or cost < best[0]:
                if best is not None:
                    best[1].remove()
                best = (cost, ann, box)
            else:
                ann.remove()
            if cost == 0:
                break
        taken.append(best[2])
        out.append(best[1])
    return out
