"""Benchmarks reported as ratios measured in one run (never timed in tests).

``python -m sinklib.bench`` (the CPU benchmark): for each embedded model and prompt length T,
a plain SDPA trunk pass, the sink probe (last K layers, all layers) and eager
``output_attentions``, timed interleaved in one process; the peak memory of each method in its
own process; the log-log slope of memory against T; the time to measure S with chapter 2's
full-profile parameters. ``python -m sinklib.bench gpu`` times S on random 7-8B models
(``sinklib.bench_gpu``); ``python -m sinklib.bench report`` writes the performance page's table
and figure from the saved results. Options: ``python -m sinklib.bench --help``.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from .bench_report import cpu_markdown, gpu_markdown, plot_cpu, write_report  # noqa: F401  (the report half)
from .errors import ParameterError

# ---------------------------------------------------------------------------------------
# timing primitives (chapter 2 uses these too)


def interleaved_timings(fns: dict[str, Callable[[], object]], repeats: int = 3, warmup: int = 1,
                        min_seconds: float = 0.0, max_repeats: int = 15) -> dict[str, list[float]]:
    """Run each function `repeats` times, interleaved (a, b, c, a, b, c, ...), after `warmup` rounds.

    Interleaving spreads machine noise over all contenders, so their ratios are fair. With `min_seconds`, short
    rounds are repeated more often: at least `repeats` rounds, and enough to last about `min_seconds` judged by
    the last warm-up round (at most `max_repeats`), so that cheap lengths get medians as stable as long ones.
    """
    round_s = 0.0
    for _ in range(warmup):
        t0 = time.perf_counter()
        for f in fns.values():
            f()
        round_s = time.perf_counter() - t0
    repeats = rounds_for(round_s, repeats, min_seconds, max_repeats)
    out: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            out[k].append(time.perf_counter() - t0)
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


# ---------------------------------------------------------------------------------------
# what is measured

REPO = Path(__file__).resolve().parent.parent
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


def load(name: str):
    """An embedded model on the CPU by name, or 'tiny-<arch>' for a random tiny model (tests)."""
    from .models import load_model, tiny_model

    if name.startswith("tiny-"):
        return tiny_model(name[len("tiny-"):], seed=0)
    return load_model(name, device="cpu")


def bench_input(lm, T: int, seed: int = 0) -> torch.Tensor:
    """One prompt of exactly T tokens [1, T]: calibration prompts concatenated, or random ids without a tokenizer."""
    if lm.tokenizer is not None:
        from .data import load_prompts

        return long_input(lm.tokenizer, load_prompts(), T)
    vocab = lm.model.config.get_text_config().vocab_size
    return torch.randint(3, vocab, (1, T), generator=torch.Generator().manual_seed(seed))


def method_fns(lm, ids: torch.Tensor, last_k_layers: int = 10, methods: Sequence[str] = tuple(METHODS)) -> dict[str, Callable]:
    """The contenders on one input ids [1, T]: each runs the transformer trunk (no LM head) once."""
    from . import sink

    model = lm.model
    L = sink.n_layers(model)
    K = min(last_k_layers, L)
    att = torch.ones_like(ids)
    s_idx = torch.zeros(ids.shape[0], dtype=torch.long)   # the sink is the first token
    trunk = sink._trunk(model)

    def plain():
        with torch.no_grad():
            trunk(input_ids=ids, attention_mask=att)

    fns = {"plain": plain,
           "probe_k": lambda: sink.record_sink(model, ids, att, layers=range(L - K, L), sink=s_idx),
           "probe_all": lambda: sink.record_sink(model, ids, att, layers=None, sink=s_idx),
           "eager": lambda: sink.eager_sink_probs(trunk, ids, att, s_idx)}
    return {m: fns[m] for m in methods}


def predict_eager_bytes(model, T: int) -> int:
    """Predicted peak extra memory of eager output_attentions: every layer's [H, T, T] map is kept, plus
    one layer's logits and softmax in flight and two [T, T] masks (full and sliding)."""
    cfg = model.config.get_text_config()
    L, H = int(cfg.num_hidden_layers), int(cfg.num_attention_heads)
    return next(model.parameters()).element_size() * T * T * (H * (L + 2) + 2)


def plain_passes(model, seqs: Sequence[Sequence[int]], batch_size: int = 8) -> None:
    """Plain SDPA trunk passes over token-id lists, in the length-sorted batches sink_strength uses
    (sink.plain_forward does the same from text prompts and a tokenizer)."""
    from .sink import _trunk, pad_batch

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
    from . import sink

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


# ---------------------------------------------------------------------------------------
# peak memory, one process per method x length


def _proc_status() -> dict[str, int]:
    """VmRSS and VmHWM (peak) of this process in bytes, from /proc (Linux)."""
    text = Path("/proc/self/status").read_text()
    return {k: int(re.search(k + r":\s+(\d+)", text).group(1)) * 1024 for k in ("VmRSS", "VmHWM")}


def _measure_peak(fn: Callable[[], object]) -> dict:
    """Run fn once; its peak resident memory above the resident memory just before it (bytes)."""
    gc.collect()
    try:
        Path("/proc/self/clear_refs").write_text("5")      # resets VmHWM (the peak) to the current RSS
        resettable = True
    except OSError:                                         # not Linux: only the peak since the process started
        resettable = False
    if resettable:
        base = _proc_status()["VmRSS"]
        fn()
        peak, source = _proc_status()["VmHWM"], "VmHWM (reset before the run)"
    else:
        import resource

        unit = 1 if sys.platform == "darwin" else 1024
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * unit
        fn()
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * unit
        source = "ru_maxrss (not resettable: load transients can hide small extras)"
    return {"baseline_bytes": base, "peak_bytes": peak, "extra_bytes": max(0, peak - base), "peak_source": source}


def _mem_child(spec: dict) -> dict:
    """In a fresh process: load the model, warm the method up on 16 tokens, then measure one pass at T."""
    torch.manual_seed(0)
    lm = load(spec["model"])
    m = spec["method"]
    method_fns(lm, bench_input(lm, 16), spec["last_k_layers"], [m])[m]()
    fn = method_fns(lm, bench_input(lm, spec["T"]), spec["last_k_layers"], [m])[m]
    return {**spec, **_measure_peak(fn)}


def peak_memory(model: str, method: str, T: int, last_k_layers: int = 10, timeout: float = 7200) -> dict:
    """Peak memory of one method at length T, measured in its own Python process (subprocess)."""
    spec = {"model": model, "method": method, "T": int(T), "last_k_layers": int(last_k_layers)}
    r = subprocess.run([sys.executable, "-m", "sinklib.bench", "_mem", json.dumps(spec)], cwd=REPO,
                       capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode != 0 or not lines:
        tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
        return {**spec, "status": f"failed (exit {r.returncode}): " + " | ".join(tail)[:300]}
    return {**json.loads(lines[-1]), "status": "ok"}


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


# ---------------------------------------------------------------------------------------
# the CPU benchmark


def timing_rows(model: str, T: int, times: dict[str, list[float]], skipped: dict[str, int] | None = None) -> list[dict]:
    """One row per method at one length: median and min seconds, ratio to plain; eager also over the probe."""
    rows = []
    med = {k: statistics.median(v) for k, v in times.items()}
    for r in ratio_table(times, "plain"):
        m = r["method"]
        row = {"model": model, "T": T, "method": m, "label": METHODS.get(m, m), "status": "ok",
               "median_s": r["median s"], "min_s": r["min s"], "ratio_to_plain": r["ratio to plain"],
               "times": times[m]}
        if m == "eager" and "probe_k" in med:
            row["eager_over_probe"] = med["eager"] / med["probe_k"]
        rows.append(row)
    for m, pred in (skipped or {}).items():
        rows.append({"model": model, "T": T, "method": m, "label": METHODS[m], "predicted_bytes": pred,
                     "status": f"skipped (predicted {pred / GIB:.1f} GiB)"})
    return rows


def run_cpu(models: Sequence[str] = DEFAULT_MODELS, lengths: Sequence[int] = DEFAULT_LENGTHS, repeats: int = 3,
            last_k_layers: int = 10, eager_budget_gib: float = 12.0, memory: bool = True, s_profile: dict | None = None,
            fit_min_T: int = 512, log: Callable[[str], None] = print, min_seconds: float = 0.0) -> tuple[dict, list]:
    """Time and memory of the four methods per model and length, and the cost of S (`min_seconds`: see
    `interleaved_timings`). Returns (results, models' provenance)."""
    from . import sink

    s_profile = dict(S_PROFILE if s_profile is None else s_profile)
    budget = int(eager_budget_gib * GIB)
    timing, mem, scost, prov = [], [], [], []
    for name in models:
        lm, fns = load(name), None
        prov.append(lm.provenance())
        log(f"[bench] {name}: loaded in {lm.load_seconds:.1f} s ({sink.n_layers(lm.model)} layers)")
        for T in lengths:
            fns = method_fns(lm, bench_input(lm, T), last_k_layers)
            pred = predict_eager_bytes(lm.model, T)
            skipped = {}
            if pred > budget:
                del fns["eager"]
                skipped["eager"] = pred
            t0 = time.perf_counter()
            rows = timing_rows(name, T, interleaved_timings(fns, repeats=repeats, min_seconds=min_seconds), skipped)
            timing += rows
            log(f"[bench] {name} T={T}: " + ", ".join(
                f"{r['method']} {r['median_s']:.3f} s" if r["status"] == "ok" else f"{r['method']} {r['status']}"
                for r in rows) + f"  ({time.perf_counter() - t0:.0f} s)")
        # the cost of S with chapter 2's parameters
        p = s_profile
        if lm.tokenizer is not None:
            from .data import load_prompts

            kw = {"prompts": load_prompts(p["n_prompts"], p["seed"])}
        else:
            g = torch.Generator().manual_seed(p["seed"])
            vocab = lm.model.config.get_text_config().vocab_size
            kw = {"seqs": [torch.randint(3, vocab, (int(n),), generator=g).tolist()
                           for n in torch.randint(p["max_tokens"] // 2, p["max_tokens"] + 1, (p["n_prompts"],), generator=g)]}
        out: dict = {}
        t = interleaved_timings(s_cost_fns(lm, **kw, last_k_layers=p["last_k_layers"], query_start=p["query_start"],
                                           max_tokens=p["max_tokens"], batch_size=p["batch_size"], out=out), repeats=repeats)
        med = {k: statistics.median(v) for k, v in t.items()}
        scost.append({"model": name, **p, "last_k_layers": min(p["last_k_layers"], sink.n_layers(lm.model)),
                      "S": out.get("S"), "S_seconds": med["S"], "plain_seconds": med["plain"],
                      "ratio": med["S"] / med["plain"], "times": t})
        log(f"[bench] {name}: S = {out.get('S'):.3f} in {med['S']:.3f} s (plain passes {med['plain']:.3f} s)")
        preds = {T: predict_eager_bytes(lm.model, T) for T in lengths}
        del lm, fns
        gc.collect()
        if memory:
            for T in lengths:
                for m in METHODS:
                    pred = preds[T] if m == "eager" else None
                    if pred is not None and pred > budget:
                        row = {"model": name, "method": m, "T": T, "status": f"skipped (predicted {pred / GIB:.1f} GiB)"}
                    else:
                        row = peak_memory(name, m, T, last_k_layers)
                    row["predicted_bytes"] = pred
                    mem.append(row)
                    log(f"[bench] {name} T={T} {m}: " + (f"+{row['extra_bytes'] / 2**20:.0f} MiB"
                                                         if row["status"] == "ok" else row["status"]))
    results = {"timing": timing, "memory": mem, "memory_fit": memory_fits(mem, fit_min_T), "s_cost": scost}
    results["targets"] = check_targets(results)
    return results, prov


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


# ---------------------------------------------------------------------------------------
# results files, report (markdown table + figure for book/performance.md)


def _results_path(out: str) -> Path:
    """A results name ('bench_cpu' -> data/results/bench_cpu.json) or a path to a .json file."""
    from .book import results_dir

    if out.endswith(".json") or os.sep in out:
        return Path(out)
    return results_dir() / f"{out}.json"


def save(out: str, results: dict, params: dict, models: list, seconds: float) -> Path:
    """save_results under a name, or into an explicit .json path."""
    from .book import save_results

    path = _results_path(out)
    old = os.environ.get("SINKBOOK_RESULTS")
    os.environ["SINKBOOK_RESULTS"] = str(path.parent)
    try:
        save_results(path.stem, results, params=params, models=models, seconds=seconds)
        return path
    finally:
        if old is None:
            os.environ.pop("SINKBOOK_RESULTS", None)
        else:
            os.environ["SINKBOOK_RESULTS"] = old


# ---------------------------------------------------------------------------------------
# command line


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m sinklib.bench", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="commands: cpu (default) | gpu | report")
    ap.add_argument("command", nargs="?", default="cpu", choices=["cpu", "gpu", "report"])
    ap.add_argument("--models", nargs="+", help="cpu: embedded names or tiny-<arch> (default: both embedded); "
                    "gpu: qwen2.5-7b qwen3-8b olmo2-7b (default: all)")
    ap.add_argument("--lengths", nargs="+", type=int, help=f"prompt lengths T (default {' '.join(map(str, DEFAULT_LENGTHS))})")
    ap.add_argument("--repeats", type=int, default=None, help="timed rounds after one warm-up round (default 3; --quick 1)")
    ap.add_argument("--min-seconds", type=float, default=None,
                    help="cpu: more rounds (up to 15) at lengths whose rounds are short, to last about this long "
                         f"(default {MIN_SECONDS:g}; --quick 0)")
    ap.add_argument("--quick", action="store_true", help=f"tiny lengths {QUICK_LENGTHS}, 1 repeat, chapter 2's quick S profile (tests)")
    ap.add_argument("--out", help="results name under data/results (default bench_cpu / bench_gpu) or a .json path")
    ap.add_argument("--last-k-layers", type=int, default=10, help="K of the probe (default 10)")
    ap.add_argument("--eager-budget-gib", type=float, default=12.0,
                    help="skip eager where its predicted memory exceeds this (default 12 GiB)")
    ap.add_argument("--no-memory", action="store_true", help="cpu: skip the per-process peak-memory measurements")
    ap.add_argument("--fit-min-t", type=int, default=512, help="fit memory slopes over T >= this (default 512)")
    ap.add_argument("--tiny", action="store_true", help="gpu: scaled-down versions of the architectures (runs on a CPU)")
    ap.add_argument("--device", default="auto", help="gpu: device (default auto)")
    ap.add_argument("--n-prompts", type=int, default=15, help="gpu: prompts per S (default 15)")
    ap.add_argument("--prompt-tokens", type=int, default=128, help="gpu: tokens per prompt (default 128)")
    ap.add_argument("--cpu-results", default="bench_cpu", help="report: CPU results name or path")
    ap.add_argument("--gpu-results", default="bench_gpu", help="report: GPU results name or path")
    ap.add_argument("--book-dir", default=str(BOOK), help="report: the book folder to write _generated/ and _static/ into")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_mem"]:                       # internal: one peak-memory measurement
        print(json.dumps(_mem_child(json.loads(argv[1]))), flush=True)
        return 0
    a = _parser().parse_args(argv)
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    t0 = time.perf_counter()
    if a.command == "report":
        paths = write_report(a.cpu_results, a.gpu_results, Path(a.book_dir))
        print("\n".join(str(p) for p in paths))
        return 0
    repeats = a.repeats if a.repeats is not None else (1 if a.quick else 3)
    if repeats < 1:
        raise ParameterError(f"--repeats must be >= 1, got {repeats}")
    if a.command == "gpu":
        from .bench_gpu import run_gpu

        params = {"models": a.models, "device": a.device, "tiny": a.tiny, "n_prompts": a.n_prompts,
                  "prompt_tokens": a.prompt_tokens, "last_k_layers": a.last_k_layers, "repeats": repeats,
                  "batch_size": 8, "seed": 0, "profile": "bench"}
        res = run_gpu(a.models, device=a.device, tiny=a.tiny, n_prompts=a.n_prompts, prompt_tokens=a.prompt_tokens,
                      last_k_layers=a.last_k_layers, repeats=repeats, log=log)
        path = save(a.out or "bench_gpu", res, params, [], time.perf_counter() - t0)
        print(gpu_markdown(json.loads(path.read_text())))
        print(f"saved {path}; now run: python -m sinklib.bench report", file=sys.stderr)
        return 0
    models = a.models or list(DEFAULT_MODELS)
    lengths = a.lengths or list(QUICK_LENGTHS if a.quick else DEFAULT_LENGTHS)
    if min(lengths) < 8:
        raise ParameterError(f"--lengths must be >= 8 tokens, got {lengths}")
    s_profile = S_PROFILE_QUICK if a.quick else S_PROFILE
    min_seconds = a.min_seconds if a.min_seconds is not None else (0.0 if a.quick else MIN_SECONDS)
    params = {"models": models, "lengths": lengths, "repeats": repeats, "min_seconds": min_seconds,
              "last_k_layers": a.last_k_layers,
              "eager_budget_gib": a.eager_budget_gib, "memory": not a.no_memory, "fit_min_T": a.fit_min_t,
              "quick": a.quick, "s_profile": s_profile, "torch_threads": torch.get_num_threads(),
              "profile": "quick" if a.quick else "bench"}
    res, prov = run_cpu(models, lengths, repeats, a.last_k_layers, a.eager_budget_gib, not a.no_memory, s_profile,
                        a.fit_min_t, log, min_seconds=min_seconds)
    path = save(a.out or "bench_cpu", res, params, prov, time.perf_counter() - t0)
    print(cpu_markdown(json.loads(path.read_text())))
    print(f"saved {path}; now run: python -m sinklib.bench report", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
