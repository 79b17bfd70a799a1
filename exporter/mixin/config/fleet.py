"""Hold the fleet rules' memory: which node keeps being the culprit across runs.

The rules themselves are :mod:`exporter.mixin.fleet`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...settings import duration_seconds
from .domain import Domain, check_durations

__all__ = ["FleetConfig"]


@dataclass(frozen=True)
class FleetConfig(Domain):
    """Say how long the fleet remembers runs and how often a node must be blamed to be suspect."""

    TITLE = "the fleet: which node keeps being the culprit across runs (exporter.mixin.fleet)"

    #: How long the fleet rules remember a run on a node and what it was blamed for.
    fleet_window: str = "7d"
    #: DDPSuspectNode: a node blamed in at least ``fleet_blamed_runs`` of its last
    #: ``fleet_runs`` distinct runs (within ``fleet_window``), each time with most of the run's
    #: other nodes not blamed.
    fleet_runs: int = 10
    #: (see ``fleet_runs``)
    fleet_blamed_runs: int = 3
    #: Evaluation interval of the fleet group. Its records carry their state from one
    #: evaluation to the next (cheap at any fleet size) ...
    fleet_interval: str = "1m"
    #: ... over at most this gap: a Prometheus outage longer than this forgets the fleet's
    #: history (the rules count again from then on).
    fleet_carry: str = "30m"
    #: How long a node must meet the definition before DDPSuspectNode fires.
    suspect_node_for: str = "15m"

    def validate(self) -> None:
        """Refuse windows that cannot carry the records' state, and impossible blame counts."""
        check_durations(self, ("fleet_window", "fleet_interval", "fleet_carry"), positive=True)
        check_durations(self, ("suspect_node_for",))
        if duration_seconds(self.fleet_carry) < 2 * duration_seconds(self.fleet_interval):
            # Each record reads its own previous value over fleet_carry: the window must reach
            # back past the group's last evaluation, with room for one that comes late.
            raise ValueError("fleet_carry must be at least twice fleet_interval")
        if duration_seconds(self.fleet_window) < duration_seconds(self.fleet_carry):
            raise ValueError("fleet_window must be at least fleet_carry")
        if not 1 <= int(self.fleet_blamed_runs) <= int(self.fleet_runs):
            raise ValueError("need 1 <= fleet_blamed_runs <= fleet_runs")
