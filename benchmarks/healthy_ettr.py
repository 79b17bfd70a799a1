"""Measure what the goodput account calls lost on healthy runs: their ETTR, window by window.

Healthy jobs side by side, as the healthy drill runs them: by default a DDP and an FSDP2 job of
three gloo ranks each (the demo trainer, one process per rank, 1 s heartbeat). Every 2 s it reads
the monitoring rank's ``ddp_goodput_seconds_total`` and prints, per job, the ETTR of the run's
unplanned time over the last ``--window`` seconds (what DDPGoodputLow judges; the drills' rules use
60 s) and where the rest went. A healthy run belongs near 1, well above ``goodput_min_ettr``
(0.85), on a loaded machine too: jitter in its steps is its healthy pace, not badput.

    python benchmarks/healthy_ettr.py
    python benchmarks/healthy_ettr.py --duration 300 --busy 2

``--busy N`` runs N busy loops beside the jobs (a loaded machine). The last line is
``healthy_ettr_min=<the lowest windowed ETTR of any job once its first window was full>``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from exporter import catalog
from exporter.sources.goodput import PLANNED
from exporter.tools.localstack import free_port

RANKS = 3
READ_EVERY_S = 2.0


def start_job(run: str, kind: str, sd: Path) -> list[subprocess.Popen[bytes]]:
    """Start one job's ranks, one process per rank (env:// rendezvous, as srun starts them)."""
    port = free_port()
    procs = []
    for rank in range(RANKS):
        env = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(RANKS),
            LOCAL_WORLD_SIZE=str(RANKS),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
        )
        cmd = [
            sys.executable,
            "-m",
            "exporter.tools.trainer",
            "--duration",
            "0",
            "--port",
            "0",
            "--addr",
            "127.0.0.1",
            "--heartbeat",
            "1",
            "--run",
            run,
            "--fault",
            "none",
            "--parallel",
            kind,
            "--file-sd",
            str(sd),
        ]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL))
    return procs


def read_account(sd: Path, run: str) -> dict[str, float] | None:
    """Return rank 0's goodput seconds by category, or None before it serves them."""
    try:
        with open(sd / f"{run}-rank-0.json") as f:
            target = json.load(f)[0]["targets"][0]
        with urllib.request.urlopen(f"http://{target}/metrics", timeout=2) as resp:
            text = resp.read().decode()
    except (OSError, ValueError, KeyError, IndexError):
        return None
    name = catalog.GOODPUT.name.removesuffix("_total")
    for family in text_string_to_metric_families(text):
        if family.name == name:
            return {s.labels["category"]: s.value for s in family.samples if "category" in s.labels}
    return None


def windowed(reads: list[tuple[float, dict[str, float]]], window: float) -> tuple[float, dict]:
    """Return the ETTR of the unplanned time over the last ``window`` s, and the badput in it."""
    now, last = reads[-1]
    then, first = next((t, a) for t, a in reads if t >= now - window)
    spent = {c: last.get(c, 0.0) - first.get(c, 0.0) for c in last}
    unplanned = sum(v for c, v in spent.items() if c not in PLANNED)
    ettr = spent.get("productive", 0.0) / unplanned if unplanned > 0 else float("nan")
    badput = {c: round(v, 2) for c, v in spent.items() if c != "productive" and v >= 0.05}
    return ettr, badput


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=150.0, help="seconds to run the jobs")
    p.add_argument("--window", type=float, default=60.0, help="ETTR window, s")
    p.add_argument(
        "--kinds",
        nargs="+",
        default=["ddp", "fsdp2"],
        choices=["ddp", "fsdp2"],
        help="one job of each",
    )
    p.add_argument("--busy", type=int, default=0, help="busy loops beside the jobs")
    args = p.parse_args()
    # A SIGTERM unwinds like Ctrl-C, so that the finally below stops every process it started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    procs: list[subprocess.Popen[bytes]] = []
    lowest = float("inf")
    with tempfile.TemporaryDirectory() as folder:
        sd = Path(folder)
        try:
            busy = [sys.executable, "-c", "while True: pass"]
            procs += [subprocess.Popen(busy) for _ in range(args.busy)]
            runs = {kind: f"healthy-{kind}" for kind in args.kinds}
            for kind, run in runs.items():
                procs += start_job(run, kind, sd)
            reads: dict[str, list[tuple[float, dict[str, float]]]] = {k: [] for k in runs}
            started = time.monotonic()
            while time.monotonic() - started < args.duration:
                time.sleep(READ_EVERY_S)
                line = [f"t={time.monotonic() - started:6.1f}s"]
                for kind, run in runs.items():
                    account = read_account(sd, run)
                    if account is None or account.get("productive", 0.0) <= 0:
                        continue
                    reads[kind].append((time.monotonic(), account))
                    ettr, badput = windowed(reads[kind], args.window)
                    if reads[kind][-1][0] - reads[kind][0][0] >= args.window:
                        lowest = min(lowest, ettr)
                    line.append(f"{kind} ettr={ettr:.3f} {badput}")
                print("  ".join(line), flush=True)
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    print(f"healthy_ettr_min={lowest:.3f}")


if __name__ == "__main__":
    main()
