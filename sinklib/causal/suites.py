"""Chapter 8's causal tests, on top of `sinklib.core.intervene`: the text suites evaluated with
chosen sink heads ablated (cached by their parameters, per-item outcomes kept), paired tests of every change
against the unablated model (exact McNemar for pass/fail metrics, a paired bootstrap interval for every
metric), and the dose-response plan with its two controls at each dose: the same number of random heads,
and the same attention mass removed from keys other than the sink (most-attended first; `remove_matched`), from
the sink heads and as many further heads as it takes to match the sink's mass (`sinklib.causal.matched`).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sinklib import evals
from sinklib.causal import matched
from sinklib.causal.matched import TOLERANCE
from sinklib.core import anatomy, intervene
from sinklib.core.cache import cached_json
from sinklib.errors import ParameterError
from sinklib.evals.items import fingerprint
from sinklib.evals.paired import (PASS_FAIL, outcomes, paired_changes)  # noqa: F401  (re-exported: chapter 8 uses causal.paired_changes)
from sinklib.core.params import check_choice, check_float, check_int

CAUSAL_VERSION = 1
CONTROLS = ("sink", "random", "matched")
RANDOM_STRIDE = 1000  # seed offset between the random draws of one dose (`dose_plans`)
FIRST_TOKENS = ("default", "none", "eos")


def _heads_key(heads: Mapping[int, Sequence[int]] | None) -> dict[str, list[int]]:
    return {str(int(l)): sorted(int(h) for h in hs) for l, hs in sorted((heads or {}).items()) if len(hs)}


@dataclass
class TinyLM:
    """One of chapter 7's tiny LMs (`sinklib.tiny.train.TinyRun`) in the shape `evaluate` takes: its suites are
    the tiny ones (`sinklib.tiny.evaluate`: format strict/lenient, knowledge, perplexity), its cache identity
    the training run's key. eval_n: {'format': n, 'knowledge': n, 'perplexity': n}."""

    name: str
    weights_sha256: str
    model: Any
    tokenizer: Any
    max_new_tokens: int = 16

    @classmethod
    def of(cls, run: Any, name: str, max_new_tokens: int = 16) -> "TinyLM":
        return cls(name, "tiny:" + run.key, run.model, run.tokenizer, max_new_tokens)

    def run_suites(self, tokenizer: Any, eval_n: Mapping[str, int], *, seed: int = 0, batch_size: int = 32) -> dict:
        from sinklib.tiny.evaluate import evaluate as tiny_evaluate

        bad = sorted(set(eval_n) - set(TINY_EVAL_N))
        if bad:
            raise ParameterError(f"eval_n of a tiny model has {bad}; allowed: {', '.join(TINY_EVAL_N)}")
        kw = {TINY_EVAL_N[k]: int(v) for k, v in eval_n.items()}
        return tiny_evaluate(self.model, tokenizer, seed=seed, batch_size=batch_size, max_new_tokens=self.max_new_tokens,
                             suites=tuple(k for k, v in eval_n.items() if v), **kw)


#: the tiny suites and their size arguments of `sinklib.tiny.evaluate.evaluate`
TINY_EVAL_N = {"format": "n_format", "knowledge": "n_knowledge", "perplexity": "n_prose"}


def evaluate(lm: Any, heads: Mapping[int, Sequence[int]] | None = None, *, mode: str = "remove", shift: float = 0.0,
             eval_n: Mapping[str, int], seed: int = 0, eval_batch_size: int = 8, first_token: str = "default",
             tag: str = "", take: Mapping[int, Mapping[int, float]] | None = None) -> dict:
    """The suites of `eval_n` on `lm` (sinklib.core.models.Loaded) with `heads` ({layer: [head, ...]}; None or empty:
    the unablated model) under the intervention `mode` (take: the shares of `remove_matched`, see
    `sinklib.core.intervene`); cached under `causal/`. first_token: 'default' (the
    tokenizer as it is), 'none' (no BOS: `FirstToken(tok, None)`) or 'eos' (the EOS token prepended instead of
    any BOS). -> {'scores' (rows of evals.results_table), 'outcomes' (`outcomes`), 'mean_mass_taken' (per
    intervened head and query), 'n_heads'}."""
    first_token = check_choice("first_token", first_token, FIRST_TOKENS)
    key = {"kind": "causal", "model": lm.name, "weights": lm.weights_sha256, "heads": _heads_key(heads),
           "mode": mode if heads else "none", "shift": float(shift) if heads and mode == "shift" else 0.0,
           "eval_n": dict(eval_n), "seed": int(seed), "batch": int(eval_batch_size), "tag": tag,
           "version": CAUSAL_VERSION}
    if take is not None and key["heads"]:
        key["take"] = {str(int(l)): {str(int(h)): round(float(s), 9) for h, s in sorted(t.items())}
                       for l, t in sorted(take.items()) if len(t)}
    if not isinstance(lm, TinyLM):  # the embedded suites' item files (chapter 7's suites are generated)
        key["items"] = fingerprint(dict(eval_n))
    if first_token != "default":
        key["first_token"] = first_token
        if first_token == "eos":
            key["first_token_fix"] = 2  # version 1 also put EOS before the perplexity suite's documents
    tok = first_token_tokenizer(lm.tokenizer, first_token)

    def compute() -> dict:
        ctx = (intervene.sink_intervention(lm.model, heads, mode=mode, shift=shift, take=take) if key["heads"]
               else contextlib.nullcontext(None))
        with ctx as plan:
            if isinstance(lm, TinyLM):
                res = lm.run_suites(tok, eval_n, seed=seed, batch_size=eval_batch_size)
            else:
                res = evals.run_suites(lm.model, tok, suites=tuple(k for k, v in eval_n.items() if v),
                                       n_items=dict(eval_n), seed=seed, batch_size=eval_batch_size)
        return {"scores": evals.results_table(res), "outcomes": outcomes(res),
                "mean_mass_taken": plan.mean_taken if plan is not None else 0.0,
                "n_heads": sum(len(v) for v in key["heads"].values())}

    return cached_json(key, compute, folder="causal")


def random_draw(control: str) -> int:
    """The draw number of a random control: 'random' is draw 1, 'random 2' draw 2, ...; 0 for other controls."""
    if control == "random":
        return 1
    head, _, tail = control.partition(" ")
    return int(tail) if head == "random" and tail.isdigit() else 0


def dose_plans(mass, layers: Sequence[int], fractions: Sequence[float], *, seed: int = 0,
               controls: Sequence[str] = CONTROLS, random_draws: int = 1) -> list[dict]:
    """The conditions of a dose-response curve: at each fraction of the (layer, head) pairs of `layers`, the
    heads with the most sink mass (`sink`, mode remove), as many random heads (`random`, remove; seed + the
    dose's index) and the same sink heads under `remove_matched` (`matched`, to be matched in mass by
    `sinklib.causal.matched.match_plans`). With `random_draws` > 1 (and `random` among the controls), below dose 1
    further random sets of as many heads ('random 2', ...; seed + the dose's index + RANDOM_STRIDE x (draw - 1)),
    to be pooled with the first (`sinklib.causal.specific`). Fraction 0 is one 'none' row.
    -> rows {dose, k, control, mode, heads}."""
    bad = [c for c in controls if c not in CONTROLS]
    if bad:
        raise ParameterError(f"parameter 'controls' has {bad}; allowed: {', '.join(CONTROLS)}")
    random_draws = check_int("random_draws", random_draws, 1, 100)
    m = np.asarray(mass, dtype=float)
    n = len(layers) * m.shape[1]
    rows = []
    for i, f in enumerate(fractions):
        f = check_float("fractions[]", f, 0.0, 1.0)
        top = intervene.heads_by_sink_mass(m, layers, f)
        k = sum(map(len, top.values()))
        if k == 0:
            rows.append({"dose": f, "k": 0, "control": "none", "mode": "none", "heads": {}})
            continue
        plans = {"sink": ("remove", top), "random": ("remove", intervene.random_heads(layers, m.shape[1], k, seed + i)),
                 "matched": ("remove_matched", top)}
        rows += [{"dose": f, "k": k, "control": c, "mode": plans[c][0], "heads": plans[c][1]} for c in controls]
        if "random" in controls and f < 1:  # at dose 1 every random set is every head
            rows += [{"dose": f, "k": k, "control": f"random {j}", "mode": "remove",
                      "heads": intervene.random_heads(layers, m.shape[1], k, seed + i + RANDOM_STRIDE * (j - 1))}
                     for j in range(2, random_draws + 1)]
    if not any(r["k"] == 0 for r in rows) and n:
        rows.insert(0, {"dose": 0.0, "k": 0, "control": "none", "mode": "none", "heads": {}})
    return rows


def set_overlap(plans: Sequence[Mapping]) -> list[dict]:
    """Per dose of `dose_plans` with both a sink and a random row: {dose, k, shared (heads in both sets),
    differ (the two sets are not the same)}."""
    by = {(float(p["dose"]), p["control"]): p for p in plans}
    out = []
    for d in sorted({d for d, c in by if c == "sink" and (d, "random") in by}):
        a, b = (_heads_key(by[(d, c)]["heads"]) for c in ("sink", "random"))
        shared = sum(len(set(a.get(l, [])) & set(b.get(l, []))) for l in a)
        out.append({"dose": d, "k": by[(d, "sink")]["k"], "shared": shared, "differ": a != b})
    return out


def shared_with_sink(plans: Sequence[Mapping]) -> list[dict]:
    """Per dose below 1 and random set of `dose_plans` ('random', 'random 2', ...): how many of the k sink heads
    the random set shares (random sets are drawn from every considered head, the sink heads among them).
    -> rows {dose, k, control, shared}."""
    by = {(float(p["dose"]), p["control"]): p for p in plans}
    out = []
    for (d, c), p in sorted(by.items(), key=lambda kv: (kv[0][0], random_draw(kv[0][1]))):
        if d < 1 and random_draw(c) and (d, "sink") in by:
            a, b = _heads_key(by[(d, "sink")]["heads"]), _heads_key(p["heads"])
            out.append({"dose": d, "k": p["k"], "control": c,
                        "shared": sum(len(set(a.get(l, [])) & set(b.get(l, []))) for l in a)})
    return out


def shared_sentence(shared: Mapping[str, Sequence[Mapping]]) -> str:
    """{model: `shared_with_sink` rows} in words: per dose, how many of the sink heads the random sets share."""
    parts = [f"{name}: {shared_cells(rows)}" for name, rows in shared.items() if rows]
    return "; ".join(parts) or "no random set below dose 1 in this run"


def shared_cells(rows: Sequence[Mapping]) -> str:
    """One model's `shared_with_sink` rows in words: '20-23 of 45 at dose 0.5, ...' (the range over its random
    sets, per dose)."""
    cells = []
    for d in sorted({r["dose"] for r in rows}):
        n = [r["shared"] for r in rows if r["dose"] == d]
        k = next(r["k"] for r in rows if r["dose"] == d)
        cells.append(f"{min(n) if min(n) == max(n) else f'{min(n)}-{max(n)}'} of {k} at dose {d:g}")
    return ", ".join(cells)


def last_layers(model: Any, last_k_layers: int) -> list[int]:
    """The indices of the last `last_k_layers` decoder layers of `model` (clamped to its depth): the layers whose
    heads chapter 8 ranks and ablates."""
    n = anatomy.n_layers(model)
    return list(range(n - anatomy.clamp_last_k(last_k_layers, model), n))


def overlap_sentence(overlaps: Mapping[str, Sequence[Mapping]]) -> str:
    """{model: `set_overlap` rows} in words: at which doses the sink and random head sets differ."""
    def doses(rows, differ: bool) -> str:
        return ", ".join(f"{r['dose']:g}" for r in rows if r["differ"] == differ)

    parts = []
    for name, rows in overlaps.items():
        diff, same = doses(rows, True), doses(rows, False)
        parts.append(f"{name}: the sink and random heads are different sets at dose {diff or 'none'}"
                     + (f" and the same set at dose {same} (every head of the considered layers)" if same else ""))
    return "; ".join(parts)


class FirstToken:
    """The natural ablation of a BOS-tied sink: a tokenizer whose encodings start with token `first` instead
    of the model's BOS (None: no special first token at all). Any leading BOS id that the wrapped tokenizer
    adds, or that its chat template writes, is removed first, and `first` goes where special tokens are added
    or a BOS was removed (an encoding without special tokens gets no first token); `bos_token_id` reports `first`, so the
    perplexity suite conditions each document on it (or on EOS when None). Everything else is the wrapped
    tokenizer's (decoding, padding, chat template)."""

    def __init__(self, tokenizer: Any, first: int | None):
        self._tok = tokenizer
        self._bos = getattr(tokenizer, "bos_token_id", None)
        self.first = first

    @property
    def bos_token_id(self) -> int | None:
        return self.first

    def __call__(self, text: str, **kw) -> dict:
        if not isinstance(text, str):
            raise ParameterError("FirstToken encodes one string at a time (as sinklib.evals does)")
        ids = list(self._tok(text, **kw)["input_ids"])
        had_bos = False
        while ids and self._bos is not None and ids[0] == self._bos:
            ids, had_bos = ids[1:], True
        # the first token takes BOS's place: where special tokens are added, or where the text itself began with
        # BOS (a chat template); an encoding without special tokens (a continuation) gets none
        if self.first is not None and (kw.get("add_special_tokens", True) or had_bos):
            ids = [self.first] + ids
        return {"input_ids": ids, "attention_mask": [1] * len(ids)}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tok, name)


def first_token_tokenizer(tokenizer: Any, first_token: str) -> Any:
    """The tokenizer of an `evaluate` condition: as it is ('default'), without BOS ('none'), or with the EOS
    token in the BOS's place ('eos': a first token that is not BOS, for models trained with one)."""
    first_token = check_choice("first_token", first_token, FIRST_TOKENS)
    if first_token == "default":
        return tokenizer
    if first_token == "eos" and getattr(tokenizer, "eos_token_id", None) is None:
        raise ParameterError("first_token='eos' needs a tokenizer with an EOS token")
    return FirstToken(tokenizer, None if first_token == "none" else tokenizer.eos_token_id)


#: the metric groups of the verdicts (names of `paired_changes` rows)
STRICT = ("instructions strict", "math strict", "format strict")  # the last: chapter 7's tiny LMs
KNOWLEDGE = ("knowledge acc",)


def dose_response(lm: Any, plans: Sequence[Mapping], *, eval_n: Mapping[str, int], seed: int = 0,
                  eval_batch_size: int = 8, log=None, tolerance: float = TOLERANCE) -> tuple[Any, dict]:
    """Evaluate every row of `dose_plans` (cached; matched rows as `sinklib.causal.matched.match_plans` left
    them) and pair it with the unablated model.
    -> (DataFrame {model, dose, control, k, n_heads, mass_taken, mass_removed, metric, base, other, change, lo,
        hi, p, mass_diff, matched_ok}, {(dose, control): evaluate's result}, with (0.0, 'none') the unablated
        model). mass_taken: per intervened head and query; mass_removed: per query summed over the intervened
        heads, in units of the dose's k (the matched control's comparison, `matched.flag` at `tolerance`)."""
    import pandas as pd

    base = evaluate(lm, None, eval_n=eval_n, seed=seed, eval_batch_size=eval_batch_size)
    results, rows = {(0.0, "none"): base}, []
    for p in plans:
        if p["k"] == 0:
            continue
        r = evaluate(lm, p["heads"], mode=p["mode"], eval_n=eval_n, seed=seed, eval_batch_size=eval_batch_size,
                     take=p.get("take"))
        results[(float(p["dose"]), p["control"])] = r
        removed = r["mean_mass_taken"] * r["n_heads"] / p["k"]
        for ch in paired_changes(base, r, seed=seed):
            rows.append({"model": lm.name, "dose": float(p["dose"]), "control": p["control"], "k": p["k"],
                         "n_heads": r["n_heads"], "mass_taken": r["mean_mass_taken"], "mass_removed": removed, **ch})
        if log:
            log(f"{lm.name}: dose {p['dose']:g} {p['control']:8s} {r['n_heads']:3d} heads, mass removed {removed:.3f}")
    table = pd.DataFrame(rows)
    return (matched.flag(table, tolerance) if len(table) else table), results


def falls(row: Mapping) -> bool:
    """A score fell outside the noise: its paired 95 % interval lies below zero (perplexity: above zero)."""
    return bool(row["lo"] > 0) if row["metric"].startswith("perplexity") else bool(row["hi"] < 0)


def _order_words(f: float | None, k: float | None, what: str = "format") -> str:
    verb = "fall" if " and " in what else "falls"
    if f is None and k is None:
        return "neither falls outside the noise at any dose"
    if k is None:
        return f"{what} {verb} (from dose {f:g}), knowledge does not"
    if f is None:
        return f"knowledge falls (from dose {k:g}), format does not"
    if f < k:
        return f"{what} {verb} first (dose {f:g}, knowledge from {k:g})"
    if k < f:
        return f"knowledge falls first (dose {k:g}, {what} from {f:g})"
    return f"{what} and knowledge fall together (dose {f:g})"


#: a strict metric in a verdict's words
STRICT_WORDS = {"instructions strict": "strict instruction format", "math strict": "strict math",
                "format strict": "strict format"}


def _first_fall(t, f: float | None) -> tuple[str, str]:
    """What fell at the first strict-format dose `f`, in words, and from which dose its lenient grading fell, where
    it fell by then (then the task itself went, not only its format; a lenient fall before `f` is named so)."""
    if f is None:
        return "format", ""
    at = sorted(r.metric for r in t[(t.dose == f) & t.metric.isin(STRICT)].itertuples() if falls(r._asdict()))
    lenient = {}
    for m in at:
        d = sorted(float(r.dose) for r in t[(t.dose <= f) & (t.metric == m.replace("strict", "lenient"))].itertuples()
                   if falls(r._asdict()))
        if d:
            lenient[m.replace(" strict", "")] = d[0]
    what = " and ".join(STRICT_WORDS.get(m, m) for m in at) or "format"
    said = [f"lenient {suite} falls too (from dose {d:g}" + (", before its strict grading)" if d < f else ")")
            for suite, d in lenient.items()]
    for m in sorted(set(STRICT) - set(at)):  # a strict metric that falls only at a larger dose is named too
        d = sorted(float(r.dose) for r in t[(t.dose > f) & (t.metric == m)].itertuples() if falls(r._asdict()))
        said += [f"{STRICT_WORDS.get(m, m)} falls later (from dose {d[0]:g})"] if d else []
    return what, (f"; {'; '.join(said)}" if said else "")


def order_verdict(table, control: str = "sink") -> dict:
    """Which skill falls first along the dose of one control (rows of `dose_response`'s table for one model):
    the smallest dose at which a strict-format metric falls (`falls`) against the same for knowledge, naming the
    strict metric that fell and whether its lenient grading fell with it (then the loss is not the format alone).
    Doses at which the control is not tested (a matched control outside the mass tolerance, `matched_ok` False)
    are left out and named. -> {'format_dose', 'knowledge_dose' (None: never), 'untested_doses', 'verdict'}."""
    t = table[table.control == control]
    bad = sorted({float(d) for d in t[~t.matched_ok].dose}) if "matched_ok" in t else []
    t = t[~t.dose.isin(bad)]
    first = {}
    for name, metrics in (("format", STRICT), ("knowledge", KNOWLEDGE)):
        d = sorted(float(r.dose) for r in t[t.metric.isin(metrics)].itertuples() if falls(r._asdict()))
        first[name] = d[0] if d else None
    f, k = first["format"], first["knowledge"]
    if bad and not len(t):
        v = "not tested: the attention mass removed is outside the tolerance at every dose"
    else:
        what, lenient = _first_fall(t, f)
        v = _order_words(f, k, what) + lenient + (
            f" (not tested at dose {', '.join(f'{d:g}' for d in bad)}: the attention mass removed is outside the "
            "tolerance)" if bad else "")
    return {"format_dose": f, "knowledge_dose": k, "untested_doses": bad, "verdict": v}


def _tiny_variants() -> tuple[str, ...]:
    from sinklib.tiny.model import VARIANTS

    return VARIANTS


def _chapter8_params() -> dict:
    from sinklib.evals import COUNT_PARAMS
    from sinklib.core.models import MODEL_PARAMS
    from sinklib.core.params import COMMON, boolean, choice, integer, list_of, number
    from sinklib.core.sink import prompt_count

    return {**MODEL_PARAMS, "seed": integer(0), "n_prompts": prompt_count, "max_tokens": integer(8, 4096),
            "last_k_layers": integer(1, 1000), "fractions": list_of(number(0.0, 1.0)),
            "controls": list_of(choice(CONTROLS)), "random_draws": integer(1, 100),
            "match_tolerance": number(0.0, 1.0),
            "first_tokens": list_of(choice(FIRST_TOKENS)),
            "repair_fractions": list_of(number(0.0, 1.0)), "tiny_variants": list_of(choice(_tiny_variants()), min_len=0),
            "tiny_profile": choice(("quick", "full")), **COUNT_PARAMS,
            "eval_batch_size": integer(1, 1024), "show_progress": boolean(), **COMMON}


#: the parameters of chapter 8 (one `validate` call in the notebook)
CHAPTER8_PARAMS = _chapter8_params()


def tiny_lm(variant: str, profile: str = "full") -> tuple[TinyLM, dict, Any]:
    """Chapter 7's base tiny LM of one QK-norm variant, trained with the panel profile's base recipe (the
    pilot's recipe in 'full'; cached, shared with chapter 7), as `TinyLM`, with the profile's suite sizes.
    -> (TinyLM, eval_n, TinyRun)."""
    from sinklib.tiny import panel as tiny_panel
    from sinklib.tiny.evaluate import EVAL_DEFAULTS
    from sinklib.tiny.model import VARIANTS
    from sinklib.tiny.train import train_tiny

    check_choice("tiny_variants[]", variant, VARIANTS)
    prof = tiny_panel.PROFILES[check_choice("tiny_profile", profile, tuple(tiny_panel.PROFILES))]
    ev = {**EVAL_DEFAULTS, **{k: v for k, v in prof["eval"].items() if not k.startswith("vqa_")}}
    run = train_tiny(variant, **prof["train"])
    eval_n = {suite: int(ev[arg]) for suite, arg in TINY_EVAL_N.items()}
    return TinyLM.of(run, f"tiny {variant}", max_new_tokens=int(ev["max_new_tokens"])), eval_n, run
