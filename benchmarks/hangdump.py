"""Time from hang onset to complete hang dumps, with the default 5 s heartbeat.

Each round starts a real torchrun job on gloo (``tests/workers/hang_worker.py behind -1``,
``--ranks`` ranks, default 3): the ranks train, then rank 1 blocks in ``load_batch()`` before a
collective and prints its onset time; the others wait in DDP's allreduce. The monitoring rank
detects the hang through the c10d store, every rank dumps, and the monitoring rank writes
``episode.json`` with ``requested_unix`` (dump requested) and ``complete_unix`` (every ack in,
verdict written). Reported per round: onset -> request and onset -> complete, seconds; then the
median and the worst, against the goal (within 20 s of onset) and the process group timeout
(the default 1800 s: the verdict must come at least 20x before it).

    python benchmarks/hangdump.py                  # 3 rounds, 3 ranks, heartbeat 5 s
    python benchmarks/hangdump.py --rounds 5 --heartbeat 1
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(REPO, "tests", "workers", "hang_worker.py")
GOAL_S = 20.0
PG_TIMEOUT_S = 1800.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_round(ranks: int, heartbeat: float, timeout: float) -> tuple[float, float]:
    """Run one hung job; return (onset -> request, onset -> complete) in seconds."""
    root = tempfile.mkdtemp(prefix="ddp-hangdump-")
    env = dict(
        os.environ,
        PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS="1",
        DDP_EXPORTER_DUMP_DIR=root,
        HANG_WORKER_HEARTBEAT_S=str(heartbeat),
        HANG_WORKER_PG_TIMEOUT=str(PG_TIMEOUT_S),
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(ranks),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(_free_port()),
        WORKER,
        "behind",
        "-1",
    ]
    log = open(os.path.join(root, "job.log"), "w+")
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=REPO
    )
    pids: list[int] = []
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = glob.glob(os.path.join(root, "*-hang-*", "episode.json"))
            if found:
                with open(found[0]) as f:
                    episode = json.load(f)
                break
            if proc.poll() is not None:
                raise RuntimeError("job exited early; see " + log.name)
            time.sleep(0.2)
        else:
            raise RuntimeError(f"no verdict within {timeout}s; see {log.name}")
        log.seek(0)
        text = log.read()
        pids = [int(p) for p in re.findall(r"^pid \d+ (\d+)$", text, re.M)]
        onset = float(re.search(r"^onset ([0-9.]+)$", text, re.M).group(1))
        return episode["requested_unix"] - onset, episode["complete_unix"] - onset
    finally:
        for pid in pids:  # torchrun's workers live in their own sessions
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        log.close()


def main() -> int:
    """Run the rounds and print the figures; the last line is ``hangdump_worst_s=``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ranks", type=int, default=3)
    p.add_argument("--heartbeat", type=float, default=5.0)
    p.add_argument("--timeout", type=float, default=240.0, help="per round, s")
    args = p.parse_args()
    requested, complete = [], []
    for i in range(args.rounds):
        req, done = one_round(args.ranks, args.heartbeat, args.timeout)
        requested.append(req)
        complete.append(done)
        print(f"round {i + 1}: onset -> dump request {req:.1f}s, -> complete dumps {done:.1f}s")
    worst = max(complete)
    print(
        f"{args.ranks} ranks, heartbeat {args.heartbeat:g}s: onset -> complete dumps median "
        f"{statistics.median(complete):.1f}s, worst {worst:.1f}s (goal {GOAL_S:g}s); "
        f"{PG_TIMEOUT_S / worst:.0f}x before the {PG_TIMEOUT_S:g}s process group timeout"
    )
    print(f"hangdump_worst_s={worst:.1f}")
    return 0 if worst <= GOAL_S else 1


if __name__ == "__main__":
    sys.exit(main())
