"""Time a loop of NCCL collectives on one GPU through the Flight Recorder's durations.

Run under torchrun (``--nproc-per-node 1``) with ``TORCH_NCCL_ENABLE_TIMING=1``; writes a JSON
report to argv[1]: the exporter's latency count, sum and untimed count per op (read from
``/metrics`` once every duration is in), and the same collectives' kernel time as
``torch.profiler`` measured it on the device. Then a DDP model whose steps all-reduce their loss
synchronously: ``ddp`` says how many of those collectives were marked on the device.
"""

import json
import os
import sys
import time
import urllib.request

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..")]
from harness import parse  # noqa: E402

import exporter  # noqa: E402

ROUNDS = 20
#: 256 MiB: a kernel of tens of microseconds even on one rank, well above the events' resolution.
NUMEL = 64 * 1024 * 1024
#: About a millisecond of GPU work (torch.cuda._sleep's cycles) queued before each collective:
#: the host runs ahead of the device, so the time between a collective's two events is the
#: device's work. On an idle device it is the host's time enqueueing the collective.
BACKLOG_CYCLES = 2_000_000
DDP_STEPS = 12


def counts(samples: dict) -> dict:
    """Return ``op -> (timed count, latency sum, untimed)`` from parsed /metrics samples."""
    out = {}
    for labels, n in samples.get("ddp_collective_duration_seconds_count", []):
        total = next(
            v
            for lab, v in samples["ddp_collective_duration_seconds_sum"]
            if lab["op"] == labels["op"]
        )
        untimed = next(
            (v for lab, v in samples.get("ddp_collective_untimed_total", []) if lab == labels), 0
        )
        out[labels["op"]] = (n, total, untimed)
    return out


def main() -> None:
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    x, out = torch.ones(NUMEL, device=device), torch.empty(NUMEL, device=device)
    dist.all_reduce(x)  # communicator set-up: before the exporter, not observed
    torch.cuda.synchronize()
    obs = exporter.instrument(None, port=0, addr="127.0.0.1", heartbeat_s=0)
    # all_gather_single replaces all_gather_into_tensor in recent torch; both are wrapped.
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(ROUNDS):
            # AVG: on one rank NCCL copies nothing for an in-place SUM, but scales for AVG.
            torch.cuda._sleep(BACKLOG_CYCLES)
            dist.all_reduce(x, op=dist.ReduceOp.AVG)
            torch.cuda._sleep(BACKLOG_CYCLES)
            dist.all_reduce(x, op=dist.ReduceOp.AVG, async_op=True).wait()
            torch.cuda._sleep(BACKLOG_CYCLES)
            gather(out, x)  # one rank: a device-to-device copy
        torch.cuda.synchronize()
    waits = obs.device_waits
    if waits is not None:
        waits.drain()
    # What ran on the device for the collectives: NCCL's kernels, and what NCCL runs instead on
    # one rank: a copy (the loop makes no other), or for AVG its oneRankReduce kernel.
    ran = [e for e in prof.events() if e.device_time > 0]
    work = [e for e in ran if any(k in e.name.lower() for k in ("nccl", "dtod", "onerankreduce"))]
    device_s = sum(e.device_time for e in work) / 1e6
    expected = {"allreduce": 2 * ROUNDS, "allgather": ROUNDS}
    deadline, seen = time.monotonic() + 60, {}
    while time.monotonic() < deadline:
        seen = counts(parse(urllib.request.urlopen(obs.url, timeout=10).read().decode()))
        if all(seen.get(op, (0, 0, 1))[2] == 0 for op in expected):
            break
        time.sleep(0.5)
    report = {
        "comm_timing": obs.comm_timing,
        "exporter": seen,
        "expected": expected,
        "profiler_s": device_s,
        "device_work": sorted({e.name for e in work}),
        "device_kernels": sorted({e.name for e in ran}),
        "errors": obs.errors.snapshot(),
        # Each collective the compute stream waited for (in Work.wait() or a synchronous call),
        # marked on the device and resolved: one per collective here.
        "device_waits": None if waits is None else waits.resolved,
    }
    obs.close()
    report["ddp"] = ddp_own_collectives(device)
    report["sync_call_returns_work"] = sync_call_returns_work(x)
    with open(sys.argv[1], "w") as f:
        json.dump(report, f)
    dist.destroy_process_group()


def ddp_own_collectives(device: torch.device) -> dict:
    """Train DDP steps that all-reduce their loss synchronously; say what was marked."""
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(256, 256).to(device), device_ids=[device.index])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    obs = exporter.instrument(model, optimizer=opt, port=0, addr="127.0.0.1", heartbeat_s=0)
    x = torch.randn(64, 256, device=device)
    for _ in range(DDP_STEPS):
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        dist.all_reduce(loss.detach())  # for logging
        opt.step()
    torch.cuda.synchronize()
    waits = obs.device_waits
    if waits is not None:
        waits.drain()
    out = {
        "steps": obs.recorder.snapshot().steps,
        "expected": DDP_STEPS,
        "device_waits": None if waits is None else waits.resolved,
        "errors": obs.errors.snapshot(),
    }
    obs.close()
    return out


def sync_call_returns_work(x: torch.Tensor) -> bool | None:
    """Say whether this NCCL returns a Work for a synchronous all-reduce (None: cannot ask)."""
    opts = dist.AllreduceOptions()
    if not hasattr(opts, "asyncOp"):
        return None
    opts.asyncOp = False
    work = dist.distributed_c10d._get_default_group().allreduce([x], opts)
    torch.cuda.synchronize()
    return work is not None


if __name__ == "__main__":
    main()
