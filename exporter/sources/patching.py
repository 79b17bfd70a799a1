"""What the two collective patchers share: their state, the undo of a patch, a payload's size.

:class:`~exporter.sources.collectives.CollectiveTiming` wraps ``torch.distributed``'s
collectives, :class:`~exporter.sources.functional.FunctionalCollectiveTiming` the
``_c10d_functional`` ops that DTensor and FSDP2's clipping call. Both replace names in a
namespace, remember each original beside its replacement, and put back only what still holds
their own replacement (another patcher may have wrapped it since).
"""

from __future__ import annotations

import threading
from typing import Any, cast

import torch

from ..errors import ErrorCounter
from .recorder import Recorder

__all__ = ["Patcher", "payload_bytes"]


def payload_bytes(payload: Any) -> int:
    """Return the bytes a collective's payload holds: a tensor, or a (nested) list of them."""
    if isinstance(payload, torch.Tensor):
        return cast(int, payload.nbytes)  # torch reads as untyped
    if isinstance(payload, (list, tuple)):
        return sum(payload_bytes(t) for t in payload)
    return 0


class Patcher:
    """Replace names of a namespace with timed stand-ins for one recorder; undo it.

    ``training_thread``: the thread whose waits are the step's comm_wait (the main thread).
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
        main = threading.main_thread().ident
        self._thread = training_thread if training_thread is not None else main
        self._timed = timed
        self._ns = namespace
        self._patched: dict[str, tuple[Any, Any]] = {}  # name -> (original, replacement)
        # Statistics are made once per group and op, by whichever thread calls first.
        self._lock = threading.Lock()

    @property
    def instrumented(self) -> bool:
        """Say whether the replacements are in place."""
        return bool(self._patched)

    def _replace(self, name: str, original: Any, replacement: Any) -> None:
        setattr(self._ns, name, replacement)
        self._patched[name] = (original, replacement)

    def _restore(self) -> None:
        """Put back every original whose name still holds this instance's replacement."""
        for name, (original, replacement) in self._patched.items():
            if getattr(self._ns, name, None) is replacement:
                setattr(self._ns, name, original)
        self._patched.clear()
