"""Measure the links between a job's nodes pairwise over its backend, and name the slow one.

``ddp-exporter doctor --links`` runs :func:`measure` inside the doctor's gloo group: one rank
per node (the lowest rank on each host) exchanges ``mib`` MiB each way with every other node's,
one pair at a time per node (a round-robin schedule: every node is in at most one pair per
round, so a fast pair never shares a NIC with another transfer), after a few one-element ping
pongs for the round trip. A pair's bandwidth is its best of several transfers: on a fast link
one transfer takes a millisecond or two, so a single scheduling delay on a busy host (the job
itself runs beside the doctor) could make a healthy link look 3x slower; noise only ever slows
a transfer, so the fastest one is the link. The lower rank decides when to stop (after
``_REPEATS`` transfers spread over at least ``_SPAN_S``, a short pause between two, so that
they do not all fall inside one burst of the job's traffic; at most ``_REPEATS_MAX``; or once
the transfers took ``_BUDGET_S``, so a slow link is not measured for long) and tells its peer,
so both sides run the same exchanges. Every rank takes part in the barrier that ends each
round, so the rounds stay in step. The anchors: Meta GCM's ``check-nccl --pairwise``, NCCL tests.

:func:`judge` names a node whose *best* link is ``ratio`` times slower than the median node's
best: a degraded NIC or cable on that node slows every pair it is in, while a healthy node has
at least one fast pair. With two nodes there is no third to compare with: the pair's figures
are printed and nobody is blamed.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DEFAULT_MIB",
    "RATIO",
    "Pair",
    "judge",
    "measure",
    "render",
    "representatives",
    "rounds",
]

#: MiB each way per pair: long enough to fill a queue, short enough for a 20 Mbit/s link.
DEFAULT_MIB = 4.0
#: A node is slow when its best link is this many times slower than the median node's best.
RATIO = 3.0
_PINGS = 5
#: At least this many transfers per pair, the best one counted...
_REPEATS = 5
#: ...over at least this long: the job beside the doctor is busy in bursts, and on a loaded
#: host one burst outlasted a tenth of a second of a fast link's transfers (a healthy lab
#: node measured 4x below the median with every other core busy)...
_SPAN_S = 0.5
#: ...with this pause between two, so that a fast link's transfers spread over the span
#: instead of reaching the cap inside one burst...
_GAP_S = 0.01
#: ...at most this many...
_REPEATS_MAX = 50
#: ...and no more once they took this long together: a transfer this long is not noise.
_BUDGET_S = 1.0


@dataclass(frozen=True)
class Pair:
    """One measured link: its two nodes, its bandwidth (bytes/s, both ways) and round trip."""

    a: str
    b: str
    bytes_per_s: float
    rtt_s: float


def rounds(n: int) -> list[list[tuple[int, int]]]:
    """Return a round-robin schedule of every pair of ``n`` items, each in one pair per round."""
    items: list[int | None] = list(range(n)) + ([None] if n % 2 else [])
    m = len(items)
    out = []
    for _ in range(m - 1):
        pairs = [(items[i], items[m - 1 - i]) for i in range(m // 2)]
        out.append([(min(a, b), max(a, b)) for a, b in pairs if a is not None and b is not None])
        items = [items[0], items[-1], *items[1:-1]]  # the circle method: rotate all but the first
    return out


def representatives(hosts: Sequence[str]) -> dict[str, int]:
    """Return ``{host: the lowest rank on it}``, hosts in order of that rank (``hosts`` by rank)."""
    reps: dict[str, int] = {}
    for rank, host in enumerate(hosts):
        reps.setdefault(host, rank)
    return reps


def measure(dist: Any, rank: int, hosts: Sequence[str], mib: float = DEFAULT_MIB) -> list[Pair]:
    """Measure every pair of nodes in the current process group; return this rank's pairs.

    ``hosts`` is every rank's host, by rank (the same list on every rank). Only the lower rank
    of a pair returns it; every rank must call this (it joins each round's barrier).
    """
    import torch

    reps = representatives(hosts)
    nodes = list(reps)
    big = torch.ones(max(1, int(mib * 2**20) // 4), dtype=torch.float32)
    small = torch.zeros(1)
    mine: list[Pair] = []
    for pairs in rounds(len(nodes)):
        for i, j in pairs:
            lo, hi = reps[nodes[i]], reps[nodes[j]]
            if rank not in (lo, hi):
                continue
            peer = hi if rank == lo else lo
            trips = []
            for _ in range(_PINGS):
                t0 = time.perf_counter()
                _exchange(dist, rank == lo, peer, small)
                trips.append(time.perf_counter() - t0)
            best = _best_transfer(dist, rank == lo, peer, big, small)
            if rank == lo:
                moved = 2 * big.numel() * big.element_size()
                mine.append(Pair(nodes[i], nodes[j], moved / best, statistics.median(trips)))
        dist.barrier()
    return mine


def _best_transfer(dist: Any, first: bool, peer: int, big: Any, flag: Any) -> float:
    """Exchange ``big`` with ``peer`` until the first side says stop; return the fastest, s."""
    times: list[float] = []
    start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        _exchange(dist, first, peer, big)
        times.append(time.perf_counter() - t0)
        if first:
            spread = len(times) >= _REPEATS and time.perf_counter() - start >= _SPAN_S
            more = not spread and len(times) < _REPEATS_MAX and sum(times) < _BUDGET_S
            flag.fill_(1.0 if more else 0.0)
            dist.send(flag, peer)
            if more:
                time.sleep(_GAP_S)
        else:
            dist.recv(flag, peer)
            more = bool(flag.item())
        if not more:
            return min(times)


def _exchange(dist: Any, first: bool, peer: int, tensor: Any) -> None:
    """Send ``tensor`` to ``peer`` and receive it back (``first``), or receive then send."""
    if first:
        dist.send(tensor, peer)
        dist.recv(tensor, peer)
    else:
        dist.recv(tensor, peer)
        dist.send(tensor, peer)


def judge(pairs: Sequence[Pair], ratio: float = RATIO) -> dict[str, str]:
    """Return ``{node: why}`` for each node whose best link is ``ratio`` x below the median's."""
    best: dict[str, float] = {}
    for p in pairs:
        for node in (p.a, p.b):
            best[node] = max(best.get(node, 0.0), p.bytes_per_s)
    if len(best) < 3:
        return {}
    median = statistics.median(best.values())
    return {
        node: (
            f"its best link moves {_rate(bw)}, {median / bw:.0f}x below the median node's "
            f"{_rate(median)}"
        )
        for node, bw in sorted(best.items())
        if bw * ratio < median
    }


def render(pairs: Sequence[Pair], mib: float) -> list[str]:
    """Return one line per pair, slowest first, under a heading."""
    lines = [f"links (one rank per node, {mib:g} MiB each way over gloo, slowest first):"]
    width = max((len(p.a) + len(p.b) for p in pairs), default=0) + 5
    for p in sorted(pairs, key=lambda p: p.bytes_per_s):
        name = f"{p.a} <-> {p.b}"
        lines.append(f"  {name:<{width}} {_rate(p.bytes_per_s):>12}  rtt {p.rtt_s * 1e3:.2f} ms")
    return lines


def _rate(bytes_per_s: float) -> str:
    return f"{bytes_per_s / 1e6:.1f} MB/s" if bytes_per_s < 1e9 else f"{bytes_per_s / 1e9:.2f} GB/s"
