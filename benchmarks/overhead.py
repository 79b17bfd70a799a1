"""Measure the training-step overhead of the exporter: plain vs instrumented DDP on gloo.

Each rank holds five identical DDP models with their own DataLoader and optimizer: ``plain``
(DDP's built-in C++ allreduce), ``instr`` (the same after ``exporter.instrument`` in its default
mode: on CPU, DDP's reducer times its own allreduce), ``instr_hook`` (the exporter with
``comm_timing="hook"``: its timing comm hook stands in for the allreduce), ``hook`` (no
exporter, only the exporter's stand-in ``allreduce_mean_hook`` registered as comm hook: the
share of ``instr_hook``'s overhead that any Python hook costs) and ``control`` (a second plain
model: the noise floor of the method). Every round runs a block of ``--block`` steps on each
model, in a rotated order, in the same processes; the per-round ratios X/plain cancel machine
drift. Rank 0's block times are reported (DDP keeps the ranks in lockstep).

    python benchmarks/overhead.py                     # 1 and 2 ranks, 100 rounds (~20 min)
    python benchmarks/overhead.py --world 2 4 --rounds 60
    python benchmarks/overhead.py --world 2 --width 3238   # 10x the parameters
    python benchmarks/overhead.py --world 2 --arms instr control --rounds 100   # the figure only

The last line is ``overhead_ratio=<median>``: the larger of the per-world-size medians of
``instr`` (the default mode).

``--parallel fsdp2`` runs the same with FSDP2 models (``fully_shard`` per layer and at the
root): ``plain``, ``instr`` and ``control`` only. The exporter times FSDP2's communication by
wrapping the ``torch.distributed`` collectives, which are process-wide, so the wrappers are put
in place before each ``instr`` block and removed before every other block::

    python benchmarks/overhead.py --parallel fsdp2 --world 2 --rounds 60

``--parallel tp`` adds tensor parallelism: the models split across groups of ``--tp-size``
ranks (``ColwiseParallel``, ``RowwiseParallel``, then ``ColwiseParallel`` gathering its output:
functional all-reduces and all-gathers, DTensor's), sharded with FSDP2 across the groups (a 2-D
mesh). ``--clip`` clips the gradients' total norm every step (``clip_grad_norm_``: on DTensor
parameters, functional all-reduces), as most FSDP2 and tensor-parallel loops do::

    python benchmarks/overhead.py --parallel fsdp2 --clip --world 2 --rounds 60
    python benchmarks/overhead.py --parallel tp --clip --world 2 --rounds 60
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from exporter.tools.reaper import raise_on_signals  # noqa: E402

ARMS = ("plain", "instr", "instr_hook", "hook", "control")


def _model(width: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(width, 2 * width),
        torch.nn.ReLU(),
        torch.nn.Linear(2 * width, 2 * width),
        torch.nn.ReLU(),
        torch.nn.Linear(2 * width, width),
    )


def _fsdp2(model: torch.nn.Module) -> torch.nn.Module:
    from torch.distributed.fsdp import fully_shard

    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    return fully_shard(model)


def _tp(model: torch.nn.Module, tp_size: int) -> torch.nn.Module:
    """Split ``model`` across groups of ``tp_size`` ranks, then shard it with FSDP2 across them."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world // tp_size, tp_size), mesh_dim_names=("dp", "tp"))
    plan = {
        "0": ColwiseParallel(),
        "2": RowwiseParallel(),
        "4": ColwiseParallel(output_layouts=Replicate()),
    }
    parallelize_module(model, mesh["tp"], plan)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh["dp"])
    return fully_shard(model, mesh=mesh["dp"])


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, out) -> None:
    import exporter
    from exporter import settings
    from exporter.observer import Observer
    from exporter.sources.commhook import allreduce_mean_hook

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    # A tensor-parallel group splits one batch: its ranks read the same data.
    g = torch.Generator().manual_seed(rank // args.tp_size if args.parallel == "tp" else rank)
    data = TensorDataset(
        torch.randn(args.batch * 16, args.width, generator=g),
        torch.randn(args.batch * 16, args.width, generator=g),
    )
    names = ("plain", *args.arms)
    arms = {}
    fsdp2 = args.parallel in ("fsdp2", "tp")  # the exporter's timing is process-wide
    for name in names:
        if args.parallel == "tp":
            model = _tp(_model(args.width), args.tp_size)
        else:
            model = _fsdp2(_model(args.width)) if fsdp2 else DDP(_model(args.width))
        if name == "hook":
            model.register_comm_hook(None, allreduce_mean_hook)
        loader = DataLoader(data, batch_size=args.batch, shuffle=False, drop_last=True)
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)
        arms[name] = (model, loader, opt)
    obs = exporter.instrument(
        arms["instr"][0],
        dataloader=arms["instr"][1],
        optimizer=arms["instr"][2],
        port=0,
        addr="127.0.0.1",
    )
    # instrument() keeps one handle per process: the hook-mode arm gets an Observer of its own,
    # with the same endpoint settings but no heartbeat (its store keys would be the first's).
    hooked = None
    if "instr_hook" in arms:
        model, loader, opt = arms["instr_hook"]
        hooked = Observer(
            model,
            settings.for_instrument(
                parallelism="ddp",
                group=(rank, world),
                run="overhead-hook",
                port=0,
                addr="127.0.0.1",
                heartbeat_s=0,
                timing="hook",
            ),
            dataloader=loader,
            optimizer=opt,
        )
    modes = (obs.comm_timing, hooked.comm_timing if hooked is not None else "-")

    comm = obs.comm_instrumentor

    def block(name: str, steps: int) -> float:
        model, loader, opt = arms[name]
        if fsdp2 and name == "instr":
            comm.instrument()
        elif fsdp2:  # the wrappers are process-wide: only the instrumented arm runs with them
            comm.uninstrument()
        done = 0
        t0 = time.perf_counter()
        while done < steps:
            for x, y in loader:
                loss = torch.nn.functional.mse_loss(model(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                if args.clip:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                done += 1
                if done == steps:
                    break
        return time.perf_counter() - t0

    for name in names:  # warm-up: allocator, DDP bucket rebuild, first-iteration costs
        block(name, args.warmup)
    times: dict[str, list[float]] = {a: [] for a in names}
    for r in range(args.rounds):
        k = len(names)
        order = names[r % k :] + names[: r % k]
        if (r // k) % 2:
            order = order[::-1]
        for name in order:
            times[name].append(block(name, args.block))
    steps_seen = obs.recorder.steps
    obs.close()
    if hooked is not None:
        hooked.close()
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        out.put((times, steps_seen, modes))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _summary(ratios: list[float]) -> tuple[float, float, float, float, float]:
    q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratios[0]] * 3
    return statistics.median(ratios), q[0], q[2], min(ratios), max(ratios)


def run_world(world: int, args: argparse.Namespace) -> float:
    """Run one world size; print its table; return the median instr/plain ratio."""
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    procs = mp.start_processes(
        _worker,
        args=(world, _free_port(), args, out),
        nprocs=world,
        start_method="spawn",
        join=False,
    )
    try:
        while not procs.join():
            pass
    finally:
        # Interrupted (Ctrl-C, SIGTERM) or failed: no rank outlives the benchmark.
        for proc in procs.processes:
            if proc.is_alive():
                proc.kill()
            proc.join()
    times, steps_seen, modes = out.get()
    if args.verbose:
        for a in times:
            print(a, [round(t, 3) for t in times[a]])
    plain = times["plain"]
    step_ms = statistics.median(plain) / args.block * 1e3
    ratios = {a: [t / p for t, p in zip(times[a], plain)] for a in times if a != "plain"}
    print(
        f"world={world}: {args.rounds} rounds x {args.block} steps per arm, "
        f"plain step {step_ms:.1f} ms (median), recorder counted {steps_seen} instr steps; "
        f"comm_timing instr={modes[0]} instr_hook={modes[1]}"
    )
    for arm, rs in ratios.items():
        med, q1, q3, lo, hi = _summary(rs)
        label = f"{arm}/plain"
        best = min(times[arm]) / min(plain)
        print(
            f"  {label:<14} median {med:.4f}  IQR [{q1:.4f}, {q3:.4f}]  min/max [{lo:.4f}, {hi:.4f}]"
            f"  fastest-block ratio {best:.4f}"
        )
    return statistics.median(ratios["instr"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world", type=int, nargs="+", default=[1, 2], help="rank counts to run")
    # About 100 rounds pin a median down to +-0.3 % at this VM's +-2-4 % per-round noise.
    p.add_argument("--rounds", type=int, default=100, help="interleaved rounds of every arm")
    p.add_argument("--block", type=int, default=10, help="steps per arm per round")
    p.add_argument("--warmup", type=int, default=10, help="warm-up steps per arm")
    p.add_argument("--width", type=int, default=1024, help="model width (step time)")
    p.add_argument("--batch", type=int, default=256, help="batch size")
    p.add_argument(
        "--arms",
        nargs="+",
        default=list(ARMS[1:]),
        choices=ARMS[1:],
        help="arms besides plain (instr is always run: it is the figure)",
    )
    p.add_argument("--verbose", action="store_true", help="print every block time")
    p.add_argument(
        "--parallel",
        choices=("ddp", "fsdp2", "tp"),
        default="ddp",
        help="how the models are wrapped (tp: tensor parallel within groups, FSDP2 across them)",
    )
    p.add_argument("--tp-size", type=int, default=2, help="tp: ranks per tensor-parallel group")
    p.add_argument("--clip", action="store_true", help="clip_grad_norm_ every step")
    args = p.parse_args(argv)
    if args.parallel in ("fsdp2", "tp"):
        hooks = [a for a in args.arms if a in ("instr_hook", "hook")]
        if hooks and "--arms" in (argv if argv is not None else sys.argv):
            p.error(
                f"--parallel {args.parallel}: {', '.join(hooks)} time DDP's comm hook; "
                "FSDP2 has none"
            )
        args.arms = [a for a in args.arms if a not in ("instr_hook", "hook")]
    if args.parallel == "tp" and any(w % args.tp_size for w in args.world):
        p.error(f"--parallel tp: --tp-size {args.tp_size} must divide every --world")
    if "instr" not in args.arms:
        args.arms.insert(0, "instr")
    raise_on_signals()  # SIGTERM/SIGHUP stop the ranks like Ctrl-C does
    clip = ", clip_grad_norm_" if args.clip else ""
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, gloo, {args.parallel}{clip}")
    medians = [run_world(w, args) for w in args.world]
    print(f"overhead_ratio={max(medians):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
