"""Measure the exporter on a real GPU step, where the GPU and where the host is the bottleneck.

One process, one GPU, NCCL with one rank (gloo where this torch has no NCCL). Each regime trains
three identical DDP models in the same process: ``plain``, ``instr`` (after
``exporter.instrument`` with its defaults, heartbeat and hang watcher included) and ``control``
(a second plain model: the noise floor of the method). Every round runs a block of steps on each
model (``--block``, by default as many as last ``--block-s``), each block timed from a
synchronised start to a synchronised end; the per-round ratios X/plain cancel drift (clocks, other
tenants). The rounds cycle through the six orders of the three arms, so that each arm follows
each other arm equally often and no arm inherits another's after-effects more than the others.

Regimes (``--regimes``, all by default):

* ``gpu``: 8 layers of width 4096, bf16 autocast, the batch doubled until a plain step takes
  ``--target-ms``: the GPU is the bottleneck, the host runs ahead of it.
* ``host``: a fine-tuning job whose host is the bottleneck: 24 Linear 4096x4096 layers with
  GELU, bf16 autocast, AdamW, a per-GPU batch of ``--host-batch`` (256), DDP's default 25 MB
  buckets (25 of them: each 64 MB weight is its own).
* ``host-loss``: the same, plus the user's own collective every step (the loss all-reduced for
  logging), which the exporter must not slow either. Its wrappers of ``torch.distributed`` are
  process-wide: the plain and control arms' all-reduce passes through them too, at the cost of
  a call the exporter does not time (under 1 µs, ``benchmarks/devicewaits.py``), and is marked
  on the device where the instr arm's last block ended on a timed step (about 10 µs a call).
* ``host-data``: the same, its batches from a DataLoader that ``instrument`` wraps.

How a regime's bottleneck is known: ``kernel_share`` is the GPU's busy time per step (the union
of its kernels and copies, from torch's profiler, on the plain model) over the plain step's wall
time. Near 1 the GPU is the bottleneck; well under 1 it waits for the host.

Also per arm, the CPU time per step of the training thread and of the autograd engine's thread
for the GPU (which runs the backward, launches DDP's buckets and runs the exporter's marks):
instr minus plain is the exporter's host cost per step there, and divided by the buckets per
step its cost per bucket, averaged over all steps. And the exporter's own threads' CPU per second
of training; the hook mode's wrapper cost per bucket (``comm_timing="hook"``, the fallback where
no Flight Recorder exists); a ``/metrics`` scrape, idle and while training.

    python benchmarks/gpu.py                       # every regime, ~2 min on one H100
    python benchmarks/gpu.py --regimes host --rounds 30 --json out.json

The last line is ``overhead_ratio=<the largest median over the regimes>``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import itertools
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from gpu_arms import (  # noqa: E402
    ARMS,
    Arm,
    Block,
    autograd_thread_clock,
    bucket_cost,
    busy_share,
    exporter_threads_cpu,
    free_port,
    marks_cost,
    scrape_ms,
    summary,
)

import exporter  # noqa: E402
from exporter.sources.versions import versions  # noqa: E402

REGIMES = ("gpu", "host", "host-loss", "host-data")


def _calibrate(arm: Arm, args: argparse.Namespace) -> int:
    """Double the batch until a plain step takes ``--target-ms``; return that batch."""
    batch = args.batch
    while True:
        arm.set_batch(batch)
        arm.block(3)
        ms = arm.block(5).wall / 5 * 1e3
        if ms >= args.target_ms or batch >= args.max_batch:
            return batch
        batch *= 2


def _block_steps(plain: Arm, args: argparse.Namespace) -> int:
    """Return the steps per block: ``--block``, or as many as last ``--block-s`` (at least 5)."""
    if args.block:
        return args.block
    step_s = plain.block(5).wall / 5
    return max(5, math.ceil(args.block_s / step_s))


def _rounds(arms: dict[str, Arm], rounds: int, steps: int) -> dict[str, list[Block]]:
    """Run ``rounds`` interleaved rounds of ``steps`` steps on every arm; return their blocks."""
    for arm in arms.values():
        arm.block(3)
    blocks: dict[str, list[Block]] = {a: [] for a in ARMS}
    orders = list(itertools.permutations(ARMS))
    for r in range(rounds):
        for name in orders[r % len(orders)]:
            blocks[name].append(arms[name].block(steps))
    return blocks


def _figures(blocks: dict[str, list[Block]], block: int, buckets: int) -> dict:
    """Return the ratios and the per-step host costs of one regime's rounds."""
    plain = blocks["plain"]
    per_round = {
        a: [b.wall / p.wall for b, p in zip(blocks[a], plain)] for a in ("instr", "control")
    }
    ratios = {a: summary(rs) for a, rs in per_round.items()}

    def per_step_us(arm: str, field: str) -> float:
        return statistics.median(getattr(b, field) for b in blocks[arm]) / block * 1e6

    cost = {}
    for field in ("main_cpu", "autograd_cpu"):
        cost[field] = {a: per_step_us(a, field) for a in ARMS}
        cost[field]["instr_minus_plain"] = cost[field]["instr"] - cost[field]["plain"]
        cost[field]["control_minus_plain"] = cost[field]["control"] - cost[field]["plain"]
    return {
        "ratio": ratios,
        "per_round": per_round,  # every round's ratio: runs can be pooled
        "plain_step_ms": statistics.median(b.wall for b in plain) / block * 1e3,
        "issue_share": statistics.median(b.issue / b.wall for b in plain),
        "cpu_us_per_step": cost,
        "buckets_per_step": buckets,
        "autograd_us_per_bucket": cost["autograd_cpu"]["instr_minus_plain"] / max(buckets, 1),
    }


def _resolved(obs: exporter.Observer, timeout: float = 10.0) -> None:
    """Wait until the iterations the exporter marked are resolved (at most ``timeout``)."""
    timing = obs.comm_instrumentor.parts[0]
    deadline = time.monotonic() + timeout
    while getattr(timing, "pending", 0) and time.monotonic() < deadline:
        time.sleep(0.05)


def _regime(name: str, arms: dict[str, Arm], args: argparse.Namespace) -> dict:
    """Measure one regime on ``arms`` (built for it); the instr arm is instrumented here."""
    for arm in arms.values():
        arm.configure(loss_collective=name == "host-loss", loader=name == "host-data")
    instr = arms["instr"]
    obs = exporter.instrument(
        instr.model,
        optimizer=instr.opt,
        dataloader=instr.loader if name == "host-data" else None,
        port=0,
        addr="127.0.0.1",
        heartbeat_s=args.heartbeat,
        comm_timing=args.comm_timing,
    )
    try:
        steps = _block_steps(arms["plain"], args)
        cpu0 = exporter_threads_cpu()
        blocks = _rounds(arms, args.rounds, steps)
        threads_cpu = exporter_threads_cpu() - cpu0
        wall = sum(b.wall for bs in blocks.values() for b in bs)
        steps_before = obs.recorder.snapshot().steps
        _resolved(obs)
        try:
            kernel_s, kernel_wall = busy_share(arms["plain"], 10)
        except Exception as exc:  # noqa: BLE001 - a profiler that fails costs one figure
            print(f"[{name}] profiler failed: {exc!r}", flush=True)
            kernel_s, kernel_wall = float("nan"), 1.0
        out = _figures(blocks, steps, arms["plain"].buckets())
        snap = obs.recorder.snapshot()
        out.update(
            regime=name,
            block=steps,
            batch=instr.batch,
            params=sum(p.numel() for p in instr.model.parameters()),
            comm_timing=obs.comm_timing,
            inflight_source=obs.inflight.name,
            kernel_ms_per_step=kernel_s / 10 * 1e3,
            kernel_share=kernel_s / 10 / (out["plain_step_ms"] / 1e3),
            kernel_share_profiled=kernel_s / kernel_wall,
            exporter_threads_cpu_per_s=threads_cpu / wall,
            instr_steps_counted=steps_before,
            iterations_timed=sum(c[4] for c in snap.collectives),
            phase_s=dict(zip(("data", "compute", "comm_wait", "optimizer"), snap.phase_sum)),
            exporter_errors={k: n for k, n in obs.errors.snapshot().items() if n},
        )
        if args.extras and name == args.regimes[-1]:
            out["scrape_ms"] = scrape_ms(obs.url, instr, steps)
    finally:
        obs.close()
    ratio = out["ratio"]["instr"]["median"]
    print(
        f"[{name}] done: instr/plain {ratio:.4f}, plain step {out['plain_step_ms']:.1f} ms",
        flush=True,
    )
    return out


def _print(report: dict) -> None:
    print(
        f"{report['device']}: torch {report['torch_version']} CUDA {report['cuda_version']} "
        f"NCCL {report['nccl_version']}, {report['backend']}, AMP {report['amp']}, "
        f"{report['rounds']} rounds of every arm"
    )
    for r in report["regimes"]:
        c, a = r["cpu_us_per_step"]["main_cpu"], r["cpu_us_per_step"]["autograd_cpu"]
        print(
            f"[{r['regime']}] {r['params'] / 1e6:.0f} M parameters, batch {r['batch']}, "
            f"{r['block']} steps per block, "
            f"plain step {r['plain_step_ms']:.1f} ms, {r['buckets_per_step']} buckets; GPU busy "
            f"{r['kernel_ms_per_step']:.1f} ms/step (kernel_share {r['kernel_share']:.2f}); "
            f"comm_timing={r['comm_timing']}, in-flight {r['inflight_source']}"
        )
        for arm, s in r["ratio"].items():
            print(
                f"  {arm}/plain  median {s['median']:.4f}  IQR [{s['q1']:.4f}, {s['q3']:.4f}]  "
                f"min/max [{s['min']:.4f}, {s['max']:.4f}]"
            )
        print(
            f"  host CPU per step, instr - plain: training thread "
            f"{c['instr_minus_plain']:+.1f} us (control {c['control_minus_plain']:+.1f}), "
            f"autograd thread {a['instr_minus_plain']:+.1f} us (control "
            f"{a['control_minus_plain']:+.1f}) = {r['autograd_us_per_bucket']:+.2f} us per "
            f"bucket; exporter threads {r['exporter_threads_cpu_per_s'] * 1e3:.2f} ms CPU/s"
        )
        if r["exporter_errors"]:
            print(f"  exporter errors: {r['exporter_errors']}")
    if "marks" in report:
        m = report["marks"]
        print(
            f"events mode: the marks per iteration {m['cost_us']:.1f} us (min; median "
            f"{m['cost_median_us']:.1f} us) on a {m['bare_us']:.1f} us backward, host side"
        )
    if "hook_bucket" in report:
        b = report["hook_bucket"]
        print(
            f"hook mode (comm_timing='hook'): wrapper per bucket {b['cost_us']:.1f} us "
            f"(bare hook {b['bare_us']:.1f} us, host side)"
        )
    for r in report["regimes"]:
        if "scrape_ms" in r:
            s = r["scrape_ms"]
            print(
                f"/metrics scrape: idle {s['idle']['median']:.2f} ms, while training "
                f"{s['training']['median']:.2f} ms, {s['bytes']} bytes"
            )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--regimes", nargs="+", choices=REGIMES, default=list(REGIMES))
    p.add_argument(
        "--rounds", type=int, default=18, help="interleaved rounds of every arm (6 orders)"
    )
    p.add_argument("--block", type=int, default=0, help="steps per arm per round (0: --block-s)")
    p.add_argument("--block-s", type=float, default=0.4, help="seconds a block lasts (auto)")
    p.add_argument("--width", type=int, default=4096, help="model width")
    p.add_argument("--depth", type=int, default=8, help="hidden layers (gpu regime)")
    p.add_argument("--host-depth", type=int, default=24, help="layers (host regimes)")
    p.add_argument("--host-width", type=int, default=4096, help="model width (host regimes)")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket_cap_mb (host)")
    p.add_argument("--host-batch", type=int, default=256, help="per-GPU batch (host regimes)")
    p.add_argument("--batch", type=int, default=1024, help="first batch tried (gpu regime)")
    p.add_argument("--max-batch", type=int, default=65536, help="largest batch tried")
    p.add_argument("--target-ms", type=float, default=100.0, help="plain step sought (gpu)")
    p.add_argument("--amp", choices=("bf16", "fp16", "off"), default="bf16")
    p.add_argument("--heartbeat", type=float, default=5.0, help="the exporter's heartbeat, s")
    p.add_argument("--comm-timing", default=None, help="instrument(comm_timing=); default auto")
    p.add_argument("--bucket-calls", type=int, default=2000, help="hook-mode wrapper calls")
    p.add_argument(
        "--no-extras",
        dest="extras",
        action="store_false",
        help="skip the hook-mode wrapper and the scrape measurements",
    )
    p.add_argument("--cpu", action="store_true", help="a smoke run on the CPU (gloo), no figures")
    p.add_argument("--json", default=None, help="write every figure to this file")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not args.cpu and not torch.cuda.is_available():
        print("benchmarks/gpu.py: torch sees no CUDA device (--cpu: a smoke run)", file=sys.stderr)
        return 2
    device = torch.device("cpu") if args.cpu else torch.device("cuda", 0)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" and dist.is_nccl_available() else "gloo"
    dist.init_process_group(
        backend,
        init_method=f"tcp://127.0.0.1:{free_port()}",
        rank=0,
        world_size=1,
        timeout=datetime.timedelta(seconds=120),
    )
    report: dict = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        **versions(),
        "backend": backend,
        "amp": args.amp,
        "rounds": args.rounds,
        "regimes": [],
    }
    clock = autograd_thread_clock(device)
    try:
        if "gpu" in args.regimes:
            arms = {a: Arm(args.width, args.depth, device, args.amp, clock) for a in ARMS}
            batch = _calibrate(arms["plain"], args)
            for arm in arms.values():
                arm.set_batch(batch)
            report["regimes"].append(_regime("gpu", arms, args))
            del arms
            if device.type == "cuda":
                torch.cuda.empty_cache()
        host = [r for r in args.regimes if r.startswith("host")]
        if host:
            arms = {
                a: Arm(args.host_width, args.host_depth, device, args.amp, clock, args.bucket_mb)
                for a in ARMS
            }
            for arm in arms.values():
                arm.set_batch(args.host_batch)
            for name in host:
                report["regimes"].append(_regime(name, arms, args))
            del arms
        if args.extras:
            pg = dist.group.WORLD
            report["hook_bucket"] = bucket_cost(pg, device, args.bucket_calls)
            report["marks"] = marks_cost(device, args.bucket_calls)
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    _print(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    print(f"overhead_ratio={max(r['ratio']['instr']['median'] for r in report['regimes']):.4f}")
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    # gloo can abort at interpreter exit after destroy_process_group() (tests/workers/results.py)
    os._exit(code)
