"""Hold the sharded deployment: past one Prometheus, shards under a global server.

The deployment itself is :mod:`exporter.deploy.sharding`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from .domain import Domain, check_durations

__all__ = ["ShardConfig"]


@dataclass(frozen=True)
class ShardConfig(Domain):
    """Say how many shards split the runs and how the global server reads them."""

    TITLE = "past one Prometheus: shards under a global server (exporter.deploy.sharding)"

    #: Prometheus shards the generated sharded deployment (deploy/sharded/) splits runs over.
    shards: int = 2
    #: Job name of the global server's federation scrape of the shards.
    federate_job: str = "ddp-federate"
    #: DDPShardDown: how long the global server may fail to read a shard.
    shard_down_for: str = "2m"

    def validate(self) -> None:
        """Refuse a shard count outside 1..1024 and a ``for`` that is no duration."""
        check_durations(self, ("shard_down_for",))
        if not 1 <= int(self.shards) <= 1024:
            raise ValueError(f"shards must be in 1..1024: {self.shards}")
