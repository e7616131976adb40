"""The model parts of the miniature VLM: a frozen, NOT pretrained, random vision encoder, the
trainable LLaVA-1.5 projector, and the embedded sequences with the answer-only loss.

Sequence layout (VL): ``[BOS if the tokenizer adds one] "Scene:" <visual tokens> "\\nQuestion: q\\nAnswer:" " a" <eos>``.
Text-only: the visual tokens are replaced by ``" " + describe(scene)``.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from sinklib.core import cache
from sinklib.core.anatomy import decoder, device_dtype, head_logits
from sinklib.errors import ParameterError
from sinklib.core.params import check_choice, check_int
from sinklib.vl.scenes import COLOURS, GRID, SHAPES, QAItem, Scene, check_image_size, describe, make_scenes

#: the seed offset of the fixed scenes that calibrate a new projector's output scale
PROJECTOR_CALIBRATION_SEED_OFFSET = 10_000

def images_to_tensor(images: Sequence[np.ndarray] | np.ndarray) -> torch.Tensor:
    """uint8 images `[B, S, S, 3]` -> float `[B, 3, S, S]` in [-1, 1]."""
    arr = np.stack(list(images)) if not isinstance(images, np.ndarray) else images
    if arr.ndim != 4 or arr.shape[-1] != 3:
        raise ParameterError(f"images must be [B, S, S, 3] uint8, got shape {arr.shape}")
    return torch.from_numpy(arr.astype(np.float32) / 127.5 - 1.0).permute(0, 3, 1, 2).contiguous()


class FrozenVisionEncoder(nn.Module):
    """Frozen random conv net: images `[B, 3, S, S]` -> patch features `[B, P, dim]`.

    conv 4x4/4 (3 -> channels) -> GELU -> conv (patch/4)/(patch/4) (channels -> dim) -> + fixed
    random position embedding -> GELU -> adaptive average pool to sqrt(P) x sqrt(P) -> LayerNorm
    without affine. Every weight is drawn from `torch.Generator().manual_seed(seed)`, so the
    encoder is the same on every machine with the same torch; nothing is trained.
    """

    def __init__(self, image_size: int = 48, patch_size: int = 16, dim: int = 256, channels: int = 64,
                 n_visual_tokens: int = 9, seed: int = 0):
        super().__init__()
        image_size = check_image_size(image_size)
        patch_size = check_int("patch_size", patch_size, 4, image_size)
        if patch_size % 4 or image_size % patch_size:
            raise ParameterError(f"parameter 'patch_size' got {patch_size}; allowed: a multiple of 4 that divides "
                                 f"image_size={image_size}")
        grid = image_size // patch_size
        n_visual_tokens = check_int("n_visual_tokens", n_visual_tokens, 1, grid * grid)
        side = math.isqrt(n_visual_tokens)
        if side * side != n_visual_tokens:
            raise ParameterError(f"parameter 'n_visual_tokens' got {n_visual_tokens}; allowed: a perfect square "
                                 f"<= {grid * grid} (the patch grid is {grid} x {grid})")
        self.config = {"image_size": image_size, "patch_size": patch_size, "dim": check_int("dim", dim, 1),
                       "channels": check_int("channels", channels, 1), "n_visual_tokens": n_visual_tokens,
                       "seed": check_int("seed", seed, 0)}
        g = torch.Generator().manual_seed(seed)
        k2 = patch_size // 4
        self.conv1 = nn.Conv2d(3, channels, 4, stride=4)
        self.conv2 = nn.Conv2d(channels, dim, k2, stride=k2)
        with torch.no_grad():
            for conv in (self.conv1, self.conv2):
                fan_in = conv.weight[0].numel()
                conv.weight.copy_(torch.randn(conv.weight.shape, generator=g) * math.sqrt(2.0 / fan_in))
                conv.bias.copy_(torch.randn(conv.bias.shape, generator=g) * 0.1)
        self.register_buffer("pos", torch.randn(1, dim, grid, grid, generator=g) * 0.5)
        self.side = side
        self.requires_grad_(False)
        self.eval()

    @property
    def n_visual_tokens(self) -> int:
        return self.config["n_visual_tokens"]

    @property
    def dim(self) -> int:
        return self.config["dim"]

    def train(self, mode: bool = True) -> FrozenVisionEncoder:  # frozen: always eval
        return super().train(False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """images float `[B, 3, S, S]` in [-1, 1] -> features `[B, P, dim]`."""
        h = nn.functional.gelu(self.conv1(images))
        h = nn.functional.gelu(self.conv2(h) + self.pos)
        if h.shape[-1] != self.side:
            h = nn.functional.adaptive_avg_pool2d(h, self.side)
        h = h.flatten(2).transpose(1, 2)  # [B, P, dim]
        return nn.functional.layer_norm(h, (h.shape[-1],))

    def encode_scenes(self, scenes: Sequence[Scene]) -> torch.Tensor:
        """scenes -> features `[B, P, dim]` on the encoder's device."""
        x = images_to_tensor([s.image for s in scenes]).to(self.pos.device)
        with torch.no_grad():
            return self(x)


def make_encoder(image_size: int = 48, patch_size: int = 16, dim: int = 256, channels: int = 64,
                 n_visual_tokens: int = 9, seed: int = 0) -> FrozenVisionEncoder:
    """The frozen, NOT pretrained, random vision encoder (see `FrozenVisionEncoder`)."""
    return FrozenVisionEncoder(image_size=image_size, patch_size=patch_size, dim=dim, channels=channels,
                               n_visual_tokens=n_visual_tokens, seed=seed)


def encoder_probe_accuracy(encoder: FrozenVisionEncoder, n_train: int = 400, n_test: int = 200,
                           seed: int = 0) -> dict[str, float]:
    """How much the frozen features tell: a ridge-regression linear probe from each visual token's
    feature `[dim]` to its grid cell's colour (or empty) and kind (or empty), on held-out scenes.

    Needs one visual token per grid cell (n_visual_tokens == 9). Returns held-out accuracies and
    the majority-class accuracies for comparison.
    """
    if encoder.n_visual_tokens != GRID * GRID:
        raise ParameterError(f"encoder_probe_accuracy needs n_visual_tokens == {GRID * GRID}, got "
                             f"{encoder.n_visual_tokens}")
    scenes = make_scenes(n_train + n_test, seed=seed, image_size=encoder.config["image_size"])
    feats = encoder.encode_scenes(scenes).reshape(-1, encoder.dim).double()  # [N*9, dim]
    out = {}
    for name, labels in (("colour", ("empty",) + tuple(COLOURS)), ("kind", ("empty",) + SHAPES)):
        y = np.zeros((len(scenes), GRID * GRID), dtype=np.int64)
        for i, sc in enumerate(scenes):
            for s in sc.shapes:
                y[i, s.row * GRID + s.col] = labels.index(s.colour if name == "colour" else s.kind)
        y = torch.from_numpy(y.reshape(-1))
        ntr = n_train * GRID * GRID
        x = torch.cat([feats, torch.ones(len(feats), 1, dtype=feats.dtype)], 1)
        onehot = nn.functional.one_hot(y[:ntr], len(labels)).double()
        w = torch.linalg.solve(x[:ntr].T @ x[:ntr] + 1e-2 * torch.eye(x.shape[1], dtype=x.dtype), x[:ntr].T @ onehot)
        pred = (x[ntr:] @ w).argmax(1)
        out[f"{name}_accuracy"] = float((pred == y[ntr:]).double().mean())
        out[f"{name}_majority"] = float((y[ntr:] == torch.bincount(y[:ntr]).argmax()).double().mean())
    return out


class Projector(nn.Module):
    """LLaVA-1.5 projector: features `[B, P, in_dim]` -> Linear -> GELU -> Linear -> `[B, P, hidden_size]`."""

    def __init__(self, in_dim: int, hidden_size: int):
        super().__init__()
        self.config = {"in_dim": int(in_dim), "hidden_size": int(hidden_size)}
        self.fc1 = nn.Linear(in_dim, hidden_size)
        self.fc2 = nn.Linear(hidden_size, hidden_size)

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        return self.fc2(nn.functional.gelu(self.fc1(feats)))


def embedding_rms(model: nn.Module, n_tokens: int = 4096) -> float:
    """RMS of the LM's input embeddings (as the embedding module returns them, scale included)."""
    emb = model.get_input_embeddings()
    dev, _ = device_dtype(model)
    with torch.no_grad():
        e = emb(torch.arange(min(n_tokens, emb.weight.shape[0]), device=dev))
    return float(e.float().pow(2).mean().sqrt())


def make_projector(encoder: FrozenVisionEncoder, model: nn.Module, seed: int = 0, n_calibration: int = 64) -> Projector:
    """A seeded projector from `encoder.dim` to the LM's hidden size.

    Its output layer is rescaled once at creation so that the visual tokens start with the same
    RMS as the LM's text embeddings (measured on `n_calibration` fixed scenes).
    """
    seed = check_int("seed", seed, 0)
    dev, dt = device_dtype(model)
    hidden = model.get_input_embeddings().weight.shape[1]
    g = torch.Generator().manual_seed(seed)
    proj = Projector(encoder.dim, hidden)
    with torch.no_grad():
        for lin in (proj.fc1, proj.fc2):
            bound = 1.0 / math.sqrt(lin.in_features)
            lin.weight.copy_((torch.rand(lin.weight.shape, generator=g) * 2 - 1) * bound)
            lin.bias.copy_((torch.rand(lin.bias.shape, generator=g) * 2 - 1) * bound)
        feats = encoder.encode_scenes(make_scenes(n_calibration, seed=PROJECTOR_CALIBRATION_SEED_OFFSET + seed,
                                                  image_size=encoder.config["image_size"]))
        out_rms = float(proj(feats.cpu().float()).pow(2).mean().sqrt())
        scale = embedding_rms(model) / max(out_rms, 1e-12)
        proj.fc2.weight.mul_(scale)
        proj.fc2.bias.mul_(scale)
    return proj.to(device=dev, dtype=dt)


# ---------------------------------------------------------------------------------------
# sequences, batches and the answer-only loss

PROMPT_PREFIX = "Scene:"


def _special_prefix(tokenizer) -> list[int]:
    """The special tokens the tokenizer puts in front of a text by default (BOS, or nothing)."""
    with_sp = list(tokenizer.encode("a", add_special_tokens=True))
    without = list(tokenizer.encode("a", add_special_tokens=False))
    k = len(with_sp) - len(without)
    return with_sp[:k] if k > 0 and with_sp[k:] == without else []


def _eos_id(tokenizer) -> int:
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        raise ParameterError("the tokenizer has no eos_token_id; answers end with the end-of-sequence token, "
                             "so use a tokenizer that defines one")
    return int(eos)


def _segments(tokenizer, item: QAItem, mode: str, n_visual: int, answer: str | list[int] | None) -> dict:
    """Token ids of one example: prefix, scene (None = visual slots), prompt, answer (+eos)."""
    enc = lambda s: list(tokenizer.encode(s, add_special_tokens=False))  # noqa: E731
    prefix = _special_prefix(tokenizer) + enc(PROMPT_PREFIX)
    scene = None if mode == "vl" else enc(" " + describe(item.scene))
    prompt = enc(f"\nQuestion: {item.question}\nAnswer:")
    if answer is None:
        ans = enc(" " + item.answer) + [_eos_id(tokenizer)]
    elif isinstance(answer, str):
        ans = enc(" " + answer) + [_eos_id(tokenizer)]
    else:
        ans = list(answer)
    return {"prefix": prefix, "scene": scene, "prompt": prompt, "answer": ans, "n_visual": n_visual if mode == "vl" else 0}


@dataclass
class Batch:
    """A right-padded batch. `inputs_embeds` `[B, T, H]`; `attention_mask`, `position_ids` `[B, T]`;
    the N supervised tokens: `targets` `[N]`, predicted from hidden states at (`src_b`, `src_t`) `[N]`;
    `example` `[N]` the example each target belongs to; `lengths` `[B]` real positions."""

    inputs_embeds: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    targets: torch.Tensor
    src_b: torch.Tensor
    src_t: torch.Tensor
    example: torch.Tensor
    lengths: torch.Tensor
    n_visual: int
    n_text: int


def build_batch(model: nn.Module, tokenizer, items: Sequence[QAItem], *, mode: str = "vl",
                encoder: FrozenVisionEncoder | None = None, projector: Projector | None = None,
                answers: Sequence[str | list[int] | None] | None = None) -> Batch:
    """Embed a batch of items (mode 'vl': visual tokens from encoder+projector; 'text': description).

    `answers[i]` overrides item i's answer: a string (tokenised, + eos, supervised), a list of
    token ids (taken as is, supervised), or None (the item's own answer).
    """
    check_choice("mode", mode, ("vl", "text"))
    if not items:
        raise ParameterError("parameter 'items' is empty; allowed: at least one item")
    dev, dt = device_dtype(model)
    n_vis = 0
    if mode == "vl":
        if encoder is None or projector is None:
            raise ParameterError("mode 'vl' needs both 'encoder' and 'projector'")
        n_vis = encoder.n_visual_tokens
    answers = [None] * len(items) if answers is None else list(answers)
    segs = [_segments(tokenizer, it, mode, n_vis, a) for it, a in zip(items, answers)]
    B = len(items)
    lens = [len(s["prefix"]) + (s["n_visual"] if s["scene"] is None else len(s["scene"])) + len(s["prompt"])
            + len(s["answer"]) for s in segs]
    T = max(lens)
    pad = getattr(tokenizer, "pad_token_id", None)
    pad = _eos_id(tokenizer) if pad is None else int(pad)
    ids = torch.full((B, T), pad, dtype=torch.long)
    is_vis = torch.zeros(B, T, dtype=torch.bool)
    mask = torch.zeros(B, T, dtype=torch.long)
    tb, tt, tgt, ex = [], [], [], []
    for i, s in enumerate(segs):
        pos = 0
        for part in ("prefix", "scene", "prompt", "answer"):
            if part == "scene" and s["scene"] is None:
                is_vis[i, pos:pos + s["n_visual"]] = True
                pos += s["n_visual"]
                continue
            seq = s[part]
            ids[i, pos:pos + len(seq)] = torch.tensor(seq, dtype=torch.long)
            if part == "answer":
                for j in range(len(seq)):
                    tb.append(i); tt.append(pos + j - 1); tgt.append(seq[j]); ex.append(i)  # noqa: E702
            pos += len(seq)
        mask[i, :pos] = 1
    ids, is_vis, mask = ids.to(dev), is_vis.to(dev), mask.to(dev)
    emb = model.get_input_embeddings()(ids)
    if mode == "vl":
        feats = encoder.encode_scenes([it.scene for it in items]).to(device=dev, dtype=dt)
        vis = projector(feats)  # [B, P, H]
        emb = emb.masked_scatter(is_vis.unsqueeze(-1).expand_as(emb), vis)
    position_ids = (mask.cumsum(1) - 1).clamp(min=0)
    n_text = int(mask.sum()) - B * n_vis
    return Batch(emb, mask, position_ids, torch.tensor(tgt, dtype=torch.long, device=dev),
                 torch.tensor(tb, dtype=torch.long, device=dev), torch.tensor(tt, dtype=torch.long, device=dev),
                 torch.tensor(ex, dtype=torch.long, device=dev), torch.tensor(lens, device=dev), n_vis, n_text)


def hidden_states(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Final (normed) hidden states `[B, T, H]` of the decoder, no LM head."""
    out = decoder(model)(inputs_embeds=batch.inputs_embeds, attention_mask=batch.attention_mask,
                         position_ids=batch.position_ids, use_cache=False)
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]


def answer_logits(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Logits `[N, V]` at the supervised positions only (hidden states sliced before the LM head)."""
    h = hidden_states(model, batch)
    return head_logits(model, h[batch.src_b, batch.src_t])


def answer_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Mean cross-entropy over the answer tokens (answer word pieces + eos) of the batch; a scalar."""
    return nn.functional.cross_entropy(answer_logits(model, batch), batch.targets)


def _rebuild_parts(path, info: dict, dev, dt) -> tuple:
    """The projector and the frozen encoder of a VL checkpoint (the encoder rebuilt from its config and checked
    against its saved weights hash)."""
    from safetensors.torch import load_file

    from sinklib.errors import SinkbookError

    projector = encoder = None
    if "projector" in info:
        projector = Projector(**info["projector"])
        projector.load_state_dict(load_file(str(path / "projector.safetensors")))
        projector = projector.to(device=dev, dtype=dt).eval()
    if "encoder" in info:
        encoder = make_encoder(**info["encoder"]).to(dev)
        if cache.tensor_sha(encoder) != info["encoder_sha256"]:
            raise SinkbookError(f"the rebuilt vision encoder differs from the one saved in {path} (weights hash "
                                "mismatch; a different torch version draws different random numbers); retrain")
    return projector, encoder


def load_checkpoint(path, model: nn.Module, weights: bool = True) -> "cache.Checkpoint":
    """Load a checkpoint written by `cache.save_checkpoint` into `model` (in place) and rebuild its projector and
    encoder. `weights=False`: projector, encoder and meta only; `model` keeps its weights."""
    return cache.load_checkpoint(path, model, weights, parts=_rebuild_parts)
