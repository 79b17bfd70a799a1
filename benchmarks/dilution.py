"""Measure how much a collective counted as compute dilutes a straggler: FSDP2 with clip_grad_norm_.

The job is pytorch/examples' FSDP2 example in shape (tests/workers/fsdp2_example_worker.py: 3
ranks under torchrun on gloo, ``instrument(model, optimizer=optim)``), with rank 2 throttled from
outside by a SIGSTOP/SIGCONT duty cycle (``--run-ms`` running, ``--stop-ms`` stopped). On FSDP2's
DTensor parameters ``clip_grad_norm_`` ends in a functional all-reduce of the total norm, where
the healthy ranks wait for the straggler: unless that wait is counted as communication, it is
counted as their compute, which raises the median compute and shrinks the straggler's ratio.

Arms: ``--layers`` x clipping kept / removed x the exporter as it is (``on``) / with its timing
of functional collectives switched off (``off``: how the exporter counted before it timed them;
``--arms on`` skips those). Each arm is a fresh job: ``--warmup`` seconds, then the compute per
step (``ddp_step_phase_seconds{phase="compute"}``, sum over steps) of every rank over
``--window`` seconds, read from the ranks' endpoints. Arms run in a rotated order per round;
figures are medians over ``--rounds`` rounds.

    python benchmarks/dilution.py                          # the table: 2 and 4 layers, ~15 min
    python benchmarks/dilution.py --layers 2 --rounds 1 --arms on
    python benchmarks/dilution.py --stop-ms 25 --run-ms 75   # a milder straggler

The criteria: with clipping kept, the healthy ranks' compute within 15 % of the figure with it
removed, and the straggler's ratio within 15 % of the ratio with it removed. The last line is
``dilution_ok=<0|1>`` for the ``on`` arms.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from exporter.tools.demo import metrics_urls  # noqa: E402
from exporter.tools.localstack import free_port  # noqa: E402
from exporter.tools.reaper import raise_on_signals, stop_tree  # noqa: E402

WORKER = os.path.join(REPO, "tests", "workers", "fsdp2_example_worker.py")
RANKS, SLOW = 3, 2


def scrape(url: str) -> tuple[float, float]:
    """Return (steps, compute seconds) of one rank."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    steps = compute = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "ddp_steps_total":
                steps = s.value
            elif s.name == "ddp_step_phase_seconds_sum" and s.labels.get("phase") == "compute":
                compute = s.value
    return steps, compute


class Throttle(threading.Thread):
    """Stop and continue one process in a duty cycle until stopped."""

    def __init__(self, pid: int, run_s: float, stop_s: float) -> None:
        super().__init__(daemon=True)
        self.pid, self.run_s, self.stop_s = pid, run_s, stop_s
        self.done = threading.Event()

    def run(self) -> None:
        import signal

        try:
            while not self.done.wait(self.run_s):
                os.kill(self.pid, signal.SIGSTOP)
                time.sleep(self.stop_s)
                os.kill(self.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass

    def stop(self) -> None:
        import signal

        self.done.set()
        self.join(timeout=5)
        try:
            os.kill(self.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


class JobEndedError(RuntimeError):
    """The job ended before training (a rendezvous port taken meanwhile, say)."""


def run_arm(layers: int, clip: bool, timing: str, args: argparse.Namespace) -> list[float]:
    """Run one job; return every rank's compute per step (s) over the window."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(RANKS),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        WORKER,
        "--layers",
        str(layers),
    ] + ([] if clip else ["--no-clip"])
    if timing == "off":
        cmd.append("--no-functional-timing")
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    throttle = None
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            text = "".join(lines)
            urls, pids = metrics_urls(text), dict(re.findall(r"^pid (\d+) (\d+)$", text, re.M))
            if len(urls) == RANKS and str(SLOW) in pids:
                break
            if proc.poll() is not None:
                raise JobEndedError("".join(line for line in lines if "rank" in line)[-6000:])
            time.sleep(0.2)
        else:
            raise RuntimeError("no metrics URLs:\n" + "".join(lines[-40:]))
        throttle = Throttle(int(pids[str(SLOW)]), args.run_ms / 1e3, args.stop_ms / 1e3)
        throttle.start()
        time.sleep(args.warmup)
        first = [scrape(urls[r]) for r in range(RANKS)]
        time.sleep(args.window)
        last = [scrape(urls[r]) for r in range(RANKS)]
    finally:
        if throttle is not None:
            throttle.stop()
        stop_tree(proc)
    return [(c1 - c0) / max(s1 - s0, 1.0) for (s0, c0), (s1, c1) in zip(first, last)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, nargs="+", default=[2, 4])
    p.add_argument(
        "--arms",
        nargs="+",
        choices=("on", "off"),
        default=["on", "off"],
        help="the exporter's functional-collective timing on, and off (before)",
    )
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--warmup", type=float, default=8.0, help="seconds before the window")
    p.add_argument("--window", type=float, default=20.0, help="seconds measured per arm")
    p.add_argument("--run-ms", type=float, default=50.0, help="rank 2 runs this long ...")
    p.add_argument("--stop-ms", type=float, default=50.0, help="... then is stopped this long")
    args = p.parse_args(argv)
    raise_on_signals()
    arms = [
        (layers, clip, timing)
        for layers in args.layers
        for timing in args.arms
        for clip in (True, False)
    ]
    results: dict[tuple, list[list[float]]] = {arm: [] for arm in arms}
    print(
        f"{RANKS} ranks, rank {SLOW} throttled: {args.run_ms:.0f} ms running, "
        f"{args.stop_ms:.0f} ms stopped; {args.rounds} rounds, {args.window:.0f} s windows"
    )
    for r in range(args.rounds):
        order = arms[r % len(arms) :] + arms[: r % len(arms)]
        for arm in order:
            try:
                per_rank = run_arm(*arm, args)
            except JobEndedError as exc:  # once: a start that failed says nothing about the arm
                print(f"  job ended before training, started again:\n{exc}", flush=True)
                per_rank = run_arm(*arm, args)
            results[arm].append(per_rank)
            print(
                f"  round {r} layers={arm[0]} clip={'kept' if arm[1] else 'removed'} "
                f"timing={arm[2]}: " + " ".join(f"{c * 1e3:.1f}" for c in per_rank) + " ms",
                flush=True,
            )
    print(
        "| layers | `clip_grad_norm_` | functional timing | healthy ranks (ms) | rank 2 (ms) "
        "| rank 2 ÷ healthy |"
    )
    print("|---|---|---|---|---|---|")
    table: dict[tuple, tuple[float, float]] = {}
    for arm in arms:
        healthy = statistics.median(statistics.mean(x[:SLOW] + x[SLOW + 1 :]) for x in results[arm])
        ratio = statistics.median(
            x[SLOW] / statistics.mean(x[:SLOW] + x[SLOW + 1 :]) for x in results[arm]
        )
        slow = statistics.median(x[SLOW] for x in results[arm])
        table[arm] = (healthy, ratio)
        print(
            f"| {arm[0]} | {'kept' if arm[1] else 'removed'} | {arm[2]} | {healthy * 1e3:.1f} "
            f"| {slow * 1e3:.1f} | {ratio:.2f} |"
        )
    ok = True
    for layers in args.layers:
        if "on" not in args.arms:
            continue
        (h_kept, r_kept), (h_removed, r_removed) = (
            table[(layers, True, "on")],
            table[(layers, False, "on")],
        )
        dh, dr = h_kept / h_removed - 1, r_kept / r_removed - 1
        good = abs(dh) <= 0.15 and abs(dr) <= 0.15
        ok &= good
        print(
            f"layers={layers}: clipping kept vs removed: healthy compute {dh:+.1%}, "
            f"straggler ratio {dr:+.1%} ({'within' if good else 'outside'} 15 %)"
        )
    print(f"dilution_ok={int(ok)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
