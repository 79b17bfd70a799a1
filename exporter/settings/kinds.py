"""Say what a setting accepts: :class:`Setting`, and the parsers and checks its values go through.

A parser turns a variable's text into a value; a check returns a value as used or raises
ValueError (TypeError where a wrong type is the caller's bug). One duration parser serves the
job deadline here and the mixin's windows (:func:`duration_seconds`).
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .names import (
    ALL_INTERFACES,
    JOB_DEADLINE,
    NODE_NAME,
    SLURM_JOB_END_TIME,
    VERSION_KEYS,
)

# -- the one validator ---------------------------------------------------------------------------
# A monitoring setting must never cost a run (the OpenTelemetry SDK's convention for environment
# configuration): a variable holding a value the exporter cannot use is logged once per process,
# in one line naming the variable, the value, what is accepted and the default used instead, and
# published (ddp_exporter_invalid_setting_info, alert DDPExporterMisconfigured). A keyword passed
# in code is the programmer's: it still raises, with the same message.


def same(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Setting:
    """One variable the exporter reads: what it accepts, its default and its keyword if any.

    ``parse`` turns the variable's text into a value; ``check`` returns a value (a keyword's or a
    parsed one) as used, or raises ValueError (TypeError where a wrong type is the caller's bug).
    """

    name: str
    accepted: str
    default: Any
    parse: Callable[[str], Any] = str.strip
    check: Callable[[Any], Any] = same
    keyword: str = ""
    #: How the default reads in messages when it is not a plain value (e.g. "the hostname").
    shown_default: str = ""
    #: What the setting does, for people (the settings reference page is rendered from it).
    meaning: str = ""
    #: What its keyword accepts, where that reads otherwise than the variable's text.
    keyword_accepted: str = ""

    @property
    def default_text(self) -> str:
        """Return the default as the messages show it."""
        return self.shown_default or str(self.default)


def integer(low: int, high: int | None = None) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError("not an int")
        if value < low or (high is not None and value > high):
            raise ValueError("out of range")
        return value

    return check


def parse_int(raw: str) -> int:
    return int(raw.strip())


def seconds(
    minimum: float, *, inclusive: bool, maximum: float = math.inf
) -> Callable[[Any], float]:
    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError("not a number")
        low = value < minimum or (value == minimum and not inclusive)
        if not math.isfinite(value) or low or value > maximum:
            raise ValueError("out of range")
        return float(value)

    return check


def parse_float(raw: str) -> float:
    return float(raw.strip())


def one_of(choices: tuple[str, ...]) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if not isinstance(value, str) or value not in choices:
            raise ValueError("not a choice")
        return value

    return check


def lower(raw: str) -> str:
    return raw.strip().lower()


_SWITCH = {
    "1": True,
    "true": True,
    "yes": True,
    "on": True,
    "0": False,
    "false": False,
    "no": False,
    "off": False,
}


def parse_switch(raw: str) -> bool:
    return _SWITCH[raw.strip().lower()] if raw.strip().lower() in _SWITCH else _no(raw)


def _no(raw: str) -> Any:
    raise ValueError(f"not accepted: {raw!r}")


def boolean(value: Any) -> bool:
    """Accept True or False (or 1 and 0): a string such as ``"no"`` is not a switch's keyword."""
    if not isinstance(value, int) or value not in (0, 1):
        raise ValueError("not a bool")
    return bool(value)


def name_text(value: Any) -> str:
    """Accept a string that is not blank (a label value such as the run's name)."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError("not a name")
    return value


def path(value: Any) -> str:
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"expected a path, got {type(value).__name__}")
    text = os.fspath(value)
    if not text:
        raise ValueError("empty path")
    return text


def is_ipv6(host: str) -> bool:

    try:
        return ipaddress.ip_address(host).version == 6
    except ValueError:
        return False


def host(value: Any) -> str:
    """Accept a host name or IP address: no port, scheme, path or blank."""
    if not isinstance(value, str):
        raise ValueError("not a host")
    if ":" in value and not is_ipv6(value) or "/" in value or any(c.isspace() for c in value):
        raise ValueError("not a host")
    return value


def bind(value: Any) -> str:
    return value if value in ALL_INTERFACES else host(value)


def node(value: Any) -> str:
    if not isinstance(value, str) or not NODE_NAME.match(value):
        raise ValueError("not a node name")
    return value


_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def duration_seconds(text: str) -> int:
    """Return the seconds of a duration such as ``1m30s`` or ``1d12h`` (d, h, m, s units only).

    The one duration parser: the job deadline's variable and the mixin's windows (Prometheus
    durations of these units) both read through it. Raises ValueError for anything else.
    """
    match = _DURATION.match(text)
    if not text or match is None:
        raise ValueError(f"not a duration of d/h/m/s units: {text!r}")
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


#: A bare number below this is surely a duration without unit, not a Unix time (2001-09-09).
MIN_UNIX = 1_000_000_000


def parse_deadline(name: str, raw: str, start_unix: float) -> float:
    """Return the Unix deadline that ``raw`` (read from variable ``name``) stands for.

    Accepts a Unix time (integer or decimal) or, for ``DDP_EXPORTER_JOB_DEADLINE``, a duration
    with d/h/m/s units counted from ``start_unix``. Raises ValueError naming the variable.
    """
    text = raw.strip()
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is not None:
        if not math.isfinite(value) or value < MIN_UNIX:
            hint = f"; for a duration write a unit, e.g. {text}s" if name == JOB_DEADLINE else ""
            raise ValueError(f"{name}={raw!r} is not a Unix time (seconds since 1970){hint}")
        return value
    if name == JOB_DEADLINE and text and _DURATION.match(text) is not None:
        total = duration_seconds(text)
        if total <= 0:
            raise ValueError(f"{name}={raw!r}: the duration must be positive")
        return start_unix + total
    if name == JOB_DEADLINE:
        raise ValueError(
            f"{name}={raw!r} is neither a Unix time nor a duration like 72h, 90m, 3600s or 1d12h"
        )
    raise ValueError(f"{name}={raw!r} is not a Unix time (seconds since 1970)")


def deadline(name: str) -> Callable[[str], str | None]:
    def parse(raw: str) -> str | None:
        text = raw.strip()
        if name == SLURM_JOB_END_TIME and text == "0":
            return None  # Slurm's "no time limit"
        parse_deadline(name, text, float(MIN_UNIX))  # raises ValueError when malformed
        return text

    return parse


def parse_attempt(raw: str) -> int:
    if not raw.strip().isdigit():
        raise ValueError("not a count")
    return int(raw.strip())


def parse_fake_versions(raw: str) -> dict[str, str]:
    out = {}
    for item in filter(None, (x.strip() for x in raw.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key not in VERSION_KEYS or not value:
            raise ValueError(f"bad item {item!r}")
        out[key] = value
    return out


EXIT_CODE = "an exit code in 1..255"
