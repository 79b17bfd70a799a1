"""Compare the ranks' reports on rank 0: duplicates, world sizes, versions, who reaches whom."""

from __future__ import annotations

import collections

from ...network import netcheck, reach
from .checks import (
    FAIL,
    FIX_GLOO,
    FIX_LAUNCHER,
    FIX_VERSIONS,
    OK,
    VERSION_KEYS,
    Check,
    Report,
    made_and_failed,
    ranks_text,
)

__all__ = ["compare", "judge_reach", "reach_targets"]


def compare(reports: list[Report], world_size: int) -> tuple[list[Report | int], list[str]]:
    """Check the ranks against each other; return table rows (an int: a missing rank) and notes.

    Adds failures to the reports in place: duplicate ranks, another world size, version skew
    (the odd ranks are those that differ from the most common value, rank 0's on a tie).
    """
    notes: list[str] = []
    by_rank: dict[int, list[Report]] = collections.defaultdict(list)
    for rep in reports:
        if rep.rank is not None:
            by_rank[rep.rank].append(rep)
    for rank, reps in by_rank.items():
        if len(reps) > 1:
            who = ", ".join(f"{r.host} pid {r.pid}" for r in reps)
            for rep in reps:
                rep.checks.env = Check(
                    FAIL, f"RANK={rank} claimed by {len(reps)} processes ({who})", FIX_LAUNCHER
                )
    for rep in reports:
        if rep.world_size != world_size:
            rep.checks.env = Check(
                FAIL, f"WORLD_SIZE={rep.world_size} here, {world_size} on rank 0", FIX_LAUNCHER
            )
    locals_ = collections.defaultdict(list)
    for rep in reports:
        locals_[(rep.host, rep.local_rank)].append(rep)
    for (host, local), reps in locals_.items():
        if len(reps) > 1 and not any(made_and_failed(r.checks.env) for r in reps):
            for rep in reps:
                rep.checks.env = Check(
                    FAIL,
                    f"LOCAL_RANK={local} shared by ranks "
                    f"{ranks_text([r.rank for r in reps])} on {host}",
                    FIX_LAUNCHER,
                )
    for key in VERSION_KEYS:
        seen = collections.Counter(rep.versions.get(key, "?") for rep in reports)
        if len(seen) < 2:
            continue
        rank0 = next((r.versions.get(key, "?") for r in reports if r.rank == 0), "?")
        top = max(seen.values())
        common = rank0 if seen.get(rank0) == top else seen.most_common(1)[0][0]
        groups: dict[str, list[int | None]] = collections.defaultdict(list)
        for rep in reports:
            groups[rep.versions.get(key, "?")].append(rep.rank)
        odd = "; ".join(
            f"{ranks_text(rs)} {'has' if len(rs) == 1 else 'have'} {v}"
            for v, rs in sorted(groups.items())
            if v != common
        )
        rest = groups[common]
        note = f"{key} differs: {odd}, {ranks_text(rest)} {'has' if len(rest) == 1 else 'have'} {common}"
        notes.append(f"version skew: {note}")
        for rep in reports:
            if rep.versions.get(key, "?") != common:
                detail = f"{key} {rep.versions.get(key, '?')}, not {common} like {ranks_text(rest)}"
                old = rep.checks.versions
                if old is not None and old.failed:
                    detail = f"{old.detail}; {detail}"
                rep.checks.versions = Check(FAIL, detail, FIX_VERSIONS)
    rows: list[Report | int] = []
    for rank in range(world_size):
        rows.extend(by_rank.get(rank) or [rank])
    rows.extend(r for r in reports if r.rank is None or not 0 <= r.rank < world_size)
    return rows, notes


def reach_targets(rank: int, world: int) -> list[int]:
    """Return the ranks ``rank`` tries to connect to: every other, or its ring neighbours."""
    return reach.reach_targets(rank, world)


def judge_reach(
    reports: list[Report], failed: dict[int, dict[int, str]], world: int
) -> tuple[dict[int, Check], list[str]]:
    """Name the ranks the others cannot reach on their gloo address; return checks and notes.

    ``failed`` maps each rank that tried to ``{peer: how it failed}``. A rank is to blame when
    more than half of the ranks that tried it failed: a firewall that drops gloo's ports on
    its node, or a GLOO_SOCKET_IFNAME the other nodes have no route to. The judgement is the
    run-time probe's too (:func:`exporter.network.reach.unreachable`): the worst-reached rank
    is blamed first and its own attempts then no longer count (a node that drops everything
    fails towards everyone), so a rank whose attempts failed only towards ranks to blame is
    fine.
    """
    by_rank = {r.rank: r for r in reports if r.rank is not None}
    blamed = reach.unreachable(failed, world)
    against = reach.failed_against(failed, set(failed))  # every rank that tried, for the detail
    checks: dict[int, Check] = {}
    notes: list[str] = []
    for rank in sorted(by_rank):
        rep = by_rank[rank]
        if rank not in failed:
            checks[rank] = Check(FAIL, "no result within the deadline", FIX_GLOO)
        elif rank in blamed:
            who, kinds = against[rank], sorted(set(against[rank].values()))
            detail = (
                f"its gloo address {rep.reach} ({rep.reach_why}) on {rep.host} is not reachable "
                f"from {ranks_text(sorted(who))} ({', '.join(kinds)})"
            )
            if netcheck.is_loopback(rep.reach.rpartition(":")[0]):
                fix = (
                    f"gloo on {rep.host} advertises a loopback address ({rep.reach_why}): map "
                    f"the hostname to {rep.host}'s network address (/etc/hosts) or set "
                    "GLOO_SOCKET_IFNAME to the interface the nodes share"
                )
            elif rep.reach_why.startswith("GLOO_SOCKET_IFNAME"):
                fix = (
                    f"set GLOO_SOCKET_IFNAME on {rep.host} to the interface the nodes share "
                    "(the one routing to MASTER_ADDR), or unset it"
                )
            else:
                fix = (
                    f"{rep.host} drops connections on ports other than MASTER_PORT: gloo connects "
                    "on ephemeral ports, so open TCP between the nodes on every port (its "
                    "firewall, a security group)"
                )
            checks[rank] = Check(FAIL, detail, fix)
        elif set(failed[rank]) - blamed:
            lost = sorted(set(failed[rank]) - blamed)
            checks[rank] = Check(
                FAIL, f"cannot reach {ranks_text(lost)} on their gloo addresses", FIX_GLOO
            )
        else:
            checks[rank] = Check(OK)
    if blamed:
        names = ", ".join(f"rank {r} on {by_rank[r].host}" for r in sorted(blamed) if r in by_rank)
        notes.append(f"reach: the other ranks cannot connect to {names}")
    return checks, notes
