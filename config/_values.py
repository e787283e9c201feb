"""Parsing of option values written as text (environment, CLI, URL query strings).

Each parser raises :class:`InvalidValue` whose message says what was expected, without
the offending text: the caller decides whether the text may be shown (it may not be
for credentials).
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterable

__all__ = [
    "InvalidValue",
    "closest",
    "describe",
    "normalize_name",
    "parse_bool",
    "parse_float",
    "parse_heartbeat",
    "parse_int",
    "suggest",
]

_INT = re.compile(r"[+-]?[0-9](?:_?[0-9])*")
_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})


class InvalidValue(ValueError):
    """A value has the wrong type or syntax. ``str()`` says what was expected."""


def parse_int(text: str) -> int:
    """A decimal integer (ASCII digits, optional sign, ``_`` separators as in TOML)."""
    stripped = text.strip()
    if not _INT.fullmatch(stripped):
        raise InvalidValue("expected an integer")
    return int(stripped)


def parse_float(text: str) -> float:
    """A finite decimal number (``2``, ``1.5``, ``1e3``); ``nan``/``inf`` are refused."""
    try:
        value = float(text.strip())
    except ValueError:
        raise InvalidValue("expected a number") from None
    if not math.isfinite(value):
        raise InvalidValue("expected a finite number")
    return value


def parse_bool(text: str) -> bool:
    """``true/false``, ``1/0``, ``yes/no``, ``on/off``, any case."""
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise InvalidValue("expected a boolean (true/false, 1/0, yes/no, on/off)")


def parse_heartbeat(text: str) -> tuple[int, int]:
    """Two integers ``"x,y"`` in ms, the syntax of the STOMP ``heart-beat`` header."""
    parts = text.split(",")
    if len(parts) != 2:
        raise InvalidValue("expected two integers 'x,y' (milliseconds)")
    try:
        return parse_int(parts[0]), parse_int(parts[1])
    except InvalidValue:
        raise InvalidValue("expected two integers 'x,y' (milliseconds)") from None


def describe(value: object) -> str:
    """A short description of a value's type for "got ..." in messages, e.g. ``string``."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, dict):
        return "table"
    return type(value).__name__


def normalize_name(name: str) -> str:
    """Lower case without ``_``/``-``: ``retryInterval`` and ``retry_interval`` match."""
    return name.lower().replace("_", "").replace("-", "")


def closest(name: str, candidates: Iterable[str]) -> str | None:
    """The candidate ``name`` was most likely meant to be, or ``None`` (difflib)."""
    pool = list(candidates)
    wanted = normalize_name(name)
    for candidate in pool:
        if normalize_name(candidate) == wanted:
            return candidate
    by_normal = {normalize_name(c): c for c in pool}
    close = difflib.get_close_matches(wanted, list(by_normal), n=1, cutoff=0.75)
    if close:
        return by_normal[close[0]]
    close = difflib.get_close_matches(name, pool, n=1, cutoff=0.6)
    return close[0] if close else None


def suggest(name: str, candidates: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest candidate, or an empty string."""
    best = closest(name, candidates)
    return "" if best is None else f" (did you mean {best!r}?)"
