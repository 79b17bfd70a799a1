"""Measure what ``ddp-exporter run`` costs a step against ``instrument()`` and against nothing.

The job is tests/workers/unmodified_worker.py under torchrun on gloo (``--ranks`` ranks, a small
MLP, SGD, a DataLoader): short host-bound steps (``--step-s 0`` by default), where any Python
the exporter adds per step shows. Arms, each a fresh job:

- ``plain``: the script alone, no exporter;
- ``instrument``: the script with its one ``exporter.instrument()`` line;
- ``run``: the unmodified script under ``ddp-exporter run --no-stack``.

Each job trains ``--steps`` steps; every rank prints its seconds per step after ``--warmup``
steps (past the exporter's start-up, which ``run`` does at the first step), and an arm's
figure is the slowest rank's. Arms run in a rotated order per round;
figures are medians over ``--rounds`` rounds, with the ratios to ``plain`` and of ``run`` to
``instrument``.

    python benchmarks/autorun.py                       # 2 ranks, DDP, 5 rounds: ~6 min
    python benchmarks/autorun.py --shape fsdp2 --rounds 3

The criterion: ``run`` within 5 % of ``instrument`` (the zero-code path adds nothing per step
but one global optimizer pre-hook that returns at once). The last line is ``autorun_ok=<0|1>``.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from exporter.tools.localstack import free_port  # noqa: E402
from exporter.tools.reaper import raise_on_signals, stop_tree  # noqa: E402

WORKER = os.path.join(REPO, "tests", "workers", "unmodified_worker.py")
ARMS = ("plain", "instrument", "run")
#: The criterion: run's time per step at most this much above instrument()'s.
TOLERANCE = 0.05


def one_job(arm: str, args: argparse.Namespace) -> float:
    """Run one job of ``arm``; return the slowest rank's seconds per step."""
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(args.ranks),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
    ]
    script = [WORKER, "--shape", args.shape, "--steps", str(args.steps), "--step-s", "0"]
    script += ["--warmup", str(args.warmup)]
    if arm == "instrument":
        script.append("--instrument")
    cmd = [*torchrun, *script]
    if arm == "run":
        cmd = [sys.executable, "-m", "exporter.tools.cli", "run", "--no-stack", "--", *cmd]
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        DDP_EXPORTER_PORT="0",
        DDP_EXPORTER_ADDR="127.0.0.1",
        PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        out, _ = proc.communicate(timeout=600)
    finally:
        stop_tree(proc)
    found = [float(s) for s in re.findall(r"step_s \d+ (\d+\.\d{6})", out)]
    if proc.returncode != 0 or len(found) != args.ranks:
        raise SystemExit(f"{arm}: the job failed (exit {proc.returncode}):\n{out[-3000:]}")
    return max(found)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--shape", choices=("ddp", "fsdp2", "loop"), default="ddp")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--warmup", type=int, default=500, help="steps before the time is measured")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    raise_on_signals()
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for i in range(args.rounds):
        order = ARMS[i % len(ARMS) :] + ARMS[: i % len(ARMS)]
        for arm in order:
            times[arm].append(one_job(arm, args))
        print(f"round {i + 1}: " + ", ".join(f"{a} {times[a][-1] * 1e3:.2f} ms" for a in ARMS))
    med = {arm: statistics.median(times[arm]) for arm in ARMS}
    print(f"\n{args.shape}, {args.ranks} ranks, {args.steps} steps, {args.rounds} rounds (medians)")
    print(f"{'arm':<12}{'ms/step':>10}{'vs plain':>10}")
    for arm in ARMS:
        print(f"{arm:<12}{med[arm] * 1e3:>10.3f}{med[arm] / med['plain']:>10.3f}")
    ratio = med["run"] / med["instrument"]
    print(f"run / instrument: {ratio:.3f}")
    ok = ratio <= 1 + TOLERANCE
    print(f"autorun_ok={int(ok)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
