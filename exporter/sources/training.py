"""Name the training thread: the one whose waits, sections and stack are the job's.

It is the thread that called :func:`exporter.instrument` (or, under ``ddp-exporter run``, the
one that stepped the optimizer first): the main thread of a script, the runner thread of a
framework that trains on one (Ray Train runs the training function on a thread of its worker).
A part made without being told the thread takes the main thread.
"""

from __future__ import annotations

import threading

__all__ = ["or_main_thread"]


def or_main_thread(ident: int | None = None) -> int | None:
    """Return ``ident``, or the main thread's identifier where it is None."""
    return ident if ident is not None else threading.main_thread().ident
