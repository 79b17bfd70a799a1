"""Train a small DDP model, then hang in a chosen way; the exporter must dump every rank.

Usage (under torchrun, or one process per rank with env://)::

    hang_worker.py behind STOP_RANK   # rank 1 blocks in load_batch(); STOP_RANK SIGSTOPs itself
                                      # (-1: none)
    hang_worker.py mismatch           # healthy phase, then rank 0 all_reduce, rank 1 broadcast

Every rank prints ``pid RANK PID`` (the test kills them all) and ``metrics at URL``; the
hanging rank prints ``onset UNIX`` when it stops entering collectives.
"""

import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import exporter


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def load_batch(release: str) -> None:
    """Stand in for a data loading function that blocks until ``release`` exists."""
    while not os.path.exists(release):
        time.sleep(0.05)  # stuck here


def step(model: DDP, opt: torch.optim.Optimizer, g: torch.Generator) -> None:
    x, y = torch.randn(8, 16, generator=g), torch.randn(8, 1, generator=g)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()  # collective call site
    opt.step()


def main() -> int:
    scenario = sys.argv[1]
    timeout = float(os.environ.get("HANG_WORKER_PG_TIMEOUT", "600"))
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout))
    rank = dist.get_rank()
    say(f"pid {rank} {os.getpid()}")
    torch.manual_seed(0)
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    beat = float(os.environ.get("HANG_WORKER_HEARTBEAT_S", "0.5"))  # the benchmark uses 5
    obs = exporter.instrument(model, optimizer=opt, port=0, addr="127.0.0.1", heartbeat_s=beat)
    say(f"rank {rank}: metrics at {obs.url}")
    g = torch.Generator().manual_seed(rank)
    if scenario == "behind":
        stop_rank = int(sys.argv[2])
        for _ in range(30):
            step(model, opt, g)
            time.sleep(0.02)
        if rank == stop_rank:
            say(f"onset {time.time()}")
            os.kill(os.getpid(), signal.SIGSTOP)
        # With HANG_WORKER_RELEASE set, rank 1 recovers when that file appears, trains on and
        # hangs a second time (a new episode); without it, it stays in the first hang.
        release = os.environ.get("HANG_WORKER_RELEASE", "/nonexistent/never")
        for episode in (1, 2):
            if rank == 1:
                say(f"onset {time.time()}")
                load_batch(release if episode == 1 else "/nonexistent/never")
            for _ in range(10):
                step(model, opt, g)  # waits for rank 1 inside DDP's allreduce
            say(f"recovered {rank}")
    elif scenario == "mismatch":
        # A step count, not a duration: ranks must agree on how many collectives they run.
        for n in range(int(os.environ.get("HANG_WORKER_HEALTHY_STEPS", "120"))):
            step(model, opt, g)
            if n == 10 and rank == 1:
                time.sleep(3.0)  # a slow step: a short wait in the collective is no hang
            time.sleep(0.05)
        dist.barrier()
        say(f"healthy done {rank}")
        t = torch.ones(4)
        say(f"onset {time.time()}")
        if rank == 0:
            dist.all_reduce(t)
        else:
            dist.broadcast(t, src=1)
    while True:  # never reached by the hung ranks; keeps a finished rank inspectable
        time.sleep(1)


if __name__ == "__main__":
    sys.exit(main())
