"""Count a rank's wait inside ``Join`` for peers with more inputs as comm_wait, not compute.

Under ``with model.join():`` (DDP with uneven inputs, or any ``Joinable`` such as
``ZeroRedundancyOptimizer``), a rank whose data runs out first leaves its loop and waits in the
context's exit, shadowing its peers' collectives until every rank is done. That wait is the
others' work. Counted as compute, it lands in the rank's next step, and the rank that finished
*first* is named a straggler by compute, the reverse of what happens. So the exit of
``torch.distributed.algorithms.Join`` is timed on the training thread and its time added to the
open step's comm_wait, as every wait for a collective is.

The exit is replaced on the class for the life of the exporter (``with`` looks it up on the
type); the other threads' exits and a torch without ``Join`` pass through untouched.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, cast

from ..errors import ErrorCounter
from .patching import MethodPatches
from .recorder import Recorder
from .training import or_main_thread

__all__ = ["JoinWaits", "join_class"]


def join_class() -> type | None:
    """Return torch's ``Join`` context manager, None where this torch has none."""
    try:
        from torch.distributed.algorithms import Join
    except (ImportError, AttributeError):
        return None
    return cast(type, Join)  # torch reads as untyped


class JoinWaits:
    """Time ``Join``'s exit on the training thread into the open step's comm_wait."""

    def __init__(
        self,
        recorder: Recorder,
        errors: ErrorCounter,
        training_thread: int | None = None,
        join: type | None = None,
    ) -> None:
        self._rec = recorder
        self._errors = errors
        self._thread = or_main_thread(training_thread)
        self._join = join if join is not None else join_class()
        self._patches = MethodPatches()

    def instrument(self) -> JoinWaits:
        """Replace ``Join.__exit__`` (once); return self."""
        if not self._patches and self._join is not None:
            self._patches.apply([(self._join, "__exit__", self._timed)])
        return self

    def uninstrument(self) -> None:
        """Put ``Join.__exit__`` back unless replaced since; idempotent."""
        self._patches.restore()

    def _timed(self, original: Callable[..., Any]) -> Callable[..., Any]:
        rec, errors, thread = self._rec, self._errors, self._thread

        @functools.wraps(original)
        def __exit__(join: Any, *exc_info: Any) -> Any:  # noqa: N807 - the method replaced
            if threading.get_ident() != thread:
                return original(join, *exc_info)
            t0 = rec.clock()
            try:
                return original(join, *exc_info)
            finally:
                try:
                    rec.comm_blocked(rec.clock() - t0)
                except Exception as exc:  # noqa: BLE001 - never into the user's exit
                    errors.record("comm_timing", exc)

        return __exit__
