"""What reading collectives' device times from the Flight Recorder costs (exporter.sources.durations).

A one-rank gloo group in this process fills the generic Flight Recorder's ring buffer with
``--entries`` all-reduces; then, ``--repeats`` times: the dump of every entry (what a read asks
torch for), its unpickling, and one whole ``RecorderDurations.drain()`` over entries given the
``duration_ms`` NCCL writes with timing on. Beside each dump a Python thread counts how far it
gets: its progress against the same time without the dump is the share of the interpreter lock
the dump left to other threads (the training thread's share while a read runs).

    python benchmarks/durations.py                 # 2000 entries, 5 repeats
"""

from __future__ import annotations

import argparse
import os
import pickle
import socket
import statistics
import sys
import threading
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from exporter.errors import ErrorCounter  # noqa: E402
from exporter.sources.durations import RecorderDurations  # noqa: E402
from exporter.sources.recorder import Recorder  # noqa: E402

DUMP = torch._C._distributed_c10d._dump_fr_trace


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed_dump(**kwargs):
    """Return the generic recorder's dump as NCCL's reads with timing on."""
    data = pickle.loads(DUMP(**kwargs))
    for e in data["entries"]:
        if e["retired"]:
            e["duration_ms"] = 0.1
    return data


class Spinner:
    """Count a Python thread's iterations: how much of the interpreter lock it gets."""

    def __init__(self) -> None:
        self.n = 0
        self._stop = False
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        while not self._stop:
            self.n += 1

    def share_during(self, fn) -> tuple[float, float]:
        """Return (seconds fn took, the spinner's progress during it vs the same time after)."""
        a = self.n
        t0 = time.perf_counter()
        fn()
        took = time.perf_counter() - t0
        b = self.n
        time.sleep(took)
        return took, (b - a) / max(self.n - b, 1)

    def close(self) -> None:
        self._stop = True
        self._thread.join()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", str(args.entries))
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1
    )
    rec = Recorder("explicit")
    stats = rec.collective_stats("allreduce", "0", None)
    spinner = Spinner()
    dumps, loads, drains, shares = [], [], [], []
    try:
        for _ in range(args.repeats):
            durations = RecorderDurations(rec, ErrorCounter(), [timed_dump], read_every_s=0)
            t = torch.ones(4)
            for _ in range(args.entries):
                dist.all_reduce(t)
                rec.collective_finished(stats, rec.collective_launched(stats, 16), timed=False)
            time.sleep(0.5)  # gloo's recorder retires entries from its own thread
            raw: list[bytes] = []
            took, share = spinner.share_during(
                lambda out=raw: out.append(DUMP(includeCollectives=True, includeStackTraces=False))
            )
            dumps.append(took)
            shares.append(share)
            t0 = time.perf_counter()
            entries = len(pickle.loads(raw[0])["entries"])
            loads.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            durations.drain()
            drains.append(time.perf_counter() - t0)
    finally:
        spinner.close()
        dist.destroy_process_group()
    ms = [f"{statistics.median(v) * 1e3:.1f} ms (max {max(v) * 1e3:.1f})" for v in (dumps, loads)]
    print(f"entries in the dump: {entries}")
    print(f"dump: {ms[0]}; unpickle: {ms[1]}")
    print(f"a whole drain: {statistics.median(drains) * 1e3:.1f} ms (max {max(drains) * 1e3:.1f})")
    print(
        f"another thread's share of the interpreter during a dump: {statistics.median(shares):.2f}"
    )
    print(f"drain_ms={statistics.median(drains) * 1e3:.1f}")


if __name__ == "__main__":
    main()
