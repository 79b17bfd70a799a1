"""A whole job's life: train, checkpoint, train, evaluate, train, end (tests/test_lifecycle.py).

Run under torchrun. Every rank waits for the go file (the test starts Prometheus first), then
trains ``--steps`` steps per training phase. Rank 0 saves a checkpoint inside
``exporter.deadline("checkpoint")`` lasting ``--checkpoint SECONDS:DEADLINE`` while the other
ranks go on into the next step and wait for it in DDP's allreduce; later rank 0 evaluates alone
inside ``exporter.deadline("evaluation")`` (``--eval SECONDS:DEADLINE``) the same way. Then the
job ends cleanly, or with ``--forever`` trains on until it is stopped. ``--fail RANK:STEP``
makes RANK raise at STEP in torchrun's first attempt only (a restart drill).

argv: go_file [--checkpoint S:D] [--eval S:D] [--steps N] [--fail RANK:STEP] [--forever]
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from results import leave
from torch.nn.parallel import DistributedDataParallel as DDP

import exporter
from exporter.tools.demo import say

STEP_S = 0.05


def pair(text: str) -> tuple[float, float]:
    a, b = text.split(":")
    return float(a), float(b)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("go")
    p.add_argument("--checkpoint", type=pair, default=None)
    p.add_argument("--eval", type=pair, default=None)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--fail", default="")
    p.add_argument("--forever", action="store_true")
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    torch.manual_seed(0)
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    obs = exporter.instrument(model, optimizer=opt, port=args.port, addr="127.0.0.1", heartbeat_s=1)
    say(f"rank {rank}: metrics at {obs.url}")
    say(f"rank {rank}: attempt {attempt}")
    while not os.path.exists(args.go):  # every rank, before any collective
        time.sleep(0.1)
    fail_rank, fail_step = (int(x) for x in args.fail.split(":")) if args.fail else (-1, -1)
    g = torch.Generator().manual_seed(rank)
    step = 0

    def train(n: int) -> None:
        nonlocal step
        for _ in range(n):
            if rank == fail_rank and step == fail_step and attempt == "0":
                raise RuntimeError(f"rank {rank} fails at step {step} (the restart drill)")
            x, y = torch.randn(8, 16, generator=g), torch.randn(8, 1, generator=g)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            step += 1
            time.sleep(STEP_S)

    def alone(what: str, seconds: float, deadline: float) -> None:
        """Rank 0 does ``what`` in a declared section; the others wait in the next allreduce."""
        say(f"rank {rank}: {what}")
        if rank == 0:
            with exporter.deadline(what, seconds=deadline), torch.no_grad():
                end = time.monotonic() + seconds
                if what == "checkpoint":
                    torch.save(
                        model.state_dict(), os.path.join(os.path.dirname(args.go), "ckpt.pt")
                    )
                while time.monotonic() < end:  # a slow file system, or the evaluation's batches
                    model.module(torch.randn(64, 16, generator=g))
                    time.sleep(0.05)
        say(f"rank {rank}: {what} done")

    train(args.steps)
    if args.checkpoint:
        alone("checkpoint", *args.checkpoint)
        train(args.steps)
    if args.eval:
        alone("evaluation", *args.eval)
        train(args.steps)
    while args.forever:
        train(args.steps)
    say(f"rank {rank}: done after {step} steps")
    leave()  # closes the exporter (a clean end) and the group


if __name__ == "__main__":
    main()
