"""Hold the thresholds that make a rank a straggler, a collective stalled, a GPU at its limit."""

from __future__ import annotations

from dataclasses import dataclass

from ...hangs.definition import DEFAULT_POLICY, HangPolicy
from .domain import Domain, check_durations, check_number

__all__ = ["ThresholdConfig"]


@dataclass(frozen=True)
class ThresholdConfig(Domain):
    """Say how far from normal a rank, a collective, a GPU or the step rate may drift."""

    TITLE = "thresholds"

    #: A rank is a straggler when its compute (or data) time per step exceeds this multiple of
    #: the run's median over ranks ...
    straggler_ratio: float = 1.5
    #: ... and exceeds the median by at least this many seconds per step (ignores tiny phases).
    straggler_min_excess_seconds: float = 0.02
    #: A rank's link is slow (DDPRankStraggler cause=link) when its median c10d-store round
    #: trip exceeds this multiple of the run's median ...
    link_rtt_ratio: float = 5.0
    #: ... and this many seconds (a loopback or LAN round trip is well under a millisecond) ...
    link_min_rtt_seconds: float = 0.01
    #: ... while more than this share of its step is exposed communication (the job waits).
    link_comm_share: float = 0.3
    #: Share of a rank's step spent waiting for data that makes it input-bound.
    input_bound_share: float = 0.4
    #: In-flight age above this multiple of the run's normal collective latency is a stall ...
    #: (the one hang definition, :mod:`exporter.hangs.definition`, shared with ``top`` and the
    #: hang watcher)
    stall_latency_factor: float = DEFAULT_POLICY.stall_latency_factor
    #: ... provided it also exceeds this many seconds (and this is the bound when no latency
    #: baseline exists yet).
    stall_min_seconds: float = DEFAULT_POLICY.stall_min_seconds
    #: In-flight age as a fraction of the collective timeout: warning and critical levels.
    timeout_warning_ratio: float = 0.5
    #: ... (DDPCollectiveTimeoutImminent warns at the first, is critical at the second).
    timeout_critical_ratio: float = 0.8
    #: Peer heartbeat age (seen by the monitoring rank) after which a rank counts as down.
    heartbeat_stale_seconds: float = 60.0
    #: GPU reserved memory as a fraction of total that raises DDPGPUMemoryNearLimit.
    gpu_memory_ratio: float = 0.92
    #: A straggler's GPU is throttled (DDPGPUThrottledStraggler reason=low_clock) when its SM
    #: clock runs below this fraction of the run's median.
    gpu_clock_ratio: float = 0.85
    #: How long DDPGPUError fires after a GPU's Xid event, uncorrectable ECC error or failed
    #: row remap (the window its counters are read over).
    gpu_error_window: str = "15m"
    #: Steps/s below this fraction of the rank's average over ``baseline_window`` is a drop.
    throughput_drop_ratio: float = 0.5
    #: Seconds a rank may spend between exporter.watch_init() and its process group existing
    #: before DDPInitStuck names it (or, when peers never checked in, names those peers).
    init_stuck_seconds: float = 300.0

    def validate(self) -> None:
        """Refuse a number out of its meaning's range, an empty GPU error window, inverted
        timeout levels and a bad hang definition."""
        # A multiple of the run's median below 1 would accuse half the ranks.
        for name in ("straggler_ratio", "link_rtt_ratio"):
            check_number(self, name, 1.0)
        for name in ("straggler_min_excess_seconds", "link_min_rtt_seconds"):
            check_number(self, name, 0.0)
        for name in (
            "stall_latency_factor",
            "stall_min_seconds",
            "heartbeat_stale_seconds",
            "init_stuck_seconds",
        ):
            check_number(self, name, 0.0, above=True)
        # Shares of a step, of a GPU's memory or clock, of the step rate.
        check_number(self, "link_comm_share", 0.0, 1.0, below=True)
        for name in ("input_bound_share", "gpu_clock_ratio", "throughput_drop_ratio"):
            check_number(self, name, 0.0, 1.0, above=True, below=True)
        check_number(self, "gpu_memory_ratio", 0.0, 1.0, above=True)
        check_durations(self, ("gpu_error_window",), positive=True)
        if not 0 < self.timeout_warning_ratio < self.timeout_critical_ratio <= 1:
            raise ValueError("need 0 < timeout_warning_ratio < timeout_critical_ratio <= 1")
        self.hang_policy  # noqa: B018 - validates the stall thresholds

    @property
    def hang_policy(self) -> HangPolicy:
        """Return the hang definition these rules encode (``top`` and the hang watcher use it too)."""
        return HangPolicy(
            stall_latency_factor=self.stall_latency_factor,
            stall_min_seconds=self.stall_min_seconds,
        )
