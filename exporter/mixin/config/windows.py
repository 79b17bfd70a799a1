"""Hold the rate windows of the rules: their lengths are part of the recording rules' names."""

from __future__ import annotations

from dataclasses import dataclass

from ...settings import duration_seconds
from .domain import Domain, check_durations

__all__ = ["WindowConfig"]


@dataclass(frozen=True)
class WindowConfig(Domain):
    """Say over how long the rules average, compare and remember."""

    TITLE = "rate windows (also part of recording-rule names)"

    #: Window of per-step means and step rates.
    rate_window: str = "1m"
    #: Window of the "normal" collective latency a stall is compared with.
    latency_window: str = "5m"
    #: How far back "recent past" reaches (throughput baseline, normal latency, vanished ranks).
    baseline_window: str = "30m"
    #: How long DDPHangAborted fires after the hang action ended a run, and how long DDPJobKilled
    #: gives such a run to come back (the launcher's restart) before it says the run is gone.
    hang_abort_window: str = "10m"
    #: How long DDPRestartLoop keeps firing after the last report of a run whose hang action
    #: stopped (the run is usually gone: nobody requeues it); at least ``baseline_window``, so
    #: that DDPJobKilled never calls such a run killed.
    restart_loop_window: str = "1h"

    def validate(self) -> None:
        """Refuse a window that is not positive, or a restart-loop window below the baseline."""
        check_durations(
            self,
            (
                "rate_window",
                "latency_window",
                "baseline_window",
                "hang_abort_window",
                "restart_loop_window",
            ),
            positive=True,
        )
        if duration_seconds(self.restart_loop_window) < duration_seconds(self.baseline_window):
            # A run given up must not be called killed once DDPRestartLoop resolves.
            raise ValueError("restart_loop_window must be at least baseline_window")
