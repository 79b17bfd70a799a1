"""Resolve one setting: keyword, else variable, else default; log a bad variable once, never raise.

A monitoring setting must never cost a run (the OpenTelemetry SDK's convention for environment
configuration): a variable holding a value the exporter cannot use is logged once per process,
in one line naming the variable, the value, what is accepted and the default used instead, and
published (``ddp_exporter_invalid_setting_info``, alert DDPExporterMisconfigured). A keyword
passed in code is the programmer's: it still raises, with the same message.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

from ..log import log
from .kinds import Setting
from .table import SETTINGS


def environ_of(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def setting_message(source: str, value: Any, setting: Setting, accepted: str = "") -> str:
    """Return the one message of a value ``setting`` does not accept, read from ``source``.

    The same text for a variable (logged) and a keyword (raised): what was given, what is
    accepted, and the default.
    """
    return (
        f"{source}: expected {accepted or setting.accepted}, got {value!r} "
        f"(default: {setting.default_text})"
    )


_lock = threading.Lock()


#: Variables found invalid in this process's environment, with the value found.
_invalid: dict[str, str] = {}


#: ``(variable, value)`` pairs already logged: once per process.
_logged: set[tuple[str, str]] = set()


def report_invalid(
    setting: Setting,
    raw: str,
    *,
    accepted: str = "",
    instead: str = "using the default",
    environ: Mapping[str, str] | None = None,
) -> None:
    """Log once that variable ``setting.name`` holds ``raw``, which is not accepted; never raises.

    ``instead`` says what is done instead. Recorded for :func:`invalid_settings` when read from
    the process's environment (``environ`` None or ``os.environ``); another mapping (a test, a
    tool) is only logged.
    """
    with _lock:
        first = (setting.name, raw) not in _logged
        _logged.add((setting.name, raw))
        if environ is None or environ is os.environ:
            _invalid[setting.name] = raw
    if first:
        log.warning(
            "ddp-exporter: %s; %s, training goes on",
            setting_message(setting.name, raw, setting, accepted),
            instead,
        )


def report_unusable(
    name: str, *, accepted: str, instead: str, environ: Mapping[str, str] | None = None
) -> None:
    """Log once that variable ``name`` holds a value this job cannot honour; never raises.

    For a value valid by itself that another setting or the model rules out (the hang action
    without a heartbeat, DDP's reducer timers on a GPU): :func:`report_invalid` with the
    variable's own value, ``accepted`` saying what could work here.
    """
    raw = environ_of(environ).get(name, "")
    report_invalid(SETTINGS[name], raw, accepted=accepted, instead=instead, environ=environ)


def invalid_settings() -> list[str]:
    """Return the variables whose value in this process's environment was found invalid."""
    with _lock:
        found = list(_invalid.items())
    # Still holding the value found: a variable fixed (or changed) since is not reported.
    return sorted(name for name, raw in found if os.environ.get(name) == raw)


def resolve(
    name: str,
    keyword: Any = None,
    *,
    caller: str = "instrument",
    environ: Mapping[str, str] | None = None,
) -> Any:
    """Return setting ``name``: the keyword, else the variable, else the default.

    Raises ValueError (TypeError) naming ``caller``'s keyword for a keyword value it does not
    accept; an invalid variable is reported (:func:`report_invalid`) and the default returned.
    """
    setting = SETTINGS[name]
    if keyword is not None:
        try:
            return setting.check(keyword)
        except (TypeError, ValueError) as exc:
            source = f"exporter.{caller}({setting.keyword or name}=...)"
            message = setting_message(source, keyword, setting, setting.keyword_accepted)
            raise type(exc)(message) from None
    raw = environ_of(environ).get(name)
    if raw is None or not raw.strip():
        return setting.default
    try:
        return setting.check(setting.parse(raw))
    except (TypeError, ValueError):
        report_invalid(setting, raw, environ=environ)
        return setting.default
