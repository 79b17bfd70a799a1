"""Train a small classifier with DistributedDataParallel, monitored by ddp-exporter.

The monitoring is one line, ``exporter.instrument(model, dataloader=loader, optimizer=opt)``
after the model is wrapped; ``exporter.deadline`` around the checkpoint tells the alerts that
rank 0 is busy saving (not hung) while the others wait. Each rank serves its metrics on
``19400 + LOCAL_RANK`` (``DDP_EXPORTER_PORT`` to change it, ``0`` for a free port).

Runs on GPUs with NCCL when CUDA is available (one process per GPU), else on CPUs with gloo.

One node (4 GPUs, or 4 CPU processes)::

    torchrun --nproc-per-node 4 examples/train_ddp.py

Two nodes with 8 GPUs each (the same command on both, ``NODE_RANK`` 0 on the first)::

    torchrun --nnodes 2 --nproc-per-node 8 --node-rank $NODE_RANK \\
        --master-addr node0.example --master-port 29500 examples/train_ddp.py

Slurm, one torchrun per node (sbatch script with ``#SBATCH --nodes 2 --gpus-per-node 8``)::

    head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
    srun --ntasks-per-node 1 torchrun --nnodes "$SLURM_NNODES" --nproc-per-node 8 \\
        --rdzv-backend c10d --rdzv-endpoint "$head:29500" --rdzv-id "$SLURM_JOB_ID" \\
        examples/train_ddp.py

Slurm, one task per GPU without torchrun (``srun --ntasks-per-node 8 --gpus-per-task 1 python
examples/train_ddp.py``): the script reads the rank from Slurm's variables.

Then point Prometheus at the ranks (``ddp-exporter mixin generate --out monitoring`` writes the
rules, dashboards and a Prometheus configuration) or watch them live with
``ddp-exporter top --targets node0:19400,node0:19401,...``.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import exporter


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--samples", type=int, default=16384, help="size of the synthetic dataset")
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument(
        "--checkpoint",
        default="checkpoint-ddp.pt",
        help="saved after every epoch; training resumes from it when it exists",
    )
    return p.parse_args()


def from_slurm() -> None:
    """Let ``srun python train_ddp.py`` (one task per GPU, no torchrun) find its rank."""
    if "RANK" not in os.environ and "SLURM_PROCID" in os.environ:
        os.environ["RANK"] = os.environ["SLURM_PROCID"]
        os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
        os.environ["LOCAL_RANK"] = os.environ["SLURM_LOCALID"]
        os.environ.setdefault("MASTER_PORT", "29500")
        if "MASTER_ADDR" not in os.environ:
            nodes = os.environ["SLURM_JOB_NODELIST"]
            os.environ["MASTER_ADDR"] = (
                os.popen(f"scontrol show hostnames {nodes}").readline().strip()
            )


def synthetic_dataset(samples: int, features: int = 32, classes: int = 8) -> TensorDataset:
    """Return points labelled by a fixed random teacher network: learnable, the same everywhere."""
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(samples, features, generator=gen)
    teacher = torch.randn(features, classes, generator=gen)
    return TensorDataset(x, (x @ teacher).argmax(dim=1))


def main() -> None:
    args = parse_args()
    from_slurm()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend)
    rank = dist.get_rank()

    dataset = synthetic_dataset(args.samples)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    model = nn.Sequential(
        nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8)
    ).to(device)
    start_epoch = 0
    if os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint, map_location=device)
        model.load_state_dict(state["model"])
        start_epoch = state["epoch"] + 1
    ddp = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)

    # The one line: per-rank metrics of steps, phases, collectives, liveness and hangs.
    obs = exporter.instrument(ddp, dataloader=loader, optimizer=opt, epochs=args.epochs)
    # obs.url is None while nothing is served (the port taken, a web configuration that cannot
    # be served): the log says why, and training goes on.
    served = f"metrics at {obs.url}" if obs.url else "metrics not served (see the log)"
    print(f"rank {rank}: {served}", flush=True)

    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)
        total, count = 0.0, 0
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(ddp(x), y)
            loss.backward()
            opt.step()
            total, count = total + loss.item(), count + 1
        if rank == 0:
            # Declared, so that the alerts do not take the others' wait for a hang.
            with exporter.deadline("checkpoint", seconds=600):
                torch.save({"model": model.state_dict(), "epoch": epoch}, args.checkpoint)
            print(f"epoch {epoch}: loss {total / max(count, 1):.4f}", flush=True)
        dist.barrier()
    obs.close()  # a clean end: published, so the finished job is not taken for a dead one
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
