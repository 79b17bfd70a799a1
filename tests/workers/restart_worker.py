"""Train with checkpoints and resume from the last one, as the PyTorch DDP tutorials do.

Used by tests/test_hang_action.py and benchmarks/restart.py, under torchrun (``--max-restarts``)
or one process per rank. Rank 0 saves a checkpoint every ``--every`` steps (atomically, inside
``exporter.deadline("checkpoint")``); every attempt starts from the last one. The process
group's timeout is 30 minutes. Faults, each in torchrun's first attempt only:

``--stuck RANK:STEP``         RANK blocks in user code (``wait_for_data``) before STEP, forever
``--straggle RANK:STEP:S``    RANK is S seconds late for STEP once, then trains on
``--checkpoint-at STEP:S``    rank 0 saves a checkpoint taking S seconds before STEP (declared)
``--eval-at STEP:S[:AFTER]``  rank 0 evaluates for S seconds before STEP (declared), the others
                              wait in the next allreduce; then AFTER seconds of undeclared work
                              before its step (a DataLoader starting its workers again)
``--slow-start RANK:S``       RANK starts its first step S seconds late
``--slow-build RANK:S``       RANK is S seconds late building its model: the others already
                              instrumented wait in the broadcast of its weights, before any step

``--parallel fsdp2|hsdp`` trains an FSDP2 (``fully_shard``) model instead of DDP, ``hsdp`` on a
2-D mesh (sharded within pairs of ranks, replicated across them); every rank then checkpoints
its own shards.

``--stuck-always RANK:STEP`` blocks RANK before STEP in every attempt (a culprit that stays
broken: the restart loop). Every attempt tells the exporter the step it resumed at
(``instrument(start_step=...)``), as the Lightning and Hugging Face callbacks do.

Prints ``rank R: attempt A resumed at step N``, ``onset UNIX`` (the stuck rank, as it blocks),
``rank 0: attempt A first step at UNIX`` (the first step completed in a restarted attempt) and
``rank R: finished at step N``; the hang action prints its own line before every rank exits.

argv: WORKDIR [--steps N] [--every N] [--port P] [--addr A] [--go FILE] [faults]
"""

import argparse
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from results import leave
from torch.nn.parallel import DistributedDataParallel as DDP

import exporter

STEP_S = 0.02


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def numbers(text: str) -> list[float]:
    return [float(x) for x in text.split(":")]


def wait_for_data(seconds: float) -> None:
    """Stand in for a data source that stops answering (an NFS mount, a dead reader)."""
    time.sleep(seconds)  # stuck here


def weights(model: torch.nn.Module) -> dict:
    """Return what this rank checkpoints: DDP's full weights, or its FSDP2 shards."""
    if isinstance(model, DDP):
        return model.module.state_dict()
    return {k: v.to_local().clone() for k, v in model.state_dict().items()}


def load(model: torch.nn.Module, state: dict) -> None:
    if isinstance(model, DDP):
        model.module.load_state_dict(state)
        return
    with torch.no_grad():
        for k, v in model.state_dict().items():
            v.to_local().copy_(state[k])


def save(
    path: str, model: torch.nn.Module, opt: torch.optim.Optimizer, step: int, seconds: float
) -> None:
    with exporter.deadline("checkpoint", seconds=600):
        tmp = path + ".tmp"
        torch.save({"model": weights(model), "opt": opt.state_dict(), "step": step}, tmp)
        time.sleep(seconds)  # a slow shared file system
        os.replace(tmp, path)


def build(parallel: str) -> torch.nn.Module:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    if parallel == "ddp":
        return DDP(net)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = None
    if parallel == "hsdp":  # shard within pairs of ranks, replicate across the pairs
        world = dist.get_world_size()
        mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("replicate", "shard"))
    for layer in (net[0], net[2]):
        fully_shard(layer, mesh=mesh)
    return fully_shard(net, mesh=mesh)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("workdir")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--every", type=int, default=20)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--addr", default="127.0.0.1", help="metrics bind address")
    p.add_argument("--go", default="", help="wait for this file before training (attempt 0)")
    p.add_argument("--stuck", type=numbers, default=None)
    p.add_argument("--straggle", type=numbers, default=None)
    p.add_argument("--checkpoint-at", type=numbers, default=None)
    p.add_argument("--slow-start", type=numbers, default=None)
    p.add_argument("--slow-build", type=numbers, default=None)
    p.add_argument("--eval-at", type=numbers, default=None)
    p.add_argument("--stuck-always", type=numbers, default=None)
    p.add_argument("--parallel", choices=("ddp", "fsdp2", "hsdp"), default="ddp")
    args = p.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=30))
    rank = dist.get_rank()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    first = attempt == 0
    model = build(args.parallel)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # DDP: rank 0 saves the full weights; FSDP2: every rank saves its own shards.
    sharded = args.parallel != "ddp"
    name = f"checkpoint-rank{rank}.pt" if sharded else "checkpoint.pt"
    path = os.path.join(args.workdir, name)
    step = 0
    if os.path.exists(path):
        state = torch.load(path, map_location="cpu")
        load(model, state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"]
    say(f"rank {rank}: attempt {attempt} resumed at step {step}")
    obs = exporter.instrument(model, optimizer=opt, port=args.port, addr=args.addr, start_step=step)
    say(f"rank {rank}: metrics at {obs.url}")
    if args.slow_build and first:
        if rank == int(args.slow_build[0]):
            time.sleep(args.slow_build[1])  # still building: the others wait in the broadcast
        for p in model.module.parameters():
            dist.broadcast(p.data, src=0)
    while args.go and first and not os.path.exists(args.go):  # every rank, before any step
        time.sleep(0.1)
    if args.slow_start and first and rank == int(args.slow_start[0]):
        time.sleep(args.slow_start[1])
    reported = False
    while step < args.steps:
        stuck = args.stuck if first else None
        stuck = args.stuck_always or stuck
        if stuck and rank == int(stuck[0]) and step == int(stuck[1]):
            say(f"onset {time.time()}")
            wait_for_data(3600)
        if args.straggle and first and rank == int(args.straggle[0]):
            if step == int(args.straggle[1]):
                time.sleep(args.straggle[2])
        if args.checkpoint_at and first and rank == 0 and step == int(args.checkpoint_at[0]):
            say(f"rank 0: long checkpoint at step {step}")
            save(path, model, opt, step, args.checkpoint_at[1])
        if args.eval_at and first and rank == 0 and step == int(args.eval_at[0]):
            say(f"rank 0: long evaluation at step {step}")
            with exporter.deadline("evaluation", seconds=600):
                time.sleep(args.eval_at[1])
            if len(args.eval_at) > 2:
                time.sleep(args.eval_at[2])
        g = torch.Generator().manual_seed(1000 * step + rank)
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 1, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        step += 1
        if rank == 0 and attempt > 0 and not reported:
            reported = True
            say(f"rank 0: attempt {attempt} first step at {time.time()}")
        if (rank == 0 or sharded) and step % args.every == 0:
            save(path, model, opt, step, 0.0)
        time.sleep(STEP_S)
    say(f"rank {rank}: finished at step {step}")
    leave()


if __name__ == "__main__":
    main()
