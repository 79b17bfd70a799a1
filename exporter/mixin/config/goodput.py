"""Hold the goodput windows and DDPGoodputLow's bar: where a run's wall clock went.

The time itself is accounted by :mod:`exporter.sources.goodput`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...settings import duration_seconds
from .domain import Domain, check_durations

__all__ = ["GoodputConfig"]


@dataclass(frozen=True)
class GoodputConfig(Domain):
    """Say over which windows ETTR is rolled and how low it may fall before an alert."""

    TITLE = "goodput: where a run's wall clock went (exporter.sources.goodput)"

    #: Rolling window of ETTR per run and per cluster, which DDPGoodputLow judges ...
    goodput_window: str = "1h"
    #: ... and the longer rolling window of ETTR (the published anchors use an hour and a day).
    goodput_long_window: str = "1d"
    #: How far back the Goodput dashboard ranks the nodes that cost runs the most time.
    goodput_node_window: str = "7d"
    #: Evaluation interval of the goodput records (rolling windows of hours need no more).
    goodput_interval: str = "1m"
    #: DDPGoodputLow: productive time below this share of the run's unplanned time (its wall
    #: clock less startup and declared sections, which their own alerts judge) ...
    goodput_min_ettr: float = 0.85
    #: ... over ``goodput_window``, for this long; judged only once the window holds at least
    #: this share of its length in unplanned time (a run's first minutes, or a window spent in
    #: declared sections, are not judged on a few seconds of jitter).
    goodput_for: str = "15m"
    goodput_min_evidence: float = 0.5

    def validate(self) -> None:
        """Refuse empty windows, a long window no longer than the short one, shares out of range."""
        check_durations(
            self,
            ("goodput_window", "goodput_long_window", "goodput_node_window", "goodput_interval"),
            positive=True,
        )
        check_durations(self, ("goodput_for",))
        if duration_seconds(self.goodput_long_window) <= duration_seconds(self.goodput_window):
            raise ValueError("goodput_long_window must be longer than goodput_window")
        if not 0 < self.goodput_min_ettr < 1:
            raise ValueError(f"goodput_min_ettr must be in (0, 1): {self.goodput_min_ettr}")
        if not 0 < self.goodput_min_evidence <= 1:
            raise ValueError(f"goodput_min_evidence must be in (0, 1]: {self.goodput_min_evidence}")
