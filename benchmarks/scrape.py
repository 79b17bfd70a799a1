"""Time real HTTP scrapes of an instrumented rank's /metrics; report size and series count.

Starts the demo trainer (``exporter.tools.trainer``) with torchrun, waits for ``--min-steps`` steps, then
GETs /metrics ``--scrapes`` times per rank as Prometheus would (the OpenMetrics and the text
format, gzip-compressed as Prometheus asks, and uncompressed). Time = request sent to body read,
on a fresh connection each time. Also renders, in process, the monitoring rank's exposition
for 1024 and 4096 peers, healthy and with every peer late (its peer-heartbeat series are
bounded by ``peer_series``, 64 by default).

    python benchmarks/scrape.py
    python benchmarks/scrape.py --ranks 2 --scrapes 200
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "tests"))

import harness  # noqa: E402  (tests/harness.py: torchrun Job, scrape helpers)

from exporter import catalog  # noqa: E402
from exporter.errors import ErrorCounter  # noqa: E402
from exporter.export.collector import DDPCollector, RankSources  # noqa: E402
from exporter.sources.flight import InFlight  # noqa: E402
from exporter.sources.recorder import Recorder  # noqa: E402
from exporter.sources.walltime import JobClock  # noqa: E402

GOAL_MS = 5.0
GOAL_SERIES = 150
ACCEPT = {
    "openmetrics+gzip": ("application/openmetrics-text; version=1.0.0", "gzip"),
    "text+gzip": ("text/plain; version=0.0.4", "gzip"),
    "text": ("text/plain; version=0.0.4", "identity"),
}


def _get(url: str, accept: str, encoding: str) -> tuple[float, int, bytes]:
    req = urllib.request.Request(url, headers={"Accept": accept, "Accept-Encoding": encoding})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=10) as resp:
        body = resp.read()
    return (time.perf_counter() - t0) * 1e3, len(body), body


def monitor_rank_render(world: int, late: bool, repeats: int = 20) -> tuple[float, int, int]:
    """Render the monitoring rank's exposition for ``world`` peers in process (no HTTP).

    Uses the real collector, recorder and heartbeat monitor (over an in-memory c10d store and a
    hand-moved clock); ``late``: no peer has beaten for 10 intervals.
    Returns (median ms, series, bytes).
    """
    import torch.distributed as dist
    from prometheus_client import CollectorRegistry, generate_latest

    from exporter.sources.heartbeat import Heartbeat
    from exporter.storekeys import for_run

    rec = Recorder("optimizer")
    st = rec.collective_stats("allreduce", "0", 1800.0)
    for _ in range(10):
        rec.bucket_done(st, rec.bucket_launched(st, 1 << 20), True)
        rec.optimizer_begin()
        rec.optimizer_end()
    store, now = dist.HashStore(), [0.0]
    for peer in range(world):
        store.add(for_run("bench").heartbeat(peer), 1)
    hb = Heartbeat(
        store, for_run("bench"), 0, world, 5.0, True, ErrorCounter(), clock=lambda: now[0]
    )
    hb.poll()
    now[0] += 50.0 if late else 1.5
    errors = ErrorCounter()
    sources = RankSources(
        run="bench",
        rank=0,
        errors=errors,
        info=lambda: {"world_size": str(world), "node": "node0000"},
        recorder=rec,
        inflight=InFlight(rec, errors, flight_recorder=False),
        job_clock=JobClock(),
        peer_ages=hb.published_ages,
    )
    reg = CollectorRegistry(auto_describe=False)
    reg.register(DDPCollector(sources))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        body = generate_latest(reg)
        times.append((time.perf_counter() - t0) * 1e3)
    series = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
    return statistics.median(times), series, len(body)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--scrapes", type=int, default=100, help="scrapes per rank and format")
    p.add_argument("--min-steps", type=int, default=50)
    args = p.parse_args(argv)

    worst_ms, worst_series = 0.0, 0
    with harness.Job(
        args.ranks,
        ["--port", "0", "--addr", "127.0.0.1", "--duration", "0", "--step-time", "0.02"],
    ) as job:
        urls = job.wait_urls()
        harness.wait_for(
            lambda: all(
                harness.value(job.scrape(r), catalog.STEPS.name) >= args.min_steps for r in urls
            ),
            120,
            f"{args.min_steps} steps on every rank",
        )
        print(f"{args.ranks}-rank demo job (gloo, CPU), training while scraped")
        print(
            f"{'rank':>4} {'format':<17} {'median ms':>9} {'p90 ms':>7} {'max ms':>7} {'bytes':>7}"
        )
        for rank, url in sorted(urls.items()):
            for fmt, (accept, enc) in ACCEPT.items():
                times, size = [], 0
                for _ in range(args.scrapes):
                    ms, size, _ = _get(url, accept, enc)
                    times.append(ms)
                times.sort()
                med = statistics.median(times)
                p90 = times[int(0.9 * (len(times) - 1))]
                worst_ms = max(worst_ms, med)
                print(f"{rank:>4} {fmt:<17} {med:9.2f} {p90:7.2f} {times[-1]:7.2f} {size:7d}")
            samples = harness.parse(harness.scrape_text(url))
            series = sum(len(v) for k, v in samples.items())
            peers = len(samples.get(catalog.PEER_HEARTBEAT_AGE.name, []))
            expected = catalog.series_per_rank(monitor=peers > 0, world_size=args.ranks)
            worst_series = max(worst_series, series)
            print(
                f"rank {rank}: {series} series ({peers} peer-heartbeat series; "
                f"catalog.series_per_rank says {expected})"
            )
    at_scale = {
        w: catalog.series_per_rank(gpu=True, monitor=True, world_size=w) for w in (1024, 4096)
    }
    print(
        "series at scale (CUDA ranks): any rank "
        f"{catalog.series_per_rank(gpu=True)}, monitoring rank at most "
        + ", ".join(f"{n} at {w} ranks" for w, n in at_scale.items())
    )
    for world in (1024, 4096):
        for late in (False, True):
            ms, n, size = monitor_rank_render(world, late)
            worst_series = max(worst_series, n)
            print(
                f"monitoring rank of {world} ranks, {'every peer late' if late else 'healthy'} "
                f"(in-process render, no HTTP): {ms:.2f} ms, {n} series, {size} bytes uncompressed"
            )
    print(f"goal: <= {GOAL_MS} ms and <= {GOAL_SERIES} series per rank")
    print(f"scrape_ms={worst_ms:.2f} series={worst_series}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
