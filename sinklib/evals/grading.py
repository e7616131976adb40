"""Graders: IFEval's own strict and loose checkers (lm-eval), the GSM8K-CoT-style strict and
lenient answer parsers, and the confidence intervals reported with every score.

IFEval's checkers are imported from the installed ``lm_eval/tasks/ifeval/`` files only: importing
the package ``lm_eval.tasks.ifeval`` would run ``lm_eval/tasks/__init__.py``, which drags in
``datasets``, ``sacrebleu`` and more. The four files are loaded by path under the synthetic package
name ``sinklib._ifeval``; their absolute ``from lm_eval.tasks.ifeval import ...`` lines are served by
a stub module placed in ``sys.modules`` only while they load.
"""
from __future__ import annotations

import importlib.util
import math
import os
import re
import sys
import types
from collections.abc import Sequence
from typing import Any

import numpy as np

from sinklib.stats.verdicts import wilson_interval  # noqa: F401  (re-exported: evals.wilson_interval)
from sinklib.errors import ModelNotAvailable, ParameterError, SinkbookError

LM_EVAL_PIP = "pip install --no-deps lm-eval==0.4.13 && pip install langdetect immutabledict nltk packaging"

#: Instruction ids whose checkers need nltk's punkt_tab data, which no PyPI package ships:
#: the local suite never uses them (the real IFEval does; see ``ensure_punkt``).
NEEDS_PUNKT = ("length_constraints:number_sentences", "change_case:capital_word_frequency")

_IFEVAL: dict[str, types.ModuleType] = {}


def _ifeval_dir():
    spec = importlib.util.find_spec("lm_eval")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotAvailable(
            "the instruction suite is graded by lm-eval's IFEval checkers, but lm-eval is not installed; "
            f"install it with: {LM_EVAL_PIP}")
    from pathlib import Path

    d = Path(list(spec.submodule_search_locations)[0]) / "tasks" / "ifeval"
    missing = [f for f in ("instructions_util.py", "instructions.py", "instructions_registry.py", "utils.py")
               if not (d / f).exists()]
    if missing:
        raise ModelNotAvailable(f"lm-eval at {d.parent.parent} lacks tasks/ifeval/{missing[0]}; "
                                f"reinstall it with: {LM_EVAL_PIP}")
    return d


def ifeval_modules() -> dict[str, types.ModuleType]:
    """lm-eval's IFEval modules {'instructions_util', 'instructions', 'instructions_registry', 'utils'}.

    Loaded once, by file path, without running ``lm_eval/tasks/__init__.py`` and without the
    ``nltk.download('punkt_tab')`` attempt at import (LOCAL_RANK is set to a non-zero rank while
    ``instructions_util`` loads). langdetect is seeded (``DetectorFactory.seed = 0``) so the language
    and case checkers give the same verdict on every run.
    """
    if _IFEVAL:
        return _IFEVAL
    names = ("instructions_util", "instructions", "instructions_registry", "utils")
    if all(f"lm_eval.tasks.ifeval.{n}" in sys.modules for n in names):  # the full lm-eval is loaded: reuse it
        for name in names:
            _IFEVAL[name] = sys.modules[f"lm_eval.tasks.ifeval.{name}"]
    else:
        d = _ifeval_dir()
        stub_name = "lm_eval.tasks.ifeval"
        previous = sys.modules.get(stub_name)
        stub = types.ModuleType(stub_name)
        stub.__path__ = []  # a package, so "from ... import x" looks up attributes
        old_rank = os.environ.get("LOCAL_RANK")
        try:
            import langdetect  # noqa: F401  (a clear message below when missing)
            import immutabledict  # noqa: F401
            import nltk  # noqa: F401
        except ImportError as e:
            raise ModelNotAvailable(f"lm-eval's IFEval checkers need {e.name!r}; install with: {LM_EVAL_PIP}") from None
        try:
            sys.modules[stub_name] = stub
            if old_rank is None:
                os.environ["LOCAL_RANK"] = "-1"  # skip the punkt_tab download attempt (offline it only fails)
            for name in names:
                spec = importlib.util.spec_from_file_location(f"sinklib._ifeval.{name}", d / f"{name}.py")
                mod = importlib.util.module_from_spec(spec)
                sys.modules[spec.name] = mod
                spec.loader.exec_module(mod)
                setattr(stub, name, mod)
                _IFEVAL[name] = mod
        except Exception:
            _IFEVAL.clear()
            raise
        finally:
            if previous is None:
                sys.modules.pop(stub_name, None)
            else:
                sys.modules[stub_name] = previous
            if old_rank is None:
                os.environ.pop("LOCAL_RANK", None)
    import langdetect

    langdetect.DetectorFactory.seed = 0
    return _IFEVAL


def instruction_ids() -> list[str]:
    """Every instruction id lm-eval's IFEval registry knows."""
    return sorted(ifeval_modules()["instructions_registry"].INSTRUCTION_DICT)


def ensure_punkt() -> bool:
    """Try to make nltk's punkt_tab data available (needs network). True when it is present."""
    import nltk

    try:
        nltk.data.find("tokenizers/punkt_tab")
        return True
    except LookupError:
        pass
    try:
        return bool(nltk.download("punkt_tab", quiet=True))
    except Exception:  # offline: nltk reports the failure and returns False or raises
        return False


def grade_instructions(item: dict, response: str) -> dict:
    """Grade one response with IFEval's strict and loose checkers.

    ``item`` has ``prompt``, ``instruction_id_list`` and ``kwargs`` (one dict per id; falsy values
    are dropped, as lm-eval does). Returns ``{"strict": bool, "lenient": bool, "strict_list": [bool],
    "lenient_list": [bool]}``: prompt level (all instructions followed) and per instruction. The
    loose test also accepts the response with its first and/or last line removed and with ``*``
    removed (lm-eval's ``test_instruction_following_loose``).
    """
    m = ifeval_modules()
    utils = m["utils"]
    known = m["instructions_registry"].INSTRUCTION_DICT
    ids = list(item["instruction_id_list"])
    for iid in ids:
        if iid not in known:
            raise ParameterError(f"instruction id {iid!r} is not in lm-eval's IFEval registry; allowed: "
                                 + ", ".join(sorted(known)))
    if len(item["kwargs"]) != len(ids):
        raise ParameterError(f"item {item.get('key')!r}: kwargs has {len(item['kwargs'])} entries for {len(ids)} ids")
    inp = utils.InputExample(key=item.get("key", 0), instruction_id_list=ids, prompt=item["prompt"],
                             kwargs=[dict(k) for k in item["kwargs"]])
    try:
        strict = utils.test_instruction_following_strict(inp, response)
        loose = utils.test_instruction_following_loose(inp, response)
    except LookupError as e:  # nltk data (punkt_tab) missing
        raise SinkbookError(
            f"instruction ids {', '.join(i for i in ids if i in NEEDS_PUNKT) or ids} need nltk data that is not "
            f"installed ({str(e).strip().splitlines()[0] if str(e).strip() else e!r}); online, run "
            "python -c \"import nltk; nltk.download('punkt_tab')\"") from None
    return {"strict": bool(strict.follow_all_instructions), "lenient": bool(loose.follow_all_instructions),
            "strict_list": [bool(x) for x in strict.follow_instruction_list],
            "lenient_list": [bool(x) for x in loose.follow_instruction_list]}


# ---------------------------------------------------------------------------------------------
# GSM8K-CoT-style answers

#: Strict: the first "The answer is N." (with its period), as lm-eval's gsm8k-cot "strict-match".
STRICT_ANSWER = re.compile(r"The answer is (-?[0-9][0-9,]*(?:\.[0-9]+)?)\.")
#: Lenient: the last number anywhere in the response (lm-eval's "flexible-extract").
ANY_NUMBER = re.compile(r"-?\$?[0-9][0-9,]*(?:\.[0-9]+)?")


def _to_number(s: str) -> float | None:
    s = s.replace(",", "").replace("$", "").rstrip(".")
    try:
        return float(s)
    except ValueError:
        return None


def parse_answer_strict(response: str) -> float | None:
    """The number in the first ``The answer is N.`` sentence, or None when the format is missing."""
    m = STRICT_ANSWER.search(response)
    return _to_number(m.group(1)) if m else None


def parse_answer_lenient(response: str) -> float | None:
    """The last number anywhere in the response (commas and $ ignored), or None when there is none."""
    found = ANY_NUMBER.findall(response)
    return _to_number(found[-1]) if found else None


def grade_math(response: str, answer: int | float) -> dict:
    """``{"strict": bool, "lenient": bool, "parsed_strict": float|None, "parsed_lenient": float|None}``."""
    s, l = parse_answer_strict(response), parse_answer_lenient(response)
    ok = lambda v: v is not None and math.isclose(v, float(answer), rel_tol=0, abs_tol=1e-9)  # noqa: E731
    return {"strict": ok(s), "lenient": ok(l), "parsed_strict": s, "parsed_lenient": l}


# ---------------------------------------------------------------------------------------------
# confidence intervals

def bootstrap_ratio_interval(num: Sequence[float], den: Sequence[float], transform=None, n_boot: int = 2000,
                             seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of ``transform(sum num / sum den)``, resampling documents with
    replacement (for perplexity: num = summed NLL, den = tokens, transform = exp)."""
    a_num = np.asarray(num, dtype=float)
    a_den = np.asarray(den, dtype=float)
    if a_num.size == 0 or a_num.shape != a_den.shape:
        raise ParameterError("a bootstrap interval needs one numerator and one denominator per document (>= 1)")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, a_num.size, size=(n_boot, a_num.size))
    stat = a_num[idx].sum(1) / a_den[idx].sum(1)
    if transform is not None:
        stat = transform(stat)
    a = (1 - level) / 2
    return float(np.quantile(stat, a)), float(np.quantile(stat, 1 - a))


def bootstrap_ppl_interval(nll_sums: Sequence[float], n_tokens: Sequence[int], n_boot: int = 2000,
                           seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Bootstrap interval of the token-weighted perplexity exp(sum nll / sum tokens) over documents."""
    return bootstrap_ratio_interval(nll_sums, n_tokens, np.exp, n_boot, seed, level)


def paired_ci(base: Sequence[float], other: Sequence[float], *, n_boot: int = 2000, seed: int = 0,
              level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of mean(other - base) * 100 over shared items (resampled together): the
    paired interval of a change in a pass/fail or 0/1-scored suite, in points."""
    a, b = np.asarray(base, float), np.asarray(other, float)
    if a.shape != b.shape or a.size == 0:
        raise ParameterError(f"paired_ci needs two equally long non-empty item lists, got {a.size} and {b.size}")
    return bootstrap_ratio_interval((b - a) * 100, np.ones_like(a), n_boot=n_boot, seed=seed, level=level)


def mcnemar_exact(base: Sequence[Any], other: Sequence[Any]) -> dict:
    """Exact McNemar test of two pass/fail outcome lists on the same items: the two-sided binomial test of
    the discordant pairs (b = passed by base only, c = passed by other only) against p = 1/2.
    -> {"b", "c", "p"} (p = 1 when no item is discordant)."""
    from scipy.stats import binomtest

    a, o = [bool(x) for x in base], [bool(x) for x in other]
    if len(a) != len(o) or not a:
        raise ParameterError(f"mcnemar_exact needs two equally long non-empty outcome lists, got {len(a)} and {len(o)}")
    b = sum(x and not y for x, y in zip(a, o))
    c = sum(y and not x for x, y in zip(a, o))
    p = 1.0 if b + c == 0 else float(binomtest(c, b + c, 0.5, alternative="two-sided").pvalue)
    return {"b": int(b), "c": int(c), "p": p}


def paired_ppl_ci(base_nll: Sequence[float], other_nll: Sequence[float], n_tokens: Sequence[int], *,
                  n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of ppl(other) - ppl(base) over shared documents (resampled together)."""
    nb, no, nt = (np.asarray(x, dtype=float) for x in (base_nll, other_nll, n_tokens))
    if not nb.shape == no.shape == nt.shape or nb.size == 0:
        raise ParameterError("paired_ppl_ci needs one NLL sum per document for both models and one token count each")
    idx = np.random.default_rng(seed).integers(0, nb.size, size=(int(n_boot), nb.size))
    d = np.exp(no[idx].sum(1) / nt[idx].sum(1)) - np.exp(nb[idx].sum(1) / nt[idx].sum(1))
    a = (1 - level) / 2
    return float(np.quantile(d, a)), float(np.quantile(d, 1 - a))


def proportion_ci_pct(flags: Sequence[Any]) -> tuple[float, tuple[float, float]]:
    """Mean of boolean flags in % and its Wilson 95 % interval in %."""
    k, n = int(sum(bool(f) for f in flags)), len(flags)
    lo, hi = wilson_interval(k, n)
    return 100.0 * k / n, (100.0 * lo, 100.0 * hi)
