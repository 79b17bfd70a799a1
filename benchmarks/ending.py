"""Measure what a clean end adds to a job's exit: ``close()`` waiting for the final scrape.

A rank that ends cleanly publishes ``ddp_finished_timestamp_seconds`` and waits until every
scraper it knows has read it (at most ``DDP_EXPORTER_FINAL_SCRAPE_S``). This runs a real
one-rank gloo DDP job in process, serves its endpoint, lets scraper threads read it at a given
interval (as Prometheus would), and times ``obs.close()``; each round also checks that the last
scrape of every scraper carried the finished timestamp.

    python benchmarks/ending.py                   # intervals 1 s and 5 s, 2 scrapers, 5 rounds
    python benchmarks/ending.py --intervals 1 5 15 --rounds 3
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import threading
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import exporter  # noqa: E402
from exporter.tools.localstack import free_port  # noqa: E402

FINISHED = b"ddp_finished_timestamp_seconds{"


def _scraper(url: str, interval: float, offset: float, stop: threading.Event, last: list) -> None:
    # Each scraper has its own scrape timeout header: two Prometheus servers on one host.
    req = urllib.request.Request(url, headers={"X-Prometheus-Scrape-Timeout-Seconds": str(offset)})
    if stop.wait(offset):
        return
    while True:
        try:
            with urllib.request.urlopen(req, timeout=2) as resp:
                last[:] = [resp.read()]
        except OSError:
            return  # the endpoint is gone
        if stop.wait(interval):
            return


def round_trip(interval: float, scrapers: int) -> tuple[float, bool]:
    """Run one instrumented job, scrape it, close it; return (close seconds, all saw the end)."""
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    obs = exporter.instrument(model, optimizer=opt, port=0, addr="127.0.0.1", heartbeat_s=0)
    for _ in range(5):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
    stop = threading.Event()
    seen = [[] for _ in range(scrapers)]
    threads = [
        threading.Thread(
            target=_scraper,
            args=(obs.url, interval, interval * i / scrapers, stop, seen[i]),
            daemon=True,
        )
        for i in range(scrapers)
    ]
    for t in threads:
        t.start()
    # Each scraper scrapes a few times, so its interval is known (a fixed wait: the point).
    time.sleep(3 * interval)
    t0 = time.perf_counter()
    obs.close()
    took = time.perf_counter() - t0
    stop.set()
    for t in threads:
        t.join()
    return took, all(s and FINISHED in s[0] for s in seen)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--intervals", type=float, nargs="+", default=[1.0, 5.0])
    p.add_argument("--scrapers", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{free_port()}",
        rank=0,
        world_size=1,
        timeout=datetime.timedelta(seconds=60),
    )
    try:
        t0 = time.perf_counter()
        alone = [round_trip(0.0, 0)[0] for _ in range(args.rounds)]
        print(f"no scraper: close() median {statistics.median(alone) * 1e3:.1f} ms")
        print(
            f"{'scrape interval':>16} {'close median s':>15} {'max s':>7} {'final state read':>17}"
        )
        for interval in args.intervals:
            times, read = [], 0
            for _ in range(args.rounds):
                took, ok = round_trip(interval, args.scrapers)
                times.append(took)
                read += ok
            print(
                f"{interval:>15g}s {statistics.median(times):15.2f} {max(times):7.2f} "
                f"{read:>10}/{args.rounds} rounds"
            )
        print(f"total {time.perf_counter() - t0:.0f} s")
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
