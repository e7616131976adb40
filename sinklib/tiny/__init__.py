"""Chapter 7's controlled panel: tiny causal LMs trained from scratch on a generated corpus, in three
attention variants that differ only in QK normalisation (none / per-head / layerwise).

- `corpus`: the deterministic corpus (prose about invented countries, five format-sensitive tasks
  with strict and lenient graders, knowledge facts), held-out items disjoint from training by
  construction, calibration prompts for S; `grading`: the strict and lenient graders.
- `tokenizer`: a byte-level BPE trained on the corpus (`tokenizers`), wrapped for transformers, cached.
- `model`: the three variants as transformers architectures (Llama, Qwen3, and a Qwen3 subclass with
  OLMo-2's layerwise QK-norm), initialised by parameter name so that they share their weights.
- `train`: training from scratch through `sinklib.core.train.run`, with S, sink mass maps and sink-token
  norms at chosen steps, cached by the run's parameters.
- `evaluate`: format (strict / lenient), knowledge (multiple choice by log-likelihood), perplexity.
- `pilot`: one model per variant, S at init vs after training and the base scores.
"""
from __future__ import annotations

from sinklib.tiny.corpus import (FORMAT_TASKS, FormatItem, KnowledgeItem, calibration_prompts, eval_items,
    make_corpus, split_of, world)
from sinklib.tiny.grading import grade
from sinklib.tiny.evaluate import TINY_SUITES, evaluate, format_suite, knowledge_suite, perplexity_suite, summary
from sinklib.tiny.model import VARIANTS, SizeConfig, build, n_parameters, qk_norm_of, size_config
from sinklib.tiny.tokenizer import get_tokenizer
from sinklib.tiny.train import TRAIN_DEFAULTS, TinyRun, measure, train_params, train_tiny

__all__ = [
    "FORMAT_TASKS", "FormatItem", "KnowledgeItem", "calibration_prompts", "eval_items", "grade", "make_corpus",
    "split_of", "world", "TINY_SUITES", "evaluate", "format_suite", "knowledge_suite", "perplexity_suite", "summary",
    "VARIANTS", "SizeConfig", "build", "n_parameters", "qk_norm_of", "size_config", "get_tokenizer",
    "TRAIN_DEFAULTS", "TinyRun", "measure", "train_params", "train_tiny",
]
