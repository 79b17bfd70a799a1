"""Train a small transformer sharded with FSDP2 (``fully_shard``), monitored by ddp-exporter.

The same one line as for DDP: ``exporter.instrument(model, dataloader=loader, optimizer=opt)``
on the sharded model. Without DDP's reducer, every ``torch.distributed`` collective FSDP2 issues
(all-gathers, reduce-scatters) is timed where it is called. Needs torch 2.6 or newer.

Runs on GPUs with NCCL when CUDA is available, else on CPUs with gloo; launched like
``train_ddp.py`` (see its docstring for two nodes and Slurm)::

    torchrun --nproc-per-node 4 examples/train_fsdp2.py
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import exporter


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=4096, help="size of the synthetic dataset")
    p.add_argument("--batch-size", type=int, default=16, help="per rank")
    p.add_argument("--lr", type=float, default=3e-3)
    return p.parse_args()


class TinyTransformer(nn.Module):
    """Classify short token sequences: embedding, transformer layers, a linear head."""

    def __init__(self, vocab: int = 64, dim: int = 64, layers: int = 2, classes: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(dim, nhead=4, dim_feedforward=128, batch_first=True)
            for _ in range(layers)
        )
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.head(h.mean(dim=1))


def synthetic_dataset(samples: int, length: int = 16, vocab: int = 64) -> TensorDataset:
    """Return token sequences labelled by which quarter of the vocabulary dominates them."""
    gen = torch.Generator().manual_seed(1234)
    tokens = torch.randint(0, vocab, (samples, length), generator=gen)
    return TensorDataset(tokens, (tokens // (vocab // 4)).mode(dim=1).values)


def main() -> None:
    args = parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device_type, backend = "cuda", "nccl"
    else:
        device_type, backend = "cpu", "gloo"
    dist.init_process_group(backend)
    rank = dist.get_rank()
    mesh = init_device_mesh(device_type, (dist.get_world_size(),))

    dataset = synthetic_dataset(args.samples)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    model = TinyTransformer().to(device_type)
    for layer in model.layers:  # shard each layer, then the rest at the root
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)

    # The one line, as for DDP.
    obs = exporter.instrument(model, dataloader=loader, optimizer=opt, epochs=args.epochs)
    # obs.url is None while nothing is served (the port taken, a web configuration that cannot
    # be served): the log says why, and training goes on.
    served = f"metrics at {obs.url}" if obs.url else "metrics not served (see the log)"
    print(f"rank {rank}: {served}", flush=True)

    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        total, count = 0.0, 0
        for tokens, labels in loader:
            tokens, labels = tokens.to(device_type), labels.to(device_type)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(tokens), labels)
            loss.backward()
            opt.step()
            total, count = total + loss.item(), count + 1
        if rank == 0:
            print(f"epoch {epoch}: loss {total / max(count, 1):.4f}", flush=True)
    obs.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
