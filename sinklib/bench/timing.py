"""What the benchmark's parts share: timing primitives (chapter 2 uses them too), what is measured and the
targets, the log-log slope fit, the memory series and the checks against the targets, the results path."""
from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from sinklib.core.resources import PACKAGE as _PACKAGE


def interleaved_timings(fns: dict[str, Callable[[], object]], repeats: int = 3, warmup: int = 1,
                        min_seconds: float = 0.0, max_repeats: int = 15, alternate: bool = False,
                        first: dict[str, object] | None = None) -> dict[str, list[float]]:
    """Run each function `repeats` times, interleaved (a, b, c, a, b, c, ...), after `warmup` rounds.

    Interleaving spreads machine noise over all contenders, so their ratios are fair. With `min_seconds`, short
    rounds are repeated more often: at least `repeats` rounds, and enough to last about `min_seconds` judged by
    the last warm-up round (at most `max_repeats`), so that cheap lengths get medians as stable as long ones.
    `alternate` reverses the order every other round (a, b / b, a, ...); `first` receives each function's
    first timed return value.
    """
    round_s = 0.0
    for _ in range(warmup):
        t0 = time.perf_counter()
        for f in fns.values():
            f()
        round_s = time.perf_counter() - t0
    repeats = rounds_for(round_s, repeats, min_seconds, max_repeats)
    out: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for r in range(repeats):
        for k in (names[::-1] if alternate and r % 2 else names):
            t0 = time.perf_counter()
            value = fns[k]()
            out[k].append(time.perf_counter() - t0)
            if first is not None:
                first.setdefault(k, value)
    return out


def rounds_for(round_seconds: float, repeats: int, min_seconds: float, max_repeats: int = 15) -> int:
    """Timed rounds for one length: `repeats`, or more (up to `max_repeats`) so that they last about
    `min_seconds` when one round takes `round_seconds`."""
    if min_seconds <= 0 or round_seconds <= 0:
        return repeats
    return int(max(repeats, min(max_repeats, math.ceil(min_seconds / round_seconds))))


def ratio_table(times: dict[str, list[float]], baseline: str) -> list[dict]:
    """Median seconds and the ratio to the baseline's median, one row per contender."""
    base = statistics.median(times[baseline])
    return [{"method": k, "median s": statistics.median(v), "min s": min(v), "ratio to " + baseline: statistics.median(v) / base}
            for k, v in times.items()]


def long_input(tokenizer, texts: list[str], n_tokens: int) -> torch.Tensor:
    """One sequence of exactly n_tokens ids [1, T], made by concatenating texts (cycled) after the default prefix."""
    ids = list(tokenizer(texts[0])["input_ids"])
    i = 1
    while len(ids) < n_tokens:
        ids += tokenizer(" " + texts[i % len(texts)], add_special_tokens=False)["input_ids"]
        i += 1
    return torch.tensor([ids[:n_tokens]])


REPO = _PACKAGE.parent


BOOK = REPO / "book"


METHODS = {"plain": "plain SDPA pass", "probe_k": "probe, last K layers", "probe_all": "probe, all layers",
           "eager": "eager output_attentions"}


DEFAULT_MODELS = ("smollm2-135m", "gemma3-270m")


DEFAULT_LENGTHS = (128, 512, 2048, 8192)


#: timed rounds at a length last at least about this long (more rounds where one is short; see interleaved_timings)
MIN_SECONDS = 40.0


QUICK_LENGTHS = (16, 32)


#: chapter 2's parameters of S on the full profile (tests/test_bench.py checks them against the notebook)
S_PROFILE = {"n_prompts": 15, "seed": 0, "last_k_layers": 10, "query_start": 1, "max_tokens": 128, "batch_size": 8}


S_PROFILE_QUICK = {**S_PROFILE, "n_prompts": 4, "max_tokens": 32}


PROBE_OVER_PLAIN = "probe_k-plain"     # the probe's memory over the plain pass (a derived series)


MEM_RESOLUTION = 16 * 2 ** 20           # bytes: differences of peak RSS between processes below this are noise


TARGETS = {"probe_over_plain_max": 1.10, "eager_over_probe_min": 3.0, "eager_T": 2048, "linear_slope_max": 1.5}


GIB = 2 ** 30


def fit_loglog_slope(T: Sequence[float], y: Sequence[float]) -> dict:
    """Least-squares slope of log(y) against log(T) (y ~ c T^slope); points with y <= 0 are left out."""
    pts = [(float(t), float(v)) for t, v in zip(T, y) if v is not None and v > 0]
    if len(pts) < 2 or len({t for t, _ in pts}) < 2:
        return {"slope": None, "intercept": None, "n": len(pts)}
    lt, ly = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
    slope, icpt = np.polyfit(lt, ly, 1)
    return {"slope": float(slope), "intercept": float(icpt), "n": len(pts)}


def probe_over_plain(mem_rows: list[dict], model: str) -> list[dict]:
    """The probe's (last K) extra memory over the plain pass at each length: {"T", "extra_bytes"} (may be <= 0)."""
    by = {(r["T"], r["method"]): r for r in mem_rows if r["model"] == model and r.get("status") == "ok"}
    return [{"T": T, "extra_bytes": by[(T, "probe_k")]["extra_bytes"] - by[(T, "plain")]["extra_bytes"]}
            for T in sorted({T for T, _ in by}) if (T, "probe_k") in by and (T, "plain") in by]


def memory_fits(mem_rows: list[dict], fit_min_T: int = 512) -> list[dict]:
    """Log-log slope of each method's extra memory against T, per model, and of the probe's memory over
    the plain pass ("probe_k-plain"); over T >= fit_min_T when at least two such lengths were measured,
    else over all."""
    out = []
    for model in dict.fromkeys(r["model"] for r in mem_rows):
        series = {m: [r for r in mem_rows if r["model"] == model and r["method"] == m and r.get("status") == "ok"]
                  for m in METHODS}
        series[PROBE_OVER_PLAIN] = probe_over_plain(mem_rows, model)
        for m, rows in series.items():
            if not rows:
                continue
            # a difference of two peaks at or below the resolution is noise: it does not enter the fit
            fit_rows = [r for r in rows if m != PROBE_OVER_PLAIN or r["extra_bytes"] > MEM_RESOLUTION]
            big = [r for r in fit_rows if r["T"] >= fit_min_T]
            use = big if len({r["T"] for r in big}) >= 2 else fit_rows
            fit = fit_loglog_slope([r["T"] for r in use], [r["extra_bytes"] for r in use])
            out.append({"model": model, "method": m, **fit, "lengths": sorted(r["T"] for r in use),
                        "max_bytes": max(r["extra_bytes"] for r in rows)})
    return out


def check_targets(results: dict) -> list[dict]:
    """The design's performance targets against the measured values, per model (ok None = not measured)."""
    out = []
    tim = [r for r in results["timing"] if r["status"] == "ok"]
    for model in dict.fromkeys([r["model"] for r in results["timing"]] + [r["model"] for r in results.get("memory", [])]):
        pr = [r for r in tim if r["model"] == model and r["method"] == "probe_k"]
        if pr:
            worst = max(pr, key=lambda r: r["ratio_to_plain"])
            out.append({"target": f"probe (last K) / plain <= {TARGETS['probe_over_plain_max']:.2f} at every length",
                        "model": model, "measured": f"max {worst['ratio_to_plain']:.2f} (T = {worst['T']})",
                        "ok": bool(worst["ratio_to_plain"] <= TARGETS["probe_over_plain_max"])})
        eg = [r for r in tim if r["model"] == model and r["method"] == "eager" and r["T"] == TARGETS["eager_T"]]
        out.append({"target": f"eager / probe (last K) >= {TARGETS['eager_over_probe_min']:g} at T = {TARGETS['eager_T']}",
                    "model": model, "measured": f"{eg[0]['eager_over_probe']:.1f}" if eg else "not measured",
                    "ok": bool(eg[0]["eager_over_probe"] >= TARGETS["eager_over_probe_min"]) if eg else None})
        fit = {f["method"]: f for f in results["memory_fit"] if f["model"] == model}
        d = fit.get(PROBE_OVER_PLAIN)
        eager = _fmt(fit.get("eager", {}).get("slope"), ".2f")
        if d is None:
            measured, ok = "not measured", None
        elif d["max_bytes"] <= MEM_RESOLUTION:
            measured = (f"probe - plain within {MEM_RESOLUTION / 2**20:g} MiB (the resolution) at every length; "
                        f"eager's slope {eager}")
            ok = True
        elif d["slope"] is None:
            measured, ok = f"probe - plain up to {d['max_bytes'] / 2**20:.0f} MiB; too few lengths to fit", None
        else:
            measured = (f"probe - plain up to {d['max_bytes'] / 2**20:.0f} MiB, slope {d['slope']:.2f}; "
                        f"eager's slope {eager}")
            ok = bool(d["slope"] <= TARGETS["linear_slope_max"])
        out.append({"target": "probe's extra memory over the plain pass linear in T (log-log slope <= "
                              f"{TARGETS['linear_slope_max']:g}; eager's grows ~T^2)",
                    "model": model, "measured": measured, "ok": ok})
    return out


def _fmt(x, spec: str, none: str = "n/a") -> str:
    return none if x is None else format(x, spec)


def _results_path(out: str) -> Path:
    """A results name ('bench_cpu' -> data/results/bench_cpu.json) or a path to a .json file."""
    from sinklib.book.runner import results_dir

    if out.endswith(".json") or os.sep in out:
        return Path(out)
    return results_dir() / f"{out}.json"


def plain_passes(model, seqs: Sequence[Sequence[int]], batch_size: int = 8) -> None:
    """Plain SDPA trunk passes over token-id lists, in the length-sorted batches sink_strength uses
    (sink.plain_forward does the same from text prompts and a tokenizer)."""
    from sinklib.core.sink import _trunk, pad_batch

    dev = next(model.parameters()).device
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    with torch.no_grad():
        for b0 in range(0, len(order), batch_size):
            ids, att = pad_batch([seqs[i] for i in order[b0:b0 + batch_size]])
            _trunk(model)(input_ids=ids.to(dev), attention_mask=att.to(dev))


def s_cost_fns(lm, prompts: Sequence[str] | None = None, seqs: Sequence[Sequence[int]] | None = None, *,
               last_k_layers: int = 10, query_start: int = 1, max_tokens: int = 128, batch_size: int = 8,
               method: str = "auto", after: Callable[[], None] = lambda: None, out: dict | None = None) -> dict[str, Callable]:
    """Plain passes vs S over the same prompts (text with a tokenizer, or token-id lists): chapter 2's timing.

    `after` runs at the end of each call (CUDA synchronisation); `out["S"]` receives the last S value.
    """
    from sinklib.core import sink

    model, _ = sink._unpack(lm, None)
    K = min(last_k_layers, sink.n_layers(model))
    out = {} if out is None else out
    kw = dict(last_k_layers=K, query_start=query_start, max_tokens=max_tokens, batch_size=batch_size, method=method)
    if prompts is not None:
        def plain():
            sink.plain_forward(lm, prompts, max_tokens=max_tokens, batch_size=batch_size)
            after()

        def s():
            out["S"] = sink.sink_strength(lm, prompts, **kw).S
            after()
    else:
        def plain():
            plain_passes(model, seqs, batch_size)
            after()

        def s():
            out["S"] = sink.sink_strength(model, input_ids=seqs, **kw).S
            after()
    return {"plain": plain, "S": s}
