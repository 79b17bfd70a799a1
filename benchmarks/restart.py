"""Time from hang onset to the first step of the restarted job, with the hang action on.

Each round starts a real torchrun job on gloo with the launch command people type
(``torchrun --standalone --max-restarts 1``: the agent's store is shared by both attempts; a
process-group timeout of 30 minutes) running ``tests/workers/restart_worker.py``: it trains,
rank 0 checkpoints every 20 steps and every attempt resumes from the last checkpoint. In the
first attempt rank 1 blocks in user code (``wait_for_data``) and prints its onset time. With
``DDP_EXPORTER_ON_HANG=abort`` and the defaults (heartbeat 5 s, abort after 20 s with complete
evidence), every rank exits, torchrun restarts the group, and rank 0 prints the time of the
restarted attempt's first completed step. Reported per round: onset -> abort decided
(``episode.json``), -> torchrun saw the exit code, -> first step of attempt 1; then the median
and the worst against the goal (30 s) and the process group's timeout (1800 s, what a hang costs
without the action). ``--launch c10d-own-store`` uses the launch the README used to require
(``--rdzv-backend c10d`` and ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``).
No scraper reads the ranks here; one that does adds up to one scrape interval to the exit
(see ``benchmarks/ending.py``).

    python benchmarks/restart.py                  # 5 rounds, 3 ranks, defaults
    python benchmarks/restart.py --rounds 3 --abort-after 30 --launch c10d-own-store
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from exporter.tools.localstack import free_port  # noqa: E402
from exporter.tools.reaper import stop_tree  # noqa: E402

WORKER = os.path.join(REPO, "tests", "workers", "restart_worker.py")
GOAL_S = 30.0
PG_TIMEOUT_S = 1800.0
STUCK_AT_STEP = 100


def one_round(
    ranks: int, abort_after: float | None, timeout: float, launch: str = "standalone"
) -> dict[str, float]:
    """Run one hung, restarted job; return its timings, seconds after onset."""
    root = tempfile.mkdtemp(prefix="ddp-restart-")
    env = dict(
        os.environ,
        PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS="1",
        DDP_EXPORTER_DUMP_DIR=os.path.join(root, "dumps"),
        DDP_EXPORTER_ON_HANG="abort",
        TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1" if launch == "c10d-own-store" else "0",
    )
    if abort_after is not None:
        env["DDP_EXPORTER_ABORT_AFTER_S"] = str(abort_after)
    rendezvous = (
        ["--standalone"]
        if launch == "standalone"
        else ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}"]
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(ranks),
        *rendezvous,
        "--max-restarts",
        "1",
        WORKER,
        root,
        "--stuck",
        f"1:{STUCK_AT_STEP}",
        "--steps",
        str(STUCK_AT_STEP + 100),
    ]
    lines: list[tuple[float, str]] = []
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
        cwd=REPO,
    )

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.time(), line))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the job did not finish within {timeout}s; see {root}") from None
    finally:
        stop_tree(proc)
        reader.join(timeout=10)
    text = "".join(line for _, line in lines)
    with open(os.path.join(root, "job.log"), "w") as f:
        f.write(text)
    if code != 0:
        raise RuntimeError(f"job exited {code}; see {root}/job.log")
    onset = float(re.search(r"^onset ([0-9.]+)$", text, re.M).group(1))
    first = float(re.search(r"attempt 1 first step at ([0-9.]+)", text).group(1))
    exited = next(t for t, line in lines if "exitcode: 75" in line)
    (path,) = glob.glob(os.path.join(root, "dumps", "*-hang-*", "episode.json"))
    with open(path) as f:
        action = json.load(f)["action"]
    return {
        "certain": float(action["certain"]),
        "decided": action["decided_unix"] - onset,
        "exited": exited - onset,
        "first_step": first - onset,
        "tracebacks": text.count("Traceback"),
    }


def main() -> int:
    """Run the rounds and print the figures; the last line is ``restart_median_s=``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--launch", choices=("standalone", "c10d-own-store"), default="standalone")
    p.add_argument("--ranks", type=int, default=3)
    p.add_argument("--abort-after", type=float, default=None, help="default: the exporter's")
    p.add_argument("--timeout", type=float, default=300.0, help="per round, s")
    args = p.parse_args()
    firsts = []
    for i in range(args.rounds):
        r = one_round(args.ranks, args.abort_after, args.timeout, args.launch)
        firsts.append(r["first_step"])
        evidence = "complete" if r["certain"] else "incomplete"
        print(
            f"round {i + 1}: onset -> abort decided {r['decided']:.1f}s ({evidence} evidence), "
            f"-> exit seen by torchrun {r['exited']:.1f}s, -> first step of the restarted "
            f"attempt {r['first_step']:.1f}s ({r['tracebacks']} tracebacks in the log)",
            flush=True,
        )
    median = statistics.median(firsts)
    print(
        f"{args.ranks} ranks, {args.launch}: onset -> first restarted step median {median:.1f}s, worst "
        f"{max(firsts):.1f}s (goal < {GOAL_S:g}s); without the action the ranks idle until the "
        f"{PG_TIMEOUT_S:g}s process group timeout ({PG_TIMEOUT_S / median:.0f}x longer)"
    )
    print(f"restart_median_s={median:.1f}")
    return 0 if median <= GOAL_S else 1


if __name__ == "__main__":
    sys.exit(main())
