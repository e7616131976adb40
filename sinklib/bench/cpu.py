"""Benchmarks reported as ratios measured in one run (never timed in tests).

``python -m sinklib.bench`` (the CPU benchmark): for each embedded model and prompt length T,
a plain SDPA trunk pass, the sink probe (last K layers, all layers) and eager
``output_attentions``, timed interleaved in one process; the peak memory of each method in its
own process; the log-log slope of memory against T; the time to measure S with chapter 2's
full-profile parameters. ``python -m sinklib.bench gpu`` times S on random 7-8B models
(``sinklib.bench.gpu``); ``python -m sinklib.bench report`` writes the performance page's table
and figure from the saved results. Options: ``python -m sinklib.bench --help``.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from sinklib.bench.report import cpu_markdown, gpu_markdown, plot_cpu, write_report  # noqa: F401  (the report half)
from sinklib.bench.timing import (BOOK, DEFAULT_LENGTHS, DEFAULT_MODELS, GIB, METHODS, MIN_SECONDS,
    QUICK_LENGTHS, REPO, S_PROFILE, S_PROFILE_QUICK, _results_path, check_targets, s_cost_fns,
    interleaved_timings, long_input, memory_fits, ratio_table)
from sinklib.errors import ParameterError

# ---------------------------------------------------------------------------------------
# what is measured


def load(name: str):
    """An embedded model on the CPU by name, or 'tiny-<arch>' for a random tiny model (tests)."""
    from sinklib.core.models import load_model, tiny_model

    if name.startswith("tiny-"):
        return tiny_model(name[len("tiny-"):], seed=0)
    return load_model(name, device="cpu")


def bench_input(lm, T: int, seed: int = 0) -> torch.Tensor:
    """One prompt of exactly T tokens [1, T]: calibration prompts concatenated, or random ids without a tokenizer."""
    if lm.tokenizer is not None:
        from sinklib.core.data import load_prompts

        return long_input(lm.tokenizer, load_prompts(), T)
    vocab = lm.model.config.get_text_config().vocab_size
    return torch.randint(3, vocab, (1, T), generator=torch.Generator().manual_seed(seed))


def method_fns(lm, ids: torch.Tensor, last_k_layers: int = 10, methods: Sequence[str] = tuple(METHODS)) -> dict[str, Callable]:
    """The contenders on one input ids [1, T]: each runs the transformer trunk (no LM head) once."""
    from sinklib.core import sink

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


def _s_cost_row(lm, name: str, p: dict, repeats: int, log: Callable[[str], None]) -> dict:
    """The cost of S with chapter 2's parameters `p` on one loaded model, beside plain passes over the same batches."""
    from sinklib.core import sink

    if lm.tokenizer is not None:
        from sinklib.core.data import load_prompts

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
    row = {"model": name, **p, "last_k_layers": min(p["last_k_layers"], sink.n_layers(lm.model)),
           "S": out.get("S"), "S_seconds": med["S"], "plain_seconds": med["plain"],
           "ratio": med["S"] / med["plain"], "times": t}
    log(f"[bench] {name}: S = {out.get('S'):.3f} in {med['S']:.3f} s (plain passes {med['plain']:.3f} s)")
    return row


def _memory_rows(name: str, lengths: Sequence[int], preds: dict[int, int], budget: int, last_k_layers: int,
                 log: Callable[[str], None]) -> list[dict]:
    """Peak memory of every method and length of one model, each in its own process (eager skipped over budget)."""
    mem = []
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
    return mem


def run_cpu(models: Sequence[str] = DEFAULT_MODELS, lengths: Sequence[int] = DEFAULT_LENGTHS, repeats: int = 3,
            last_k_layers: int = 10, eager_budget_gib: float = 12.0, memory: bool = True, s_profile: dict | None = None,
            fit_min_T: int = 512, log: Callable[[str], None] = print, min_seconds: float = 0.0) -> tuple[dict, list]:
    """Time and memory of the four methods per model and length, and the cost of S (`min_seconds`: see
    `interleaved_timings`). Returns (results, models' provenance)."""
    from sinklib.core import sink

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
        scost.append(_s_cost_row(lm, name, s_profile, repeats, log))
        preds = {T: predict_eager_bytes(lm.model, T) for T in lengths}
        del lm, fns
        gc.collect()
        if memory:
            mem += _memory_rows(name, lengths, preds, budget, last_k_layers, log)
    results = {"timing": timing, "memory": mem, "memory_fit": memory_fits(mem, fit_min_T), "s_cost": scost}
    results["targets"] = check_targets(results)
    return results, prov


# ---------------------------------------------------------------------------------------
# results files, report (markdown table + figure for book/performance.md)


def save(out: str, results: dict, params: dict, models: list, seconds: float) -> Path:
    """save_results under a name, or into an explicit .json path."""
    from sinklib.book.runner import save_results

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
                                 epilog="commands: cpu (default) | gpu | eval (chapter 4's evaluation and training rows) | report")
    ap.add_argument("command", nargs="?", default="cpu", choices=["cpu", "gpu", "eval", "report"])
    ap.add_argument("--models", nargs="+", help="cpu: embedded names or tiny-<arch> (default: both embedded); "
                    "gpu: qwen2.5-7b qwen3-8b olmo2-7b (default: all)")
    ap.add_argument("--lengths", nargs="+", type=int, help=f"prompt lengths T (default {' '.join(map(str, DEFAULT_LENGTHS))})")
    ap.add_argument("--repeats", type=int, default=None, help="timed rounds after one warm-up round (default 2; --quick 1)")
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
    ap.add_argument("--items", nargs=2, type=int, metavar=("INSTRUCTIONS", "MATH"),
                    help="eval: items of the two generation suites (default 16 24; --quick 2 2)")
    ap.add_argument("--train-steps", type=int, default=None, help="eval: training steps per stage (default 2; --quick 1)")
    ap.add_argument("--cpu-results", default="bench_cpu", help="report: CPU results name or path")
    ap.add_argument("--gpu-results", default="bench_gpu", help="report: GPU results name or path")
    ap.add_argument("--book-dir", default=str(BOOK), help="report: the book folder to write _generated/ and _static/ into")
    return ap


def _main_eval(a: argparse.Namespace, log: Callable[[str], None], t0: float) -> int:
    from sinklib.bench.report import eval_markdown
    from sinklib.bench.speed import run_eval

    models = a.models or list(DEFAULT_MODELS)
    n = dict(zip(("instructions", "math"), a.items or ((2, 2) if a.quick else (16, 24))))
    repeats = a.repeats if a.repeats is not None else (1 if a.quick else 2)
    steps = a.train_steps if a.train_steps is not None else (1 if a.quick else 2)
    params = {"models": models, "items": n, "repeats": repeats, "train_steps": steps,
              "torch_threads": torch.get_num_threads(), "profile": "quick" if a.quick else "bench"}
    res, loaded = {"rows": []}, []
    for name in models:  # saved after each model, so a stopped run keeps the models it finished
        part, lm = run_eval([name], n, repeats, steps, log)
        res = {"rows": res["rows"] + part["rows"], "threads": part["threads"]}
        loaded += lm
        path = save(a.out or "bench_eval", res, params, loaded, time.perf_counter() - t0)
    print(eval_markdown(json.loads(path.read_text())))
    print(f"saved {path}; now run: python -m sinklib.bench report", file=sys.stderr)
    return 0


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
    if a.command == "eval":
        return _main_eval(a, log, t0)
    if a.command == "gpu":
        from sinklib.bench.gpu import run_gpu

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
