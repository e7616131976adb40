"""The benchmark's structure (never its timings): rows and ratios, memory fits, skipping, report, GPU builder."""
import json
import statistics
from pathlib import Path

import numpy as np
import pytest
import torch

from sinklib import bench
from sinklib.bench import cpu as bench_cpu, gpu as bench_gpu
from sinklib.core import sink
from sinklib.errors import ParameterError, ResultsMissing

ROOT = Path(__file__).resolve().parent.parent


def _chapter2_parameters() -> dict:
    nb = json.loads((ROOT / "notebooks" / "02_sink_strength.ipynb").read_text())
    cell = next(c for c in nb["cells"] if "parameters" in (c["metadata"].get("tags") or []))
    ns: dict = {}
    exec("".join(cell["source"]), ns)
    return ns


def test_s_profile_is_chapter_2s():
    import yaml

    defaults = _chapter2_parameters()
    prof = yaml.safe_load((ROOT / "data" / "profiles" / "02_sink_strength.yml").read_text())
    for name, p in (("full", bench.S_PROFILE), ("quick", bench.S_PROFILE_QUICK)):
        params = {**defaults, **(prof.get(name) or {})}
        assert p == {k: params[k] for k in p}, name


def test_ratios_are_computed_from_the_medians():
    times = {"plain": [1.0, 3.0, 2.0], "probe_k": [2.2, 2.0, 9.0], "probe_all": [2.4, 2.4, 2.4], "eager": [8.0, 6.0, 7.0]}
    rows = bench.timing_rows("m", 128, times, skipped={})
    by = {r["method"]: r for r in rows}
    assert set(by) == set(bench.METHODS)
    for m, r in by.items():
        assert r["median_s"] == statistics.median(times[m])
        assert r["min_s"] == min(times[m])
        assert r["ratio_to_plain"] == pytest.approx(statistics.median(times[m]) / 2.0)
        assert r["status"] == "ok" and r["T"] == 128 and r["label"] == bench.METHODS[m]
    assert by["plain"]["ratio_to_plain"] == 1.0
    assert by["eager"]["eager_over_probe"] == pytest.approx(7.0 / 2.2)


def test_short_rounds_are_repeated_more_often():
    assert bench.rounds_for(1.0, 3, 0.0) == 3                     # off by default
    assert bench.rounds_for(4.0, 3, 40.0) == 10                   # 40 s of 4-s rounds
    assert bench.rounds_for(0.01, 3, 40.0) == 15                  # capped
    assert bench.rounds_for(30.0, 3, 40.0) == 3                   # long rounds keep the minimum
    calls = []
    t = bench.interleaved_timings({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, repeats=2,
                                  min_seconds=1.0, max_repeats=5)
    assert len(t["a"]) == len(t["b"]) == 5 and calls[:4] == ["a", "b", "a", "b"] and len(calls) == 12


def test_skipped_rows_say_the_predicted_memory():
    rows = bench.timing_rows("m", 8192, {"plain": [1.0], "probe_k": [1.0]}, skipped={"eager": 18 * bench.GIB})
    sk = [r for r in rows if r["method"] == "eager"]
    assert len(sk) == 1 and sk[0]["status"] == "skipped (predicted 18.0 GiB)"
    assert "median_s" not in sk[0]


def test_predicted_eager_memory_is_quadratic():
    lm = sink_model = bench.load("tiny-llama")
    cfg = sink_model.model.config
    p1, p2 = bench.predict_eager_bytes(lm.model, 1024), bench.predict_eager_bytes(lm.model, 2048)
    assert p2 == 4 * p1
    assert p1 >= 4 * cfg.num_hidden_layers * cfg.num_attention_heads * 1024 ** 2   # every layer's map, fp32


@pytest.mark.parametrize("power", [1, 2])
def test_loglog_fit_recovers_the_slope(power):
    rng = np.random.default_rng(0)
    T = np.array([128, 512, 2048, 8192])
    y = 3e3 * T ** power * np.exp(rng.normal(0, 0.03, size=T.size))
    fit = bench.fit_loglog_slope(T, y)
    assert fit["slope"] == pytest.approx(power, abs=0.05) and fit["n"] == 4


def test_loglog_fit_leaves_out_zeros_and_needs_two_points():
    assert bench.fit_loglog_slope([128, 512, 2048], [0, 10.0, 40.0])["slope"] == pytest.approx(1.0)
    assert bench.fit_loglog_slope([128], [5.0])["slope"] is None
    assert bench.fit_loglog_slope([128, 512], [0, -1])["slope"] is None


def test_memory_fits_per_model_and_method():
    rows = []
    for T in (16, 128, 512, 2048):
        rows += [{"model": "a", "T": T, "method": "probe_k", "status": "ok", "extra_bytes": 1000 * T + (5e6 if T == 16 else 0)},
                 {"model": "a", "T": T, "method": "eager", "status": "ok", "extra_bytes": 7 * T * T}]
    rows.append({"model": "a", "T": 8192, "method": "eager", "status": "skipped (predicted 20.0 GiB)"})
    fits = {f["method"]: f for f in bench.memory_fits(rows, fit_min_T=128)}
    assert fits["probe_k"]["slope"] == pytest.approx(1.0) and fits["probe_k"]["lengths"] == [128, 512, 2048]
    assert fits["eager"]["slope"] == pytest.approx(2.0)
    assert set(fits) == {"probe_k", "eager"}


def _mem_rows(probe_extra):
    rows = []
    for T in (512, 2048, 8192):
        rows += [{"model": "a", "T": T, "method": "plain", "status": "ok", "extra_bytes": 50_000 * T},
                 {"model": "a", "T": T, "method": "probe_k", "status": "ok", "extra_bytes": 50_000 * T + probe_extra(T)}]
    return rows


@pytest.mark.parametrize("probe_extra,ok,words", [
    (lambda T: 0, True, "within"),                 # below the resolution of peak RSS
    (lambda T: 40_000 * T, True, "slope 1.00"),    # linear
    (lambda T: 40 * T * T, False, "slope 2.00"),   # a T x T buffer
])
def test_memory_target_is_the_probe_over_the_plain_pass(probe_extra, ok, words):
    mem = _mem_rows(probe_extra)
    fits = bench.memory_fits(mem)
    (diff,) = [f for f in fits if f["method"] == bench.PROBE_OVER_PLAIN]
    assert diff["max_bytes"] == max(probe_extra(T) for T in (512, 2048, 8192))
    (target,) = [t for t in bench.check_targets({"timing": [], "memory": mem, "memory_fit": fits})
                 if t["target"].startswith("probe's extra memory")]
    assert target["ok"] is ok and words in target["measured"]


def test_run_cpu_structure_on_a_tiny_model():
    res, prov = bench.run_cpu(["tiny-llama"], [16, 32], repeats=2, memory=False, s_profile=bench.S_PROFILE_QUICK,
                              log=lambda s: None)
    assert prov[0]["name"] == "tiny-llama"
    assert {(r["T"], r["method"]) for r in res["timing"]} == {(T, m) for T in (16, 32) for m in bench.METHODS}
    for r in res["timing"]:
        assert len(r["times"]) == 2 and r["median_s"] == statistics.median(r["times"])
        plain = next(p for p in res["timing"] if p["T"] == r["T"] and p["method"] == "plain")
        assert r["ratio_to_plain"] == pytest.approx(r["median_s"] / plain["median_s"])
    (s,) = res["s_cost"]
    assert s["n_prompts"] == bench.S_PROFILE_QUICK["n_prompts"] and s["last_k_layers"] == 4
    assert s["ratio"] == pytest.approx(s["S_seconds"] / s["plain_seconds"]) and np.isfinite(s["S"])
    assert res["memory"] == [] and res["memory_fit"] == []
    kinds = [t["target"].split(" ")[0] for t in res["targets"]]
    assert len(res["targets"]) == 3 and kinds[0] == "probe"
    assert res["targets"][1]["ok"] is None and res["targets"][1]["measured"] == "not measured"   # no T = 2048


def test_eager_is_skipped_above_the_budget(monkeypatch):
    calls = []

    def fake_peak(model, method, T, last_k_layers=10, timeout=0):
        calls.append((method, T))
        return {"model": model, "method": method, "T": T, "status": "ok", "extra_bytes": 100 * T}

    monkeypatch.setattr(bench_cpu, "peak_memory", fake_peak)
    lm = bench.load("tiny-llama")
    budget = (bench.predict_eager_bytes(lm.model, 16) + bench.predict_eager_bytes(lm.model, 32)) / 2 / bench.GIB
    res, _ = bench.run_cpu(["tiny-llama"], [16, 32], repeats=1, eager_budget_gib=budget, memory=True,
                           s_profile=bench.S_PROFILE_QUICK, fit_min_T=0, log=lambda s: None)
    eager = {r["T"]: r for r in res["timing"] if r["method"] == "eager"}
    assert eager[16]["status"] == "ok" and eager[32]["status"].startswith("skipped (predicted ")
    assert ("eager", 32) not in calls and ("eager", 16) in calls and len(calls) == 7
    mem32 = next(r for r in res["memory"] if r["method"] == "eager" and r["T"] == 32)
    assert mem32["status"].startswith("skipped (predicted ") and mem32["predicted_bytes"] > 0
    fits = {f["method"]: f["slope"] for f in res["memory_fit"]}
    assert fits["probe_k"] == pytest.approx(1.0) and fits["eager"] is None   # one length only


def test_peak_memory_in_its_own_process():
    r = bench.peak_memory("tiny-llama", "probe_k", 32, last_k_layers=2)
    assert r["status"] == "ok", r
    assert r["method"] == "probe_k" and r["T"] == 32
    assert r["peak_bytes"] >= r["baseline_bytes"] > 0 and r["extra_bytes"] == r["peak_bytes"] - r["baseline_bytes"]


def test_command_line_and_report(tmp_path):
    out = tmp_path / "bench_cpu.json"
    assert bench.main(["--quick", "--models", "tiny-llama", "--no-memory", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["parameters"]["lengths"] == list(bench.QUICK_LENGTHS) and doc["provenance"]["device"].startswith("cpu")
    book = tmp_path / "book"
    assert bench.main(["report", "--cpu-results", str(out), "--gpu-results", str(tmp_path / "none.json"),
                       "--book-dir", str(book)]) == 0
    md = (book / "_generated" / "performance_table.md").read_text()
    assert "| model | T (tokens) | rounds | plain SDPA (s)" in md and "partial run" in md and "--no-memory" in md
    for r in doc["results"]["timing"]:          # every number comes from the JSON
        assert f"{r['median_s']:.3f}" in md
    gpu = (book / "_generated" / "performance_gpu.md").read_text()
    assert "has not been run" in gpu and "Qwen/Qwen3-8B" in gpu
    png = book / "_static" / "performance.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_without_results_names_the_command(tmp_path):
    with pytest.raises(ResultsMissing, match="python -m sinklib.bench"):
        bench.write_report(str(tmp_path / "missing.json"), str(tmp_path / "none.json"), tmp_path / "book")


# ---------------------------------------------------------------------------------------
# GPU benchmark: configurations and builder (tiny versions on the CPU)

ARCH = {"qwen2.5-7b": "Qwen2ForCausalLM", "qwen3-8b": "Qwen3ForCausalLM", "olmo2-7b": "Olmo2ForCausalLM"}


def test_gpu_configs_have_the_real_sizes():
    billions = {name: bench_gpu.param_count(bench_gpu.build_config(name)) / 1e9 for name in bench_gpu.GPU_CONFIGS}
    assert billions["qwen2.5-7b"] == pytest.approx(7.62, abs=0.01)
    assert billions["qwen3-8b"] == pytest.approx(8.19, abs=0.01)
    assert billions["olmo2-7b"] == pytest.approx(7.30, abs=0.01)


@pytest.mark.parametrize("name", list(bench_gpu.GPU_CONFIGS))
def test_tiny_versions_keep_the_architecture(name):
    cfg = bench_gpu.build_config(name, tiny=True)
    model, placement = bench_gpu.build_random_model(cfg, device="cpu", dtype=torch.float32)
    assert type(model).__name__ == ARCH[name] and placement["devices"] == ["cpu"]
    assert all(t.device.type == "cpu" for t in list(model.parameters()) + list(model.buffers()))
    real = bench_gpu.GPU_CONFIGS[name]["config"]
    assert cfg.rope_parameters["rope_theta"] == real["rope_theta"]
    assert real["num_attention_heads"] // real["num_key_value_heads"] >= cfg.num_attention_heads // cfg.num_key_value_heads
    attn = model.model.layers[0].self_attn
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    qk = bench_gpu.GPU_CONFIGS[name]["qk_norm"]
    if qk == "none":
        assert not hasattr(attn, "q_norm")
    else:
        width = head_dim if qk == "per_head" else cfg.num_attention_heads * head_dim
        assert attn.q_norm.weight.shape == (width,)
    rope = model.model.rotary_emb.inv_freq
    expect = 1.0 / real["rope_theta"] ** (torch.arange(0, head_dim, 2).float() / head_dim)
    assert torch.allclose(rope.float(), expect, rtol=1e-5)
    std = float(attn.q_proj.weight.detach().std())
    assert 0.01 < std < 0.03        # random normal init, not uninitialised memory
    seq = bench_gpu.random_prompts(cfg.vocab_size, 1, 24)[0]
    assert bench_gpu.probe_vs_eager(model, seq) < 1e-5


def test_builder_materialises_a_device_map():
    cfg = bench_gpu.build_config("qwen3-8b", tiny=True)
    dmap = {"model.embed_tokens": "cpu", "model.layers": "cpu", "model.norm": "cpu", "model.rotary_emb": "cpu",
            "lm_head": "cpu"}
    model, placement = bench_gpu.build_random_model(cfg, device="cpu", dtype=torch.float32, device_map=dmap)
    assert all(not t.is_meta for t in list(model.parameters()) + list(model.buffers()))
    assert placement["devices"] == ["cpu"]


def test_gpu_script_runs_on_tiny_versions_on_cpu(tmp_path):
    out = tmp_path / "bench_gpu.json"
    assert bench.main(["gpu", "--tiny", "--device", "cpu", "--n-prompts", "3", "--prompt-tokens", "16",
                       "--repeats", "1", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    rows = doc["results"]["rows"]
    assert [r["model"] for r in rows] == list(bench_gpu.GPU_CONFIGS)
    for r in rows:
        assert r["tiny"] and r["architecture"] == ARCH[r["model"]] and r["last_k_layers"] == 4
        assert r["ratio"] == pytest.approx(r["S_seconds"] / r["plain_seconds"])
        assert np.isfinite(r["S_value"]) and r["probe_vs_eager_max_abs"] < 2e-2     # bf16 eager reference
    assert doc["results"]["paper"]["seconds"] == bench_gpu.PAPER_SECONDS
    md = bench.gpu_markdown(doc)
    assert "tiny, scaled-down versions" in md and "has not been run" not in md


def test_gpu_benchmark_refuses_a_cpu_without_tiny():
    with pytest.raises(ParameterError, match="--tiny"):
        bench_gpu.run_gpu(["qwen3-8b"], device="cpu")
    with pytest.raises(ParameterError, match="allowed"):
        bench_gpu.run_gpu(["llama-70b"], device="cpu", tiny=True)


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="no CUDA GPU visible: the chunked probe is checked against eager output_attentions "
                           "on CUDA only on a machine with a GPU (python -m pytest tests/test_bench.py -k cuda)")
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("name", list(bench_gpu.GPU_CONFIGS))
def test_chunked_probe_equals_eager_on_cuda(name, dtype, tol):
    cfg = bench_gpu.build_config(name, tiny=True)
    model, _ = bench_gpu.build_random_model(cfg, device="cuda", dtype=dtype)
    seqs = bench_gpu.random_prompts(cfg.vocab_size, 2, 40)
    ids, att = sink.pad_batch([seqs[0], seqs[1][:25]])          # right padding in the second row
    ids, att = ids.cuda(), att.cuda()
    rec = sink.record_sink(model, ids, att, method="chunked")
    ref = sink.eager_sink_probs(model, ids, att, rec.sink_index.cuda()).cpu()
    valid = rec.valid[:, None, None, :]
    assert float(((rec.p - ref).abs() * valid).max()) < tol


# ---------------------------------------------------------------------------------------
# the embedded model (slow: loads it)


@pytest.mark.slow
def test_methods_and_cost_of_s_run_on_an_embedded_model(smollm2):
    from sinklib.core.data import load_prompts

    ids = bench.bench_input(smollm2, 40)
    assert ids.shape == (1, 40)
    fns = bench.method_fns(smollm2, ids, last_k_layers=10)
    assert set(fns) == set(bench.METHODS)
    for f in fns.values():
        f()
    out = {}
    s_fns = bench.s_cost_fns(smollm2, prompts=load_prompts(2), max_tokens=16, out=out)
    s_fns["plain"]()
    s_fns["S"]()
    assert np.isfinite(out["S"])


def test_committed_performance_page_matches_the_committed_results(tmp_path):
    """The page's generated table is what `python -m sinklib.bench report` makes of data/results (fresh)."""
    from sinklib.core.resources import checkout_root

    root = checkout_root()
    if root is None or not (root / "data" / "results" / "bench_cpu.json").exists():
        pytest.skip("no committed benchmark results")
    bench.write_report(str(root / "data" / "results" / "bench_cpu.json"),
                       str(root / "data" / "results" / "bench_gpu.json"), tmp_path,
                       str(root / "data" / "results" / "bench_eval.json"))
    for name in ("performance_table.md", "performance_gpu.md", "performance_eval.md"):
        assert (tmp_path / "_generated" / name).read_text() == (root / "book" / "_generated" / name).read_text(), \
            f"book/_generated/{name} is stale: run `python -m sinklib.bench report`"


def test_eval_rows_agreement_alternation_and_table():
    """The evaluation benchmark's pieces (never its timings): agreement fractions, alternating rounds, the table."""
    from sinklib.bench import report, speed

    rows = [{"answer": "3"}, {"answer": "4"}]
    a = speed.agreement("math", rows, ["The answer is 3.", "so 4"], ["The answer is 3.", "The answer is 4."])
    assert a == {"n": 2, "same_answer": 0.5, "same_strict": 0.5, "same_lenient": 1.0}
    calls = []
    times, first = speed.alternating({"before": lambda: calls.append("b") or "B", "after": lambda: calls.append("a") or "A"}, 3)
    assert calls == ["b", "a", "a", "b", "b", "a"] and first == {"before": "B", "after": "A"}
    assert all(len(v) == 3 for v in times.values())
    ev = {"part": "evaluation", "model": "m", "suite": "math", "n_items": 2, "median_s": 2.0, "items_per_s": 1.0,
          "tokens_per_s": 5.0}
    doc = {"results": {"rows": [{**ev, "code": "before", "batch": 8, "speedup": 1.0},
                                {**ev, "code": "after", "batch": 32, "speedup": 2.5, "speedup_min": 2.0, "speedup_max": 3.0,
                                 "agreement": a},
                                {"part": "training", "model": "m", "suite": "stage1", "batch": 32, "threads": 2, "steps": 2,
                                 "seconds_per_step": 1.5, "items_per_s": 21.3, "tokens_per_s": 500.0}]},
           "parameters": {"repeats": 3}, "provenance": {}}
    md = report.eval_markdown(doc)
    assert "2.50 (2.00-3.00)" in md and "| 50 % | 50 % | 100 % |" in md and "| m | stage1 | 1.50 |" in md
    assert "Training rows: batch 32, torch threads 2, steps 2 in every row." in md
    assert "Not measured yet" in report.eval_markdown(None) and "matmul peak" not in md
    doc["results"]["rows"][-1].update(flops_per_step=3.6e11, gflops_per_s=170.0, matmul_gflops_per_s=238.0,
                                       share_of_matmul_peak=170 / 238)
    md = report.eval_markdown(doc)
    assert "| 1.50 | 500 | 360 | 170 | 71 % |" in md and "(238 GFLOP/s)" in md
    doc["results"]["rows"].append({**doc["results"]["rows"][-1], "suite": "stage2", "batch": 16})
    md = report.eval_markdown(doc)  # settings that differ between rows stay columns
    assert "Training rows: torch threads 2, steps 2 in every row." in md and "| m | stage2 | 16 | 1.50 |" in md


def test_a_training_step_is_counted_and_the_matmul_peak_measured():
    """The FLOP count of one step grows with the batch (the count, never a timing), and the peak is a positive rate."""
    from sinklib.bench import speed
    from sinklib.core.models import tiny_model
    from tests.test_vl import TOK

    lm = tiny_model("llama", seed=0)
    lm.tokenizer, lm.name = TOK, "tiny-llama"
    f2, f4 = (speed.step_flops(lm, "stage1", b) for b in (2, 4))
    assert 0 < f2 < f4 and speed.step_flops(lm, "stage2", 2) > f2
    assert speed.matmul_rate(64, 2) > 0
