"""Train a DDP model big enough that its gradients load the network (the slow-link drills).

    torchrun ... tests/workers/link_worker.py --width 512 --port 19400 --addr 0.0.0.0

Each step all-reduces ``width * width`` float32 gradients (512: 1 MiB); compute is a short
matmul, so the step time is mostly communication, as on a network-bound job. Prints one line
per ``--every`` steps with the mean step time; trains until ``--steps`` or until stopped.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import exporter  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--steps", type=int, default=0, help="0: until stopped")
    p.add_argument("--every", type=int, default=20)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--addr", default="127.0.0.1")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(args.width, args.width, bias=False))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    exporter.instrument(model, optimizer=opt, port=args.port, addr=args.addr)
    x = torch.randn(8, args.width)
    step, start = 0, time.monotonic()
    while args.steps == 0 or step < args.steps:
        with exporter.step():
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
        step += 1
        if step % args.every == 0:
            now = time.monotonic()
            print(f"rank {rank} step {step} {(now - start) / args.every:.3f} s/step", flush=True)
            start = now
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
