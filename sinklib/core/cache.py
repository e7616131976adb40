"""The cache: trained checkpoints and cached JSON evaluations, keyed by their parameters, and the
one rule that derives a seed from (seed, name).

Everything lives under `sinklib.core.models.cache_dir()` (`SINKBOOK_CACHE`, default `~/.cache/sinkbook`),
never in git:

    vl/<key>/            a checkpoint: model.safetensors, projector.safetensors (VL only), meta.json, weights.json
                         (the SHA-256 of model.safetensors)
    evals/<key>.json     one evaluated condition (sinklib.adapt.pairs.evaluate_condition)
    injection/<key>.json one evaluated QK-norm injection condition (sinklib.controls.inject)

`key(params)` is the 16-hex-digit SHA-256 of the canonical JSON of the parameters: the same
parameters give the same key on every machine, so a rerun loads instead of recomputing. The
keys are pinned by tests (tests/test_cache.py): changing how they are computed orphans every cache.

A checkpoint carried to another machine without its weights (`sinklib.book.carry` carries the small files of one
too large to carry: meta.json, the projector, weights.json) is *weightless*: it exists (its training log, stamp and
projector are read as usual) but `load_state` and `load_checkpoint(weights=True)` need its weights. The code that
trains it registers how to make them (`defer_weights`: the same training again), so they are made on first read,
only when a result that needs them is not cached; `fill_weights` writes them and says in retrained.json whether
they are bit-identical to the ones first trained.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from sinklib.errors import ParameterError, SinkbookError

#: moduli of `key_seed` at its two call sites (kept apart: each gives the numbers its site always gave)
MERGE_SEED_MODULUS = 2**63 - 1     # per-tensor seeds of merge methods (DARE masks)
RANDOM_SEED_MODULUS = 2**63        # per-tensor directions of the norm-matched random control


def key(params: Mapping[str, Any]) -> str:
    """A 16-hex-digit hash of the parameters (canonical JSON, sorted keys): the same params, the same key."""
    try:
        text = json.dumps(params, sort_keys=True, separators=(",", ":"), default=str)
    except TypeError as e:
        raise ParameterError(f"parameter 'params' cannot be hashed as JSON: {e}") from None
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def key_seed(seed: int, name: str, modulus: int = MERGE_SEED_MODULUS) -> int:
    """The seed of one named part (a tensor key): depends on (seed, name) only, not on which other
    parts exist or their order. `(seed * 1_000_003 + crc32(name)) % modulus`."""
    return (int(seed) * 1_000_003 + zlib.crc32(name.encode())) % modulus


def root() -> Path:
    from sinklib.core.models import cache_dir

    return cache_dir()


def cached_json(key_params: Mapping[str, Any], compute: Callable[[], dict], folder: str = "evals",
                refresh: bool = False) -> dict:
    """Return compute() and store it as JSON under cache_dir()/folder/<key>.json; reuse it next time."""
    path = root() / folder / f"{key(dict(key_params))}.json"
    if path.exists() and not refresh:
        return json.loads(path.read_text())
    value = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value, default=float))
    tmp.rename(path)
    return value


# ---------------------------------------------------------------------------------------
# checkpoints

def checkpoint_dir(key_: str, root_: str | Path | None = None) -> Path:
    """`<root or cache_dir()>/vl/<key>` (not created)."""
    return Path(root() if root_ is None else root_) / "vl" / key_


def checkpoint_exists(path: str | Path) -> bool:
    """True when `path` holds a complete checkpoint (written by `save_checkpoint`)."""
    p = Path(path) / "meta.json"
    if not p.exists():
        return False
    try:
        return bool(json.loads(p.read_text()).get("complete"))
    except json.JSONDecodeError:
        return False


def tensor_sha(module: nn.Module) -> str:
    """SHA-256 of a module's state dict (sorted keys, raw bytes)."""
    h = hashlib.sha256()
    for k, v in sorted(module.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


WEIGHTS = "model.safetensors"
WEIGHTS_RECORD = "weights.json"
RETRAINED = "retrained.json"
_MAKERS: dict[Path, Callable[[], None]] = {}
_FILLED: list[dict] = []  # what fill_weights did in this process


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


def weights_present(path: str | Path) -> bool:
    """True when the checkpoint folder `path` holds its weights (a carried checkpoint may not: it is weightless)."""
    return (Path(path) / WEIGHTS).exists()


def weights_record(path: str | Path) -> dict:
    """{'sha256', 'bytes'} of a checkpoint's weights file, written beside it (computed now for a checkpoint saved
    before the record existed)."""
    path = Path(path)
    rec = path / WEIGHTS_RECORD
    if not rec.exists():
        if not weights_present(path):
            raise SinkbookError(f"the checkpoint in {path} has neither its weights nor their record")
        st = (path / WEIGHTS).stat()
        rec.write_text(json.dumps({"sha256": file_sha256(path / WEIGHTS), "bytes": st.st_size}))
        os.utime(rec, ns=(st.st_atime_ns, st.st_mtime_ns))  # as old as the weights it describes
    return json.loads(rec.read_text())


def defer_weights(path: str | Path, make: Callable[[], None]) -> None:
    """Register `make()`, which writes the weights of the weightless checkpoint `path` (`fill_weights`), to run
    when they are first read; nothing for a checkpoint that has its weights."""
    if not weights_present(path):
        _MAKERS[Path(path).resolve()] = make


def ensure_weights(path: str | Path) -> None:
    """Make a weightless checkpoint's weights by its registered maker (`defer_weights`); a clear error without one."""
    path = Path(path)
    if weights_present(path):
        return
    make = _MAKERS.pop(path.resolve(), None)
    if make is not None:
        make()
    if not weights_present(path):
        raise SinkbookError(
            f"the checkpoint in {path} was carried without its weights and nothing here can retrain them: run the "
            "chapter that trains it (its pairs.build_pair, dose.train_series or sweep.train_point makes them on first "
            "use), or copy the whole folder from the machine that trained it")


def fill_weights(path: str | Path, model: nn.Module) -> dict:
    """Write `model`'s weights into the weightless checkpoint `path`, keeping its meta.json (so its stamp and
    everything cached under it stay) and its projector (the first training's, which the training log and the cached
    VQA results belong to); retrained.json says whether the weights are bit-identical to the first training's
    (weights.json). -> that record."""
    from safetensors.torch import save_model

    path = Path(path)
    want = json.loads((path / WEIGHTS_RECORD).read_text()) if (path / WEIGHTS_RECORD).exists() else {}
    tmp = path / f"{WEIGHTS}.{os.getpid()}.tmp"
    save_model(model, str(tmp))
    got = file_sha256(tmp)
    note = {"bit_identical": got == want.get("sha256"), "sha256": got, "first_sha256": want.get("sha256")}
    (path / RETRAINED).write_text(json.dumps(note, indent=1))
    os.replace(tmp, path / WEIGHTS)
    rel = path.resolve().relative_to(root().resolve()).as_posix() if path.resolve().is_relative_to(root().resolve()) else path.name
    _FILLED.append({"checkpoint": rel, "bit_identical": note["bit_identical"]})
    return note


def machine() -> dict:
    """Which machine computed a cached result: {'boot': 8 hex digits of the hostname and this boot's id (a new
    machine, or the same one restarted, gets a new one), 'cpu': the CPU's model name, 'cores'}."""
    import platform

    boot = Path("/proc/sys/kernel/random/boot_id")
    ident = platform.node() + (boot.read_text().strip() if boot.exists() else "")
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() \
        else platform.processor()
    return {"boot": hashlib.sha256(ident.encode()).hexdigest()[:8], "cpu": cpu or "?", "cores": os.cpu_count()}


def filled_here() -> list[dict]:
    """[{'checkpoint': folder relative to the cache, 'bit_identical'}] of every checkpoint `fill_weights` retrained
    in this process (a chapter saves it with its results)."""
    return [dict(r) for r in _FILLED]


def retrained(path: str | Path) -> dict | None:
    """What `fill_weights` recorded of a checkpoint retrained here (None: trained here the first time)."""
    p = Path(path) / RETRAINED
    return json.loads(p.read_text()) if p.exists() else None


def save_checkpoint(path: str | Path, model: nn.Module, projector: nn.Module | None = None,
                    encoder: nn.Module | None = None, meta: Mapping[str, Any] | None = None,
                    weights: bool = True) -> Path:
    """Write `model.safetensors` (the LM; not with `weights=False`, for a checkpoint whose LM is the base model,
    such as a VL stage 1, which trains the projector only: it is then weightless, `weights_present`),
    `projector.safetensors` (if any) and `meta.json` to `path`.

    The encoder is not stored: its config (seed included) and a hash of its weights go into
    meta.json, and `load_checkpoint` rebuilds it and checks the hash. Written to a temporary
    folder and renamed, so an interrupted save never looks complete.
    """
    from safetensors.torch import save_file, save_model

    path = Path(path)
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if weights:
        save_model(model, str(tmp / WEIGHTS))
        (tmp / WEIGHTS_RECORD).write_text(json.dumps({"sha256": file_sha256(tmp / WEIGHTS),
                                                      "bytes": (tmp / WEIGHTS).stat().st_size}))
    info: dict[str, Any] = {"complete": True, "meta": dict(meta or {}),
                            "model_class": type(model).__name__,
                            "model_type": getattr(model.config, "model_type", None),
                            "n_parameters": sum(p.numel() for p in model.parameters())}
    if projector is not None:
        save_file({k: v.detach().cpu().contiguous() for k, v in projector.state_dict().items()},
                  str(tmp / "projector.safetensors"))
        info["projector"] = dict(projector.config)
    if encoder is not None:
        info["encoder"] = dict(encoder.config)
        info["encoder_sha256"] = tensor_sha(encoder)
    (tmp / "meta.json").write_text(json.dumps(info, indent=1, default=str))
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)
    return path


@dataclass
class Checkpoint:
    """What `load_checkpoint` returns."""

    model: nn.Module
    projector: nn.Module | None
    encoder: nn.Module | None
    meta: dict


def _checkpoint_info(path: Path, model: nn.Module) -> dict:
    if not checkpoint_exists(path):
        raise SinkbookError(f"no complete checkpoint in {path}; run the training (or save_checkpoint) first")
    info = json.loads((path / "meta.json").read_text())
    if info.get("model_class") != type(model).__name__:
        raise ParameterError(f"parameter 'model' is a {type(model).__name__} but the checkpoint in {path} holds a "
                             f"{info.get('model_class')}; load the base model it was trained from")
    return info


def checkpoint_stamp(path: str | Path) -> str:
    """16 hex digits of the SHA-256 of a complete checkpoint's meta.json: it changes whenever the checkpoint is
    written again (the training log inside holds the run's seconds), so results derived from the checkpoint's
    weights can be cached under it."""
    path = Path(path)
    if not checkpoint_exists(path):
        raise SinkbookError(f"no complete checkpoint in {path}; run the training (or save_checkpoint) first")
    return hashlib.sha256((path / "meta.json").read_bytes()).hexdigest()[:16]


def load_state(path: str | Path, model: nn.Module) -> dict:
    """The LM state dict of a checkpoint, read from its file without touching `model` (which gives the
    architecture: every key of `model.state_dict()`, tied keys sharing one tensor as in the model, on its
    device). Equal to loading the checkpoint into `model` and copying its state dict."""
    from safetensors.torch import _remove_duplicate_names, load_file

    from sinklib.core.anatomy import device_dtype

    path = Path(path)
    _checkpoint_info(path, model)
    ensure_weights(path)
    dev, _ = device_dtype(model)
    sd = load_file(str(path / WEIGHTS), device=str(dev))
    want = model.state_dict()
    for kept, dropped in _remove_duplicate_names(want, preferred_names=list(sd)).items():
        for k in dropped:  # save_model stored tied tensors once
            if kept in sd:
                sd[k] = sd[kept]
    bad = sorted(set(want) ^ set(sd))[:5] or [k for k in want if want[k].shape != sd[k].shape][:5]
    if bad:
        raise ParameterError(f"the checkpoint in {path} does not fit parameter 'model' (keys or shapes differ, e.g. "
                             f"{bad}); load the base model it was trained from")
    return {k: sd[k] if sd[k].dtype == want[k].dtype else sd[k].to(want[k].dtype) for k in want}


def state_gap(path: str | Path, model: nn.Module, other: Mapping[str, Any] | Callable[[], Mapping[str, Any]],
              other_path: str | Path | None = None) -> float:
    """Largest absolute weight difference between the checkpoint in `path` and the state dict `other` (or a
    function that returns it, called only when the difference is not cached), over floating-point tensors; `model`
    gives the architecture and is not changed. With `other_path` (the checkpoint `other` was read from) the result
    is cached under both checkpoints' stamps, so a rerun reads neither."""
    def compute() -> dict:
        now = load_state(path, model)
        ref = other() if callable(other) else other
        return {"gap": max((float((now[k].double() - v.double()).abs().max()) for k, v in ref.items()
                            if v.is_floating_point() and v.numel()), default=0.0)}

    if other_path is None or not checkpoint_exists(other_path):
        return compute()["gap"]
    return cached_json({"what": "weight gap", "a": checkpoint_stamp(path), "b": checkpoint_stamp(other_path)},
                       compute)["gap"]


def load_checkpoint(path: str | Path, model: nn.Module, weights: bool = True,
                    parts: Callable[[Path, dict, Any, Any], tuple] | None = None) -> Checkpoint:
    """Load a checkpoint into `model` (same architecture, loaded in place). `weights=False`: meta only; `model`
    keeps its weights (`load_state` reads them). A checkpoint that also holds a projector and an encoder (a VL
    model) needs `parts(path, info, device, dtype) -> (projector, encoder)`: use `sinklib.vl.load_checkpoint`."""
    from safetensors.torch import load_model

    from sinklib.core.anatomy import device_dtype

    path = Path(path)
    info = _checkpoint_info(path, model)
    if parts is None and ("projector" in info or "encoder" in info):
        raise SinkbookError(f"the checkpoint in {path} holds a projector and a vision encoder: load it with "
                            "sinklib.vl.load_checkpoint")
    dev, dt = device_dtype(model)
    if weights:
        ensure_weights(path)
        try:
            load_model(model, str(path / "model.safetensors"), strict=True, device=str(dev))
        except RuntimeError as e:
            raise ParameterError(f"the checkpoint in {path} does not fit parameter 'model': {str(e)[:300]}") from None
    projector, encoder = parts(path, info, dev, dt) if parts is not None else (None, None)
    if weights:
        model.eval()
    return Checkpoint(model=model, projector=projector, encoder=encoder, meta=info.get("meta", {}))
