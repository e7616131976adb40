"""A small byte-level BPE tokenizer trained on the tiny corpus (the `tokenizers` library), wrapped as
a transformers fast tokenizer with ``<pad>`` (0), ``<bos>`` (1) and ``<eos>`` (2).

Byte-level: every string encodes (the VL prompts of chapter 4 included) and decodes back exactly.
The vocabulary is trained once per (vocab_size, n_docs, seed, format_share) and cached as
``cache_dir()/tiny/tokenizers/<key>/tokenizer.json``; whether BOS is prepended (``add_bos``) is a
property of the wrapper only, so models trained with and without BOS share one vocabulary.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from sinklib.core.cache import key, root
from sinklib.core.params import check_bool, check_int
from sinklib.tiny.corpus import CORPUS_VERSION, check_corpus_params, make_corpus

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>")
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
TOKENIZER_DEFAULTS = {"vocab_size": 1024, "n_docs": 20_000, "seed": 0, "format_share": 0.5}
_VERSION = 1


def tokenizer_params(vocab_size: int = TOKENIZER_DEFAULTS["vocab_size"], n_docs: int = TOKENIZER_DEFAULTS["n_docs"],
                     seed: int = TOKENIZER_DEFAULTS["seed"],
                     format_share: float = TOKENIZER_DEFAULTS["format_share"]) -> dict:
    """The checked parameters of a tokenizer (what its cache key is made of)."""
    n_docs, seed, format_share = check_corpus_params(n_docs, seed, format_share)
    return {"kind": "tiny_tokenizer", "version": _VERSION, "corpus_version": CORPUS_VERSION,
            "vocab_size": check_int("vocab_size", vocab_size, 300, 65536), "n_docs": n_docs, "seed": seed,
            "format_share": format_share}


def train_bpe(docs: list[str], vocab_size: int):
    """A byte-level BPE `tokenizers.Tokenizer` trained on ``docs`` (special tokens get ids 0, 1, 2)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(docs, trainer=trainer)
    return tok


def _raw(params: dict, refresh: bool = False):
    """The trained `tokenizers.Tokenizer` of `params`, from the cache or trained and cached."""
    from tokenizers import Tokenizer

    folder = root() / "tiny" / "tokenizers" / key(params)
    path = folder / "tokenizer.json"
    if path.exists() and not refresh:
        return Tokenizer.from_file(str(path))
    docs = make_corpus(params["n_docs"], params["seed"], params["format_share"])
    tok = train_bpe(docs, params["vocab_size"])
    tmp = folder.with_name(folder.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tok.save(str(tmp / "tokenizer.json"))
    (tmp / "params.json").write_text(json.dumps(params, indent=1))
    try:
        if folder.exists():
            shutil.rmtree(folder)
        tmp.rename(folder)
    except OSError:  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
    return tok


def wrap(raw, add_bos: bool = True):
    """A transformers fast tokenizer around a `tokenizers.Tokenizer`: BOS prepended by
    ``tokenizer(text)`` when ``add_bos`` (never with ``add_special_tokens=False``); pad, bos, eos set."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    add_bos = check_bool("add_bos", add_bos)
    raw = raw.__class__.from_str(raw.to_str())  # a private copy: the post-processor differs per wrapper
    raw.post_processor = (processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A $B",
                                                        special_tokens=[("<bos>", BOS_ID)])
                          if add_bos else None)
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")
    tok.padding_side = "right"
    tok.init_kwargs["sinkbook_add_bos"] = add_bos
    return tok


def get_tokenizer(add_bos: bool = True, refresh: bool = False, **params):
    """The tiny corpus's tokenizer (trained on first use, then loaded from the cache).

    params: vocab_size (1024), n_docs (20000 documents of ``make_corpus``), seed (0), format_share (0.5).
    """
    p = tokenizer_params(**params)
    return wrap(_raw(p, refresh=refresh), add_bos=add_bos)


def tokenizer_dir(**params) -> Path:
    """Folder of the cached vocabulary of these parameters (exists after the first `get_tokenizer`)."""
    return root() / "tiny" / "tokenizers" / key(tokenizer_params(**params))
