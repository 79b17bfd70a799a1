"""Judge who reaches whom: which members to try, and which one the others cannot reach.

One judgement for two callers: ``ddp-exporter doctor`` (ranks, before a job) and the hang
watcher's run-time probe (nodes, while every rank waits in a collective,
:mod:`exporter.network.probe`). A member is anything that listens and tries its peers: a rank, or a
node. Failures live between machines, and a member that drops everything fails towards every
peer as well as from them; so the worst-reached member is blamed first, and its own attempts
then no longer count: its victims are not confused with it.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping

__all__ = ["REACH_ALL_MAX", "REACH_NEIGHBOURS", "failed_against", "reach_targets", "unreachable"]

#: Largest group in which every member tries every other; beyond, each its ring neighbours.
REACH_ALL_MAX = 64
#: Ring neighbours tried on each side beyond :data:`REACH_ALL_MAX` members.
REACH_NEIGHBOURS = 4


def reach_targets(member: int, count: int) -> list[int]:
    """Return the members ``member`` tries to connect to: every other, or its ring neighbours."""
    if count <= REACH_ALL_MAX:
        return [m for m in range(count) if m != member]
    near = {(member + d) % count for d in range(-REACH_NEIGHBOURS, REACH_NEIGHBOURS + 1)}
    return sorted(near - {member})


def failed_against(
    failed: Mapping[int, Mapping[int, str]], triers: set[int]
) -> dict[int, dict[int, str]]:
    """Return ``{peer: {member that failed to reach it: how}}`` over ``triers``' attempts."""
    out: dict[int, dict[int, str]] = collections.defaultdict(dict)
    for member in triers:
        for peer, kind in failed[member].items():
            out[int(peer)][member] = kind
    return out


def unreachable(failed: Mapping[int, Mapping[int, str]], count: int) -> set[int]:
    """Return the members the others cannot reach, worst-reached first removed from the triers.

    ``failed`` maps each member that tried (and reported) to ``{peer: how it failed}``; the
    peers it reached are absent. A member is blamed when more than half of the members that
    tried it (and are not blamed themselves) failed; the worst-reached one is blamed first and
    its own attempts then no longer count, so a member whose attempts failed only towards
    blamed members is fine.
    """
    blamed: set[int] = set()
    while True:
        triers = set(failed) - blamed
        tried = collections.Counter(p for m in triers for p in reach_targets(m, count))
        against = failed_against(failed, triers)
        worst = max(
            (p for p, who in against.items() if p not in blamed and len(who) * 2 > tried[p]),
            key=lambda p: (len(against[p]) / tried[p], -p),
            default=None,
        )
        if worst is None:
            return blamed
        blamed.add(worst)
