"""GPU benchmark: the cost of S on randomly initialised 7-8B models (configurations of real hub models).

The paper reports that S costs about 15 forward passes, about 8 s for a 7B model on one A6000
(section 3.2). This module rebuilds the *architectures* of three backbones from their hub
``config.json`` values (written here, nothing is downloaded), fills them with random bf16 weights
on the GPU, and times S with the exact chunked probe. Random weights give honest timings: the
cost of a forward pass does not depend on the values of the weights (S itself does).

``python -m sinklib.bench gpu`` runs it (``--tiny`` builds scaled-down versions of the same
architecture classes, which is how the tests run it on a CPU).
"""
from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from sinklib.errors import ParameterError

PAPER_SECONDS = 8.0            # reported by the paper (section 3.2): ~8 s per 7B model on one A6000
PAPER_GPU = "one NVIDIA A6000"

#: The hub config.json values that shape the computation (architecture, sizes, RoPE, norms).
#: qk_norm is not a config key: it is what the architecture class does (none / per-head / layerwise).
GPU_CONFIGS: dict[str, dict] = {
    "qwen2.5-7b": {
        "hub_id": "Qwen/Qwen2.5-7B-Instruct", "qk_norm": "none",
        "config": {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
                   "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
                   "vocab_size": 152064, "rope_theta": 1000000.0, "max_position_embeddings": 32768,
                   "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": False,
                   "use_sliding_window": False, "sliding_window": None, "max_window_layers": 28,
                   "bos_token_id": 151643, "eos_token_id": 151645, "initializer_range": 0.02},
    },
    "qwen3-8b": {
        "hub_id": "Qwen/Qwen3-8B", "qk_norm": "per_head",
        "config": {"model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288,
                   "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
                   "head_dim": 128, "vocab_size": 151936, "rope_theta": 1000000.0,
                   "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "hidden_act": "silu",
                   "attention_bias": False, "tie_word_embeddings": False, "use_sliding_window": False,
                   "sliding_window": None, "max_window_layers": 36,
                   "bos_token_id": 151643, "eos_token_id": 151645, "initializer_range": 0.02},
    },
    "olmo2-7b": {
        "hub_id": "allenai/OLMo-2-1124-7B", "qk_norm": "layerwise",
        "config": {"model_type": "olmo2", "hidden_size": 4096, "intermediate_size": 11008,
                   "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
                   "vocab_size": 100352, "rope_theta": 500000.0, "max_position_embeddings": 4096,
                   "rms_norm_eps": 1e-6, "hidden_act": "silu", "attention_bias": False,
                   "tie_word_embeddings": False, "pad_token_id": 100277, "eos_token_id": 100257,
                   "bos_token_id": None, "initializer_range": 0.02},
    },
}

#: The defaults of the GPU run: chapter 2's S parameters (N = 15 prompts, K = 10, 128 tokens, batches of 8).
GPU_DEFAULTS = {"n_prompts": 15, "prompt_tokens": 128, "last_k_layers": 10, "batch_size": 8, "repeats": 3,
                "seed": 0}


def tiny_sizes(cfg: dict) -> dict:
    """Scaled-down sizes of a config: 4 layers, 4 query heads (kv heads keep the GQA ratio), head_dim 16."""
    ratio = cfg["num_attention_heads"] // cfg["num_key_value_heads"]
    heads = 4
    kv = max(1, heads // ratio)
    out = {**cfg, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
           "num_attention_heads": heads, "num_key_value_heads": kv, "vocab_size": 256,
           "max_position_embeddings": 1024}
    if "head_dim" in cfg:
        out["head_dim"] = 16
    if "max_window_layers" in cfg:
        out["max_window_layers"] = 4
    for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if out.get(k) is not None:
            out[k] = min(out[k], 255 - (k == "pad_token_id"))
    return out


def build_config(name: str, tiny: bool = False):
    """A transformers config of one of GPU_CONFIGS (``tiny``: same architecture class, small sizes)."""
    from transformers import AutoConfig

    if name not in GPU_CONFIGS:
        raise ParameterError(f"unknown GPU benchmark model {name!r}; allowed: {', '.join(GPU_CONFIGS)}")
    kw = dict(GPU_CONFIGS[name]["config"])
    if tiny:
        kw = tiny_sizes(kw)
    model_type = kw.pop("model_type")
    return AutoConfig.for_model(model_type, **kw)


def param_count(cfg) -> int:
    """Number of parameters of a model built from cfg, without building it (meta device)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    return sum(p.numel() for p in model.parameters())


def _materialise(model, device_map: dict[str, str | int | torch.device]) -> None:
    """Allocate the meta model's tensors on the devices of device_map (module name -> device), uninitialised."""
    for name, dev in sorted(device_map.items(), key=lambda kv: len(kv[0])):
        dev = torch.device(f"cuda:{dev}" if isinstance(dev, int) else dev)
        module = model.get_submodule(name) if name else model
        module.to_empty(device=dev, recurse=True)


def build_random_model(cfg, device: str | torch.device = "cuda", dtype: torch.dtype = torch.bfloat16,
                       device_map: str | dict | None = "auto", seed: int = 0, attn_implementation: str = "sdpa"):
    """A randomly initialised causal LM of config ``cfg``: built on the meta device, then allocated and
    initialised directly where it will run (fast: no CPU copy of 7B weights).

    device_map: None (everything on ``device``), a dict (module name -> device), or "auto": one GPU
    when the weights fit in 90 % of its free memory, else accelerate's ``infer_auto_device_map``
    over every visible GPU (and the CPU). Returns (model, placement) where placement describes it.
    """
    from transformers import AutoModelForCausalLM

    device = torch.device(device)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation=attn_implementation)
    need = sum(p.numel() * p.element_size() for p in model.parameters())
    if isinstance(device_map, dict):
        dmap = device_map
    elif device_map == "auto" and device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        if need < 0.9 * free:
            dmap = {"": device}
        else:
            from accelerate import infer_auto_device_map

            dmap = infer_auto_device_map(model, no_split_module_classes=list(model._no_split_modules or []),
                                         dtype=dtype)
    elif device_map in (None, "auto"):
        dmap = {"": device}
    else:
        raise ParameterError(f"parameter 'device_map' got {device_map!r}; allowed: 'auto', None or a dict")
    if "disk" in {str(d) for d in dmap.values()}:
        raise ParameterError(f"the model ({need / 2 ** 30:.1f} GiB of weights) does not fit in the GPUs' and the "
                             "CPU's memory together; use a machine with more GPU memory")
    _materialise(model, dmap)
    torch.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.manual_seed_all(seed)
    model.initialize_weights()   # normal(0, initializer_range) weights, unit norms, RoPE buffers recomputed
    model.tie_weights()
    model.eval()
    devices = sorted({str(torch.device(f"cuda:{d}" if isinstance(d, int) else d)) for d in dmap.values()})
    if len(devices) > 1:
        from accelerate import dispatch_model

        model = dispatch_model(model, device_map=dmap)
    return model, {"devices": devices, "weights_gib": round(need / 2 ** 30, 2), "device_map": "auto" if
                   len(dmap) > 1 else devices[0]}


def random_prompts(vocab_size: int, n_prompts: int, prompt_tokens: int, seed: int = 0,
                   special: Sequence[int | None] = ()) -> list[list[int]]:
    """n_prompts lists of prompt_tokens random token ids (special token ids excluded)."""
    g = torch.Generator().manual_seed(seed)
    bad = {int(s) for s in special if s is not None}
    out = []
    for _ in range(n_prompts):
        ids = torch.randint(0, vocab_size, (prompt_tokens,), generator=g).tolist()
        out.append([t if t not in bad else (t + 1) % vocab_size for t in ids])
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_s(model, seqs: list[list[int]], last_k_layers: int = 10, batch_size: int = 8, repeats: int = 3,
           method: str = "chunked") -> dict:
    """Median seconds of S (sink_strength over seqs, the exact chunked probe) beside plain passes, interleaved."""
    from sinklib.bench import timing as bench
    from sinklib.core import sink

    dev = next(model.parameters()).device
    K = min(last_k_layers, sink.n_layers(model))
    out: dict = {}
    fns = bench.s_cost_fns(model, seqs=seqs, last_k_layers=K, max_tokens=max(len(s) for s in seqs),
                           batch_size=batch_size, method=method, after=lambda: _sync(dev), out=out)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    t = bench.interleaved_timings(fns, repeats=repeats)
    rows = bench.ratio_table(t, "plain")
    med = {r["method"]: r["median s"] for r in rows}
    return {"S_seconds": med["S"], "plain_seconds": med["plain"], "ratio": med["S"] / med["plain"],
            "S_value": out.get("S"), "last_k_layers": K, "times": t,
            "peak_gpu_gib": (torch.cuda.max_memory_allocated(dev) / 2 ** 30) if dev.type == "cuda" else None}


def probe_vs_eager(model, seq: list[int], method: str = "chunked") -> float:
    """Largest |probe - eager output_attentions| sink probability over all layers and heads, one prompt."""
    from sinklib.core import sink

    dev = next(model.parameters()).device
    ids = torch.tensor([seq], device=dev)
    rec = sink.record_sink(model, ids, method=method)
    ref = sink.eager_sink_probs(sink._trunk(model), ids, torch.ones_like(ids), rec.sink_index.to(dev))
    return float((rec.p - ref.cpu()).abs().max())


def run_gpu(models: Sequence[str] | None = None, *, device: str = "auto", dtype: str | torch.dtype = "bfloat16",
            tiny: bool = False, n_prompts: int = 15, prompt_tokens: int = 128, last_k_layers: int = 10,
            batch_size: int = 8, repeats: int = 3, seed: int = 0, device_map: str | None = "auto",
            check_eager: bool = True, log=print) -> dict:
    """Build each model (random weights) and time S on it. Returns the results dict (rows per model)."""
    from sinklib.core.models import resolve_device

    models = list(models or GPU_CONFIGS)
    for m in models:
        if m not in GPU_CONFIGS:
            raise ParameterError(f"unknown GPU benchmark model {m!r}; allowed: {', '.join(GPU_CONFIGS)}")
    dev, dt = resolve_device(device, dtype)
    if dev.type != "cuda" and not tiny:
        raise ParameterError("the GPU benchmark builds 7-8B models: it needs a CUDA GPU (device='cuda'); "
                             "on a CPU, run it with --tiny (scaled-down versions of the same architectures)")
    rows = []
    for name in models:
        cfg = build_config(name, tiny=tiny)
        t0 = time.perf_counter()
        model, placement = build_random_model(cfg, device=dev, dtype=dt, device_map=device_map, seed=seed)
        _sync(dev)
        build_s = time.perf_counter() - t0
        special = [cfg.bos_token_id, cfg.eos_token_id, getattr(cfg, "pad_token_id", None)]
        seqs = random_prompts(cfg.vocab_size, n_prompts, prompt_tokens, seed=seed, special=special)
        log(f"[bench gpu] {name}: built in {build_s:.1f} s on {placement['devices']}; timing S over "
            f"{n_prompts} prompts x {prompt_tokens} tokens ...")
        res = time_s(model, seqs, last_k_layers=last_k_layers, batch_size=batch_size, repeats=repeats)
        diff = probe_vs_eager(model, seqs[0]) if check_eager else None
        n_params = sum(p.numel() for p in model.parameters())
        rows.append({"model": name, "config_of": GPU_CONFIGS[name]["hub_id"], "tiny": tiny,
                     "architecture": type(model).__name__, "qk_norm": GPU_CONFIGS[name]["qk_norm"],
                     "params_b": n_params / 1e9, "dtype": str(dt).replace("torch.", ""),
                     "build_seconds": build_s, **placement,
                     **{k: v for k, v in res.items() if k != "times"}, "times": res["times"],
                     "probe_vs_eager_max_abs": diff})
        log(f"[bench gpu] {name}: S {res['S_seconds']:.3f} s (plain {res['plain_seconds']:.3f} s, "
            f"x{res['ratio']:.2f}); probe vs eager max |diff| {diff}")
        del model
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return {"rows": rows, "paper": {"seconds": PAPER_SECONDS, "gpu": PAPER_GPU, "where": "section 3.2"},
            "weights": "random (normal, std = initializer_range): timings are honest, S values are not"}

