"""Time a loop of NCCL collectives on one GPU through the Flight Recorder's durations.

Run under torchrun (``--nproc-per-node 1``) with ``TORCH_NCCL_ENABLE_TIMING=1``; writes a JSON
report to argv[1]: the exporter's latency count, sum and untimed count per op (read from
``/metrics`` once every duration is in), and the same collectives' kernel time as
``torch.profiler`` measured it on the device.
"""

import json
import os
import sys
import time
import urllib.request

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..")]
from harness import parse  # noqa: E402

import exporter  # noqa: E402

ROUNDS = 20
#: 256 MiB: a kernel of tens of microseconds even on one rank, well above the events' resolution.
NUMEL = 64 * 1024 * 1024


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
            dist.all_reduce(x, op=dist.ReduceOp.AVG)
            dist.all_reduce(x, op=dist.ReduceOp.AVG, async_op=True).wait()
            gather(out, x)  # one rank: a device-to-device copy
        torch.cuda.synchronize()
    waits = obs.device_waits
    if waits is not None:
        waits.drain()
    # What ran on the device for the collectives: NCCL's kernels, and the copies NCCL makes
    # instead on one rank (the loop makes no other).
    work = [
        e
        for e in prof.events()
        if e.device_time > 0 and ("nccl" in e.name.lower() or "dtod" in e.name.lower())
    ]
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
        "errors": obs.errors.snapshot(),
        # Each Work.wait() marked on the device and resolved (one per collective here).
        "device_waits": None if waits is None else waits.resolved,
    }
    obs.close()
    with open(sys.argv[1], "w") as f:
        json.dump(report, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
