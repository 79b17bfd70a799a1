"""Serve recorded GPU health readings where there is no GPU: tests, the demo, a drill.

A recording is JSON written by :meth:`GPUHealth.to_dict` from a real GPU (``scripts/gpu-check.sh``
records one per run); :class:`Recorded` serves one reading and can be switched to another while
the job runs (a GPU that starts throttling, an Xid that arrives).
"""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from pathlib import Path

from .health import GPUHealth

__all__ = ["Recorded", "load_recording"]


def load_recording(path: str | Path) -> list[GPUHealth]:
    """Return the readings of a recording: a JSON list of readings, or one reading."""
    data = json.loads(Path(path).read_text())
    items = data if isinstance(data, list) else [data]
    return [GPUHealth.from_dict(item) for item in items]


class Recorded:
    """A GPU health source serving one reading at a time, switched by :meth:`serve`."""

    def __init__(self, reading: GPUHealth) -> None:
        self._reading = reading
        self._lock = threading.Lock()
        #: Readings served so far (what a test waits on).
        self.reads = 0

    def serve(self, reading: GPUHealth) -> None:
        """Serve ``reading`` from now on."""
        with self._lock:
            self._reading = reading

    def add_xid(self, xid: int, unix: float) -> None:
        """Count one Xid event (``xid`` at Unix time ``unix``) on the reading served."""
        with self._lock:
            r = self._reading
            self._reading = replace(r, xid_errors=r.xid_errors + 1, last_xid=(xid, unix))

    def __call__(self) -> GPUHealth:
        """Return the reading served now."""
        with self._lock:
            self.reads += 1
            return self._reading
