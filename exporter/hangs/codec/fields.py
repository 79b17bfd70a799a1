"""Read the protocol's JSON fields: keep what was read, refuse what is not the type."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, TypeVar

__all__ = [
    "JSON",
    "Raw",
    "ints",
    "line",
    "load",
    "num",
    "opt_int",
    "opt_num",
    "opt_str",
]

_T = TypeVar("_T")
Raw = str | bytes | bytearray
JSON = dict[str, Any]


def num(value: Any) -> float:
    """Return a JSON number as read (an int stays an int); refuse anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return float(value)  # a numeric string still reads; None or a list raises TypeError
    return value


def opt_num(value: Any) -> float | None:
    return None if value is None else num(value)


def opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def line(value: Any) -> int | None:
    """Return a frame's line number; one that is not a number reads as unknown."""
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def ints(values: Iterable[Any] | None) -> tuple[int, ...]:
    return tuple(int(v) for v in values or ())


def load(raw: Raw) -> JSON:
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    return data
