"""Hold what ``top`` knows of one rank: :class:`RankRow`, and the counters it differences."""

from __future__ import annotations

from dataclasses import dataclass, field

from ... import catalog as c

__all__ = ["COUNTERS", "RankRow"]


@dataclass
class RankRow:
    """What one rank says, reduced to the figures ``top`` shows."""

    target: str
    rank: int = -1
    up: bool = False
    #: Why its endpoint could not be read (``up`` False), in a few words.
    error: str = ""
    # Totals since the rank started (counters as read).
    steps: float = 0.0
    step_sum: float = 0.0
    phase_sum: dict[str, float] = field(default_factory=dict)
    coll_sum: float = 0.0
    coll_count: float = 0.0
    # Per process group: last enqueued sequence number, oldest in-flight age, timeout.
    pg_seq: dict[str, float] = field(default_factory=dict)
    #: Per process group: last completed sequence number.
    pg_done: dict[str, float] = field(default_factory=dict)
    pg_age: dict[str, float] = field(default_factory=dict)
    pg_timeout: dict[str, float] = field(default_factory=dict)
    heartbeat: float = 0.0
    #: The last store heartbeat's round trip, seconds (-1: not published).
    store_rtt: float = -1.0
    #: The machine the rank runs on (``ddp_rank_info``'s node).
    node: str = ""
    memory: float = 0.0
    #: The rank's GPU (``ddp_rank_gpu_info``'s index), its SM clock in Hz (0: not published)
    #: and the slowdown reasons holding its clocks down.
    gpu_index: str = ""
    gpu_clock: float = 0.0
    gpu_slowdown: list[str] = field(default_factory=list)
    #: Declared sections running on the rank: name -> (Unix start, deadline seconds).
    sections: dict[str, tuple[float, float]] = field(default_factory=dict)
    section_deadline: dict[str, float] = field(default_factory=dict)
    #: Unix end of the rank's last section run that ended within its deadline (0: none).
    section_ended: float = 0.0
    #: Unix time the rank ended cleanly (0: it has not).
    finished: float = 0.0
    #: Its clean end was read from its heartbeat's end mark by the monitoring rank (its own
    #: final scrapes were gone before this top read it): ``finished`` is that read's time.
    ended_mark: bool = False
    #: The run's size, from ``ddp_rank_info`` (0: not read).
    world_size: int = 0
    #: On the monitoring rank: each peer's heartbeat age it publishes (peers that ended are
    #: left out), and how many ranks ended cleanly (-1: not the monitoring rank, or no
    #: heartbeat).
    peer_ages: dict[int, float] = field(default_factory=dict)
    peers_ended: int = -1
    #: Its endpoint closed in the read where its peers ended cleanly, before its own end was
    #: read: it ended with them (``finished`` is theirs).
    with_peers: bool = False
    #: Which attempt of the run the rank is (torchrun's restart, Slurm's requeue count).
    attempt: str = ""
    #: Monitoring rank with on_hang="abort": aborts in a row without progress, their limit
    #: (-1: not published) and the aborted attempts ``(attempt, culprit rank, node, step)``.
    abort_streak: float = -1.0
    abort_limit: float = -1.0
    aborted_attempts: list[tuple[str, str, str, float]] = field(default_factory=list)
    #: Monitoring rank during a hang with nobody behind: what the probe between the nodes
    #: found, ``(finding, node, peer_node)`` (``ddp_hang_network_info``).
    network: list[tuple[str, str, str]] = field(default_factory=list)
    #: Increases over a window, when the source computed them (Prometheus); None: diagnose()
    #: takes the difference to the previous read.
    window: dict[str, float] | None = None
    #: The Unix time the read's figures end at, and (Prometheus) the length of their window:
    #: a read from endpoints covers the time since the previous read.
    read_at: float = 0.0
    window_s: float = 0.0
    # Derived by diagnose():
    step_time: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)
    coll_latency: float = 0.0
    seq_lag: float = 0.0
    #: What this read alone suggests ("down", "behind", "stuck", "straggler:<phase>"); an
    #: accusation needs the same suspicion in the previous read too.
    suspect: str = ""
    #: ``read_at`` of the first read of the consecutive reads holding this suspicion.
    suspect_since: float = 0.0
    verdict: str = ""
    note: str = ""

    def in_section(self, now: float) -> str:
        """Return a declared section the rank runs within its deadline at ``now``, else ""."""
        for name, (started, deadline) in sorted(self.sections.items()):
            if now - started <= deadline:
                return name
        return ""

    @property
    def enqueued(self) -> float:
        """Return the highest last-enqueued sequence number over process groups."""
        return max(self.pg_seq.values(), default=0.0)

    @property
    def inflight_age(self) -> float:
        """Return the oldest in-flight age over process groups."""
        return max(self.pg_age.values(), default=0.0)

    @property
    def timeout(self) -> float:
        """Return the largest collective timeout over process groups."""
        return max(self.pg_timeout.values(), default=0.0)


#: Cumulative samples whose increase gives the per-step figures.
COUNTERS = (
    c.STEPS.name,
    c.STEP_DURATION.name + "_sum",
    c.STEP_PHASE.name + "_sum",
    c.COLLECTIVE_DURATION.name + "_sum",
    c.COLLECTIVE_DURATION.name + "_count",
)
