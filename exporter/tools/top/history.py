"""Judge consecutive reads of the ranks' endpoints over a window, as Prometheus's rate window does.

A rank's endpoint gives counters since its start. Differenced between two reads a second apart,
one burst of contention on a busy host (a rank's threads waiting for a core) fills the whole
interval and makes a healthy rank look slow, or hides a real straggler behind a peer's burst. So
the per-step figures of each read are the increases since the newest earlier read at least
``window_s`` old (since the first read, until one is that old), and the verdicts' "held in the
previous read" compares with the read just before. The groups a declared section held up are
remembered from read to read, so that their wait counts from the section's end.
"""

from __future__ import annotations

from collections import deque

from ...hangs.heldup import HeldUp
from ...mixin.config import DEFAULT, MixinConfig
from .diagnose import ENDPOINT_HOLD_S, diagnose
from .rows import RankRow

__all__ = ["ReadHistory"]


class ReadHistory:
    """The reads of one run's endpoints so far, kept as far back as the window needs."""

    def __init__(self, window_s: float = ENDPOINT_HOLD_S, *, config: MixinConfig = DEFAULT):
        if window_s < 0:
            raise ValueError(f"window_s must be 0 or more, not {window_s}")
        self.window_s = window_s
        self.config = config
        self._reads: deque[tuple[float, dict[str, RankRow]]] = deque()
        self._held = HeldUp()

    @property
    def last(self) -> dict[str, RankRow] | None:
        """Return the last judged read, by target (None before the first)."""
        return self._reads[-1][1] if self._reads else None

    def judge(self, rows: list[RankRow], now: float | None = None) -> list[RankRow]:
        """Diagnose one read against the last and the window's baseline; keep it; return it."""
        at = min((r.read_at for r in rows if r.read_at), default=0.0)
        baseline = self._baseline(at)
        rows = diagnose(
            rows, self.last, baseline=baseline, config=self.config, now=now, held=self._held
        )
        self._reads.append((at, {r.target: r for r in rows}))
        # Keep the newest read that is already a window old, and every read after it.
        while len(self._reads) > 1 and self._reads[1][0] <= at - self.window_s:
            self._reads.popleft()
        return rows

    def _baseline(self, at: float) -> dict[str, RankRow] | None:
        """Return the newest read at least a window before ``at``, else the oldest kept."""
        chosen = self._reads[0][1] if self._reads else None
        for read_at, read in self._reads:
            if read_at > at - self.window_s:
                break
            chosen = read
        return chosen
