"""Name what the ranks of a run exchange about a hang, as frozen, typed values.

Every rank *reports* its in-flight state; the monitoring rank publishes a *dump request*; every
rank answers with an *ack* carrying its *summary*; the monitoring rank completes the *episode*
(written as ``episode.json``) and, with ``on_hang="abort"``, publishes the *action*, which
carries the run's *ledger* (:mod:`exporter.hangs.restarts`). A rank's dump file holds its
captured *state*. While every rank waits in a collective, the monitoring rank publishes a
*probe request*; each rank it names tries its peers' probe addresses and answers with a *probe
result*; the monitoring rank judges them into a *network* finding (those values are the
network's own, :mod:`exporter.network.findings`), which the episode and the action carry.

These classes know nothing of JSON: :mod:`exporter.hangs.codec` is the one place that knows the
keys they travel under, through the c10d store and in the files. The rest of
:mod:`exporter.hangs` reads attributes, which a type checker follows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..network.findings import LinkFault, Network, NodeFault, PeerReach, ProbeRequest, ProbeResult

__all__ = [
    "Ack",
    "Action",
    "DumpRequest",
    "Episode",
    "FlightEntry",
    "Frame",
    "InflightOp",
    "LedgerEntry",
    "LinkFault",
    "Located",
    "Network",
    "NodeFault",
    "PeerReach",
    "PgReport",
    "PgSeqs",
    "ProbeRequest",
    "ProbeResult",
    "RankDump",
    "RankState",
    "Report",
    "Summary",
    "ThreadStack",
]


@dataclass(frozen=True)
class Frame:
    """One frame of a Python stack, outermost first in a list."""

    file: str
    line: int | None
    function: str
    #: The source line (full dumps only; summaries carry no code).
    code: str | None = None


@dataclass(frozen=True)
class ThreadStack:
    """One thread of a rank's dump: its name, role and stack."""

    name: str
    ident: int | None
    daemon: bool | None
    #: The thread that runs the training loop (the one that called ``exporter.instrument()``).
    training: bool
    #: The hang watcher's own thread.
    exporter: bool
    frames: tuple[Frame, ...]


@dataclass(frozen=True)
class FlightEntry:
    """One collective the Flight Recorder knows of (:func:`exporter.sources.flight.entries_report`)."""

    op: str
    seq: int
    pg: str
    pg_desc: str = ""
    state: str = ""
    input_sizes: Any = None
    frames: tuple[Frame, ...] = ()


@dataclass(frozen=True)
class PgSeqs:
    """The last sequence numbers one rank enqueued and completed in one process group."""

    last_enqueued: int
    last_completed: int


@dataclass(frozen=True)
class RankState:
    """What :func:`exporter.hangs.capture.capture_state` reads of one rank."""

    time_unix: float
    errors: tuple[str, ...]
    #: Every thread, the training thread first.
    threads: tuple[ThreadStack, ...]
    #: The Flight Recorder's report, as :mod:`exporter.sources.flight` gives it (opaque here:
    #: :mod:`exporter.hangs.codec` reads it).
    flight_recorder: Mapping[str, Any]
    #: What the training thread does (:func:`exporter.hangs.capture.phase`; None: not said).
    phase: str | None
    step: int | None = None
    #: Sequence numbers per process group (None: not read).
    seqs: Mapping[str, PgSeqs] | None = None


@dataclass(frozen=True)
class PgReport:
    """What one rank reports about one process group, every interval."""

    pg: str
    #: Last sequence number enqueued (a number as read: an int from the sources).
    last_enqueued: float
    #: Age of the oldest collective in flight, seconds (0: none).
    inflight_age_s: float
    timeout_s: float | None
    #: Last sequence number completed (None from a report that did not say).
    last_completed: float | None = None


@dataclass(frozen=True)
class Report:
    """One rank's report, read by the monitoring rank."""

    #: The reporting rank's tick (changes at each full tick: the report is alive).
    tick: int
    pgs: tuple[PgReport, ...]
    #: Mean collective latency since the last full tick, seconds (None before the first).
    latency_s: float | None
    #: Inside a declared section within its deadline (or just out of one): excused.
    in_section: bool
    #: Ended cleanly: neither behind nor waiting.
    finished: bool
    #: Steps this rank completed in this attempt.
    steps: int


@dataclass(frozen=True)
class DumpRequest:
    """The monitoring rank's request that every rank dump its state: one hang episode."""

    episode: int
    pg: str
    #: ``behind`` or ``symmetric`` (:class:`exporter.hangs.definition.HangFinding`).
    kind: str
    seq: float
    behind: tuple[int, ...] = ()
    waiting: tuple[int, ...] = ()
    age: float = 0.0
    threshold: float = 0.0
    requested_unix: float = 0.0


@dataclass(frozen=True)
class InflightOp:
    """A collective one rank has in flight, as its summary carries it."""

    op: str
    seq: int
    pg: str
    pg_desc: str = ""
    #: The Flight Recorder's state of it (``scheduled``, ``started``; ``""``: not said).
    state: str = ""


@dataclass(frozen=True)
class Summary:
    """The short form of a rank's dump that travels through the store in its ack."""

    rank: int
    step: int | None = None
    phase: str | None = None
    #: The training thread's innermost frames, outermost first.
    frames: tuple[Frame, ...] = ()
    #: The innermost frame in the user's code (else the innermost one; None without frames).
    where: Frame | None = None
    inflight: tuple[InflightOp, ...] = ()
    seqs: Mapping[str, PgSeqs] = field(default_factory=dict)
    errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class Ack:
    """One rank's answer to the latest request (at start: episode 0, its node only)."""

    episode: int
    node: str
    summary: Summary | None = None
    #: Where this rank's probe listener accepts its peers, ``ip:port`` (``""``: none).
    probe: str = ""


@dataclass(frozen=True)
class RankDump:
    """One rank's dump file (``rank-N.json``): its state, who it is, what it answered."""

    state: RankState
    episode: int
    run: str | None
    rank: int
    world_size: int | None
    host: str
    node: str
    pid: int
    request: DumpRequest
    summary: Summary | None = None


@dataclass(frozen=True)
class Located:
    """Where a culprit that answered is stuck (the verdict's, for the action and tools)."""

    rank: int
    op: str
    seq: float
    pg: str
    file: str
    line: int | None
    function: str


@dataclass(frozen=True)
class LedgerEntry:
    """One attempt of a run whose hang reached the action (:mod:`exporter.hangs.restarts`)."""

    run: str | None
    attempt: int
    episode: int
    #: ``abort``, ``give_up`` or ``decline``.
    decision: str
    exit_code: int | None
    progress: bool
    #: Aborts in a row without progress, this one included.
    streak: int
    #: The furthest step the attempt reached.
    furthest: int
    steps: int
    start_step: int | None
    culprits: tuple[int, ...]
    nodes: tuple[str, ...]
    folder: str
    decided_unix: float


@dataclass(frozen=True)
class Action:
    """What the monitoring rank decided for an episode (:mod:`exporter.hangs.action`)."""

    #: ``abort`` (every rank exits) or ``none`` (declined).
    action: str
    #: ``abort``, ``give_up`` (the last abort) or ``decline``.
    decision: str
    episode: int
    run: str | None
    attempt: str
    pg: str
    seq: float
    kind: str
    culprits: tuple[int, ...]
    #: The node of each culprit (``""`` when it never said).
    nodes: tuple[str, ...]
    #: ``file:line in function`` of the first located culprit.
    where: str | None
    folder: str
    age_s: float
    due_s: float
    certain: bool
    exit_code: int
    streak: int
    limit: int
    decided_unix: float
    #: The run's ledger, this attempt's entry last (set once judged).
    ledger: tuple[LedgerEntry, ...] | None = None
    #: What the run-time probe named for a hang with nobody behind (None: nothing).
    network: str | None = None


@dataclass(frozen=True)
class Episode:
    """A hang episode: its request, then who answered and what they said (``episode.json``)."""

    request: DumpRequest
    run: str | None = None
    world_size: int | None = None
    answered: tuple[int, ...] = ()
    missing: tuple[int, ...] = ()
    #: Node of the ranks a verdict may name (behind, or silent), from their acks.
    nodes: Mapping[int, str] = field(default_factory=dict)
    #: Last sequence number each rank reported in the episode's process group.
    last_enqueued: Mapping[int, float] = field(default_factory=dict)
    complete_unix: float | None = None
    #: Every rank's summary, None for a rank that did not answer (None: not collected yet).
    summaries: Mapping[int, Summary | None] | None = None
    #: What the hang action did (None: nothing).
    action: Action | None = None
    #: The attempt the episode belongs to (only while the action is planned).
    attempt: str | None = None
    #: Read from one node's dump files, without the monitoring rank's ``episode.json``.
    local_only: bool = False
    #: What the run-time probe found while every rank waited (None: no probe).
    network: Network | None = None
    #: What NCCL's RAS reported as wrong while the episode was collected (NCCL only).
    ras: tuple[str, ...] = ()
