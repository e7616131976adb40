"""Validation of notebook parameters (papermill may pass any JSON type).

Each check returns the (possibly coerced) value or raises ParameterError with a message
that names the parameter, what it got, and what is allowed. A notebook declares its parameters
once, as a schema (name -> check, built with `integer`, `number`, `choice`, `text`, `list_of`, ...;
each chapter's schema lives in sinklib next to the functions that use the values), and validates
them with one call: `params = validate(SCHEMA, globals())`.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from sinklib.errors import ParameterError


def _fail(name: str, value: Any, allowed: str) -> ParameterError:
    return ParameterError(
        f"parameter {name!r} got {value!r} ({type(value).__name__}); allowed: {allowed}"
    )


def check_int(name: str, value: Any, lo: int | None = None, hi: int | None = None) -> int:
    """An integer in [lo, hi] (bounds inclusive, None = unbounded). Floats like 3.0 are accepted."""
    rng = f"an integer in [{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}]"
    if isinstance(value, bool):
        raise _fail(name, value, rng)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise _fail(name, value, rng) from None
    if not isinstance(value, int):
        raise _fail(name, value, rng)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise _fail(name, value, rng)
    return value


def check_float(name: str, value: Any, lo: float | None = None, hi: float | None = None) -> float:
    """A finite real number in [lo, hi]."""
    rng = f"a number in [{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}]"
    if isinstance(value, bool):
        raise _fail(name, value, rng)
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise _fail(name, value, rng) from None
    if not isinstance(value, (int, float)):
        raise _fail(name, value, rng)
    value = float(value)
    if value != value or value in (float("inf"), float("-inf")):
        raise _fail(name, value, rng)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise _fail(name, value, rng)
    return value


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> Any:
    """One of a fixed set of values."""
    choices = list(choices)
    if value not in choices or isinstance(value, bool) != any(isinstance(c, bool) for c in choices if c == value):
        raise _fail(name, value, "one of " + ", ".join(repr(c) for c in choices))
    return value


def check_bool(name: str, value: Any) -> bool:
    """True or False (papermill passes real booleans; the strings 'true'/'false' are accepted)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise _fail(name, value, "True or False")


def check_str(name: str, value: Any, nonempty: bool = True) -> str:
    """A string (non-empty unless nonempty=False)."""
    if not isinstance(value, str) or (nonempty and not value.strip()):
        raise _fail(name, value, "a non-empty string" if nonempty else "a string")
    return value


def check_list(name: str, value: Any, item_check=None, min_len: int = 1) -> list:
    """A list (a single scalar or a comma-separated string is turned into a list)."""
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    elif not isinstance(value, Sequence):
        value = [value]
    value = list(value)
    if len(value) < min_len:
        raise _fail(name, value, f"a list with at least {min_len} item(s)")
    if item_check is not None:
        value = [item_check(f"{name}[{i}]", v) for i, v in enumerate(value)]
    return value


# ---------------------------------------------------------------------------------------
# schemas: a notebook's parameters declared once, validated by one call

Check = Callable[[str, Any], Any]


@dataclass(frozen=True)
class Dependent:
    """A check that also sees the parameters validated before it: fn(name, value, checked) -> value."""

    fn: Callable[[str, Any, dict], Any]


def integer(lo: int | None = None, hi: int | None = None) -> Check:
    """An integer in [lo, hi] (`check_int`)."""
    return partial(check_int, lo=lo, hi=hi)


def number(lo: float | None = None, hi: float | None = None) -> Check:
    """A finite number in [lo, hi] (`check_float`)."""
    return partial(check_float, lo=lo, hi=hi)


def choice(choices: Iterable[Any]) -> Check:
    """One of `choices` (`check_choice`)."""
    return partial(check_choice, choices=tuple(choices))


def text(nonempty: bool = True) -> Check:
    """A string (`check_str`)."""
    return partial(check_str, nonempty=nonempty)


def boolean() -> Check:
    """True or False (`check_bool`)."""
    return check_bool


def list_of(item: Check | None = None, min_len: int = 1) -> Check:
    """A list whose items pass `item` (`check_list`)."""
    return partial(check_list, item_check=item, min_len=min_len)


def optional(check: Check) -> Check:
    """None, or a value that passes `check`."""
    return lambda name, value: None if value is None else check(name, value)


def anything(name: str, value: Any) -> Any:
    """No check (a value passed through as given, e.g. `device`, resolved later)."""
    return value


#: the parameters every notebook has
COMMON: dict[str, Check] = {"profile": choice(("quick", "full", "colab"))}


def validate(schema: Mapping[str, Check | Dependent], values: Mapping[str, Any]) -> dict:
    """Check every parameter of `schema` in `values` (a notebook passes `globals()`), in schema order.

    Returns {name: checked value} (what the notebook uses and saves as its `params`). A parameter
    that fails raises ParameterError naming it, the value received and the values allowed; a
    missing one raises ParameterError naming it.
    """
    out: dict[str, Any] = {}
    for name, check in schema.items():
        if name not in values:
            raise ParameterError(f"parameter {name!r} is missing; the notebook's parameters cell must define it")
        value = values[name]
        out[name] = check.fn(name, value, out) if isinstance(check, Dependent) else check(name, value)
    return out
