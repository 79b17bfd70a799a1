"""Drive 10^6 training steps' worth of events through the Recorder and check memory stays flat.

Each step: one DataLoader ``next()`` (data_begin/data_end), ``--buckets`` gradient buckets
(bucket_launched/bucket_done), one optimizer step (optimizer_begin/end, the step boundary);
a scrape-time ``snapshot()`` + ``inflight()`` every ``--scrape-every`` steps. Memory is read
with tracemalloc (Python allocations, diff of snapshots taken after warm-up and at the end)
and the process RSS, at every tenth of the run. Then a hang: buckets launched and never done,
to show the in-flight bookkeeping is bounded.

    python benchmarks/memory.py
    python benchmarks/memory.py --steps 100000
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
import tracemalloc

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from exporter.sources.recorder import Recorder  # noqa: E402


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--buckets", type=int, default=4, help="gradient buckets per step")
    p.add_argument("--scrape-every", type=int, default=1000, help="steps between snapshots")
    p.add_argument("--warmup", type=int, default=10_000)
    args = p.parse_args(argv)

    rec = Recorder("optimizer")
    stats = [rec.collective_stats("allreduce", "0", 1800.0)]
    st = stats[0]
    nbytes = 25 * 2**20

    def run(steps: int) -> None:
        data_begin, data_end = rec.data_begin, rec.data_end
        launched, done = rec.bucket_launched, rec.bucket_done
        ob, oe = rec.optimizer_begin, rec.optimizer_end
        last = args.buckets - 1
        every = args.scrape_every
        for i in range(steps):
            data_end(data_begin())
            for b in range(args.buckets):
                done(st, launched(st, nbytes), b == last)
            ob()
            oe()
            if i % every == 0:
                rec.snapshot()
                rec.inflight()

    tracemalloc.start()
    run(args.warmup)
    gc.collect()
    snap0 = tracemalloc.take_snapshot()
    rss0 = _rss_kib()
    traced0 = tracemalloc.get_traced_memory()[0]
    t0 = time.perf_counter()
    chunk = max(1, args.steps // 10)
    print(f"{'steps':>10} {'traced KiB':>11} {'RSS KiB':>9}")
    print(f"{0:>10} {traced0 / 1024:11.1f} {rss0:9d}")
    done_steps = 0
    while done_steps < args.steps:
        k = min(chunk, args.steps - done_steps)
        run(k)
        done_steps += k
        gc.collect()
        print(f"{done_steps:>10} {tracemalloc.get_traced_memory()[0] / 1024:11.1f} {_rss_kib():9d}")
    elapsed = time.perf_counter() - t0
    snap1 = tracemalloc.take_snapshot()
    traced1 = tracemalloc.get_traced_memory()[0]
    rss1 = _rss_kib()
    events = args.steps * (2 + 2 * args.buckets + 2)
    print(
        f"{args.steps} steps, {events} recorder calls in {elapsed:.1f} s under tracemalloc; "
        f"recorder counted {rec.steps - args.warmup} steps, {st.completed} collectives"
    )
    diff = [
        s
        for s in snap1.compare_to(snap0, "lineno")
        if s.size_diff and "tracemalloc" not in s.traceback[0].filename
    ]
    diff.sort(key=lambda s: -abs(s.size_diff))
    print("largest tracemalloc differences (end - after warm-up):")
    for s in diff[:5]:
        print(f"  {s.traceback[0].filename}:{s.traceback[0].lineno}: {s.size_diff:+d} B")
    exporter_growth = sum(s.size_diff for s in diff if "/exporter/" in s.traceback[0].filename)
    print(
        f"traced growth {traced1 - traced0:+d} B total, {exporter_growth:+d} B in exporter/; "
        f"RSS growth {rss1 - rss0:+d} KiB; pending after run {len(st.pending)}"
    )

    # Hang: collectives launched and never completed (a hung peer) must not grow without bound.
    for _ in range(100_000):
        rec.bucket_launched(st, nbytes)
    bound = st.pending.maxlen
    print(
        f"hang: 100000 launches without completion -> pending {len(st.pending)} "
        f"(bounded by maxlen {bound}); enqueued-completed {st.enqueued - st.completed}"
    )
    ok = exporter_growth <= 4096 and len(st.pending) <= (bound or 0)
    print(f"memory_growth_bytes={exporter_growth} ok={ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
