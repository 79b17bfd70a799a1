"""Read the values the tools' options take: one rule and one message for each kind of value.

Each function here is an argparse ``type``: argparse calls it on the option's text, and a value
it refuses is a usage error (exit 2) in one line that names the option, before the tool does
anything (``ddp-exporter top: error: argument --refresh: expected ..., got 'nan'``), instead of
a traceback from a sleep, a bind or a URL deep inside the tool, or nonsense accepted silently.
:func:`make_folder` does the same for a folder a tool writes into.
"""

from __future__ import annotations

import argparse
import math
import os
import urllib.parse

from ..mixin.config import duration_seconds

__all__ = [
    "MAX_SECONDS",
    "count",
    "duration",
    "make_folder",
    "mebibytes",
    "port",
    "prometheus_url",
    "seconds",
    "seconds_or_zero",
    "share",
]

#: The longest wait an option may ask for: a day. A longer refresh or timeout is a typo, and
#: the platform's timers overflow past 2**63 ns (``time.sleep(1e300)`` raises).
MAX_SECONDS = 86400.0


def _refuse(expected: str, text: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")


def _number(text: str, expected: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise _refuse(expected, text) from None
    if not math.isfinite(value):
        raise _refuse(expected, text)
    return value


def seconds(text: str) -> float:
    """Return a number of seconds > 0 and at most :data:`MAX_SECONDS`."""
    expected = f"a number of seconds > 0 and <= {MAX_SECONDS:g}"
    value = _number(text, expected)
    if not 0 < value <= MAX_SECONDS:
        raise _refuse(expected, text)
    return value


def seconds_or_zero(text: str) -> float:
    """Return a number of seconds >= 0 and at most :data:`MAX_SECONDS` (0 means what the option
    says: never, at once, until Ctrl-C)."""
    expected = f"a number of seconds >= 0 and <= {MAX_SECONDS:g}"
    value = _number(text, expected)
    if not 0 <= value <= MAX_SECONDS:
        raise _refuse(expected, text)
    return value


def mebibytes(text: str) -> float:
    """Return a size in MiB > 0 and at most 1024 (a GiB, already minutes on a slow link)."""
    value = _number(text, "a size in MiB > 0 and <= 1024")
    if not 0 < value <= 1024:
        raise _refuse("a size in MiB > 0 and <= 1024", text)
    return value


def share(text: str) -> float:
    """Return a share: a number from 0 to 1."""
    value = _number(text, "a number from 0 to 1")
    if not 0 <= value <= 1:
        raise _refuse("a number from 0 to 1", text)
    return value


def count(text: str) -> int:
    """Return a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise _refuse("a whole number >= 1", text) from None
    if value < 1:
        raise _refuse("a whole number >= 1", text)
    return value


def port(text: str) -> int:
    """Return a TCP port, 0..65535 (0: the tool takes free ports)."""
    try:
        value = int(text)
    except ValueError:
        raise _refuse("a port 0..65535", text) from None
    if not 0 <= value <= 65535:
        raise _refuse("a port 0..65535", text)
    return value


def duration(text: str) -> str:
    """Return a Prometheus duration > 0 of d/h/m/s units (``30s``, ``1h30m``, ``7d``)."""
    expected = "a duration > 0 such as 30s, 5m, 1h or 1d"
    try:
        positive = duration_seconds(text) > 0
    except ValueError:
        raise _refuse(expected, text) from None
    if not positive:
        raise _refuse(expected, text)
    return text


def prometheus_url(text: str) -> str:
    """Return the http(s) URL of a Prometheus server (``http://host:9090``, a path allowed)."""
    expected = "an http:// or https:// URL such as http://localhost:9090"
    try:
        split = urllib.parse.urlsplit(text)
        split.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError:
        raise _refuse(expected, text) from None
    if split.scheme not in ("http", "https") or not split.hostname:
        raise _refuse(expected, text)
    return text


def make_folder(path: str) -> None:
    """Create folder ``path`` and its parents unless it exists; raise ValueError saying why
    it cannot be one (a file there, no permission)."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"expected a folder, {path} is a file")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"cannot create the folder {path}: {exc.strerror or exc}") from None
