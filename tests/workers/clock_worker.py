"""Train a small DDP model under torchrun with named sections and a job deadline.

Run by tests/test_walltime_live.py. The two ranks publish as two runs (``fits``, ``late``) so
one job shows a deadline it can meet beside one it cannot:

- rank 0, run ``fits``: SLURM_JOB_END_TIME an hour away, 600 steps to go; every 20 steps a short
  ``eval`` section (deadline 30 s) that finishes in time.
- rank 1, run ``late``: SLURM_JOB_END_TIME two minutes away, a million steps to go; an
  asynchronous ``checkpoint`` section (deadline 2 s) entered in a thread BEFORE instrument()
  whose storage "hangs" until the test creates the stop file.

Training stops (on every rank at the same step) once the stop file exists.
argv: stop_file
"""

import os
import sys
import tempfile
import threading
import time

import torch
import torch.distributed as dist
from results import leave
from torch.nn.parallel import DistributedDataParallel as DDP

import exporter
from exporter import settings
from exporter.tools.demo import say

stop_file = sys.argv[1]
rank = int(os.environ[settings.RANK])
say(f"worker pid {os.getpid()}")
dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)

checkpoint = exporter.deadline("checkpoint", seconds=2)
entered = threading.Event()


def save_checkpoint() -> None:
    with checkpoint:
        entered.set()
        with tempfile.TemporaryDirectory() as tmp:
            torch.save(model.module.state_dict(), os.path.join(tmp, "ckpt.pt"))
        # The storage "hangs": the write does not return until the test releases it.
        while not os.path.exists(stop_file):
            time.sleep(0.1)
    say(f"rank {rank}: checkpoint done")


saver = None
if rank == 1:
    saver = threading.Thread(target=save_checkpoint)
    saver.start()
    # Entered before instrument(): the section shows up once the endpoint serves.
    entered.wait()

# The deadline comes from the environment, as Slurm sets it; each rank its own run (see above).
os.environ[settings.SLURM_JOB_END_TIME] = str(int(time.time()) + (3600 if rank == 0 else 120))
obs = exporter.instrument(
    model,
    optimizer=opt,
    port=0,
    addr="127.0.0.1",
    run="fits" if rank == 0 else "late",
    heartbeat_s=0,
    total_steps=600 if rank == 0 else 1_000_000,
)
say(f"rank {rank}: metrics at {obs.url}")

g = torch.Generator().manual_seed(rank)
step = 0
while True:
    x, y = torch.randn(8, 16, generator=g), torch.randn(8, 1, generator=g)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    step += 1
    if rank == 0 and step % 20 == 0:
        with exporter.deadline("eval", seconds=30), torch.no_grad():
            model.module(torch.randn(64, 16, generator=g))
    if step % 10 == 0:
        # Every rank stops at the same step: a rank alone in the next allreduce would hang.
        flag = torch.tensor([float(os.path.exists(stop_file))])
        dist.all_reduce(flag)
        if flag.item() > 0:
            break
    time.sleep(0.05)  # a steady, modest pace: the machine is shared
if saver is not None:
    saver.join()
say(f"rank {rank}: done after {step} steps")
leave()  # closes the exporter and the group
