"""Name every key the exporter writes into a c10d store, in one place.

Every key starts with ``ddp_exporter/``, the run and the attempt, so concurrent jobs sharing a
store (torchrun's agent store, a Slurm job's rank 0) never read each other's keys, and a
restarted attempt of a run never reads what its predecessor left in a store that outlived it.
Heartbeats, discovery and hang watching of one attempt share one :class:`Keys`; the init watch
beats under its own (:func:`for_init`); the doctor has its prefix per launch attempt.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PREFIX", "Keys", "doctor_prefix", "for_init", "for_run"]

PREFIX = "ddp_exporter"


@dataclass(frozen=True)
class Keys:
    """The store keys of one attempt of a run (or of its init watch)."""

    #: Every key of this attempt starts with it.
    prefix: str

    def heartbeat(self, rank: int) -> str:
        """Return the key holding ``rank``'s heartbeat counter."""
        return f"{self.prefix}/hb/{rank}"

    def sd(self) -> str:
        """Return the key the ranks append their discovery registrations to."""
        return f"{self.prefix}/sd"

    def episode(self) -> str:
        """Return the hang-episode counter (bumped by the monitoring rank only)."""
        return f"{self.prefix}/fx/episode"

    def request(self) -> str:
        """Return the key of the latest dump request."""
        return f"{self.prefix}/fx/request"

    def report(self, rank: int) -> str:
        """Return ``rank``'s in-flight report, read by the monitoring rank's hang watcher."""
        return f"{self.prefix}/fx/report/{rank}"

    def ack(self, rank: int) -> str:
        """Return ``rank``'s answer to the latest dump request (its summary)."""
        return f"{self.prefix}/fx/ack/{rank}"

    def action(self) -> str:
        """Return the key of the hang action decided (by the monitoring rank only)."""
        return f"{self.prefix}/fx/action"

    def leaving(self, rank: int) -> str:
        """Return the key ``rank`` sets once it published the action and is ready to exit."""
        return f"{self.prefix}/fx/leaving/{rank}"

    def leave(self) -> str:
        """Return the key the monitoring rank sets when every rank may exit."""
        return f"{self.prefix}/fx/leave"

    def probe(self) -> str:
        """Return the run-time probe's round counter (bumped by the monitoring rank only)."""
        return f"{self.prefix}/fx/probe"

    def probe_request(self) -> str:
        """Return the key of the latest probe request."""
        return f"{self.prefix}/fx/probe/request"

    def probe_result(self, rank: int) -> str:
        """Return ``rank``'s answer to the latest probe request."""
        return f"{self.prefix}/fx/probe/result/{rank}"


def for_run(run: str, attempt: str = "0") -> Keys:
    """Return the keys of one attempt of ``run`` while it trains."""
    return Keys(f"{PREFIX}/{run}/attempt/{attempt}")


def for_init(run: str, attempt: str = "0") -> Keys:
    """Return the keys the init watch of one attempt of ``run`` beats under."""
    return Keys(f"{PREFIX}/{run}/init/{attempt}")


def doctor_prefix(attempt: str) -> str:
    """Return the prefix of every key ``ddp-exporter doctor`` uses in one launch attempt."""
    return f"{PREFIX}/doctor/{attempt}/"
