"""Declare a framework's checkpoint and evaluation as sections, so their users need not.

A rank saving a checkpoint or evaluating inside a declared section (``exporter.deadline``) within
its deadline is not hung, nor are the ranks waiting for it (see :mod:`exporter.hangs.definition`).
The framework callbacks wrap the framework's own checkpoint and evaluation entry points with
:class:`MethodSection` and restore them exactly when training ends. This module imports no
framework.
"""

from __future__ import annotations

import functools
from typing import Any

from ..log import log
from ..sources.sections import Deadline, deadline

__all__ = [
    "CHECKPOINT",
    "CHECKPOINT_SECONDS",
    "EVALUATION",
    "EVALUATION_SECONDS",
    "MethodSection",
    "section",
]

#: Section names the callbacks declare (values of the bounded ``section`` label).
CHECKPOINT, EVALUATION = "checkpoint", "evaluation"
#: Default deadlines: a checkpoint on a slow shared file system takes minutes, an evaluation
#: longer; past them DDPSectionOverdue fires and the hang logic applies again. Both are below
#: gloo's 30-minute collective timeout; raise them for larger jobs (callback keywords).
CHECKPOINT_SECONDS = 600.0
EVALUATION_SECONDS = 1800.0


def section(name: str, seconds: float, keyword: str) -> Deadline:
    """Return the section ``name``; raise ValueError naming the callback's ``keyword``."""
    try:
        return deadline(name, seconds=seconds)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"ExporterCallback({keyword}=...): {exc}") from None


class MethodSection:
    """Run ``obj.name(...)`` inside a section, as an instance attribute; restore exactly."""

    def __init__(self, obj: Any, name: str, section_: Deadline) -> None:
        self.obj = obj
        self.name = name
        self.section = section_
        self._wrapper: Any = None
        self._had_own = False
        self._own: Any = None

    def apply(self) -> bool:
        """Wrap the method; return False (and log once) when the object has no such method."""
        if self._wrapper is not None:
            return True
        original = getattr(self.obj, self.name, None)
        if not callable(original):
            log.info(
                "ddp-exporter: %s has no %s(); its %s is not declared as a section",
                type(self.obj).__name__,
                self.name,
                self.section.name,
            )
            return False
        self._had_own = self.name in vars(self.obj)
        self._own = vars(self.obj).get(self.name)
        section_ = self.section

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with section_:
                return original(*args, **kwargs)

        setattr(self.obj, self.name, wrapper)
        self._wrapper = wrapper
        return True

    def restore(self) -> None:
        """Put back what was there (the class's method, or an attribute of the instance)."""
        if self._wrapper is None:
            return
        if vars(self.obj).get(self.name) is self._wrapper:
            if self._had_own:
                setattr(self.obj, self.name, self._own)
            else:
                delattr(self.obj, self.name)
        self._wrapper = None
