"""Tell the recorder of the declared sections run on the training thread, and only those."""

from __future__ import annotations

import threading

from .recorder import Recorder

__all__ = ["ThreadSections"]


class ThreadSections:
    """Tell a recorder of the declared sections run on one thread (the training thread) only.

    A section on another thread (a background checkpoint writer) does not interrupt training.
    """

    def __init__(self, recorder: Recorder, thread_ident: int | None) -> None:
        self._recorder = recorder
        self._ident = thread_ident

    def section_begin(self) -> None:
        """Pause the recorder's step if called on the watched thread."""
        if threading.get_ident() == self._ident:
            self._recorder.section_begin()

    def section_end(self) -> None:
        """Resume it if called on the watched thread."""
        if threading.get_ident() == self._ident:
            self._recorder.section_end()
