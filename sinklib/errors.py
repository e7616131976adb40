"""Errors users meet. Every message says what was wrong and how to fix it."""
from __future__ import annotations


class SinkbookError(Exception):
    """Base class of every error sinklib raises on purpose."""


class ParameterError(SinkbookError, ValueError):
    """A parameter has the wrong type or a value outside the allowed range."""


class ModelNotAvailable(SinkbookError, RuntimeError):
    """A model cannot be loaded: unknown name, package missing, or no network for a hub id."""


class ResultsMissing(SinkbookError, FileNotFoundError):
    """A notebook needs results that an earlier notebook writes."""


class PanelError(SinkbookError, ValueError):
    """A panel CSV is malformed (missing columns, duplicate pairs, non-numeric values, n < 3)."""


class AttentionError(SinkbookError, FloatingPointError):
    """Attention probabilities are NaN/inf or the probe cannot see the model's attention."""
