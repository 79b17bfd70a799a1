"""Decide when a collective is hung and which ranks are to blame: the one definition.

``ddp-exporter top`` (from endpoints or from Prometheus), the generated alert rules and the
hang watcher (:mod:`exporter.hangs.watcher`) all read these thresholds and this logic, so they
never disagree.

A collective is *stalled* when some rank of the process group has had it in flight for longer
than :meth:`HangPolicy.stall_seconds`: the larger of a floor and a multiple of the run's normal
collective latency. While that holds, every rank whose last enqueued sequence number is below
the group's maximum is *behind*: it never entered the collective the others wait in (the hung
rank). Ranks are read milliseconds apart, so on a live job sequence numbers differ by one or two
all the time; without an in-flight age past the threshold, a lag means nothing. A rank that is
itself stuck inside a collective past half the threshold (readings are taken moments apart),
in this group or any other, is waiting, not behind: either its reading is older than the
others' (it has since left the collective they all passed), or every rank is stuck in
collectives and the one that launched fewer is no culprit, or (a 2-D mesh) it waits in one
group for the culprit and so never enters the next collective of its other group.

When no rank is behind, the stalled ranks are *waiting* (the alerts say ``role="waiting"``); once
every rank of the group has sat inside a collective for longer than
:meth:`HangPolicy.symmetric_seconds` the hang is *symmetric* (nobody is behind, everybody waits:
the network, the device or the backend, or ranks that entered the collectives of two groups in
opposite orders, each waiting in the one the others have not entered), which is when the
watcher dumps for it. Before that, while every rank sits in a collective past the stall
threshold, the watcher probes the links between the nodes (:mod:`exporter.hangs.probing`).

A job has edges. A rank inside a declared section (``exporter.deadline``) within its deadline
is not hung: it is saving a checkpoint or evaluating, and the ranks waiting for it in a
collective are not hung either. Such a rank is *excused* rather than behind; a stall whose
ranks behind are all excused (or, with nobody behind, whose ranks are all inside sections) is
of kind ``section`` and accuses nobody. Once the section passes its deadline it no longer
excuses (DDPSectionOverdue names it, and the rank is behind again).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["DEFAULT_POLICY", "HangFinding", "HangPolicy", "SeqState", "find_hangs"]


@dataclass(frozen=True)
class HangPolicy:
    """Thresholds of the hang definition (the mixin's config carries the same numbers)."""

    #: In-flight age above this multiple of the run's normal collective latency is a stall ...
    stall_latency_factor: float = 20.0
    #: ... provided it also exceeds this many seconds (the bound when no latency is known).
    stall_min_seconds: float = 10.0
    #: A symmetric hang (every rank inside the same collective) needs this multiple ...
    symmetric_latency_factor: float = 50.0
    #: ... and at least this many seconds ...
    symmetric_min_seconds: float = 60.0
    #: ... but is declared no later than this share of the process group's timeout.
    symmetric_timeout_share: float = 0.25

    def __post_init__(self) -> None:
        """Reject thresholds that would make every collective a hang."""
        for name in ("stall_latency_factor", "stall_min_seconds", "symmetric_latency_factor"):
            if not getattr(self, name) > 0:
                raise ValueError(f"HangPolicy.{name} must be positive")
        if not 0 < self.symmetric_timeout_share <= 1:
            raise ValueError("HangPolicy.symmetric_timeout_share must be in (0, 1]")

    def stall_seconds(self, normal_latency: float | None) -> float:
        """Return the in-flight age past which a collective is stalled."""
        if normal_latency is not None and normal_latency > 0:
            return max(self.stall_min_seconds, self.stall_latency_factor * normal_latency)
        return self.stall_min_seconds

    def symmetric_seconds(self, normal_latency: float | None, timeout: float | None) -> float:
        """Return the in-flight age past which a hang with no rank behind is declared."""
        bound = max(
            self.symmetric_min_seconds, self.symmetric_latency_factor * (normal_latency or 0)
        )
        if timeout is not None and timeout > 0:
            bound = min(bound, self.symmetric_timeout_share * timeout)
        return bound


#: The thresholds the committed rules, ``top`` and the hang watcher use.
DEFAULT_POLICY = HangPolicy()


@dataclass(frozen=True)
class SeqState:
    """What one rank reports about one process group."""

    rank: int
    pg: str
    last_enqueued: float
    inflight_age: float
    timeout: float | None = None
    #: The rank is inside a declared section within its deadline.
    in_section: bool = False


@dataclass(frozen=True)
class HangFinding:
    """One stalled process group: who is behind, who waits, since how long."""

    pg: str
    #: "behind" (some ranks never entered), "waiting" (stalled, nobody behind), "symmetric"
    #: (nobody behind and every rank inside the collective past the symmetric threshold) or
    #: "section" (the ranks that hold it up are inside declared sections: nobody is accused).
    kind: str
    #: The highest sequence number any rank of the group entered.
    seq: float
    #: Ranks that never entered collective ``seq`` (empty for a symmetric hang).
    behind: tuple[int, ...]
    #: Ranks stuck inside the collective for longer than ``threshold``.
    waiting: tuple[int, ...]
    #: Oldest in-flight age in the group, seconds.
    age: float
    #: The in-flight age that made it a hang, seconds.
    threshold: float
    #: Ranks that hold the collective up from inside a declared section (not accused).
    excused: tuple[int, ...] = ()


def find_hangs(
    states: Iterable[SeqState],
    normal_latency: float | None = None,
    policy: HangPolicy = DEFAULT_POLICY,
) -> list[HangFinding]:
    """Return one finding per stalled process group, by pg name; an empty list when healthy.

    ``states`` holds one entry per (live) rank and process group; ``normal_latency`` is the
    run's normal collective latency in seconds (None when not known yet).
    """
    groups: dict[str, list[SeqState]] = {}
    for s in states:
        groups.setdefault(s.pg, []).append(s)
    stall = policy.stall_seconds(normal_latency)
    # A rank stuck inside a collective of any group waits; it is behind nowhere. In a 2-D mesh
    # (HSDP) the rank that waits in its shard group for the culprit never enters the next
    # collective of its replicate group, whose other ranks then wait for it: a victim.
    # Half the threshold: ranks are read moments apart, so in a deadlock across two groups a
    # rank's older reading can show it short of the threshold while the others' show them past.
    stuck = {s.rank for s in states if s.inflight_age > stall / 2}
    # How long each rank has sat inside a collective, of any group: in a deadlock across two
    # groups every rank waits, each in the group the others have not entered.
    inside: dict[int, float] = {}
    for s in states:
        inside[s.rank] = max(inside.get(s.rank, 0.0), s.inflight_age)
    out = []
    for pg in sorted(groups):
        ranks = groups[pg]
        age = max(s.inflight_age for s in ranks)
        if age <= stall:
            continue
        top = max(s.last_enqueued for s in ranks)
        late = [s for s in ranks if s.last_enqueued < top and s.rank not in stuck]
        behind = tuple(sorted(s.rank for s in late if not s.in_section))
        excused = tuple(sorted(s.rank for s in late if s.in_section))
        waiting = tuple(sorted(s.rank for s in ranks if s.inflight_age > stall))
        if behind:
            out.append(HangFinding(pg, "behind", top, behind, waiting, age, stall, excused))
            continue
        if excused or all(s.in_section for s in ranks):
            excused = excused or tuple(sorted(s.rank for s in ranks))
            out.append(HangFinding(pg, "section", top, (), waiting, age, stall, excused))
            continue
        timeout = min((s.timeout for s in ranks if s.timeout), default=None)
        symmetric = policy.symmetric_seconds(normal_latency, timeout)
        if min(inside[s.rank] for s in ranks) > symmetric:
            out.append(HangFinding(pg, "symmetric", top, (), waiting, age, symmetric))
        else:
            out.append(HangFinding(pg, "waiting", top, (), waiting, age, stall))
    return out
