"""Judge the run-time probe: which link or which node does not carry traffic, and say so.

The probe (:mod:`exporter.network.probe`) is planned per node: failures live between machines,
and every rank of a node talks to its peers through the same interface, so one rank per node
(the lowest that has a listener) tries one rank of every other node (ring neighbours beyond
:data:`exporter.network.reach.REACH_ALL_MAX` nodes). Who failed against whom is judged as the
doctor judges it (:func:`exporter.network.reach.unreachable`): a node that more than half of
its triers, and at least two, cannot reach is *down* (its firewall, its NIC, its cable), and
its own failed attempts are its, not its peers'; what fails between two nodes that both reach
the others is their *link*. With two nodes there is no third to tell which end is broken:
that is a link too.

The findings become the verdict's lines (:func:`lines`), the abort line's reason
(:func:`reason`), the nodes the action and the ledger name (:func:`blamed_nodes`) and the
series of ``ddp_hang_network_info`` (:func:`series`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping

from . import reach as reaching
from .findings import LinkFault, Network, NodeFault, ProbeRequest, ProbeResult
from .probe import MOVE_S, PAYLOAD_BYTES

__all__ = [
    "MAX_LINKS",
    "blamed_nodes",
    "confirm",
    "details",
    "judge",
    "lines",
    "plan",
    "reason",
    "series",
    "series_text",
]

#: Links named at most (a network that fails between most pairs is named by its count).
MAX_LINKS = 8

#: How a failure reads, by kind.
_HOW = (
    ("dropped", "connections time out (dropped)"),
    ("refused", "connections refused"),
    ("unreachable", "no route to the address (unreachable)"),
    ("unresolved", "its address does not resolve"),
    ("stalled", f"connects but cannot move {PAYLOAD_BYTES // 1024} KiB in {MOVE_S:g} s (stalled)"),
    ("reset", "connections reset"),
)


def _how(kind: str) -> str:
    return next((text for k, text in _HOW if k == kind), kind)


def plan(
    nodes: Mapping[int, str], addresses: Mapping[int, str]
) -> tuple[dict[int, str], dict[int, tuple[int, ...]]]:
    """Return who takes part (``{rank: address}``) and whom each tries (``{rank: ranks}``).

    One rank per node, the lowest with a listener; nodes in name order; each tries every
    other node's rank, or its ring neighbours beyond ``REACH_ALL_MAX`` nodes.
    """
    first: dict[str, int] = {}
    for rank in sorted(addresses):
        if addresses[rank] and nodes.get(rank):
            first.setdefault(nodes[rank], rank)
    order = [first[n] for n in sorted(first)]
    peers = {rank: addresses[rank] for rank in order}
    targets = {
        order[i]: tuple(order[j] for j in reaching.reach_targets(i, len(order)))
        for i in range(len(order))
    }
    return peers, targets


def judge(
    request: ProbeRequest,
    results: Mapping[int, ProbeResult | None],
    nodes: Mapping[int, str],
) -> Network:
    """Judge one round: the nodes that are down, the links between the rest, the silent ones.

    ``results`` holds every rank of the plan (None: no result for this round in time),
    ``nodes`` the node of every rank.
    """
    order = sorted(request.plan, key=lambda r: nodes.get(r, ""))
    index = {rank: i for i, rank in enumerate(order)}
    name = {i: nodes.get(rank, f"rank {rank}") for rank, i in index.items()}
    failed: dict[int, dict[int, str]] = {}
    times: list[tuple[float, str, str]] = []
    pairs: set[tuple[int, int]] = set()
    silent = []
    for rank in order:
        got = results.get(rank)
        if got is None or got.round != request.round or got.error:
            silent.append(name[index[rank]])
            continue
        mine: dict[int, str] = {}
        for peer, found in got.reached.items():
            if peer not in index:
                continue
            i, j = index[rank], index[peer]
            pairs.add((min(i, j), max(i, j)))
            if found.kind == "ok":
                times.append((found.seconds, name[i], name[j]))
            else:
                mine[j] = found.kind
        failed[index[rank]] = mine
    count = len(order)
    down = _down(failed, count)
    links: dict[tuple[int, int], str] = {}
    for i, mine in failed.items():
        for j, kind in mine.items():
            if i not in down and j not in down:
                links.setdefault((min(i, j), max(i, j)), kind)
    against = reaching.failed_against(failed, set(failed))
    slowest = max(times, default=None)
    return Network(
        request.pg,
        request.seq,
        time.time(),
        nodes=count,
        pairs=len(pairs),
        links=tuple(LinkFault(name[i], name[j], kind) for (i, j), kind in sorted(links.items())),
        down=tuple(NodeFault(name[i], _common(against[i]), len(against[i])) for i in sorted(down)),
        silent=tuple(silent),
        slowest=None if slowest is None else (slowest[1], slowest[2], round(slowest[0], 4)),
        median_s=round(statistics.median(t for t, _, _ in times), 4) if times else None,
    )


def _down(failed: Mapping[int, Mapping[int, str]], count: int) -> set[int]:
    """Return the nodes that are down: unreachable by the doctor's judgement, from at least two
    triers (with one, nothing tells the node from the link)."""
    blamed = reaching.unreachable(failed, count)
    against = reaching.failed_against(failed, set(failed) - blamed)
    return {i for i in blamed if len(against.get(i, {})) >= 2}


def _common(kinds: Mapping[int, str]) -> str:
    """Return the most common way the attempts against one node failed."""
    values = list(kinds.values())
    return max(sorted(set(values)), key=values.count) if values else "dropped"


def confirm(first: Network, second: Network) -> Network:
    """Return ``second`` keeping only the faults ``first`` found too (a fault must hold twice)."""
    links = {(f.a, f.b) for f in first.links}
    down = {f.node for f in first.down}
    return Network(
        second.pg,
        second.seq,
        second.probed_unix,
        second.nodes,
        second.pairs,
        tuple(f for f in second.links if (f.a, f.b) in links),
        tuple(f for f in second.down if f.node in down),
        second.silent,
        second.slowest,
        second.median_s,
        second.note,
    )


def blamed_nodes(network: Network | None) -> list[str]:
    """Return the nodes the finding names: down ones, then both ends of each broken link."""
    if network is None:
        return []
    out = [f.node for f in network.down]
    for f in network.links:
        out += [n for n in (f.a, f.b) if n not in out]
    return out


def series(network: Network | None) -> list[tuple[str, str, str]]:
    """Return ``(finding, node, peer_node)`` for ``ddp_hang_network_info``: a down node, a
    broken link (its two nodes), or ``clear`` (every pair answered)."""
    if network is None or network.note:
        return []
    out = [("node", f.node, "") for f in network.down]
    out += [("link", f.a, f.b) for f in network.links[:MAX_LINKS]]
    if not out and not network.silent and network.pairs:
        out.append(("clear", "", ""))
    return out


def series_text(found: list[tuple[str, str, str]]) -> str:
    """Return what ``ddp_hang_network_info``'s series say, in one phrase (``""``: nothing)."""
    parts = [
        f"node {node} unreachable on its backend address"
        for what, node, _ in found
        if what == "node"
    ]
    parts += [
        f"the link between node {node} and node {peer} carries no traffic"
        for what, node, peer in found
        if what == "link"
    ]
    if not parts and any(what == "clear" for what, _, _ in found):
        parts.append("every pair of nodes reachable and moving data: not the network")
    return "; ".join(parts)


def reason(network: Network | None) -> str | None:
    """Return the abort line's reason for a hang with nobody behind (None: nothing named)."""
    if network is None or not network.faulty:
        return None
    parts = [f"node {f.node} unreachable on its backend address ({f.how})" for f in network.down]
    parts += [
        f"the link between node {f.a} and node {f.b} carries no traffic ({f.how})"
        for f in network.links[:MAX_LINKS]
    ]
    return "; ".join(parts)


def lines(network: Network) -> list[str]:
    """Return the verdict's lines about the network: what is broken, or that nothing is."""
    if network.note:
        return [network.note]
    out = []
    for d in network.down:
        out.append(
            f"node {d.node}: unreachable from every peer on its backend address: {_how(d.how)} "
            f"from {d.tried_by} node{'s' if d.tried_by != 1 else ''}"
        )
    for k in network.links[:MAX_LINKS]:
        out.append(
            f"link between node {k.a} and node {k.b}: {_how(k.how)}; both reach their other peers"
            if network.nodes > 2
            else f"link between node {k.a} and node {k.b}: {_how(k.how)} (two nodes: nothing "
            "tells which end is broken)"
        )
    if len(network.links) > MAX_LINKS:
        out.append(f"... and {len(network.links) - MAX_LINKS} more broken links")
    for n in network.silent:
        out.append(f"node {n}: its probe gave no result in time")
    if not out:
        median = f", median {network.median_s * 1e3:.1f} ms" if network.median_s else ""
        out.append(
            f"every pair of the {network.nodes} nodes reachable and moving data "
            f"({network.pairs} pairs, {PAYLOAD_BYTES // 1024} KiB each way{median}): not the "
            "network"
        )
    return out


def details(network: Network) -> list[str]:
    """Return the verdict's NETWORK section: what was probed, how fast, what it found."""
    if network.note:
        return [network.note]
    when = time.strftime("%H:%M:%S UTC", time.gmtime(network.probed_unix))
    head = (
        f"{network.nodes} nodes, {network.pairs} pairs of nodes tried at {when}, "
        f"{PAYLOAD_BYTES // 1024} KiB each way"
    )
    if network.median_s is not None:
        head += f"; median {network.median_s * 1e3:.1f} ms"
    if network.slowest is not None:
        a, b, seconds = network.slowest
        head += f", slowest {a} <-> {b} {seconds * 1e3:.1f} ms"
    return [head, *lines(network)]
