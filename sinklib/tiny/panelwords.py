"""Chapter 7's result sentences, computed from its tables and glued into its prose (`findings`), and its Remark 1
sentence (`remark_sentence`)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from sinklib.tiny.adapt import TINY_STRICT_TASK
from sinklib.tiny.pilot import SINK_RISE, sink03_sentence


def findings(pilot: pd.DataFrame, rows: pd.DataFrame, pre: pd.DataFrame, hyp: pd.DataFrame) -> dict[str, str]:
    """The chapter's result sentences: 'pilot', 'sinks', 'band', 'lost', 'vqa', 'chance', 'text_only', 'spread',
    'verdicts', 'h1', 'h6', 'sink03', 'lenient'."""
    parts = []
    for _, r in pilot.iterrows():
        rise = r["S trained"] - r["S at init"]
        sink = "a sink formed" if r["sink formed"] else f"rise {rise:+.2f}, below the {SINK_RISE} a sink needs"
        band = "inside" if r["scores in band"] else "not all inside"
        parts.append(f"{r['variant']}: S {r['S at init']:+.2f} at initialisation, {r['S trained']:+.2f} after "
                     f"{r['steps']} steps ({sink}; largest head mass {r['max head mass']:.2f}; scores {band} the band)")
    pre_t = pre.set_index("precondition")["models"]
    out = {"pilot": "; ".join(parts), "sinks": f"a sink formed in {pre_t['a sink formed in training']} models",
           "sink03": sink03_sentence(rows),
           "band": f"base scores inside the band in {pre_t['base scores inside the band']} models",
           "lost": f"VL lost strict-format score outside the noise in {pre_t['VL lost strict-format score']} models",
           "vqa": f"the VL model learned the visual task in {pre_t['the VL model learned the visual task']} models",
           "chance": f"the base knowledge score lies above chance in {pre_t['knowledge above chance']} models",
           "text_only": "not computed (no text-only control in this run)", "lenient": lenient_sentence(rows)}
    more = ""
    if "text_only_format_strict" in rows:
        vl, to = rows[TINY_STRICT_TASK], rows["text_only_format_strict"]
        more = f"; the text-only control lost more than VL in {int((to < vl).sum())} of {int(to.notna().sum())} models"
        out["text_only"] = (f"mean strict-format change {vl.mean():+.1f} points under VL and {to.mean():+.1f} under the "
                            f"text-only control (VL minus text-only per model: {(vl - to).min():+.0f} to "
                            f"{(vl - to).max():+.0f}){more}")
    sp = rows.groupby("qk_norm")["S"].agg(["count", "min", "max"])
    out["spread"] = "; ".join(f"{v}: {int(r['count'])} models, S {r['min']:+.2f} to {r['max']:+.2f} "
                              f"(range {r['max'] - r['min']:.2f})" for v, r in sp.iterrows())
    out["verdicts"] = "; ".join(f"{r['hypothesis']}: {r['verdict']} ({r['this panel']})" for _, r in hyp.iterrows())
    h1 = hyp.iloc[0]
    out["h1"] = f"{h1['this panel']}: {h1['verdict']}"
    h6 = hyp[hyp.hypothesis.str.startswith("H6")]
    out["h6"] = (f"{h6.iloc[0]['this panel']}: {h6.iloc[0]['verdict']}{more}" if len(h6)
                 else "not computed (no text-only control in this run)")
    return out


def lenient_sentence(rows: pd.DataFrame) -> str:
    """How far the lenient grading separates from the strict one on the panel: the base models whose two scores are
    equal, and the largest gap between their VL changes (a lenient row that repeats the strict one is no separate
    test of format)."""
    if not {"base_strict", "base_lenient", TINY_STRICT_TASK, "delta_format_lenient"} <= set(rows.columns) or rows.empty:
        return "not computed (no strict and lenient scores in this run)"
    same = int(np.isclose(rows["base_strict"], rows["base_lenient"]).sum())
    gap = float((rows["delta_format_lenient"] - rows[TINY_STRICT_TASK]).abs().max())
    return (f"the base model's strict and lenient scores are equal in {same} of {len(rows)} models, and their VL "
            f"changes differ by at most {gap:.0f} points")


def remark_sentence(summary: pd.DataFrame) -> str:
    """Remark 1 on the pilot's models in words (rows of `bound.remark1_summary` with a 'variant'): the spread of the
    raw query shares and of the query norms, and their rank correlations; the query of the variant without
    QK-norm is not normalised, so its norm is called the query norm."""
    parts = []
    for r in summary.itertuples():
        what = "query norms" if r.variant == "none" else "normalised query norms"
        parts.append(f"{r.variant}: raw shares vary {r.raw_share_spread:.2f}-fold, {what} {r.query_norm_spread:.2f}-fold, "
                     + (f"rho(share, query norm) {r.rho_share_query_norm:+.2f} (p {r.p_share_query_norm:.2g})"
                        if np.isfinite(r.rho_share_query_norm) else "query norms equal whatever the share")
                     + (f", rho(share, logit range) {r.rho_share_logit_range:+.2f} (p {r.p_share_logit_range:.2g})"
                        if np.isfinite(r.rho_share_logit_range) else ""))
    return "; ".join(parts)


def remark_reading(summary: pd.DataFrame, alpha: float = 0.05) -> str:
    """What Remark 1's table shows, in words: whether the layerwise model's query norm follows the raw share outside
    the noise (the compression the Remark predicts), how far per-head normalisation evens the query norms out
    against layerwise, and how far the model without QK-norm spreads them."""
    by = {r.variant: r for r in summary.itertuples()}
    out = []
    lw, ph, no = by.get("layerwise"), by.get("per_head"), by.get("none")
    if lw is not None and np.isfinite(lw.rho_share_query_norm):
        seen = lw.rho_share_query_norm > 0 and lw.p_share_query_norm < alpha
        out.append(f"the layerwise model's weak heads are {'compressed, as Remark 1 predicts' if seen else 'not compressed outside the noise'}"
                   f" (rho(share, query norm) {lw.rho_share_query_norm:+.2f}, p {lw.p_share_query_norm:.2g})")
    if ph is not None and lw is not None:
        out.append(f"per-head normalisation keeps its query norms within {ph.query_norm_spread:.2f}-fold against "
                   f"{lw.query_norm_spread:.2f}-fold under layerwise")
    if no is not None:
        out.append(f"without QK-norm the query norms vary {no.query_norm_spread:.2f}-fold, since nothing rescales them")
    return "; ".join(out) or "not computed (no pilot models)"
