"""The performance page's generated parts: markdown tables and the figure, from the saved results JSON.

``python -m sinklib.bench report`` calls ``write_report``: it reads ``data/results/bench_cpu.json``
(and ``bench_gpu.json`` when present) and writes ``book/_generated/performance_table.md``,
``book/_generated/performance_gpu.md`` and ``book/_static/performance.png``. No number on the
page is typed by hand.
"""
from __future__ import annotations

import json
from pathlib import Path

MIB = 2 ** 20


def _load_doc(name_or_path: str) -> dict | None:
    from sinklib.bench.timing import _results_path

    path = _results_path(name_or_path)
    return json.loads(path.read_text()) if path.exists() else None


def _cell(x, spec: str = ".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def _table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def _provenance_line(doc: dict) -> str:
    prov, par = doc.get("provenance") or {}, doc.get("parameters") or {}
    if not prov:
        return ""
    v = prov.get("versions", {})
    return (f"Measured on {prov.get('device', '?')} at {prov.get('utc', '?')} (git {str(prov.get('git_commit', '?'))[:12]}; "
            f"torch {v.get('torch', '?')}, transformers {v.get('transformers', '?')}); the whole run took "
            f"{prov.get('seconds', 0) / 60:.1f} min. Times are medians of at least {par.get('repeats', '?')} interleaved "
            "rounds after one warm-up round" + (f"; short lengths get more rounds (up to 15) so that their rounds last "
                                                 f"about {par['min_seconds']:g} s (the rounds column)"
                                                 if par.get("min_seconds") else "") + ".")


def is_partial(params: dict) -> bool:
    """True when a CPU run is not the full benchmark (fewer models, lengths or repeats than the defaults)."""
    from sinklib.bench.timing import DEFAULT_LENGTHS, DEFAULT_MODELS

    return bool(params.get("quick") or int(params.get("repeats", 0)) < 3 or not params.get("memory", True)
                or not set(DEFAULT_LENGTHS) <= set(params.get("lengths", []))
                or not set(DEFAULT_MODELS) <= set(params.get("models", [])))


def _partial_warning(par: dict) -> str:
    """The warning over a partial CPU run (`is_partial`)."""
    return ("```{warning}\nThis is a partial run (models: " + ", ".join(par.get("models", [])) + "; lengths: "
            + ", ".join(map(str, par.get("lengths", []))) + f"; {par.get('repeats')} repeat(s)"
            + ("" if par.get("memory", True) else "; memory not measured")
            + "), a smoke test of the command rather than the benchmark; its times were taken on a machine "
            "that may have been busy. The full benchmark is `python -m sinklib.bench` with its defaults, "
            "on a quiet machine.\n```")


def _time_section(tim: list[dict]) -> str:
    """The 'Time per pass' table of the CPU section."""
    by = {(r["model"], r["T"], r["method"]): r for r in tim}
    keys = list(dict.fromkeys((r["model"], r["T"]) for r in tim))

    def t_cell(model, T, m, key="ratio_to_plain"):
        r = by.get((model, T, m))
        if r is None:
            return "not run"
        if r["status"] != "ok":
            return r["status"]
        return f"{r['median_s']:.3f}" + (f" ({r[key]:.2f})" if key and key in r else "")

    def n_rounds(model, T):
        r = by.get((model, T, "plain"))
        return str(len(r.get("times", []))) if r and r["status"] == "ok" else "n/a"

    rows = [[model, str(T), n_rounds(model, T), t_cell(model, T, "plain", None), t_cell(model, T, "probe_k"),
             t_cell(model, T, "probe_all"), t_cell(model, T, "eager", "eager_over_probe")] for model, T in keys]
    return ("### Time per pass\n\nMedian seconds of one pass over the timed rounds; in brackets, the ratio of "
            "medians to the plain pass (for eager: to the probe, last K layers).\n\n" + _table(
                ["model", "T (tokens)", "rounds", "plain SDPA (s)", "probe, last K: s (/ plain)",
                 "probe, all layers: s (/ plain)", "eager output_attentions: s (/ probe)"], rows))


def _memory_table(mem: list[dict]) -> str:
    """The 'Peak memory' table of the CPU section (measured memory rows `mem`, not empty)."""
    mby = {(r["model"], r["T"], r["method"]): r for r in mem}

    def m_cell(model, T, m):
        r = mby.get((model, T, m))
        if r is None:
            return "not run"
        return f"{r['extra_bytes'] / MIB:.0f}" if r["status"] == "ok" else r["status"]

    def diff(model, T):
        a, b = mby.get((model, T, "probe_k")), mby.get((model, T, "plain"))
        if a and b and a["status"] == b["status"] == "ok":
            return f"{(a['extra_bytes'] - b['extra_bytes']) / MIB:+.0f}"
        return "n/a"

    def pred(model, T):
        p = (mby.get((model, T, "eager")) or {}).get("predicted_bytes")
        return f"{p / MIB:.0f}" if p else "n/a"

    mkeys = list(dict.fromkeys((r["model"], r["T"]) for r in mem))
    rows = [[model, str(T), m_cell(model, T, "plain"), m_cell(model, T, "probe_k"), diff(model, T),
             m_cell(model, T, "probe_all"), m_cell(model, T, "eager"), pred(model, T)] for model, T in mkeys]
    return ("### Peak memory\n\nPeak resident memory of one pass above the memory of the loaded model "
            "(MiB), each method and length measured in its own process (plain: the plain SDPA pass; eager: "
            "eager output_attentions; eager predicted: what the skipping rule expects of eager).\n\n" + _table(
                ["model", "T", "plain", "probe, last K", "probe - plain", "probe, all", "eager",
                 "eager predicted"], rows))


def _slope_table(fits: list[dict]) -> str:
    """The fitted memory slopes per model and method (`timing.memory_fits`) of the CPU section."""
    from sinklib.bench.timing import MEM_RESOLUTION, METHODS, PROBE_OVER_PLAIN

    fby = {(f["model"], f["method"]): f for f in fits}
    series = [*METHODS, PROBE_OVER_PLAIN]
    rows = [[model, ", ".join(map(str, next((f["lengths"] for f in fits if f["model"] == model), [])))]
            + [_cell(fby.get((model, m), {}).get("slope"), ".2f") for m in series]
            for model in dict.fromkeys(f["model"] for f in fits)]
    return ("Fitted log-log slope of that memory against T (1 = linear, 2 = quadratic; n/a where it "
            "could not be fitted; probe - plain leaves out differences within the resolution of "
            f"{MEM_RESOLUTION // MIB} MiB, which are noise between processes):\n\n" + _table(
                ["model", "fitted over T", "plain", "probe, last K", "probe, all", "eager", "probe - plain"],
                rows))


def _s_cost_section(res: dict, par: dict) -> str:
    """The 'Time to measure S' table of the CPU section."""
    rows = [[s["model"], str(s["n_prompts"]), str(s["last_k_layers"]), str(s["max_tokens"]), _cell(s.get("S"), ".3f"),
             f"{s['S_seconds']:.3f}", f"{s['plain_seconds']:.3f}", f"{s['ratio']:.2f}"] for s in res.get("s_cost", [])]
    return ("### Time to measure S\n\nS with chapter 2's parameters of the "
            + ("quick" if par.get("quick") else "full") + " profile (sink = first token, q0 = "
            f"{(res.get('s_cost') or [{}])[0].get('query_start', '?')}, batches of "
            f"{(res.get('s_cost') or [{}])[0].get('batch_size', '?')}), beside plain SDPA passes over the same "
            "batches; model loading not included.\n\n" + _table(
                ["model", "prompts N", "K", "max tokens", "S", "time of S (s)", "plain passes (s)", "S / plain"], rows))


def cpu_markdown(doc: dict) -> str:
    """The CPU section of the performance page (time, memory, slopes, targets, cost of S) as MyST markdown."""
    from sinklib.bench.timing import check_targets, memory_fits

    res, par = dict(doc["results"]), doc.get("parameters") or {}
    # slopes and verdicts are derived again from the raw measurements, so the page follows the current rules
    res["memory_fit"] = memory_fits(res.get("memory") or [], int(par.get("fit_min_T", 512)))
    res["targets"] = check_targets(res)
    parts = []
    if is_partial(par):
        parts.append(_partial_warning(par))
    line = _provenance_line(doc)
    if line:
        parts.append(line)
    parts.append(_time_section(res["timing"]))
    mem = res.get("memory") or []
    if mem:
        parts.append(_memory_table(mem))
        parts.append(_slope_table(res.get("memory_fit") or []))
    else:
        parts.append("### Peak memory\n\nNot measured in this run (`--no-memory`).")

    verdict = {True: "yes", False: "**no**", None: "not measured"}
    rows = [[t["target"], t["model"], t["measured"], verdict[t["ok"]]] for t in res.get("targets", [])]
    parts.append("### Targets\n\n" + _table(["target", "model", "measured", "met"], rows))
    parts.append(_s_cost_section(res, par))
    return "\n\n".join(parts) + "\n"


def gpu_markdown(doc: dict | None) -> str:
    """The GPU section: the measured table, or a notice that it has not been run, and the configurations."""
    from sinklib.bench.gpu import GPU_CONFIGS, PAPER_GPU, PAPER_SECONDS, build_config, param_count

    parts = []
    paper = (f"Reported by the paper (section 3.2): S costs about {PAPER_SECONDS:g} s for a 7B model on "
             f"{PAPER_GPU} (what that time includes is not stated).")
    rows_ = (doc or {}).get("results", {}).get("rows", [])
    if not rows_:
        parts.append("```{warning}\nThe GPU benchmark has not been run: no GPU numbers are shown here. "
                     "Run `python -m sinklib.bench gpu` on a machine with a CUDA GPU, then "
                     "`python -m sinklib.bench report`.\n```")
    else:
        if any(r.get("tiny") for r in rows_):
            parts.append("```{warning}\nThese rows come from the tiny, scaled-down versions of the architectures "
                         "(`--tiny`): a test of the code path, not GPU numbers.\n```")
        line = _provenance_line(doc)
        if line:
            parts.append(line)
        quantities = [("architecture", lambda r: r["architecture"]), ("QK-norm", lambda r: r["qk_norm"]),
                      ("parameters (B)", lambda r: f"{r['params_b']:.2f}"), ("dtype", lambda r: r["dtype"]),
                      ("devices", lambda r: ", ".join(r["devices"])),
                      ("build (s)", lambda r: f"{r['build_seconds']:.1f}"),
                      ("time of S (s)", lambda r: f"{r['S_seconds']:.2f}"),
                      ("plain passes (s)", lambda r: f"{r['plain_seconds']:.2f}"),
                      ("S / plain", lambda r: f"{r['ratio']:.2f}"),
                      ("peak GPU memory (GiB)", lambda r: _cell(r.get("peak_gpu_gib"), ".1f")),
                      ("probe vs eager, max abs diff", lambda r: _cell(r.get("probe_vs_eager_max_abs"), ".1e"))]
        rows = [[q] + [f(r) for r in rows_] for q, f in quantities]
        p = doc.get("parameters") or {}
        parts.append(f"S over {p.get('n_prompts', '?')} prompts of {p.get('prompt_tokens', '?')} random tokens, "
                     f"K = {p.get('last_k_layers', '?')}, exact chunked probe, random weights:\n\n"
                     + _table([""] + [r["model"] for r in rows_], rows))
    parts.append(paper)
    names = list(GPU_CONFIGS)
    cfgs = [GPU_CONFIGS[n]["config"] for n in names]
    rows = [["configuration of"] + [GPU_CONFIGS[n]["hub_id"] for n in names],
            ["architecture"] + [c["model_type"] for c in cfgs]]
    for label, key in (("layers", "num_hidden_layers"), ("hidden size", "hidden_size"),
                       ("attention heads", "num_attention_heads"), ("kv heads", "num_key_value_heads"),
                       ("intermediate size", "intermediate_size"), ("vocabulary", "vocab_size")):
        rows.append([label] + [str(c[key]) for c in cfgs])
    rows.append(["RoPE theta"] + [f"{c['rope_theta']:,.0f}" for c in cfgs])
    rows.append(["QK-norm"] + [GPU_CONFIGS[n]["qk_norm"] for n in names])
    rows.append(["parameters (B)"] + [f"{param_count(build_config(n)) / 1e9:.2f}" for n in names])
    parts.append("The configurations (values of each model's hub `config.json`, written in `sinklib/bench_gpu.py`):\n\n"
                 + _table([""] + names, rows))
    return "\n\n".join(parts) + "\n"


def plot_cpu(doc: dict, path: Path) -> Path:
    """Time and memory against T (log-log), one column per model, one line per method. Saved as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    from sinklib.bench.timing import METHODS
    from sinklib.plots import set_theme

    set_theme()
    res = doc["results"]
    models = list(dict.fromkeys(r["model"] for r in res["timing"]))
    mem = res.get("memory") or []
    nrow = 2 if mem else 1
    with plt.rc_context({"font.size": 12, "axes.titlesize": 13, "axes.labelsize": 12, "legend.fontsize": 11,
                         "xtick.labelsize": 11, "ytick.labelsize": 11}):
        ncol = len(models)
        fig, axes = plt.subplots(nrow, ncol, figsize=(max(9.0, 6.0 * ncol), 4.6 * nrow), squeeze=False)
        markers = dict(zip(METHODS, "osD^"))
        colors = dict(zip(METHODS, sns.color_palette("colorblind", len(METHODS))))
        fmt = FuncFormatter(lambda y, _: f"{y:g}")
        for j, model in enumerate(models):
            panels = [("timing", "median_s", 1.0, "median time of one pass (s)", "time per pass")]
            if mem:
                panels.append(("memory", "extra_bytes", 1 / MIB, "peak memory above the loaded model (MiB)",
                               "peak memory"))
            for i, (key, field, scale, ylabel, what) in enumerate(panels):
                ax = axes[i][j]
                lengths = []
                for m, label in METHODS.items():
                    pts = sorted((r["T"], r[field] * scale) for r in res[key]   # log axes: zeros left out
                                 if r["model"] == model and r["method"] == m and r.get("status") == "ok"
                                 and r[field] > 0)
                    if pts:
                        ax.plot(*zip(*pts), marker=markers[m], color=colors[m], label=label)
                        lengths += [p[0] for p in pts]
                ax.set_xscale("log", base=2)
                ax.set_yscale("log")
                ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
                ax.yaxis.set_major_formatter(fmt)
                ax.yaxis.set_minor_formatter(NullFormatter())
                if lengths:
                    ax.set_xticks(sorted(set(lengths)), [str(t) for t in sorted(set(lengths))])
                    ax.xaxis.set_minor_formatter(NullFormatter())
                ax.set_xlabel("prompt length T (tokens)")
                ax.set_ylabel(ylabel)
                ax.set_title(f"{model}: {what}")
        handles = [Line2D([], [], color=colors[m], marker=markers[m], label=label) for m, label in METHODS.items()]
        fig.legend(handles=handles, loc="lower center", ncol=len(METHODS) if ncol > 1 else 2, frameon=False)
        fig.suptitle("Sink probe vs plain SDPA pass vs eager output_attentions\n(CPU, log-log axes)",
                     fontweight="bold")
        fig.tight_layout(rect=(0, 0.09 if ncol == 1 else 0.05, 1, 1))
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
        plt.close(fig)
    return path


def _eval_table(rows: list[dict]) -> str:
    """Two tables that fit the book's column: the speed of each code path, then the new code's agreement with the
    old one (answers, strict and lenient grades)."""
    speed_rows, agree_rows = [], []
    for r in rows:
        a = r.get("agreement") or {}
        speed = "1" if r["code"] == "before" else f"{r['speedup']:.2f} ({r['speedup_min']:.2f}-{r['speedup_max']:.2f})"
        speed_rows.append([r["model"], r["suite"], f"{r['code']}, {r['batch']}", f"{r['median_s']:.1f}",
                           f"{r['items_per_s']:.3f}", f"{r['tokens_per_s']:.1f}", speed])
        if a:
            agree_rows.append([r["model"], r["suite"], str(r["n_items"])]
                              + [f"{100 * a[k]:.0f} %" for k in ("same_answer", "same_strict", "same_lenient")])
    out = _table(["model", "suite", "code, batch", "median s", "items/s", "answer tok/s", "speed-up (rounds)"],
                 speed_rows)  # the items of each suite: the agreement table
    if agree_rows:
        out += "\n\n" + _table(["model", "suite", "items", "same answer", "same strict grade", "same lenient grade"],
                                agree_rows)
    return out


#: the training rows' settings in words (a column, or one sentence when every row has the same)
WORDS = {"batch": "batch", "threads": "torch threads", "steps": "steps"}


def eval_markdown(doc: dict | None) -> str:
    """The evaluation and training rows (`sinklib.bench.speed`) as the page shows them."""
    if doc is None:
        return "*Not measured yet: run `python -m sinklib.bench eval`, then `python -m sinklib.bench report`.*\n"
    rows, par, prov = doc["results"]["rows"], doc.get("parameters") or {}, doc.get("provenance") or {}
    ev = [r for r in rows if r["part"] == "evaluation"]
    tr = [r for r in rows if r["part"] == "training"]
    out = [f"Measured on {prov.get('device', '?')} at {prov.get('utc', '?')} (git {str(prov.get('git_commit', '?'))[:12]}), "
           f"{par.get('repeats', '?')} interleaved rounds per suite with the order alternating; the speed-up is the "
           "median of the per-round ratios of seconds (before / after), with the smallest and largest in brackets.", "",
           _eval_table(ev)]
    if tr:
        rate = all("share_of_matmul_peak" in r for r in tr)  # measured since session 41
        same = {k: tr[0][k] for k in ("batch", "threads", "steps") if len({r[k] for r in tr}) == 1}
        cols = [k for k in ("batch", "threads", "steps") if k not in same]  # said once above the table when equal
        if same:
            out += ["", "Training rows: " + ", ".join(f"{WORDS[k]} {v}" for k, v in same.items()) + " in every row."]
        out += ["", _table(["model", "stage"] + [WORDS[k] for k in cols] + ["s per step",
                            "input positions/s"] + (["GFLOP per step", "GFLOP/s", "share of the matmul peak"] if rate else []),
                           [[r["model"], r["suite"]] + [str(r[k]) for k in cols] +
                            [f"{r['seconds_per_step']:.2f}", f"{r['tokens_per_s']:.0f}"]
                            + ([f"{r['flops_per_step'] / 1e9:.0f}", f"{r['gflops_per_s']:.0f}",
                                f"{100 * r['share_of_matmul_peak']:.0f} %"] if rate else []) for r in tr])]
        if rate:
            from sinklib.bench.speed import MATMUL_N

            out += ["", f"The matmul peak is the best of ten {MATMUL_N} x {MATMUL_N} fp32 products at the training "
                    f"thread count on the same machine ({tr[0]['matmul_gflops_per_s']:.0f} GFLOP/s); a step's operations "
                    "are counted by torch's FlopCounterMode (matrix products and attention) and divided by the "
                    "fastest step's seconds. A stage near the peak cannot run twice as fast in fp32 on this "
                    "machine; the rest of a stage-2 step is AdamW and gradient bookkeeping over every weight."]
    return "\n".join(out) + "\n"


def write_report(cpu: str = "bench_cpu", gpu: str = "bench_gpu", book_dir: Path | None = None,
                 evals: str = "bench_eval") -> list[Path]:
    """Write the page's generated table (CPU), GPU section and figure from the saved results."""
    from sinklib.bench.timing import BOOK
    from sinklib.errors import ResultsMissing

    book_dir = Path(book_dir or BOOK)
    cdoc = _load_doc(cpu)
    if cdoc is None:
        from sinklib.bench.timing import _results_path

        raise ResultsMissing(f"{_results_path(cpu)} does not exist: run the CPU benchmark first "
                             "(`python -m sinklib.bench`), then `python -m sinklib.bench report`")
    gen = book_dir / "_generated"
    gen.mkdir(parents=True, exist_ok=True)
    table = gen / "performance_table.md"
    table.write_text(cpu_markdown(cdoc))
    gpu_md = gen / "performance_gpu.md"
    gpu_md.write_text(gpu_markdown(_load_doc(gpu)))
    eval_md = gen / "performance_eval.md"
    eval_md.write_text(eval_markdown(_load_doc(evals)))
    fig = plot_cpu(cdoc, book_dir / "_static" / "performance.png")
    return [table, gpu_md, eval_md, fig]
