"""A training script that knows nothing of the exporter, for ``ddp-exporter run``.

The shapes users write from their libraries' own examples, CPU/gloo under torchrun or one
process per rank, each with a ``DataLoader`` and an optimizer: ``--shape ddp``
(``DistributedDataParallel`` over a small MLP), ``--shape fsdp2`` (``fully_shard`` on every
block and at the root, as pytorch/examples' FSDP2 example), ``--shape loop`` (no wrapper: a
hand-written gradient all-reduce), ``--shape accelerate`` (``accelerator.prepare`` and its
loop) and ``--shape trainer`` (``transformers.Trainer`` on a tiny BERT). ``--instrument`` adds
the one ``exporter.instrument()`` line (a script run under ``ddp-exporter run`` that
instruments itself too). ``--slow-rank R`` makes rank R slower by ``--slow-s`` per step: in
its compute, or in its data for the Trainer. Prints ``trained R STEPS`` at the end and ends
cleanly; ``--steps 0`` trains until stopped.

    ddp-exporter run -- torchrun --nproc-per-node 3 tests/workers/unmodified_worker.py
"""

from __future__ import annotations

import argparse
import atexit
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

WIDTH, BATCH, SAMPLES = 64, 16, 4096
SHAPES = ("ddp", "fsdp2", "loop", "accelerate", "trainer")


def _say(line: str) -> None:
    """Print ``line`` in one write: the ranks share the launcher's output."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _model(shape: str) -> nn.Module:
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU()) for _ in range(3)]
    model = nn.Sequential(*blocks, nn.Linear(WIDTH, 1))
    if shape == "ddp":
        return nn.parallel.DistributedDataParallel(model)
    if shape == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for block in blocks:
            fully_shard(block)
        fully_shard(model)
    return model


class _SlowData(torch.utils.data.Dataset):
    """Token ids and labels for the Trainer; ``slow_s`` seconds more per batch when asked."""

    def __init__(self, slow_s: float) -> None:
        g = torch.Generator().manual_seed(3)
        self.ids = torch.randint(0, 64, (SAMPLES, 12), generator=g)
        self.labels = torch.randint(0, 2, (SAMPLES,), generator=g)
        self.sample_s = slow_s / BATCH

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> dict:
        if self.sample_s:
            time.sleep(self.sample_s)
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def _trainer(args: argparse.Namespace, slow_s: float) -> int:
    """Train a tiny BERT with ``transformers.Trainer``; return its global step."""
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        num_labels=2,
    )
    training = TrainingArguments(
        output_dir=os.environ.get("TMPDIR", "/tmp"),
        max_steps=args.steps or 10**9,
        per_device_train_batch_size=BATCH,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    model = BertForSequenceClassification(config)
    trainer = Trainer(model=model, args=training, train_dataset=_SlowData(slow_s))
    trainer.train()
    return int(trainer.state.global_step)


def _loop(args: argparse.Namespace, rank: int, extra: float) -> int:
    """Train the plain torch shapes and Accelerate's loop; return the steps taken."""
    model = _model("none" if args.shape == "accelerate" else args.shape)
    data = TensorDataset(torch.randn(SAMPLES, WIDTH), torch.randn(SAMPLES, 1))
    if args.shape == "accelerate":
        from accelerate import Accelerator

        accelerator = Accelerator(cpu=True)
        loader = DataLoader(data, batch_size=BATCH, shuffle=True)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        backward = accelerator.backward
    else:
        loader = DataLoader(data, batch_size=BATCH, sampler=DistributedSampler(data))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        backward = torch.Tensor.backward
    if args.instrument:
        import exporter

        obs = exporter.instrument(model, dataloader=loader, optimizer=optimizer)
        _say(f"rank {rank}: metrics at {obs.url}")
    steps, epoch, warm = 0, 0, 0.0
    while not args.steps or steps < args.steps:
        if isinstance(loader.sampler, DistributedSampler):
            loader.sampler.set_epoch(epoch)
        for x, y in loader:
            backward(nn.functional.mse_loss(model(x), y))
            if args.shape == "loop":
                for param in model.parameters():
                    dist.all_reduce(param.grad)
            time.sleep(extra)  # the rest of a step's compute (a GPU would keep the host waiting)
            optimizer.step()
            optimizer.zero_grad()
            steps += 1
            if steps == args.warmup:
                warm = time.perf_counter()
            if steps == args.steps:
                break
        epoch += 1
    if steps > args.warmup:  # for benchmarks/autorun.py: seconds per step after the warm-up
        _say(f"step_s {rank} {(time.perf_counter() - warm) / (steps - args.warmup):.6f}")
    return steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", choices=SHAPES, default="ddp")
    p.add_argument("--steps", type=int, default=200, help="0: until stopped")
    p.add_argument("--step-s", type=float, default=0.02, help="extra compute per step, s")
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-s", type=float, default=0.0)
    p.add_argument("--instrument", action="store_true", help="also call exporter.instrument()")
    p.add_argument("--warmup", type=int, default=20, help="steps before step_s is measured")
    p.add_argument(
        "--hold",
        default="",
        help="after printing its count, keep serving until this file exists (120 s at most): "
        "a test reads the final count however late it gets to it",
    )
    args = p.parse_args()
    if args.shape != "trainer":  # Trainer's own set-up makes the group
        dist.init_process_group("gloo")
    rank = int(os.environ["RANK"])
    slow = args.slow_s if rank == args.slow_rank else 0.0
    if args.shape == "trainer":
        steps = _trainer(args, slow)
    else:
        steps = _loop(args, rank, args.step_s + slow)
    _say(f"trained {rank} {steps}")
    deadline = time.monotonic() + 120
    while args.hold and not os.path.exists(args.hold) and time.monotonic() < deadline:
        time.sleep(0.1)
    dist.barrier()
    dist.destroy_process_group()
    # What a normal exit runs (the exporter's clean end, when it is there), then no interpreter
    # teardown: torch 2.13 + gloo can abort in it after destroy_process_group (results.leave).
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
