"""Learn what the other ranks did, through the store, and find the rank the run waited for.

Each rank ``set``s its own work so far (:class:`~.categories.Work`: steps, data and compute time,
its declared sections) under one key every heartbeat interval, from a background thread; the
monitoring rank reads every rank's with one ``multi_get``. Through the store, never through
collectives: no synchronisation is added to training. At 4,096 ranks and 5 s that is ~820 small
writes per second and one read per interval.

:class:`PeerTally` turns the readings into windows: a window closes once every live rank's work
has moved since the last one (a hung rank that never moves closes none: that time is the hang's),
and each rank's window covers its own readings, so every second of every rank's work falls in
exactly one window. In a window the rank with the most work holds the others up by its excess
over the median rank (:data:`~.categories.STRAGGLER_SHARE` of noise aside), split by cause.

That excess is a straggler's only when it persists: the same rank must also have done the most
work over the last :data:`PERSIST_WINDOWS` windows together, by more than the share. On ranks
that share busy cores (a noisy neighbour, oversubscribed CPUs) every window has a slowest rank,
a different one each time: that jitter evens out over the windows, and the waits it causes are
the job's healthy pace (productive), not a straggler's cost. A rank that stays slow stands out
at once.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from statistics import median_low
from typing import Any

from .categories import STRAGGLER_SHARE, Work

__all__ = ["Excess", "PeerTally", "decode_work", "encode_work", "work_key"]

#: Below this many seconds a window's excess is noise, whatever the share.
MIN_EXCESS_S = 0.005
#: The windows a slowest rank must stand out over, together, for its excess to count ...
PERSIST_WINDOWS = 8
#: ... and the fewest of them before any excess counts (a job's first windows are too few to
#: tell a straggler from jitter).
PERSIST_MIN = 3


def work_key(prefix: str, rank: int) -> str:
    """Return the store key of ``rank``'s work under an attempt's key prefix."""
    return f"{prefix}/gp/{rank}"


def encode_work(work: Work, finished: bool = False) -> str:
    """Return a rank's work as it travels (a list: small), ``finished`` once it ended cleanly."""
    return json.dumps(
        [
            work.steps,
            round(work.data_s, 4),
            round(work.compute_s, 4),
            round(work.checkpoint_s, 4),
            round(work.evaluation_s, 4),
            round(work.section_s, 4),
            int(finished),
            round(work.cpu_wait_s, 4),
        ]
    )


def decode_work(raw: bytes | str) -> Work | None:
    """Read a rank's work; None for a rank that ended cleanly or wrote nothing readable.

    A reading without the CPU wait (the seven fields of earlier versions) waited for none;
    fields past the ones known are a later version's, not read.
    """
    try:
        fields: Any = json.loads(raw)
        steps, data, compute, ckpt, evaluation, section, finished, *more = fields
        if finished:
            return None
        return Work(
            int(steps),
            float(data),
            float(compute),
            float(ckpt),
            float(evaluation),
            float(section),
            float(more[0]) if more else 0.0,
        )
    except (ValueError, TypeError):
        return None


@dataclass(frozen=True)
class Excess:
    """What one window's slowest rank cost the others, by cause (seconds)."""

    culprit: int
    causes: dict[str, float]
    #: When the window closed (Unix time).
    unix: float
    #: The median rank's data and compute per step in the window (seconds).
    usual: dict[str, float] = field(default_factory=dict)
    #: Whether the culprit stood out over the recent windows too. Not lasting, its compute and
    #: data excess is jitter: the run's healthy pace, blamed on nobody. (Declared sections
    #: always count: they are no jitter.)
    lasting: bool = True

    @property
    def seconds(self) -> float:
        """Return the whole excess."""
        return sum(self.causes.values())


class PeerTally:
    """Close windows over every rank's work; return each window's excess over the median."""

    def __init__(self, share: float = STRAGGLER_SHARE) -> None:
        self.share = share
        self._start: dict[int, Work] = {}
        #: Every rank's readings where the recent windows started, oldest first.
        self._starts: deque[dict[int, Work]] = deque(maxlen=PERSIST_WINDOWS)

    def observe(self, works: Sequence[Work | None], now: float | None = None) -> Excess | None:
        """Read every rank's latest work (None: finished or unknown); return a window's excess.

        The excess is None while a window is still open, and when it closes below the noise.
        """
        live = {rank: w for rank, w in enumerate(works) if w is not None}
        for rank in list(self._start):
            if rank not in live:
                del self._start[rank]  # ended cleanly: neither slow nor waiting any more
        for rank, w in live.items():
            self._start.setdefault(rank, w)
        if len(live) < 2 or any(live[r] == self._start[r] for r in live):
            return None
        deltas = {r: live[r].minus(self._start[r]) for r in live}
        self._starts.append(self._start)
        self._start = dict(live)
        found = self._excess(deltas, time.time() if now is None else now)
        if found is None or self._lasting(live, found.culprit):
            return found
        return replace(found, lasting=False)

    def _lasting(self, live: dict[int, Work], culprit: int) -> bool:
        """Say whether ``culprit`` also did the most work over the recent windows together."""
        if len(self._starts) < PERSIST_MIN:
            return False
        # A rank's reading where the oldest recent window it was in started.
        oldest = {r: next(s[r] for s in self._starts if r in s) for r in live}
        lasting = self._excess({r: live[r].minus(oldest[r]) for r in live}, 0.0)
        return lasting is not None and lasting.culprit == culprit

    def _excess(self, deltas: dict[int, Work], now: float) -> Excess | None:
        # Ranks read at their own phase of the interval close windows a step or so apart: their
        # work per step compares like with like. Declared sections are not per step: they
        # count as they are. The excess is the slowest rank's, over its own steps.
        counts = [d.steps for d in deltas.values() if d.steps > 0]
        usual = median_low(counts) if counts else 0
        busy = {r: sum(_scaled(d, usual).values()) for r, d in deltas.items()}
        culprit = max(busy, key=lambda r: busy[r])
        steps = deltas[culprit].steps
        parts = {r: _scaled(d, steps) for r, d in deltas.items()}
        busy = {r: sum(p.values()) for r, p in parts.items()}
        typical = median_low(busy.values())
        excess = busy[culprit] - typical
        if excess <= max(self.share * typical, MIN_EXCESS_S):
            return None
        over = {}
        for cause, seconds in parts[culprit].items():
            median = median_low(p[cause] for p in parts.values())
            if seconds > median:
                over[cause] = seconds - median
        total = sum(over.values())
        if total <= 0:
            return None
        per_step = {
            c: median_low(p[c] for p in parts.values()) / steps if steps else 0.0
            for c in ("data", "compute")
        }
        return Excess(culprit, {c: excess * s / total for c, s in over.items()}, now, per_step)


def _scaled(delta: Work, steps: int) -> dict[str, float]:
    """Return a window's work by cause, its per-step part scaled to ``steps`` steps."""
    parts = delta.parts()
    scale = steps / delta.steps if delta.steps > 0 else 0.0
    for cause in ("data", "compute"):
        parts[cause] *= scale
    return parts
