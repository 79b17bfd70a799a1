"""Distributed evaluation where one rank has a larger shard: the README's evaluation recipe.

Run by tests/test_eval_recipe.py under torchrun with 3 ranks. Every rank evaluates its shard
batch by batch inside ``exporter.step()``, then all ranks ``all_gather`` their counts. Rank 1's
shard is heavier: 8x the rows per batch, and more batches (it goes on until the test has looked,
i.e. until the release file exists). The light ranks finish first and wait in the gather.
argv: release_file
"""

import os
import sys

import torch
import torch.distributed as dist
from results import leave
from torch.nn.parallel import DistributedDataParallel as DDP

import exporter
from exporter import settings
from exporter.tools.demo import say

# Batches large enough that the matrix work, not Python's per-step overhead or the scheduling of
# three ranks on two cores, decides a step's time: the heavy shard is then clearly the slowest.
HEAVY, BATCHES, ROWS = 1, 20, 1024

release = sys.argv[1]
rank = int(os.environ[settings.RANK])
say(f"worker pid {os.getpid()}")
dist.init_process_group("gloo")
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))
# instrument() takes a DDP model; in evaluation DDP only runs forward (no gradient sync).
model = DDP(net)
obs = exporter.instrument(model, port=0, addr="127.0.0.1", heartbeat_s=0)
say(f"rank {rank}: metrics at {obs.url}")

g = torch.Generator().manual_seed(rank)
rows = ROWS * (8 if rank == HEAVY else 1)
correct = total = batches = 0
model.eval()
with torch.no_grad():
    while batches < BATCHES or (rank == HEAVY and not os.path.exists(release)):
        with exporter.step():
            x = torch.randn(rows, 256, generator=g)
            y = torch.randint(0, 10, (rows,), generator=g)
            correct += int((model(x).argmax(1) == y).sum())
            total += rows
        batches += 1
say(f"rank {rank}: evaluated {batches} batches, gathering")
counts = torch.tensor([correct, total], dtype=torch.float64)
gathered = [torch.zeros_like(counts) for _ in range(dist.get_world_size())]
dist.all_gather(gathered, counts)
if rank == 0:
    say(f"rank 0: gathered {len(gathered)} ranks, {int(sum(t[1] for t in gathered))} samples")
leave()  # closes the exporter and the group
