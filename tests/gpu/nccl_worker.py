"""Train one NCCL rank on one GPU with the whole exporter, then report what it published.

Run under torchrun (``--nproc-per-node 1``); writes a JSON report to argv[1]:

- ``comm_timing``, ``inflight_source``: what the exporter chose on CUDA (each iteration marked
  with CUDA events where this torch has a Flight Recorder for NCCL, else the hook);
  ``reducer_on_cuda``: the error that refuses the reducer's timers on a CUDA model;
- ``steps``/``buckets``/``latencies``: the recorder's own snapshot (CUDA-event timing, resolved
  off the training thread);
- ``hook``: the same model with ``comm_timing="hook"`` (the fallback: a timing comm hook, two
  CUDA events per bucket): its snapshot and the buckets a counting hook sees on the same steps;
- ``metrics``: ``/metrics`` scraped over HTTP once training is idle, next to ``torch_memory``,
  read in the same idle moment from ``torch.cuda``;
- ``sync_debug``: a plain DDP model and the instrumented one each trained under
  ``torch.cuda.set_sync_debug_mode("error")``; ``bites`` proves the mode raises on a real
  synchronisation (``.item()``), so "no error" means something.
"""

import json
import os
import sys
import time
import traceback
import urllib.request

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, ".."), os.path.join(HERE, "..", "workers")]
from harness import parse  # noqa: E402
from results import settled  # noqa: E402

import exporter  # noqa: E402

WARMUP_STEPS = 20
CHECKED_STEPS = 30


def make_model(device: torch.device) -> DDP:
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(512, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 16),
    ).to(device)
    # 1 MiB buckets: several per backward, so the hook and CUDA events see more than one.
    return DDP(net, device_ids=[device.index], bucket_cap_mb=1)


def make_loader(device: torch.device) -> DataLoader:
    # The data already lives on the GPU: a host-to-device copy from pageable memory is a
    # synchronisation that sync-debug mode rightly flags, and it is not the exporter's.
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4096, 512, generator=g).to(device)
    y = torch.randn(4096, 16, generator=g).to(device)
    return DataLoader(TensorDataset(x, y), batch_size=128, shuffle=False)


def train(model: DDP, loader: DataLoader, opt: torch.optim.Optimizer, steps: int) -> None:
    done = 0
    while done < steps:
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            done += 1
            if done == steps:
                return


def count_buckets(device: torch.device, loader: DataLoader, steps: int) -> int:
    """Train a fresh model as the instrumented one trained, counting its buckets with a hook."""
    model = make_model(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    calls = [0]

    def counting(state, bucket):  # DDP checks the parameters' names
        calls[0] += 1
        return default_hooks.allreduce_hook(state, bucket)

    model.register_comm_hook(None, counting)
    train(model, loader, opt, steps)
    torch.cuda.synchronize()
    return calls[0]


def hook_mode(device: torch.device, loader: DataLoader, steps: int) -> dict:
    """Train a fresh model timed by the hook (comm_timing="hook"); report what it timed."""
    model = make_model(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    obs = exporter.instrument(
        model, optimizer=opt, port=0, addr="127.0.0.1", heartbeat_s=0, comm_timing="hook"
    )
    train(model, loader, opt, steps)
    settled(obs)
    snap = obs.recorder.snapshot()
    out = {
        "comm_timing": obs.comm_timing,
        "collectives": [list(c) for c in snap.collectives],
        "bookkeeping": [list(c) for c in obs.recorder.inflight()],
        "errors": obs.errors.snapshot(),
    }
    obs.close()
    out["expected_buckets"] = count_buckets(device, loader, steps)
    return out


def under_sync_debug(fn) -> str | None:
    """Run ``fn`` with sync-debug mode "error"; return the error it raised, or None."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn()
        return None
    except RuntimeError:
        return traceback.format_exc(limit=6)
    finally:
        torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()


def mode_bites(device: torch.device) -> bool:
    t = torch.ones(1, device=device)
    return under_sync_debug(lambda: t.sum().item()) is not None


def main() -> None:
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl")
    report: dict = {"world_size": dist.get_world_size(), "backend": dist.get_backend()}

    model, loader = make_model(device), make_loader(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    # DDP's reducer timers would synchronise the host every step on CUDA: refused, nothing left.
    try:
        exporter.instrument(model, optimizer=opt, port=0, addr="127.0.0.1", comm_timing="reducer")
        report["reducer_on_cuda"] = "accepted"
    except ValueError as exc:
        report["reducer_on_cuda"] = str(exc)
    report["active_after_refusal"] = exporter.active() is not None
    obs = exporter.instrument(
        model, dataloader=loader, optimizer=opt, port=0, addr="127.0.0.1", heartbeat_s=0.5
    )
    report.update(comm_timing=obs.comm_timing, inflight_source=obs.inflight.name)
    train(model, loader, opt, WARMUP_STEPS)  # DDP rebuilds its buckets after iteration 1

    plain = make_model(device)
    plain_opt = torch.optim.SGD(plain.parameters(), lr=1e-3)
    train(plain, loader, plain_opt, 2)
    report["sync_debug"] = {
        "bites": mode_bites(device),
        "plain": under_sync_debug(lambda: train(plain, loader, plain_opt, CHECKED_STEPS)),
        # The scrape path runs meanwhile on the server's thread: memory and Flight Recorder.
        "instrumented": under_sync_debug(
            lambda: [
                train(model, loader, opt, 1) or urllib.request.urlopen(obs.url).read()
                for _ in range(CHECKED_STEPS)
            ]
        ),
    }

    steps = WARMUP_STEPS + CHECKED_STEPS
    # CUDA-event marks are resolved on the exporter's thread once the GPU passed them.
    settled(obs)
    report["bookkeeping"] = [list(c) for c in obs.recorder.inflight()]
    # NCCL's watchdog marks completions in the Flight Recorder as it polls: wait for it too.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if all(st.last_enqueued == st.last_completed for st in obs.inflight.read()):
            break
        time.sleep(0.1)
    snap = obs.recorder.snapshot()
    report["recorder"] = {"steps": snap.steps, "collectives": [list(c) for c in snap.collectives]}
    report["expected_steps"] = steps

    # Idle now: the allocator's figures hold still between the scrape and torch's own reads.
    text = urllib.request.urlopen(obs.url, timeout=10).read().decode()
    report["torch_memory"] = {
        "allocated": torch.cuda.memory_allocated(device),
        "reserved": torch.cuda.memory_reserved(device),
        "peak": torch.cuda.max_memory_allocated(device),
        "total": torch.cuda.get_device_properties(device).total_memory,
    }
    report["metrics"] = {name: samples for name, samples in parse(text).items()}
    report["errors"] = obs.errors.snapshot()
    obs.close()
    report["expected_buckets"] = count_buckets(device, loader, steps)
    report["hook"] = hook_mode(device, loader, WARMUP_STEPS)
    with open(sys.argv[1], "w") as f:
        json.dump(report, f, default=str)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
