"""Measure discovery at scale: registration cost per rank and the ``/sd`` answer over HTTP.

For ``--ranks`` ranks (default 4096) it starts a real TCPStore server on loopback, connects
``--clients`` store clients (as many ranks share a node's connections to the store here; each
real rank has its own), and registers every rank through :func:`exporter.export.discovery.register`
with a counting wrapper that counts every store call. Then it builds the monitoring rank's
:class:`exporter.export.discovery.Discovery` over the same store (one ``get`` of all registrations),
mounts its ``/sd`` on a real :class:`exporter.export.server.MetricsServer` on loopback and GETs it
``--requests`` times per encoding on fresh connections, as Prometheus's http_sd refresh does.
Last, a real Prometheus (when installed) is pointed at that ``/sd`` and timed until it lists
every rank as an active target.

    python benchmarks/sd.py
    python benchmarks/sd.py --ranks 1024 --requests 50
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "tests"))

import torch.distributed as dist  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402

from exporter import storekeys  # noqa: E402
from exporter.errors import ErrorCounter  # noqa: E402
from exporter.export import discovery  # noqa: E402
from exporter.export.server import MetricsServer  # noqa: E402

GOAL_MS = 100.0
RANKS_PER_NODE = 8


class CountingStore:
    """Forward to a real store, counting the calls by method."""

    def __init__(self, store: dist.Store) -> None:
        self.store = store
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str):
        method = getattr(self.store, name)

        def counted(*args, **kwargs):
            self.calls[name] = self.calls.get(name, 0) + 1
            return method(*args, **kwargs)

        return counted


def _labels(run: str, rank: int) -> dict[str, str]:
    return {
        "run": run,
        "rank": str(rank),
        "local_rank": str(rank % RANKS_PER_NODE),
        "node": f"gpu-node-{rank // RANKS_PER_NODE:04d}",
    }


def _get(url: str, gzipped: bool) -> tuple[float, int, bytes]:
    headers = {"Accept-Encoding": "gzip"} if gzipped else {}
    t0 = time.perf_counter()
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
        body = r.read()
    ms = (time.perf_counter() - t0) * 1e3
    return ms, len(body), gzip.decompress(body) if gzipped else body


def _stats(xs: list[float]) -> str:
    xs = sorted(xs)
    p90 = xs[min(len(xs) - 1, int(0.9 * len(xs)))]
    return f"median {statistics.median(xs):.2f} ms, p90 {p90:.2f}, max {xs[-1]:.2f}"


def _prometheus_discovers(url: str, ranks: int, workdir: str) -> float:
    """Start a real Prometheus with ``url`` as its only http_sd; return seconds to see all.

    The targets are unroutable addresses: Prometheus's first scrape of each is spread over
    the hour-long interval, so discovery is measured, not scraping.
    """
    from pathlib import Path

    import promstack

    config = {
        "scrape_configs": [
            {
                "job_name": "ddp",
                "honor_labels": True,
                "scrape_interval": "1h",
                "http_sd_configs": [{"url": url, "refresh_interval": "5s"}],
            }
        ]
    }
    with promstack.run_prometheus(Path(workdir), config, timeout=120) as prom:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 120:
            active = prom.api("targets", state="active")["activeTargets"]
            if len(active) >= ranks:
                elapsed = time.perf_counter() - t0
                last = max(active, key=lambda t: int(t["labels"]["rank"]))
                assert last["labels"]["rank"] == str(ranks - 1), last
                assert {"run", "local_rank", "node"} <= set(last["labels"]), last
                return elapsed
            time.sleep(0.2)
    raise RuntimeError(f"Prometheus did not discover {ranks} targets in 120 s")


def main(argv: list[str] | None = None) -> int:
    """Run the measurement and print the figures; exit 1 when a goal is missed."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=4096)
    p.add_argument("--clients", type=int, default=16, help="store client connections")
    p.add_argument("--requests", type=int, default=100, help="GETs of /sd per encoding")
    p.add_argument(
        "--no-prometheus", action="store_true", help="skip the real Prometheus discovery step"
    )
    args = p.parse_args(argv)
    run = "bench-sd-4096"
    keys = storekeys.for_run(run)

    server_store = dist.TCPStore("127.0.0.1", 0, -1, True, wait_for_workers=False)
    clients = [
        CountingStore(dist.TCPStore("127.0.0.1", server_store.port, -1, False))
        for _ in range(args.clients)
    ]
    reg_times = []
    t_all = time.perf_counter()
    for rank in range(args.ranks):
        store = clients[rank % len(clients)]
        target = f"10.{rank // 65536}.{rank // 256 % 256}.{rank % 256}:{19400 + rank % 8}"
        t0 = time.perf_counter()
        discovery.register(store, keys, target, _labels(run, rank))
        reg_times.append((time.perf_counter() - t0) * 1e3)
    t_all = time.perf_counter() - t_all
    calls: dict[str, int] = {}
    for c in clients:
        for name, n in c.calls.items():
            calls[name] = calls.get(name, 0) + n
    writes_per_rank = sum(calls.values()) / args.ranks
    print(f"registration: {args.ranks} ranks through {args.clients} TCPStore clients")
    print(f"  store calls: {calls} -> {writes_per_rank:g} per rank")
    print(f"  per registration (one round trip): {_stats(reg_times)}; all: {t_all:.2f} s")
    raw = server_store.get(keys.sd())
    print(f"  store value: {len(raw) / 1024:.0f} KiB for {args.ranks} records")

    errors = ErrorCounter()
    monitor_store = CountingStore(dist.TCPStore("127.0.0.1", server_store.port, -1, False))
    t0 = time.perf_counter()
    found = discovery.Discovery(
        store=monitor_store,
        keys=keys,
        run=run,
        rank=0,
        local_rank=0,
        world_size=args.ranks,
        host="10.0.0.0",
        port=19400,
        monitor=True,
        errors=errors,
    )
    first_ms = (time.perf_counter() - t0) * 1e3
    assert found.directory is not None and found.directory.complete
    reads = dict(monitor_store.calls)
    full, idle = [], []
    for _ in range(10):
        fresh = discovery.Directory(monitor_store, keys, args.ranks, errors)
        t0 = time.perf_counter()
        fresh.refresh()
        full.append((time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter()
        fresh.refresh()
        idle.append((time.perf_counter() - t0) * 1e3)
    print(f"monitoring rank: start (register, create key, first read) {first_ms:.1f} ms; store")
    print(f"  calls {reads}; complete={found.directory.complete}")
    print(f"  read of all {args.ranks} (get + parse + JSON + gzip): {_stats(full)}")
    print(f"  read that finds nothing new (get only): {_stats(idle)}")

    server = MetricsServer(CollectorRegistry(), "127.0.0.1", 0)
    port = server.start()
    server.route("/sd", found.sd_app)
    url = f"http://127.0.0.1:{port}/sd"
    worst = 0.0
    try:
        for gzipped in (False, True):
            times, size, body = [], 0, b""
            for _ in range(args.requests):
                ms, size, body = _get(url, gzipped)
                times.append(ms)
            groups = json.loads(body)
            assert len(groups) == args.ranks, len(groups)
            assert groups[-1]["labels"]["rank"] == str(args.ranks - 1)
            label = "gzip" if gzipped else "identity"
            print(
                f"GET /sd ({label}): {len(groups)} targets, {size / 1024:.0f} KiB; {_stats(times)}"
            )
            worst = max(worst, statistics.median(times))
        if not args.no_prometheus and shutil.which("prometheus"):
            with tempfile.TemporaryDirectory() as workdir:
                seconds = _prometheus_discovers(url, args.ranks, workdir)
            print(f"real Prometheus (http_sd, refresh 5s): all {args.ranks} targets active in")
            print(f"  {seconds:.1f} s after it was ready, with run/rank/local_rank/node labels")
    finally:
        server.close()
        found.close()
    ok = worst < GOAL_MS and writes_per_rank == 1
    print(f"verdict: {'ok' if ok else 'MISSED'} (goal: /sd < {GOAL_MS:.0f} ms, 1 write per rank)")
    print(f"sd_median_ms={worst:.2f} writes_per_rank={writes_per_rank:g}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
