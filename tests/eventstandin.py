"""Device waits on stand-in events: marks read from a clock the test moves.

CUDA events cannot exist without a GPU. :class:`Events` stands in for them (the injected
:class:`~exporter.sources.devicewaits.EventSource`): a mark is the clock's time, completed when
the test says so.
"""

from __future__ import annotations

from harness import HandClock as Clock

from exporter.errors import ErrorCounter
from exporter.sources.devicewaits import DeviceWaits
from exporter.sources.recorder import Recorder


class Mark:
    def __init__(self, t: float, done: bool) -> None:
        self.t, self.done = t, done


class Events:
    """Marks at the clock's time; ``complete`` says whether new marks have completed."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.complete = True
        self.capturing = False
        self.default = True  # the current stream is the device's default stream
        self.fail: Exception | None = None
        self.marks: list[Mark] = []
        self.waited: list[object] = []

    def usable(self) -> bool:
        return not self.capturing

    def on_default_stream(self) -> bool:
        return self.default

    def record(self) -> Mark:
        if self.fail is not None:
            raise self.fail
        mark = Mark(self.clock(), self.complete)
        self.marks.append(mark)
        return mark

    def wait(self, event: object) -> None:
        self.waited.append(event)

    def elapsed(self, start: Mark, end: Mark) -> float | None:
        return end.t - start.t if end.done else None


def device_waits(every: int) -> tuple[Recorder, ErrorCounter, DeviceWaits, Clock]:
    """Return a recorder whose steps close explicitly, and waits timed every ``every`` steps."""
    clock = Clock()
    rec, errors = Recorder("explicit", clock=clock), ErrorCounter()
    waits = DeviceWaits(rec, errors, every=every, events=Events(clock), interval_s=3600)
    return rec, errors, waits, clock
