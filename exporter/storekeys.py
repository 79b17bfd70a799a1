"""Name every key the exporter writes into a c10d store, in one place.

Every key starts with ``ddp_exporter/`` and, except the doctor's, with the run, so concurrent
jobs sharing a store (torchrun's agent store, a Slurm job's rank 0) never read each other's
keys. Heartbeats, discovery and hang forensics of one run share one namespace; the init watch
beats under its own namespace per torchrun attempt (:func:`init_run`).
"""

from __future__ import annotations

__all__ = [
    "PREFIX",
    "ack",
    "doctor_prefix",
    "episode",
    "heartbeat",
    "init_run",
    "report",
    "request",
    "sd",
]

PREFIX = "ddp_exporter"


def heartbeat(run: str, rank: int) -> str:
    """Return the key holding ``rank``'s heartbeat counter."""
    return f"{PREFIX}/{run}/hb/{rank}"


def init_run(run: str, attempt: str) -> str:
    """Return the ``run`` namespace the init watch of one torchrun attempt beats under."""
    return f"{run}/init/{attempt}"


def sd(run: str) -> str:
    """Return the key the ranks of ``run`` append their discovery registrations to."""
    return f"{PREFIX}/{run}/sd"


def episode(run: str) -> str:
    """Return the hang-episode counter of ``run`` (bumped by the monitoring rank only)."""
    return f"{PREFIX}/{run}/fx/episode"


def request(run: str) -> str:
    """Return the key of the latest dump request of ``run``."""
    return f"{PREFIX}/{run}/fx/request"


def report(run: str, rank: int) -> str:
    """Return ``rank``'s in-flight report, read by the monitoring rank's hang watcher."""
    return f"{PREFIX}/{run}/fx/report/{rank}"


def ack(run: str, rank: int) -> str:
    """Return ``rank``'s answer to the latest dump request (its summary)."""
    return f"{PREFIX}/{run}/fx/ack/{rank}"


def doctor_prefix(attempt: str) -> str:
    """Return the prefix of every key ``ddp-exporter doctor`` uses in one launch attempt."""
    return f"{PREFIX}/doctor/{attempt}/"
