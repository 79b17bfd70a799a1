"""Hold the ``for`` durations: how long a condition must hold before its alert fires."""

from __future__ import annotations

from dataclasses import dataclass

from .domain import Domain, check_durations

__all__ = ["ForConfig"]


@dataclass(frozen=True)
class ForConfig(Domain):
    """Say how long each alert of the training loop waits before it fires."""

    TITLE = "for durations: how long a condition must hold before its alert fires"

    #: DDPRankStraggler.
    straggler_for: str = "5m"
    #: DDPInputBound.
    input_bound_for: str = "10m"
    #: DDPCollectiveStalled.
    stalled_for: str = "1m"
    #: DDPCollectiveTimeoutImminent.
    timeout_for: str = "15s"
    #: DDPRankDown.
    rank_down_for: str = "1m"
    #: DDPTrainingStalled.
    training_stalled_for: str = "5m"
    #: DDPTrainingStalled, for a rank that has not completed a step in its attempt: how long it
    #: runs without one (a checkpoint load, a first step's torch.compile) before it counts as
    #: stalled; the alert's own ``training_stalled_for`` comes on top.
    training_startup_for: str = "30m"
    #: DDPGPUMemoryNearLimit.
    gpu_memory_for: str = "5m"
    #: DDPThroughputDrop.
    throughput_for: str = "10m"
    #: DDPInitStuck.
    init_stuck_for: str = "1m"

    def validate(self) -> None:
        """Refuse a ``for`` that is no duration (zero is fine: the alert fires at once)."""
        check_durations(
            self,
            (
                "straggler_for",
                "input_bound_for",
                "stalled_for",
                "timeout_for",
                "rank_down_for",
                "training_stalled_for",
                "gpu_memory_for",
                "throughput_for",
                "init_stuck_for",
            ),
        )
        check_durations(self, ("training_startup_for",), positive=True)
