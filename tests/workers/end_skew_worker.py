"""Rank 1 ends cleanly while rank 0 saves a last checkpoint in a declared section.

Run by tests/test_top_after_end.py, one process per rank. Rank 0 saves until the release file
exists, so the test reads the job while rank 1 is gone and rank 0 is still there.
argv: release_file
"""

import os
import sys
import time

import torch
import torch.distributed as dist
from results import leave
from torch.nn.parallel import DistributedDataParallel as DDP

import exporter
from exporter import settings
from exporter.tools.demo import say

release = sys.argv[1]
rank = int(os.environ[settings.RANK])
dist.init_process_group("gloo")
model = DDP(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
obs = exporter.instrument(model, optimizer=opt, port=0, addr="127.0.0.1", heartbeat_s=0.2)
say(f"rank {rank}: metrics at {obs.url}")
for _ in range(20):
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
if rank == 0:
    with exporter.deadline("checkpoint", seconds=300):
        say("rank 0: saving")
        deadline = time.monotonic() + 120
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.05)
obs.close()
say(f"rank {rank}: finished")
leave()
