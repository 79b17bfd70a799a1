"""Train plain and instrumented DDP, FSDP2, classic FSDP, tensor parallel; compare gradients.

FSDP2 and tensor parallelism clip the gradients' total norm (``clip_grad_norm_`` on DTensor
parameters: functional all-reduces, timed by the exporter's stand-ins), classic FSDP with its own
``clip_grad_norm_`` (an all-reduce), then compare bit for bit.

Run under torchrun; rank 0 writes a JSON verdict per scenario to the path in argv[1]. With
``cuda`` as argv[2] the models train on GPU 0 over gloo (tests/gpu: ranks share the GPU), where
``auto`` marks each iteration with CUDA events; ``nccl`` as argv[3] takes NCCL
instead (one rank: NCCL refuses two on one device); ``ddp`` or ``sharded`` as argv[4] runs those
scenarios alone (default: all).
"""

import sys

import torch
import torch.distributed as dist
from results import leave, settled, write_all_ranks
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import exporter

STEPS = 6


ARGS = sys.argv[1:] + [None] * 3
# Every rank on GPU 0: torch.cuda.set_device needs an index, and one GPU hosts them all.
DEVICE = torch.device("cuda", 0) if ARGS[1] == "cuda" else torch.device("cpu")
BACKEND = ARGS[2] or "gloo"
SCENARIOS = ARGS[3] or "all"


def make_net() -> torch.nn.Sequential:
    torch.manual_seed(1234)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64),
        torch.nn.Tanh(),
        torch.nn.Linear(64, 64),
        torch.nn.Tanh(),
        torch.nn.Linear(64, 3),
    )


def make_model() -> DDP:
    net = make_net()
    # A tiny bucket cap gives several buckets per backward, so ordering matters too.
    return DDP(net.to(DEVICE), bucket_cap_mb=0.005)


def train(model: DDP, opt: torch.optim.Optimizer, rank: int) -> list[list[torch.Tensor]]:
    g = torch.Generator().manual_seed(100 + rank)
    grads = []
    for _ in range(STEPS):
        x = torch.randn(16, 32, generator=g).to(DEVICE)
        y = torch.randn(16, 3, generator=g).to(DEVICE)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        opt.step()
    return grads


def scenario(name: str, timing: str, rank: int) -> dict:
    plain = make_model()
    inst = make_model()
    if name.startswith("fp16"):
        plain.register_comm_hook(None, default_hooks.fp16_compress_hook)
    if name == "fp16_before":
        inst.register_comm_hook(None, default_hooks.fp16_compress_hook)
    opt_p = torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9)
    opt_i = torch.optim.SGD(inst.parameters(), lr=0.1, momentum=0.9)
    obs = exporter.instrument(
        inst, optimizer=opt_i, port=0, addr="127.0.0.1", heartbeat_s=0, comm_timing=timing
    )
    if name == "fp16_after":
        inst.register_comm_hook(None, default_hooks.fp16_compress_hook)
    gp = train(plain, opt_p, rank)
    gi = train(inst, opt_i, rank)
    done = settled(obs)
    snap = obs.recorder.snapshot()
    obs.close()
    same_grads = all(torch.equal(a, b) for sa, sb in zip(gp, gi) for a, b in zip(sa, sb))
    same_params = all(torch.equal(a, b) for a, b in zip(plain.parameters(), inst.parameters()))
    buckets = sum(c[4] for c in snap.collectives)
    return {
        "grads": same_grads,
        "params": same_params,
        "steps": snap.steps,
        "buckets": buckets,
        "settled": done,
        "timing": obs.comm_timing,
        "inflight": obs.inflight.name,
    }


def make_fsdp2() -> torch.nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    # The mesh on the model's device: fully_shard's default mesh is CUDA's wherever CUDA exists.
    mesh = init_device_mesh(DEVICE.type, (dist.get_world_size(),))
    net = make_net().to(DEVICE)
    for layer in (net[0], net[2], net[4]):
        fully_shard(layer, mesh=mesh)
    return fully_shard(net, mesh=mesh)


def make_fsdp() -> torch.nn.Module:
    """Classic FSDP: each Linear a unit of its own, fully sharded (one rank: unsharded)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    shard = ShardingStrategy.FULL_SHARD if dist.get_world_size() > 1 else ShardingStrategy.NO_SHARD
    policy = ModuleWrapPolicy({torch.nn.Linear})
    net = make_net().to(DEVICE)
    return FSDP(net, auto_wrap_policy=policy, device_id=DEVICE, sharding_strategy=shard)


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (FSDP2, tensor parallel); classic FSDP's is a tensor."""
    return t.to_local() if hasattr(t, "to_local") else t


def make_tp() -> torch.nn.Module:
    """Tensor parallel across every rank: column-, row-, then column-wise gathered."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh(DEVICE.type, (dist.get_world_size(),))
    plan = {
        "0": ColwiseParallel(),
        "2": RowwiseParallel(),
        "4": ColwiseParallel(output_layouts=Replicate()),
    }
    return parallelize_module(make_net().to(DEVICE), mesh, plan)


def train_fsdp2(
    model: torch.nn.Module, opt: torch.optim.Optimizer, rank: int, shared: bool = False
) -> tuple:
    """``shared``: every rank reads the same batches (a tensor-parallel group splits one)."""
    g = torch.Generator().manual_seed(100 + (0 if shared else rank))
    grads, losses = [], []
    for _ in range(STEPS):
        x = torch.randn(16, 32, generator=g).to(DEVICE)
        y = torch.randn(16, 3, generator=g).to(DEVICE)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        if hasattr(model, "clip_grad_norm_"):  # classic FSDP's own, over every rank's shards
            model.clip_grad_norm_(0.5)
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        losses.append(loss.detach().clone())
        grads.append([_local(p.grad).clone() for p in model.parameters()])  # this rank's shard
        opt.step()
    return grads, losses


def fsdp2_scenario(rank: int, make=make_fsdp2, shared: bool = False) -> dict:
    """FSDP2 (classic FSDP, tensor parallel) with and without the exporter; the plain model
    trains before instrument() wraps the collectives, so it really runs without the exporter."""
    plain = make()
    opt_p = torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9)
    gp, lp = train_fsdp2(plain, opt_p, rank, shared)
    inst = make()
    opt_i = torch.optim.SGD(inst.parameters(), lr=0.1, momentum=0.9)
    obs = exporter.instrument(inst, optimizer=opt_i, port=0, addr="127.0.0.1", heartbeat_s=0)
    gi, li = train_fsdp2(inst, opt_i, rank, shared)
    done = settled(obs)
    snap = obs.recorder.snapshot()
    obs.close()
    local = [_local(p) for p in plain.parameters()], [_local(p) for p in inst.parameters()]
    return {
        "grads": all(torch.equal(a, b) for sa, sb in zip(gp, gi) for a, b in zip(sa, sb)),
        "params": all(torch.equal(a, b) for a, b in zip(*local)),
        "losses": all(torch.equal(a, b) for a, b in zip(lp, li)),
        "steps": snap.steps,
        "buckets": sum(c[4] for c in snap.collectives),
        "ops": sorted({c[0] for c in snap.collectives if c[4]}),
        "untimed_ops": sorted({op for op, _, n in snap.untimed if n}),
        "settled": done,
        "timing": obs.comm_timing,
        "comm_timing_errors": obs.errors.snapshot()["comm_timing"],
        "comm_wait": snap.phase_sum[2],
    }


def main() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.set_device(DEVICE)
    dist.init_process_group(BACKEND)
    rank = dist.get_rank()
    # On CUDA, "auto" marks iterations with CUDA events: the reducer's timers would synchronise
    # the host.
    timings = ("auto",) if DEVICE.type == "cuda" else ("auto", "hook", "events")
    out = {}
    if SCENARIOS in ("all", "ddp"):
        for timing in timings:
            for name in ("builtin", "fp16_after", "fp16_before"):
                out[f"{name}/{timing}"] = scenario(name, timing, rank)
    if SCENARIOS in ("all", "sharded"):
        out["fsdp2/collectives"] = fsdp2_scenario(rank)
        out["fsdp/collectives"] = fsdp2_scenario(rank, make_fsdp)
        out["tp/collectives"] = fsdp2_scenario(rank, make_tp, shared=True)
    write_all_ranks(sys.argv[1], out)
    leave()


if __name__ == "__main__":
    main()
