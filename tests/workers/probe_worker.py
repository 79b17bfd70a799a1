"""Train a small DDP model on gloo until stopped, for the hang probe's lab drills.

    torchrun ... tests/workers/probe_worker.py [--cross-at STEP] [--big MIB]

Every rank prints ``rank R step N`` every 20 steps. The faults between nodes come from outside
(nftables, ``tc`` in the lab); the job itself can make one hang that is not the network:

``--cross-at STEP``  at STEP, even ranks all-reduce in group A then group B, odd ranks in B
                     then A: every rank waits, each in the group the others have not entered
                     (both groups' timeout ``--group-timeout`` seconds)
``--big MIB``        every step also all-reduces MIB mebibytes (a link at a few Mbit/s then
                     keeps every rank inside that collective for many seconds, alive)
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import exporter  # noqa: E402


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def cross(rank: int, first: dist.ProcessGroup, second: dist.ProcessGroup) -> None:
    """Enter the two groups' collectives in this rank's order: a deadlock across them."""
    t = torch.ones(4)
    order = (first, second) if rank % 2 == 0 else (second, first)
    say(f"rank {rank}: crossing at {time.time()}")
    for group in order:
        dist.all_reduce(t, group=group)  # stuck here


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--addr", default="127.0.0.1")
    p.add_argument("--cross-at", type=int, default=-1)
    p.add_argument("--group-timeout", type=float, default=1800.0)
    p.add_argument("--big", type=float, default=0.0)
    args = p.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    timeout = datetime.timedelta(seconds=args.group_timeout)
    groups = [dist.new_group(list(range(world)), timeout=timeout) for _ in range(2)]
    torch.manual_seed(0)
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    obs = exporter.instrument(model, optimizer=opt, port=args.port, addr=args.addr)
    say(f"rank {rank}: metrics at {obs.url}")
    big = torch.ones(int(args.big * 2**20) // 4) if args.big > 0 else None
    step = 0
    while True:
        if step == args.cross_at:
            cross(rank, *groups)
        g = torch.Generator().manual_seed(1000 * step + rank)
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 1, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if big is not None:
            started = time.monotonic()
            dist.all_reduce(big)
            took = time.monotonic() - started
            if took > 5:
                say(f"rank {rank}: step {step} big all_reduce took {took:.1f} s")
        step += 1
        if step % 20 == 0:
            say(f"rank {rank} step {step}")
        time.sleep(0.02)


if __name__ == "__main__":
    main()
