"""Build the Liveness dashboard: is every rank alive and progressing?

Heartbeat ages, the monitoring rank's view of its peers (which survives a dead endpoint),
scrape health, the exporter's own errors, and what stops a rank without killing it: a hang's
location, a named section against its deadline.
"""

from __future__ import annotations

from ... import catalog, settings
from ..config import DEFAULT, MixinConfig
from ..prose import number_word
from ..recording import Recorded, recorded
from .panels import DashboardSpec, PanelSpec, Queries, Target

__all__ = ["LATE_AFTER_INTERVALS", "dashboard"]

#: After how many heartbeat intervals the monitoring rank publishes a peer of a large job as
#: late (exporter.sources.heartbeat.LATE_AFTER_INTERVALS, which this room may not import).
LATE_AFTER_INTERVALS = 3

_RANKS = "rank {{rank}}"


def dashboard(cfg: MixinConfig = DEFAULT) -> DashboardSpec:
    """Return the Liveness dashboard of ``cfg``."""
    q, r = Queries(cfg), recorded(cfg)
    return DashboardSpec(
        "liveness",
        "ddp-liveness",
        "DDP / Liveness",
        "Is every rank alive and progressing? Heartbeat ages, the monitoring rank's view of "
        "its peers (which survives a dead endpoint), and scrape health.",
        (*_alive(q, r), *_stopped(q)),
    )


def _alive(q: Queries, r: Recorded) -> tuple[PanelSpec, ...]:
    """Return the heartbeat ages, scrape health and the exporter's errors."""
    cfg = q.cfg
    rank = q.by("run, rank")
    peer = q.filtered(
        catalog.PEER_HEARTBEAT_AGE.name, cfg.selector, 'run=~"$run", peer_rank=~"$rank"'
    )
    late = number_word(LATE_AFTER_INTERVALS)
    return (
        PanelSpec(
            "Heartbeat age per rank (time since last progress)",
            (Target(f"time() - max {rank} ({q.series(catalog.HEARTBEAT)})", _RANKS),),
            description=(
                "Seconds since each rank last made progress (finished a step or "
                "collective), from its own endpoint."
            ),
            unit="s",
        ),
        PanelSpec(
            "Peer heartbeat age (seen by the monitoring rank)",
            (Target(f"max {q.by('run, peer_rank')} ({peer})", "rank {{peer_rank}}"),),
            unit="s",
            thresholds=(("green", None), ("red", cfg.heartbeat_stale_seconds)),
            description=(
                "Every peer in jobs of up to DDP_EXPORTER_PEER_SERIES "
                f"({settings.DEFAULT_PEER_SERIES}) ranks; in larger jobs only late peers "
                f"(silent for over {late} heartbeat intervals), so an empty panel is healthy."
            ),
        ),
        PanelSpec(
            "Scrape up per rank",
            (Target(f"max {rank} ({q.up()})", _RANKS),),
            description=(
                "1 when Prometheus scraped the rank's endpoint, 0 when the scrape failed "
                "(dead or unreachable rank)."
            ),
            min=0,
            max=1,
        ),
        PanelSpec(
            "Exporter errors/s",
            (
                # Recorded with only the places that have errors (32k zero series at 4096).
                Target(q.rec(r.errors_rate), "rank {{rank}} {{where}}"),
            ),
            description=(
                "Errors the exporter caught and counted, by place; training continues. "
                "Empty when there are none."
            ),
            unit="ops",
            needs="errors",
        ),
    )


def _stopped(q: Queries) -> tuple[PanelSpec, ...]:
    """Return the rank facts, a hang's location and the named sections against deadlines."""
    started = q.series(catalog.SECTION_STARTED)
    return (
        PanelSpec(
            "Rank info",
            (Target(q.series(catalog.RANK_INFO), _RANKS),),
            description=(
                "Static facts of each rank: node, local rank, world size, backend, device "
                "and versions."
            ),
            kind="table",
            width=24,
        ),
        PanelSpec(
            "Hang location (culprit of an open hang episode)",
            (Target(q.series(catalog.HANG_LOCATION), _RANKS),),
            kind="table",
            width=24,
            needs="hang",
            description=(
                "Where a rank that never entered a collective is stuck: the innermost frame "
                "of its training thread in user code, from its automatic hang dump. Empty "
                "while no hang is open. `ddp-exporter hangs DUMP_DIR` prints every rank's "
                "stack."
            ),
        ),
        PanelSpec(
            "Named sections: running time vs deadline",
            (
                Target(f"time() - {started}", "rank {{rank}} {{section}} running"),
                Target(
                    f"{q.series(catalog.SECTION_DEADLINE)}\n"
                    f"and {q.on('run, rank, section')}\n{started}",
                    "rank {{rank}} {{section}} deadline",
                ),
            ),
            unit="s",
            width=24,
            needs="sections",
            description=(
                "How long each running exporter.deadline() section has been running, "
                "against its deadline; DDPSectionOverdue fires when a line crosses its "
                "deadline. Empty while no section runs."
            ),
        ),
    )
