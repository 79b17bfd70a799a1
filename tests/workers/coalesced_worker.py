"""Train a small model whose communication goes through torch's coalescing manager, as
DeepSpeed's ZeRO does: every step reduces the gradients as one coalesced all-reduce (waited for
at ``cm.wait()``) and gathers a shard of each parameter as one coalesced all-gather (waited for
at the manager's exit). Then rank 1 stops entering collectives.

Usage (under torchrun)::

    coalesced_worker.py HEALTHY_STEPS   # rank 1 then blocks in hang_worker.load_batch()
                                        # until $COALESCED_WORKER_RELEASE exists

Every rank prints ``metrics at URL`` and ``step N`` after each step.
"""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from hang_worker import load_batch, say  # the stuck data loader of the hang drills

import exporter


def main() -> int:
    healthy = int(sys.argv[1])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank, world = dist.get_rank(), dist.get_world_size()
    c10d = dist.distributed_c10d
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    obs = exporter.instrument(model, optimizer=opt, port=0, addr="127.0.0.1", heartbeat_s=0.5)
    say(f"rank {rank}: metrics at {obs.url}")
    g = torch.Generator().manual_seed(rank)
    params = list(model.parameters())
    # torch 2.13 renames all_gather_into_tensor all_gather_single; older releases lack the new name.
    gather = getattr(c10d, "all_gather_single", None) or c10d.all_gather_into_tensor
    step = 0
    while True:
        if rank == 1 and step == healthy:
            load_batch(os.environ["COALESCED_WORKER_RELEASE"])
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 1, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        # Looked up at each use, as DeepSpeed's comm layer does.
        with c10d._coalescing_manager(async_ops=True) as cm:
            for p in params:
                dist.all_reduce(p.grad, async_op=True)
        cm.wait()  # collective call site
        opt.step()
        with torch.no_grad(), c10d._coalescing_manager():
            for p in params:  # one element of each: its "shard"
                gather(torch.empty(world), p.detach().reshape(-1)[:1].contiguous())
        step += 1
        say(f"step {step}")
        time.sleep(0.02)


if __name__ == "__main__":
    sys.exit(main())
