"""Measure what the goodput account costs the monitoring rank: one tick of its thread, by job size.

The account runs on a background thread (``ddp-exporter-goodput``), never on the training
thread: each tick it reads the rank's step split under the recorder's lock (as a scrape does),
reads every rank's published work with one ``multi_get`` on a real TCPStore, closes a window
of the peer tally, splits the steps that are due and, at most once a second, rewrites the run's
file. This times whole ticks of a real :class:`GoodputTracker` on the monitoring rank of an
N-rank job whose peers (their keys in the store) all move between ticks, one rank straggling,
and the time the tick holds the recorder's lock (the only thing it shares with training).

    python benchmarks/goodput.py
    python benchmarks/goodput.py --ranks 8 1024 4096 --ticks 200

A tick's share of the thread's interval (``interval / 4``, 1.25 s at the default 5 s heartbeat)
is its share of one core, taken from the training process's GIL while it runs. The last line is
``goodput_tick_share=<the largest job's mean tick over its tick interval>``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from torch.distributed import TCPStore

from exporter.errors import ErrorCounter
from exporter.settings import DEFAULT_HEARTBEAT_S, identity
from exporter.sources.context import RankContext
from exporter.sources.goodput import GoodputTracker, Work
from exporter.sources.goodput.peers import encode_work, work_key
from exporter.sources.recorder import Recorder
from exporter.sources.sections import REGISTRY
from exporter.storekeys import for_run
from exporter.tools.localstack import free_port


def _tracker(store: TCPStore, world: int, folder: str) -> GoodputTracker:
    ident = identity(run="bench", group=(0, world), environ={})
    rec = Recorder("explicit")
    return GoodputTracker(
        RankContext(
            identity=ident,
            store=store,
            recorder=rec,
            sections=REGISTRY,
            interval_s=DEFAULT_HEARTBEAT_S,
            monitor=True,
            dump_dir=folder,
            errors=ErrorCounter(),
        )
    )


def one(world: int, ticks: int) -> tuple[float, float, float]:
    """Return the mean and the longest tick (ms), the median time reading this rank (µs).

    Above ``FAST_READ_MAX_RANKS`` the peers are read one tick in four: the mean is the cost.
    """
    store = TCPStore("127.0.0.1", free_port(), 1, True, wait_for_workers=False)
    prefix = for_run("bench", "0").prefix
    keys = [work_key(prefix, r) for r in range(world)]
    with tempfile.TemporaryDirectory() as folder:
        tracker = _tracker(store, world, folder)
        times, held = [], []
        for tick in range(ticks):
            steps = 10 * (tick + 1)
            for r in range(1, world):  # every peer moved: each tick closes a window
                slow = 0.15 if r == 1 else 0.1
                store.set(keys[r], encode_work(Work(steps, 0.01 * steps, slow * steps)))
            t0 = time.perf_counter()
            tracker._tick()  # noqa: SLF001 - the thread's body, timed without the thread
            times.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            tracker.own_work()  # what the tick reads under the recorder's lock, and no more
            held.append(time.perf_counter() - t0)
        tracker.close()
    return statistics.fmean(times) * 1e3, max(times) * 1e3, statistics.median(held) * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[8, 1024, 4096])
    p.add_argument("--ticks", type=int, default=100)
    args = p.parse_args()
    interval = DEFAULT_HEARTBEAT_S / 4.0
    share = 0.0
    for world in args.ranks:
        mean, longest, held = one(world, args.ticks)
        share = mean / 1e3 / interval
        print(
            f"ranks={world}: tick mean {mean:.2f} ms, longest {longest:.2f} ms; reading this rank "
            f"{held:.1f} µs; {share:.3%} of the {interval:g} s tick interval"
        )
    print(f"goodput_tick_share={share:.5f}")


if __name__ == "__main__":
    main()
