"""Time FSDP2, classic FSDP, tensor-parallel or a loop's NCCL collectives against the profiler.

One rank per GPU. Run under torchrun with ``TORCH_NCCL_ENABLE_TIMING=1``:
``parallel_worker.py REPORT fsdp2|fsdp|tp|loop [cpu]``. Each rank trains a few steps of a model
large enough for collectives of tens of MiB, under ``torch.profiler``, then writes ``REPORT.RANK``
(JSON): the exporter's latency count, sum and untimed count per op (read from ``/metrics`` once
every duration is in), its comm_wait over those steps, and from the profiler's trace the NCCL
kernels' device time and the part of it no other kernel overlapped (the exposed
communication). ``cpu``: a dry run of the same on gloo (no kernels: the figures are the
exporter's own).
"""

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

import torch
import torch.distributed as dist
from durations_worker import counts
from torch.distributed.device_mesh import init_device_mesh
from torch.profiler import ProfilerActivity, profile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..")]
from harness import parse, value  # noqa: E402

import exporter  # noqa: E402

STEPS = 10
#: 4096 x 4096 fp32 weights: 64 MiB all-gathered per FSDP2 layer; a 4096-row batch makes
#: tensor parallelism's activation all-reduces 64 MiB too.
WIDTH, BATCH, LAYERS = 4096, 4096, 4


def build(parallel: str, device: torch.device) -> torch.nn.Module:
    """Return the model: sharded (fsdp2, fsdp), split across the ranks (tp) or replicated (loop)."""
    torch.manual_seed(0)
    if parallel == "loop":  # its gradients averaged by hand, one all-reduce each
        layers = (torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(LAYERS))
        return torch.nn.Sequential(*layers).to(device)
    if parallel in ("fsdp2", "fsdp"):
        from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        model = torch.nn.Sequential(
            *(torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(2 * LAYERS))
        ).to(device)
        if parallel == "fsdp":  # classic FSDP, each layer a unit of its own
            policy = ModuleWrapPolicy({torch.nn.Linear})
            return FullyShardedDataParallel(model, auto_wrap_policy=policy, device_id=device)
        for layer in model:
            fully_shard(layer)
        return fully_shard(model)
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    blocks = []
    for _ in range(LAYERS):
        blocks += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, WIDTH)]
    model = torch.nn.Sequential(*blocks).to(device)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    plan = {}
    for i in range(LAYERS):
        plan[str(3 * i)], plan[str(3 * i + 2)] = ColwiseParallel(), RowwiseParallel()
    return parallelize_module(model, mesh, plan)


def merged(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Return the union of ``(start, end)`` spans as disjoint spans in order."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def exposed(comm: list[tuple[float, float]], other: list[tuple[float, float]]) -> float:
    """Return how long ``comm`` spans run while no ``other`` span does."""
    total, busy = 0.0, merged(other)
    for start, end in merged(comm):
        covered = sum(max(0.0, min(end, b) - max(start, a)) for a, b in busy)
        total += end - start - covered
    return total


def kernels(prof: profile) -> tuple[float, float]:
    """Return the NCCL kernels' device time and its exposed part, in seconds, from the trace."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f).get("traceEvents", [])
    comm, other = [], []
    for e in events:
        if e.get("cat") != "kernel" or "dur" not in e:
            continue
        span = (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
        (comm if "nccl" in e.get("name", "").lower() else other).append(span)
    return sum(b - a for a, b in comm) / 1e6, exposed(comm, other) / 1e6


def contexts() -> list[str]:
    """Return the GPUs (UUIDs) this process holds a context on, as nvidia-smi lists them.

    Empty where nvidia-smi cannot tell (absent, or processes of another PID namespace).
    """
    try:
        listed = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    pid, found = str(os.getpid()), set()
    for line in listed.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 2 and fields[0] == pid:
            found.add(fields[1])
    return sorted(found)


def main() -> None:
    out, parallel = sys.argv[1], sys.argv[2]
    cpu = sys.argv[3:] == ["cpu"]
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cpu:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    else:
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    model = build(parallel, device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    x = torch.randn(BATCH // (16 if cpu else 1), WIDTH, device=device)

    def step() -> None:
        model(x).square().mean().backward()
        if parallel == "loop":
            for p in model.parameters():
                dist.all_reduce(p.grad)  # synchronous: the compute stream waits for it
                p.grad.div_(dist.get_world_size())
        opt.step()
        opt.zero_grad()

    step()  # communicator set-up and lazy initialisation: before the exporter, not observed
    if not cpu:
        torch.cuda.synchronize()
    obs = exporter.instrument(model, optimizer=opt, port=0, addr="127.0.0.1", heartbeat_s=0)
    activities = [ProfilerActivity.CPU if cpu else ProfilerActivity.CUDA]
    with profile(activities=activities) as prof:
        for _ in range(STEPS):
            step()
        if not cpu:
            torch.cuda.synchronize()
    device_s, exposed_s = kernels(prof)
    deadline, seen, samples = time.monotonic() + 90, {}, {}
    while time.monotonic() < deadline:
        samples = parse(urllib.request.urlopen(obs.url, timeout=10).read().decode())
        seen = counts(samples)
        if seen and all(n > 0 and untimed == 0 for n, _, untimed in seen.values()):
            break
        time.sleep(0.5)
    report = {
        "parallel": parallel,
        "rank": dist.get_rank(),
        "comm_timing": obs.comm_timing,
        "exporter": seen,
        "comm_wait_s": value(samples, "ddp_step_phase_seconds_sum", phase="comm_wait"),
        "steps": value(samples, "ddp_steps_total"),
        "profiler_s": device_s,
        "profiler_exposed_s": exposed_s,
        "errors": obs.errors.snapshot(),
        "contexts": [] if cpu else contexts(),
        "own_gpu": None if cpu else str(torch.cuda.get_device_properties(device).uuid),
    }
    obs.close()
    with open(f"{out}.{dist.get_rank()}", "w") as f:
        json.dump(report, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
