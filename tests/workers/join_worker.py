"""DDP with uneven inputs under ``model.join()``: rank 1 runs out first and waits in the join.

Run by tests/test_join.py under torchrun with 2 ranks. Rank 0 has EXTRA more batches than rank 1
in each of two epochs; every step spends STEP_S in its forward (a compute stand-in), so rank 1
waits at least EXTRA * STEP_S in the join of each epoch. Writes each rank's steps and phase
sums, and whether ``Join.__exit__`` is torch's own again once the exporter closed.
argv: results_file
"""

import os
import sys
import time

import torch
import torch.distributed as dist
from results import leave, write_all_ranks
from torch.distributed.algorithms import Join
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

import exporter
from exporter import settings

BATCHES, EXTRA, STEP_S, EPOCHS = 20, 40, 0.02, 2

out = sys.argv[1]
rank = int(os.environ[settings.RANK])
dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
n = 16 * (BATCHES + (EXTRA if rank == 0 else 0))
loader = DataLoader(TensorDataset(torch.randn(n, 16), torch.randn(n, 1)), batch_size=16)
own_exit = Join.__exit__
obs = exporter.instrument(model, dataloader=loader, optimizer=opt, port=0, addr="127.0.0.1")
for _ in range(EPOCHS):
    with model.join():
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            time.sleep(STEP_S)
            loss.backward()
            opt.step()
            opt.zero_grad()
snap = obs.recorder.snapshot()
obs.close()
phases = dict(zip(("data", "compute", "comm_wait", "optimizer"), snap.phase_sum))
write_all_ranks(out, {"steps": snap.steps, "phases": phases, "restored": Join.__exit__ is own_exit})
leave()
