"""Count the wait of ranks a declared section held up from the section's end, not before.

While a rank is inside a declared section within its deadline, the ranks waiting for it in a
collective are not hung (:mod:`exporter.hangs.definition`, kind ``section``). Once it leaves,
their collective has already been in flight for the whole section: judged by that age, a rank
that works a few seconds more before it reaches the collective (a DataLoader starting its
workers again, a log upload) would be behind a collective stalled for minutes, and the hang
action, which waits for the same age, would end a healthy job at once. So the monitoring rank
remembers, per process group, the last read in which a section held it up, and counts every
in-flight age in that group from then: a rank that never comes after its section is named one
stall threshold after it, and the action waits its own time from there too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from .definition import HangFinding, SeqState

__all__ = ["HeldUp", "held_up"]


def held_up(states: Iterable[SeqState], findings: Iterable[HangFinding]) -> set[str]:
    """Return the process groups a declared section holds up in one read.

    A group is held up where its finding is of kind ``section``, or where every rank that has
    not entered the collective the others have is inside a section (a section shorter than the
    stall threshold: no finding yet) or inside a collective of a group a section holds up (a
    2-D mesh: the rank waiting in its shard group for the section's rank never enters its
    replicate group's next collective, whose other ranks then wait for it). Not where a rank is
    behind: a real hang beside a section is judged as it is.
    """
    states = list(states)
    found = {f.pg: f.kind for f in findings}
    groups: dict[str, list[SeqState]] = {}
    for s in states:
        groups.setdefault(s.pg, []).append(s)
    late = {}
    for pg, ranks in groups.items():
        top = max(s.last_enqueued for s in ranks)
        late[pg] = [s for s in ranks if s.last_enqueued < top]
    held = {pg for pg, kind in found.items() if kind == "section"}
    grew = True
    while grew:
        inside = {s.rank for s in states if s.pg in held and s.inflight_age > 0}
        grown = {
            pg
            for pg, ranks in late.items()
            if pg not in held
            and ranks
            and found.get(pg) != "behind"
            and all(s.in_section or s.rank in inside for s in ranks)
        }
        held |= grown
        grew = bool(grown)
    return held


class HeldUp:
    """The process groups a declared section held up lately, and since when they wait again."""

    def __init__(self) -> None:
        #: Process group -> time of the last read in which a section held it up, on the
        #: caller's clock (the monitoring rank's monotonic clock, the read time of ``top``).
        self._until: dict[str, float] = {}
        #: The groups whose finding in the last noted read is of kind ``section``.
        self._sections: set[str] = set()

    def note(
        self, states: Iterable[SeqState], findings: Iterable[HangFinding], now: float
    ) -> set[str]:
        """Remember the groups a section holds up in this read (:func:`held_up`); return them."""
        findings = list(findings)
        held = held_up(states, findings)
        for pg in held:
            self._until[pg] = now
        self._sections = {f.pg for f in findings if f.kind == "section"}
        return held

    def ages_from_end(self, states: list[SeqState], now: float) -> list[SeqState]:
        """Return ``states`` with the in-flight ages of held-up groups counted from the end.

        Call it after :meth:`note` of the same read. A group whose finding in that read is of
        kind ``section`` keeps its ages: the definition excuses it already, and its finding
        names the section. A group is forgotten once none of its collectives in flight predates
        the section's end.
        """
        if not self._until.keys() - self._sections:
            return states
        oldest: dict[str, float] = {}
        for s in states:
            oldest[s.pg] = max(oldest.get(s.pg, 0.0), s.inflight_age)
        for pg, until in list(self._until.items()):
            if oldest.get(pg, 0.0) <= now - until:
                del self._until[pg]
        capped = self._until.keys() - self._sections
        if not capped:
            return states
        return [
            dataclasses.replace(s, inflight_age=self.age(s.pg, s.inflight_age, now))
            if s.pg in capped
            else s
            for s in states
        ]

    def age(self, pg: str, age: float, now: float) -> float:
        """Return an in-flight ``age`` of group ``pg`` counted from its section's end."""
        until = self._until.get(pg)
        return age if until is None else min(age, max(0.0, now - until))
