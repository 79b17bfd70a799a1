"""Run a small instrumented DDP training on gloo, optionally with an injected fault.

This is the training script of ``ddp-exporter demo`` (:mod:`exporter.tools.demo`); it uses
only the public API, like a user's script. Launch one process per rank with torchrun::

    python -m torch.distributed.run --nproc-per-node 3 -m exporter.tools.trainer --duration 60

Faults (on ``--fault-rank``, ``--fault-after`` seconds into training):
``straggler`` adds compute time to every step; ``slow-data`` slows that rank's DataLoader;
``hang`` stops entering collectives while the process stays alive; ``kill`` SIGKILLs the
rank; ``freeze`` SIGSTOPs it; ``stall`` (``--device cuda``) stalls its GPU's stream with a kernel
that does not end, so its next collectives never start on the device while the others' do.
Compute faults are emulated with sleeps so that a 2-core machine still shows a clean signal.

``--parallel fsdp2`` shards the model with FSDP2 (``fully_shard``) instead of DDP, ``fsdp`` with
classic FSDP (``FullyShardedDataParallel``, each layer a unit); ``hsdp`` shards it within groups
of ``--shard-size`` ranks and replicates it across them (a 2-D mesh);
``tp`` splits both layers across groups of ``--tp-size`` ranks with tensor parallelism (DTensor's
``ColwiseParallel`` then ``RowwiseParallel``: one all-reduce per forward, a functional
collective) and shards them with FSDP2 across the groups (a 2-D mesh, ``dp`` x ``tp``); the ranks
of a group read the same batches. ``--clip`` clips the gradients' total norm, as most FSDP2 and
tensor-parallel loops do (on DTensor parameters, an all-reduce per mesh dimension).
``--sync-loss`` all-reduces the loss after the forward pass, as a loop logging its mean loss
does: the ranks then wait for a straggler there as well as in DDP's buckets.
``--device cuda`` trains on the GPU (``LOCAL_RANK`` modulo the GPUs seen), by default still over
gloo, which reduces CUDA tensors: several ranks can share one GPU, which NCCL refuses (tests/gpu);
``--backend nccl`` runs one rank per GPU over NCCL. ``--thread`` builds, instruments and trains
on a worker thread, as Ray Train runs a training function.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import signal
import sys
import threading
import time
from typing import NoReturn

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

import exporter
from exporter.settings import is_all_interfaces
from exporter.tools.demo import FAULTS, say
from exporter.tools.gpustandin import GPU_FAULTS, inject, standin

__all__ = ["PARALLEL", "build_model", "main", "parse_args", "run"]

#: The data parallelism the trainer can use (``--parallel``).
PARALLEL: tuple[str, ...] = ("ddp", "fsdp2", "fsdp", "hsdp", "tp")
#: GPU clock cycles the ``stall`` fault's kernel spins: an hour at 2 GHz, longer than any drill.
_STALL_CYCLES = 2_000_000_000 * 3600


class _Synthetic(Dataset):
    """Deterministic random regression data; optionally slow for one rank."""

    def __init__(self, n: int, dim: int, seed: int, delay: list[float]) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, dim, generator=g)
        self.y = torch.randn(n, 1, generator=g)
        self.delay = delay  # a one-element list so the fault can switch it on later

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        if self.delay[0]:
            time.sleep(self.delay[0])
        return self.x[i], self.y[i]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the demo trainer's options."""
    p = argparse.ArgumentParser(
        prog="python -m exporter.tools.trainer", description=__doc__.split("\n")[0]
    )
    p.add_argument("--duration", type=float, default=60.0, help="seconds to train (0: forever)")
    p.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: no limit)")
    p.add_argument(
        "--fault",
        choices=(*FAULTS, "stall"),
        default="none",
        help="the fault to inject; stall (--device cuda): a kernel that does not end stalls the "
        "rank's GPU stream",
    )
    p.add_argument("--fault-rank", type=int, default=1)
    p.add_argument("--fault-after", type=float, default=10.0)
    p.add_argument(
        "--hang-after",
        type=float,
        default=0.0,
        help="then --fault-rank hangs after this many seconds (0: never): a straggler "
        "that later stops entering collectives",
    )
    p.add_argument("--step-time", type=float, default=0.05, help="emulated compute per step, s")
    p.add_argument("--straggle", type=float, default=0.15, help="extra compute of a straggler, s")
    p.add_argument("--data-delay", type=float, default=0.05, help="per-sample delay of slow-data")
    p.add_argument("--port", type=int, default=None, help="base metrics port (default 19400)")
    p.add_argument("--addr", default=None, help="metrics bind address")
    p.add_argument("--run", default=None, help="run label")
    p.add_argument("--heartbeat", type=float, default=None, help="store heartbeat interval, s")
    p.add_argument("--file-sd", default=None, help="directory to write a Prometheus file_sd target")
    p.add_argument("--timeout", type=float, default=1800.0, help="process group timeout, s")
    p.add_argument(
        "--backend", choices=("gloo", "nccl"), default="gloo", help="nccl: one rank per GPU"
    )
    p.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="where the model trains"
    )
    p.add_argument(
        "--parallel",
        choices=PARALLEL,
        default="ddp",
        help="ddp; fsdp2 (fully_shard per layer and at the root); fsdp: classic "
        "FullyShardedDataParallel, each layer a unit; hsdp: fsdp2 on a 2-D mesh, "
        "sharded within groups of --shard-size ranks, replicated across them; tp: tensor "
        "parallel within groups of --tp-size ranks, fsdp2 across them",
    )
    p.add_argument("--shard-size", type=int, default=2, help="hsdp: ranks per shard group")
    p.add_argument("--tp-size", type=int, default=2, help="tp: ranks per tensor-parallel group")
    p.add_argument(
        "--gpu-recording",
        default=None,
        help="serve this recorded GPU health reading as each rank's own GPU (no GPU needed)",
    )
    p.add_argument(
        "--gpu-fault",
        choices=GPU_FAULTS,
        default=None,
        help="with --gpu-recording, on --fault-rank after --fault-after: its GPU throttles "
        "(hardware slowdown, SM clock down) or raises Xid 79",
    )
    p.add_argument(
        "--sync-loss",
        action="store_true",
        help="all-reduce the loss before the backward pass, as a loop logging its mean loss does",
    )
    p.add_argument(
        "--thread",
        action="store_true",
        help="build, instrument and train on a worker thread, as Ray Train runs a training "
        "function (the process group is still made on the main thread)",
    )
    p.add_argument(
        "--clip",
        type=float,
        default=0.0,
        help="clip the gradients' total norm to this (clip_grad_norm_; 0: no clipping)",
    )
    return p.parse_args(argv)


def _write_file_sd(directory: str, obs: exporter.Observer, host: str) -> None:
    os.makedirs(directory, exist_ok=True)
    target = [
        {"targets": [f"{host}:{obs.port}"], "labels": {"run": obs.run, "rank": str(obs.rank)}}
    ]
    # One file per (run, rank): jobs of several runs can share the folder.
    name = f"{re.sub(r'[^A-Za-z0-9_.-]', '_', obs.run)}-rank-{obs.rank}.json"
    tmp = os.path.join(directory, f".{name}.tmp")
    with open(tmp, "w") as f:
        json.dump(target, f)
    os.replace(tmp, os.path.join(directory, name))


def _load_batch_that_never_returns() -> None:
    """Hang where the next batch would be fetched: alive, heartbeating, out of collectives.

    The hang dump names this function and line, so the demo's verdict shows where it is stuck.
    """
    while True:
        time.sleep(1)


def _linger(args: argparse.Namespace, t_start: float) -> None:
    while not args.duration or time.monotonic() - t_start < args.duration:
        time.sleep(0.5)


def _finished(args: argparse.Namespace, elapsed: float, steps: int) -> bool:
    """Say whether to stop training now: every rank gives the same answer at the same step."""
    if args.steps and steps >= args.steps:
        return True
    if not args.duration:
        return False
    # Each rank reads its own clock a fraction of a step apart from the others: a rank that
    # stopped alone would leave its peers in an allreduce it never enters. Agree on it.
    up = torch.tensor([float(elapsed >= args.duration)])
    dist.all_reduce(up, op=dist.ReduceOp.MAX)
    return bool(up.item())


def _peer_failed(rank: int, exc: RuntimeError, args: argparse.Namespace, t_start: float) -> int:
    # A peer died: keep this rank's endpoint up for inspection until the end.
    say(f"rank {rank}: collective failed ({str(exc)[:120]}); still serving metrics")
    _linger(args, t_start)
    return 1


def _device(kind: str) -> torch.device:
    if kind == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device")
    index = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def build_model(
    parallel: str, device: torch.device, shard_size: int = 2, tp_size: int = 2
) -> torch.nn.Module:
    """Return the trainer's small model, the same on every rank, wrapped for ``parallel``."""
    torch.manual_seed(0)
    layers = torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1)
    ).to(device)
    if parallel == "ddp":
        return DDP(layers)
    if parallel == "fsdp":
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        policy = ModuleWrapPolicy({torch.nn.Linear})
        return FullyShardedDataParallel(layers, auto_wrap_policy=policy, device_id=device)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = None
    world = dist.get_world_size()
    if parallel == "hsdp":
        mesh = init_device_mesh(
            device.type, (world // shard_size, shard_size), mesh_dim_names=("replicate", "shard")
        )
    elif parallel == "tp":
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )

        mesh_2d = init_device_mesh(
            device.type, (world // tp_size, tp_size), mesh_dim_names=("dp", "tp")
        )
        # Column- then row-wise: the hidden layer stays split, the output is all-reduced
        # (gloo runs this on CPU; sequence parallelism would need reduce-scatters too).
        parallelize_module(layers, mesh_2d["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
        mesh = mesh_2d["dp"]
    for layer in (layers[0], layers[2]):
        fully_shard(layer, mesh=mesh)
    return fully_shard(layers, mesh=mesh)


def main(argv: list[str] | None = None) -> int:
    """Train until the duration or step limit, injecting the chosen fault."""
    args = parse_args(argv)
    device = _device(args.device)
    if args.backend == "nccl" and device.type != "cuda":
        print("--backend nccl needs --device cuda", file=sys.stderr)
        return 2
    if args.gpu_fault and not args.gpu_recording:
        print("--gpu-fault needs --gpu-recording (the GPU it acts on)", file=sys.stderr)
        return 2
    if args.fault == "stall" and not (device.type == "cuda" and hasattr(torch.cuda, "_sleep")):
        print("--fault stall needs --device cuda (and torch.cuda._sleep)", file=sys.stderr)
        return 2
    timeout = datetime.timedelta(seconds=args.timeout)
    dist.init_process_group(args.backend, timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    if not 0 <= args.fault_rank < world and args.fault != "none":
        print(f"--fault-rank {args.fault_rank} out of range for {world} ranks", file=sys.stderr)
        return 2
    if args.parallel == "hsdp" and (args.shard_size < 1 or world % args.shard_size):
        print(f"--shard-size {args.shard_size} does not divide {world} ranks", file=sys.stderr)
        return 2
    if args.parallel == "tp" and (args.tp_size < 1 or world % args.tp_size):
        print(f"--tp-size {args.tp_size} does not divide {world} ranks", file=sys.stderr)
        return 2
    if not args.thread:
        return _train(args, device, rank)
    code = [1]  # an exception on the thread leaves 1, and its traceback is printed

    def train() -> None:
        code[0] = _train(args, device, rank)

    # A daemon: a main thread interrupted in join() must not wait at exit for a hung worker.
    worker = threading.Thread(target=train, name="train-worker", daemon=True)
    worker.start()
    worker.join()
    return code[0]


def _train(args: argparse.Namespace, device: torch.device, rank: int) -> int:
    """Build, instrument and train the model on the calling thread; return the exit status."""
    model = build_model(args.parallel, device, args.shard_size, args.tp_size)
    delay = [0.0]
    # A tensor-parallel group splits one batch: its ranks read the same data.
    seed = rank // args.tp_size if args.parallel == "tp" else rank
    data = _Synthetic(4096, 64, seed=seed, delay=delay)
    loader = DataLoader(data, batch_size=8, shuffle=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gpu = standin(args.gpu_recording, rank) if args.gpu_recording else None
    obs = exporter.instrument(
        model,
        dataloader=loader,
        optimizer=opt,
        port=args.port,
        addr=args.addr,
        run=args.run,
        heartbeat_s=args.heartbeat,
        gpu_source=gpu,
    )
    say(
        f"rank {rank}: "
        + (f"metrics at {obs.url}" if obs.url else "metrics not served (see the log)")
    )
    if args.file_sd and obs.port is not None:
        host = args.addr if args.addr and not is_all_interfaces(args.addr) else "127.0.0.1"
        _write_file_sd(args.file_sd, obs, host)

    faulty = args.fault != "none" and rank == args.fault_rank
    gpu_fault = args.gpu_fault if gpu is not None and rank == args.fault_rank else None
    t_start = time.monotonic()
    steps = 0
    fault_on = False
    while True:
        for x, y in loader:
            elapsed = time.monotonic() - t_start
            try:
                if _finished(args, elapsed, steps):
                    obs.close()
                    return 0
            except RuntimeError as exc:
                code = _peer_failed(rank, exc, args, t_start)
                obs.close()
                return code
            if gpu_fault and elapsed >= args.fault_after:
                say(f"rank {rank}: injecting GPU fault {gpu_fault}")
                inject(gpu, gpu_fault)
                gpu_fault = None
            if faulty and not fault_on and elapsed >= args.fault_after:
                fault_on = True
                say(f"rank {rank}: injecting fault {args.fault}")
                if args.fault == "slow-data":
                    delay[0] = args.data_delay
                elif args.fault == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                elif args.fault == "freeze":
                    os.kill(os.getpid(), signal.SIGSTOP)
                elif args.fault == "hang":
                    _load_batch_that_never_returns()
                elif args.fault == "stall":
                    torch.cuda._sleep(_STALL_CYCLES)  # queued: the host goes on, the GPU does not
            if args.hang_after and rank == args.fault_rank and elapsed >= args.hang_after:
                say(f"rank {rank}: injecting fault hang")
                _load_batch_that_never_returns()
            try:
                x, y = x.to(device), y.to(device)
                loss = torch.nn.functional.mse_loss(model(x), y)
                extra = args.straggle if fault_on and args.fault == "straggler" else 0.0
                time.sleep(args.step_time + extra)
                if args.sync_loss:
                    dist.all_reduce(loss.detach().clone())
                opt.zero_grad()
                loss.backward()
                if args.clip and args.parallel == "fsdp":  # its own: over every rank's shards
                    model.clip_grad_norm_(args.clip)
                elif args.clip:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
                opt.step()
            except RuntimeError as exc:
                code = _peer_failed(rank, exc, args, t_start)
                obs.close()
                return code
            steps += 1


def run(argv: list[str] | None = None) -> NoReturn:
    """Train, then leave with the exit status without the interpreter's finalization.

    torch 2.13 + gloo aborts at interpreter exit after training in about one run of six
    ("terminate called without an active exception", SIGABRT), with or without the exporter:
    gloo's threads still hold work whose tensors are freed during finalization (an upstream
    teardown race, pytorch/pytorch PR 179291). Training and the exporter are closed by then, and
    a crash while they run happens inside :func:`main`, which is not masked.
    """
    code = main(argv)
    if dist.is_initialized():
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
