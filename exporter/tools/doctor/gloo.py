"""The one collective the doctor runs: a tiny gloo ``all_reduce`` with every rank, and on
``--links`` the bandwidth between nodes measured in the same group.

The group is formed through the doctor's own prefix on the job's store, bounded by a step's
deadline (a rank that cannot connect fails its check instead of hanging the others). Rank 0
judges the measured pairs (:mod:`exporter.network.links`) into a check per node.
"""

from __future__ import annotations

import datetime
import json
import socket
import time
from dataclasses import asdict
from typing import Any

from ...network import links
from .board import Board
from .checks import FAIL, FIX_GLOO, OK, Check, Deadline, Report, bounded

__all__ = ["all_reduce", "judge_links"]


def all_reduce(board: Board, rank: int, world: int, dl: Deadline, links_mib: float) -> Check:
    """Run the gloo all_reduce with every rank; measure the links after it on ``links_mib``."""
    import torch
    import torch.distributed as dist

    seconds = dl.step()

    def run() -> float:
        dist.init_process_group(
            "gloo",
            store=dist.PrefixStore(board.prefix + "pg", board.store),
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=seconds),
        )
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)
        return float(t.item())

    t0 = time.monotonic()
    finished, value = bounded(run, seconds + 1)
    if finished and value == world * (world + 1) / 2:
        took = time.monotonic() - t0
        if links_mib > 0:
            _measure_links(board, rank, dl, links_mib, dist)
        bounded(dist.destroy_process_group, 2.0)
        return Check(OK, f"all_reduce in {took * 1e3:.0f} ms")
    if finished:
        return Check(FAIL, f"all_reduce returned {value}", FIX_GLOO)
    first = str(value).splitlines()[0] if str(value) else type(value).__name__
    return Check(FAIL, f"gloo all_reduce: {first}", FIX_GLOO)


def _measure_links(board: Board, rank: int, dl: Deadline, mib: float, dist: Any) -> None:
    """Measure the links between nodes in the live group; publish this rank's pairs."""

    def run() -> list[links.Pair]:
        hosts: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(hosts, socket.gethostname())
        return links.measure(dist, dist.get_rank(), hosts, mib)

    finished, value = bounded(run, dl.left())
    if finished and isinstance(value, list):
        board.publish(f"links/{rank}", json.dumps([asdict(p) for p in value]))
    else:
        first = str(value).splitlines()[0] if str(value) else "no result in time"
        board.publish(f"links/{rank}", json.dumps({"error": first}))


def judge_links(
    board: Board, reports: list[Report], notes: list[str], until: float, timeout: float, mib: float
) -> None:
    """Collect every rank's measured pairs; name the node whose links are slow."""
    pairs: list[links.Pair] = []
    errors: dict[int | None, str] = {}
    for rep in reports:
        got = board.wait(f"links/{rep.rank}", until)
        found = json.loads(got) if got else {"error": f"no result within {timeout:.0f} s"}
        if isinstance(found, dict):
            errors[rep.rank] = found["error"]
        else:
            pairs += [links.Pair(**p) for p in found]
    slow = links.judge(pairs)
    # The ranks that measured for their node (every rank reported: the gloo group ran).
    first_on = links.representatives([r.host for r in sorted(reports, key=lambda r: r.rank or 0)])
    for rep in reports:
        if rep.rank in errors:
            rep.checks.links = Check(FAIL, f"links: {errors[rep.rank]}", FIX_GLOO)
        elif rep.host in slow and first_on[rep.host] == rep.rank:
            rep.checks.links = Check(
                FAIL,
                f"{rep.host}: {slow[rep.host]}",
                f"check {rep.host}'s NIC (negotiated speed, errors: ethtool, ip -s link), its "
                "cable and switch port, and other traffic on it; drain it until it is fixed",
            )
        else:
            rep.checks.links = Check(OK)
    if pairs:
        notes.extend(links.render(pairs, mib))
    nodes = len({r.host for r in reports})
    if nodes == 2:
        notes.append(
            "links: 2 nodes, one pair: no third node to tell which end is slow (run with a "
            "healthy third node to name it)"
        )
    elif nodes < 2:
        notes.append("links: one node: no link between nodes to measure")
