"""Measure the exporter on a real GPU step: overhead ratio, per-bucket wrapper cost, scrape time.

One process, one GPU, NCCL with one rank (gloo where this torch has no NCCL). Three identical
DDP models train in the same process: ``plain``, ``instr`` (after ``exporter.instrument``,
which on CUDA times each bucket with its comm hook and CUDA events) and ``control`` (a second
plain model: the noise floor of the method). The batch is sized so that a plain step takes
``--target-ms`` (50-200 ms), with AMP on (``--amp``). Every round runs ``--block`` steps on each
model, in a rotated order, timed from a synchronised start to a synchronised end; the per-round
ratios X/plain cancel drift (clocks, other tenants).

    python benchmarks/gpu.py                       # ~3 min on one H100
    python benchmarks/gpu.py --rounds 60 --json out.json

Also measured: the host-side cost of the timing wrapper per bucket (``CommHookWrapper`` with
CUDA events vs the bare ``allreduce_mean_hook`` on a real CUDA ``GradBucket``) and the time of
a ``/metrics`` scrape, idle and while training. The last line is ``overhead_ratio=<median>``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import socket
import statistics
import sys
import threading
import time
import urllib.request

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import exporter  # noqa: E402
from exporter.errors import ErrorCounter  # noqa: E402
from exporter.sources.commhook import (  # noqa: E402
    CommHookWrapper,
    CudaEventResolver,
    allreduce_mean_hook,
)
from exporter.sources.recorder import Recorder  # noqa: E402
from exporter.sources.versions import versions  # noqa: E402

ARMS = ("plain", "instr", "control")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _summary(xs: list[float]) -> dict[str, float]:
    q = statistics.quantiles(xs, n=4) if len(xs) >= 2 else [xs[0]] * 3
    return {"median": statistics.median(xs), "q1": q[0], "q3": q[2], "min": min(xs),
            "max": max(xs)}  # fmt: skip


def _model(width: int, depth: int, device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, width)).to(device)


class Arm:
    """One model with its optimizer, AMP settings and (for ``instr``) the exporter."""

    def __init__(self, name: str, args: argparse.Namespace, device: torch.device) -> None:
        self.name = name
        self.model = DDP(_model(args.width, args.depth, device), device_ids=[device.index])
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-5, foreach=True)
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp)
        self.scaler = torch.amp.GradScaler("cuda") if args.amp == "fp16" else None

    def step(self, x: torch.Tensor) -> None:
        self.opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=self.dtype, enabled=self.dtype is not None):
            loss = self.model(x).float().pow(2).mean()
        if self.scaler is None:
            loss.backward()
            self.opt.step()
        else:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.opt)
            self.scaler.update()

    def block(self, x: torch.Tensor, steps: int) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            self.step(x)
        torch.cuda.synchronize()
        return time.perf_counter() - t0


def _calibrate(arm: Arm, args: argparse.Namespace, device: torch.device) -> torch.Tensor:
    """Double the batch until a plain step takes ``--target-ms``; return that batch."""
    batch = args.batch
    while True:
        x = torch.randn(batch, args.width, device=device)
        arm.block(x, 3)
        ms = arm.block(x, 5) / 5 * 1e3
        if ms >= args.target_ms or batch >= args.max_batch:
            print(f"batch {batch}: plain step {ms:.1f} ms", flush=True)
            return x
        batch *= 2


def _bucket_cost(pg: dist.ProcessGroup, device: torch.device, n: int) -> dict[str, float]:
    """Time the wrapper per bucket (host side) against the bare hook on a real CUDA bucket."""
    got: list = []

    def capture(state, bucket):
        got.append(bucket)
        fut = torch.futures.Future(devices=[device])
        fut.set_result(bucket.buffer())
        return fut

    probe = DDP(torch.nn.Linear(1024, 1024).to(device), device_ids=[device.index])
    probe.register_comm_hook(None, capture)
    probe(torch.randn(8, 1024, device=device)).sum().backward()
    bucket = got[-1]
    errors = ErrorCounter()
    recorder = Recorder("comm_hook")
    resolver = CudaEventResolver(recorder, errors)
    stats = recorder.collective_stats("allreduce", "0", None)
    wrapper = CommHookWrapper(recorder, errors, stats, allreduce_mean_hook, pg, resolver)

    def loop(fn) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        for i in range(n):
            fn(pg, bucket)
            if i % 100 == 99:  # keep the GPU queue short; same for both
                torch.cuda.synchronize()
        torch.cuda.synchronize()
        return (time.perf_counter_ns() - t0) / n / 1e3

    bare, wrapped = [], []
    try:
        for r in range(7):
            for fn in (
                (allreduce_mean_hook, wrapper) if r % 2 == 0 else (wrapper, allreduce_mean_hook)
            ):
                (bare if fn is allreduce_mean_hook else wrapped).append(loop(fn))
    finally:
        resolver.close()
    if any(errors.snapshot().values()):
        raise RuntimeError(f"wrapper errors: {errors.snapshot()}")
    return {"bare_us": statistics.median(bare), "wrapped_us": statistics.median(wrapped),
            "cost_us": statistics.median(w - b for w, b in zip(wrapped, bare))}  # fmt: skip


def _scrape_ms(url: str, n: int) -> tuple[list[float], int]:
    out, size = [], 0
    for _ in range(n):
        t0 = time.perf_counter()
        with urllib.request.urlopen(url, timeout=10) as resp:
            size = len(resp.read())
        out.append((time.perf_counter() - t0) * 1e3)
    return out, size


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=30, help="interleaved rounds of every arm")
    p.add_argument("--block", type=int, default=5, help="steps per arm per round")
    p.add_argument("--width", type=int, default=4096, help="model width")
    p.add_argument("--depth", type=int, default=8, help="hidden layers")
    p.add_argument("--batch", type=int, default=1024, help="first batch size tried")
    p.add_argument("--max-batch", type=int, default=65536, help="largest batch tried")
    p.add_argument("--target-ms", type=float, default=100.0, help="plain step time sought")
    p.add_argument("--amp", choices=("bf16", "fp16", "off"), default="bf16")
    p.add_argument("--bucket-calls", type=int, default=2000, help="wrapper calls per repeat")
    p.add_argument("--json", default=None, help="write every figure to this file")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/gpu.py: torch sees no CUDA device", file=sys.stderr)
        return 2

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    backend = "nccl" if dist.is_nccl_available() else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0,
                            world_size=1, timeout=datetime.timedelta(seconds=120))  # fmt: skip
    try:
        arms = {name: Arm(name, args, device) for name in ARMS}
        obs = exporter.instrument(arms["instr"].model, optimizer=arms["instr"].opt, port=0,
                                  addr="127.0.0.1", heartbeat_s=0)  # fmt: skip
        x = _calibrate(arms["plain"], args, device)
        for arm in arms.values():
            arm.block(x, 3)
        times: dict[str, list[float]] = {a: [] for a in ARMS}
        order = list(ARMS)
        for r in range(args.rounds):
            for name in order[r % 3 :] + order[: r % 3]:
                times[name].append(arms[name].block(x, args.block))
        ratios = {
            a: [t / p for t, p in zip(times[a], times["plain"])] for a in ("instr", "control")
        }

        idle, size = _scrape_ms(obs.url, 50)
        busy: list[float] = []
        stop = threading.Event()

        def scraper() -> None:
            while not stop.is_set():
                busy.extend(_scrape_ms(obs.url, 1)[0])
                stop.wait(0.2)

        thread = threading.Thread(target=scraper, daemon=True)
        thread.start()
        arms["instr"].block(x, 4 * args.block)
        stop.set()
        thread.join()
        snap = obs.recorder.snapshot()
        report = {
            "device": torch.cuda.get_device_name(device),
            **versions(),
            "backend": backend,
            "amp": args.amp,
            "batch": x.shape[0],
            "params": sum(p.numel() for p in arms["plain"].model.parameters()),
            "plain_step_ms": statistics.median(times["plain"]) / args.block * 1e3,
            "rounds": args.rounds,
            "block": args.block,
            "comm_timing": obs.comm_timing,
            "inflight_source": obs.inflight.name,
            "instr_steps_counted": snap.steps,
            "buckets_timed": sum(c[4] for c in snap.collectives),
            "ratio": {a: _summary(rs) for a, rs in ratios.items()},
            "bucket": _bucket_cost(arms["instr"].model.process_group, device, args.bucket_calls),
            "scrape_ms": {
                "idle": _summary(idle),
                "training": _summary(busy or [float("nan")]),
                "bytes": size,
            },  # fmt: skip
            "exporter_errors": {k: n for k, n in obs.errors.snapshot().items() if n},
        }
        obs.close()
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    r = report
    print(f"{r['device']}: torch {r['torch_version']} CUDA {r['cuda_version']} "
          f"NCCL {r['nccl_version']}; {r['params'] / 1e6:.0f} M parameters, batch {r['batch']}, "
          f"AMP {r['amp']}, plain step {r['plain_step_ms']:.1f} ms, "
          f"comm_timing={r['comm_timing']}, in-flight source {r['inflight_source']}")  # fmt: skip
    for arm, s in r["ratio"].items():
        print(f"  {arm}/plain  median {s['median']:.4f}  IQR [{s['q1']:.4f}, {s['q3']:.4f}]  "
              f"min/max [{s['min']:.4f}, {s['max']:.4f}]  ({r['rounds']} rounds x {r['block']})")  # fmt: skip
    b = r["bucket"]
    print(f"  wrapper per bucket: {b['cost_us']:.1f} us (bare hook {b['bare_us']:.1f} us, "
          f"wrapped {b['wrapped_us']:.1f} us, host side)")  # fmt: skip
    s = r["scrape_ms"]
    print(f"  /metrics scrape: idle {s['idle']['median']:.2f} ms, while training "
          f"{s['training']['median']:.2f} ms, {s['bytes']} bytes")  # fmt: skip
    if r["exporter_errors"]:
        print(f"  exporter errors: {r['exporter_errors']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    print(f"overhead_ratio={r['ratio']['instr']['median']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
