"""Measure the init watch of the monitoring rank of a large job, over a real TCPStore.

Hosts a TCPStore in process as torchrun's agent would, then starts rank 0's init watch for a
job of ``--world`` ranks (no process group: init never completes here). Reports how long
``watch_init()`` takes to return and to serve, how long the monitoring rank's check-in (one
``add`` per peer to create its counter, then one ``multi_get``) takes, and the scrape time and
series count of its endpoint with no peer arrived: the worst case, as every peer is late and
the arrival series are capped by ``peer_series`` (64 by default). With every peer arrived and
beating, no peer is late and only this rank's own 10 init series remain.

    python benchmarks/initwatch.py
    python benchmarks/initwatch.py --world 1024 --scrapes 50
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import urllib.request
from datetime import timedelta

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "tests"))

import torch.distributed as dist  # noqa: E402
from harness import free_port, parse, wait_for  # noqa: E402

from exporter import catalog, watch_init  # noqa: E402

INTERVAL_S = 0.2


def _scrape(url: str, n: int) -> tuple[float, int]:
    """Return the median scrape time (ms) over ``n`` fresh-connection GETs and the series."""
    times, body = [], b""
    for _ in range(n):
        t0 = time.perf_counter()
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = resp.read()
        times.append((time.perf_counter() - t0) * 1e3)
    series = sum(len(v) for v in parse(body.decode()).values())
    return statistics.median(times), series


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=4096)
    ap.add_argument("--scrapes", type=int, default=20)
    args = ap.parse_args()
    port = free_port()
    agent_store = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=60))
    os.environ.update(
        TORCHELASTIC_USE_AGENT_STORE="True",
        TORCHELASTIC_RESTART_COUNT="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE=str(args.world),
    )
    t0 = time.perf_counter()
    watch = watch_init(port=0, addr="127.0.0.1", run="bench", heartbeat_s=INTERVAL_S)
    returned = time.perf_counter() - t0
    url = f"http://127.0.0.1:{watch.port}/metrics"
    urllib.request.urlopen(url, timeout=10).read()
    serving = time.perf_counter() - t0
    wait_for(lambda: watch.heartbeat is not None, 120, "the check-in", interval=0.001)
    checked_in = time.perf_counter() - t0
    arrived = catalog.INIT_PEER_ARRIVED.name
    # Every peer but rank 0 is late after LATE_AFTER_INTERVALS intervals.
    wait_for(lambda: arrived in parse(urllib.request.urlopen(url).read().decode()), 30, "late")
    missing_ms, missing_series = _scrape(url, args.scrapes)
    watch.close()
    del agent_store  # the agent's store lives as long as the job
    print(f"init watch, monitoring rank of a {args.world}-rank job (peer_series 64)")
    print(f"  watch_init() returned in {returned * 1e3:.1f} ms, served in {serving * 1e3:.1f} ms")
    print(f"  check-in ({args.world} adds + 1 multi_get) done after {checked_in * 1e3:.0f} ms")
    print(f"  no peer arrived: scrape {missing_ms:.2f} ms, {missing_series} series")


if __name__ == "__main__":
    main()
