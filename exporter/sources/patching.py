"""What the two collective patchers share: their state, the undo of a patch, a payload's size.

:class:`~exporter.sources.collectives.CollectiveTiming` wraps ``torch.distributed``'s
collectives, :class:`~exporter.sources.functional.FunctionalCollectiveTiming` the
``_c10d_functional`` ops that DTensor and FSDP2's clipping call. Both replace names in a
namespace, remember each original beside its replacement, and put back only what still holds
their own replacement (another patcher may have wrapped it since).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, cast

import torch

from ..errors import ErrorCounter
from .recorder import CollectiveStats, Recorder
from .training import or_main_thread

__all__ = [
    "MethodPatches",
    "Patcher",
    "call_arg",
    "patch_method",
    "payload_bytes",
    "restore_method",
]


def call_arg(args: tuple[Any, ...], kwargs: dict[str, Any], name: str | None, at: int) -> Any:
    """Return the argument ``name`` (at position ``at``) of a call, None where not given."""
    if name is not None and name in kwargs:
        return kwargs[name]
    return args[at] if 0 <= at < len(args) else None


def payload_bytes(payload: Any) -> int:
    """Return the bytes a collective's payload holds: a tensor, or a (nested) list of them."""
    if isinstance(payload, torch.Tensor):
        return cast(int, payload.nbytes)  # torch reads as untyped
    if isinstance(payload, (list, tuple)):
        return sum(payload_bytes(t) for t in payload)
    return 0


def patch_method(owner: Any, name: str, wrap: Callable[[Any], Any]) -> tuple[Any, Any] | None:
    """Replace ``owner.name`` (a class's method, a namespace's function) by ``wrap(original)``.

    Return ``(original, replacement)`` for :func:`restore_method`, or None where there is no
    such method or the class refuses the change (nothing replaced).
    """
    original = getattr(owner, name, None) if owner is not None else None
    if not callable(original):
        return None
    replacement = wrap(original)
    try:
        setattr(owner, name, replacement)
    except (AttributeError, TypeError):
        return None
    return original, replacement


def restore_method(owner: Any, name: str, patched: tuple[Any, Any] | None) -> None:
    """Put back what :func:`patch_method` replaced, unless someone replaced it again since."""
    if patched is None:
        return
    original, replacement = patched
    if owner.__dict__.get(name) is replacement:
        setattr(owner, name, original)


class MethodPatches:
    """Names replaced with :func:`patch_method`, restored together, last first."""

    def __init__(self) -> None:
        self._done: list[tuple[Any, str, tuple[Any, Any] | None]] = []

    def __bool__(self) -> bool:
        """Say whether the replacements are in place."""
        return bool(self._done)

    def apply(self, wraps: list[tuple[Any, str, Callable[[Any], Any]]]) -> None:
        """Replace each ``owner.name`` by ``wrap(original)``, where there is one."""
        for owner, name, wrap in wraps:
            self._done.append((owner, name, patch_method(owner, name, wrap)))

    def restore(self) -> None:
        """Restore every name unless someone replaced it since; idempotent."""
        for owner, name, patched in reversed(self._done):
            restore_method(owner, name, patched)
        self._done.clear()


class Patcher:
    """Replace names of a namespace with timed stand-ins for one recorder; undo it.

    ``training_thread``: the thread whose waits are the step's comm_wait (default: the main thread).
    ``timed``: observe latencies and waits (False on CUDA, where the host does not see them).
    ``namespace``: where the replaced names live.
    """

    def __init__(
        self,
        recorder: Recorder,
        errors: ErrorCounter,
        *,
        training_thread: int | None,
        timed: bool,
        namespace: Any,
    ) -> None:
        self._rec = recorder
        self._errors = errors
        self._thread = or_main_thread(training_thread)
        self._timed = timed
        self._ns = namespace
        self._patched: dict[str, tuple[Any, Any]] = {}  # name -> (original, replacement)
        # Statistics are made once per group and op, by whichever thread calls first.
        self._lock = threading.Lock()

    @property
    def instrumented(self) -> bool:
        """Say whether the replacements are in place."""
        return bool(self._patched)

    def _issue(
        self,
        call: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        stats: CollectiveStats,
        t0: float,
        settle: Callable[[Any, CollectiveStats, float], None],
    ) -> Any:
        """Issue a collective whose launch was recorded at ``t0``; return what it returns.

        ``settle`` records what the call returned (its Work or its output) for the wait that
        ends it. Where the call raises, or ``settle`` fails, the collective ends untimed: it is
        never left in flight.
        """
        try:
            out = call(*args, **kwargs)
        except BaseException:
            self._rec.collective_finished(stats, t0, timed=False)
            raise
        try:
            settle(out, stats, t0)
        except Exception as exc:  # noqa: BLE001 - never in the way of the collective
            self._rec.collective_finished(stats, t0, timed=False)
            self._errors.record("comm_timing", exc)
        return out

    def _replace(self, name: str, original: Any, replacement: Any) -> None:
        setattr(self._ns, name, replacement)
        self._patched[name] = (original, replacement)

    def _restore(self) -> None:
        """Put back every original whose name still holds this instance's replacement."""
        for name, (original, replacement) in self._patched.items():
            if getattr(self._ns, name, None) is replacement:
                setattr(self._ns, name, original)
        self._patched.clear()
