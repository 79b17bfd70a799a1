"""The parts of benchmarks/gpu.py: one DDP model per arm, its timed blocks, and the side figures.

An :class:`Arm` trains one DDP model (AdamW, autocast) on a fixed batch, optionally all-reducing
its loss every step (a user's own collective) or drawing its batches from a DataLoader. A
:class:`Block` is one timed run of steps: wall time from a synchronised start to a synchronised
end, the time the host took to issue them, and the CPU time of the training thread and of the
autograd engine's thread for the device (read through its POSIX CPU clock).
"""

from __future__ import annotations

import statistics
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from exporter.errors import ErrorCounter
from exporter.sources.commhook import CommHookWrapper, CudaEventResolver, allreduce_mean_hook
from exporter.sources.ddpevents import IterationEvents
from exporter.sources.recorder import Recorder
from exporter.tools.localstack import free_port

__all__ = [
    "ARMS",
    "Arm",
    "Block",
    "autograd_thread_clock",
    "bucket_cost",
    "busy_share",
    "exporter_threads_cpu",
    "free_port",
    "marks_cost",
    "scrape_ms",
    "summary",
]

ARMS = ("plain", "instr", "control")
#: Distinct batches a DataLoader arm cycles through.
LOADER_BATCHES = 8


def summary(xs: list[float]) -> dict[str, float]:
    """Return median, quartiles, min and max."""
    q = statistics.quantiles(xs, n=4) if len(xs) >= 2 else [xs[0]] * 3
    return {
        "median": statistics.median(xs),
        "q1": q[0],
        "q3": q[2],
        "min": min(xs),
        "max": max(xs),
    }


def synchronizer(device: torch.device) -> Callable[[], None]:
    """Return what waits for ``device``'s queued work: CUDA's synchronize, or nothing (CPU)."""
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def autograd_thread_clock(device: torch.device) -> Callable[[], int]:
    """Return a reader of the CPU time (ns) of the thread that runs ``device``'s backward.

    The autograd engine runs a CUDA device's backward on a thread of its own, the same for every
    model in the process; on the CPU it is the calling thread.
    """
    idents: list[int] = []
    leaf = torch.ones(2, device=device, requires_grad=True)
    leaf.register_hook(lambda grad: idents.append(threading.get_ident()))
    (leaf * 2).sum().backward()
    clock = time.pthread_getcpuclockid(idents[0])
    return lambda: time.clock_gettime_ns(clock)


def exporter_threads_cpu() -> float:
    """Return the CPU seconds used so far by the exporter's live threads."""
    total = 0
    for thread in threading.enumerate():
        if thread.name.startswith("ddp-exporter") and thread.ident is not None:
            try:
                total += time.clock_gettime_ns(time.pthread_getcpuclockid(thread.ident))
            except OSError:  # ended meanwhile
                pass
    return total / 1e9


@dataclass(frozen=True)
class Block:
    """One timed block of steps on one arm (seconds)."""

    wall: float
    issue: float
    main_cpu: float
    autograd_cpu: float


def marks_cost(device: torch.device, n: int) -> dict[str, float]:
    """Time the events mode's marks per iteration: backward passes with and without them.

    The smallest backward (a ``Linear(4, 4)`` carrying DDP's ``require_backward_grad_sync``
    flag), so that the GPU keeps up and the host's time is the wall time; bare and marked
    loops alternate over seven repeats. Enough slots that no iteration goes unmarked.
    """
    lin = torch.nn.Linear(4, 4, device=device)
    lin.require_backward_grad_sync = True  # type: ignore[assignment]
    x = torch.randn(2, 4, device=device)
    recorder, errors = Recorder("optimizer"), ErrorCounter()
    stats = recorder.collective_stats("allreduce", "0", None)
    timing = IterationEvents(lin, recorder, errors, stats, slots=n + 1)
    sync = synchronizer(device)

    def loop() -> float:
        sync()
        t0 = time.perf_counter_ns()
        for _ in range(n):
            lin(x).sum().backward()
        sync()
        return (time.perf_counter_ns() - t0) / n / 1e3

    loop()  # warm-up
    bare: list[float] = []
    marked: list[float] = []
    try:
        for r in range(7):
            for on in (False, True) if r % 2 == 0 else (True, False):
                if on:
                    timing.instrument()
                    marked.append(loop())
                    timing.uninstrument()
                else:
                    bare.append(loop())
    finally:
        timing.close()
    return {
        "bare_us": min(bare),
        "marked_us": min(marked),
        "cost_us": min(marked) - min(bare),
        "cost_median_us": statistics.median(m - b for m, b in zip(marked, bare)),
        "timed": stats.hist.count,
        "skipped": timing.skipped,
        "errors": sum(errors.snapshot().values()),
    }


def _model(width: int, depth: int, device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width, device=device), torch.nn.GELU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, width, device=device))


class Arm:
    """One DDP model with its optimizer and batches."""

    def __init__(
        self,
        width: int,
        depth: int,
        device: torch.device,
        amp: str,
        autograd_cpu: Callable[[], int],
        bucket_mb: float = 25.0,
    ) -> None:
        self.device = device
        self.width = width
        ids = [device.index] if device.type == "cuda" else None
        self.model = DDP(_model(width, depth, device), device_ids=ids, bucket_cap_mb=bucket_mb)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-5, foreach=True)
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp)
        cuda = device.type == "cuda"
        self.scaler = torch.amp.GradScaler("cuda") if amp == "fp16" and cuda else None
        self._autograd_cpu = autograd_cpu
        self._sync = synchronizer(device)
        self.batch = 0
        self.x = torch.empty(0)
        self.loader: torch.utils.data.DataLoader | None = None
        self.loss_collective = False
        self._batches: Iterator[torch.Tensor] = iter(())

    def set_batch(self, batch: int) -> None:
        """Train on a batch of ``batch`` samples."""
        self.batch = batch
        self.x = torch.randn(batch, self.width, device=self.device)
        self.loader = None
        self._batches = self._fixed()

    def configure(self, *, loss_collective: bool, loader: bool) -> None:
        """Choose the step's extras: the loss all-reduced, the batches from a DataLoader."""
        self.loss_collective = loss_collective
        if loader and self.loader is None:
            xs = [torch.randn_like(self.x) for _ in range(LOADER_BATCHES)]
            self.loader = torch.utils.data.DataLoader(xs, batch_size=None)  # type: ignore[arg-type]
        self._batches = self._from_loader() if loader else self._fixed()

    def _fixed(self) -> Iterator[torch.Tensor]:
        while True:
            yield self.x

    def _from_loader(self) -> Iterator[torch.Tensor]:
        assert self.loader is not None
        while True:
            yield from self.loader

    def buckets(self) -> int:
        """Return DDP's gradient buckets per step (after its rebuild)."""
        sizes = self.model._get_ddp_logging_data().get("rebuilt_bucket_sizes") or ""
        return len([s for s in str(sizes).split(",") if s.strip()])

    def step(self, x: torch.Tensor) -> None:
        """Run one training step."""
        self.opt.zero_grad(set_to_none=True)
        with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype is not None):
            loss = self.model(x).float().pow(2).mean()
        if self.scaler is None:
            loss.backward()
            self.opt.step()
        else:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.opt)
            self.scaler.update()
        if self.loss_collective:
            logged = loss.detach().clone()
            dist.all_reduce(logged)  # what a user logs, averaged over ranks

    def block(self, steps: int) -> Block:
        """Run ``steps`` steps between two synchronisations; return their times."""
        self._sync()
        t0, c0, a0 = time.perf_counter(), time.thread_time_ns(), self._autograd_cpu()
        for _ in range(steps):
            self.step(next(self._batches))
        issued, c1, a1 = time.perf_counter(), time.thread_time_ns(), self._autograd_cpu()
        self._sync()
        wall = time.perf_counter() - t0
        return Block(wall, issued - t0, (c1 - c0) / 1e9, (a1 - a0) / 1e9)


def busy_share(arm: Arm, steps: int) -> tuple[float, float]:
    """Profile ``steps`` steps of ``arm``; return (GPU busy seconds, profiled wall seconds).

    Busy is the union of the device's kernels and copies (overlaps counted once). (0, 1) on the
    CPU or where the profiler gives no device events.
    """
    if arm.device.type != "cuda":
        return 0.0, 1.0
    from torch.profiler import ProfilerActivity, profile

    arm.block(2)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        wall = arm.block(steps).wall
    spans = sorted(
        (e.start_ns(), e.end_ns())
        for e in prof.profiler.kineto_results.events()
        if e.device_type() == torch.autograd.DeviceType.CUDA
    )
    busy, end = 0, 0
    for start, stop in spans:
        if stop > end:
            busy += stop - max(start, end)
            end = stop
    return busy / 1e9, wall


def bucket_cost(pg: dist.ProcessGroup, device: torch.device, n: int) -> dict[str, float]:
    """Time the hook mode's wrapper per bucket (host side) against the bare hook on a real bucket."""
    got: list = []

    def capture(state, bucket):  # noqa: ANN001 - DDP checks real annotations; these are strings
        got.append(bucket)
        fut: torch.futures.Future = torch.futures.Future(
            devices=[device] if device.type == "cuda" else None
        )
        fut.set_result(bucket.buffer())
        return fut

    ids = [device.index] if device.type == "cuda" else None
    probe = DDP(torch.nn.Linear(1024, 1024).to(device), device_ids=ids)
    probe.register_comm_hook(None, capture)
    probe(torch.randn(8, 1024, device=device)).sum().backward()
    bucket = got[-1]
    errors = ErrorCounter()
    recorder = Recorder("comm_hook")
    resolver = CudaEventResolver(recorder, errors) if device.type == "cuda" else None
    stats = recorder.collective_stats("allreduce", "0", None)
    wrapper = CommHookWrapper(recorder, errors, stats, allreduce_mean_hook, pg, resolver)
    sync = synchronizer(device)

    def loop(fn: Callable[..., Any]) -> float:
        sync()
        t0 = time.perf_counter_ns()
        for i in range(n):
            fn(pg, bucket)
            if i % 100 == 99:  # keep the GPU queue short; same for both
                sync()
        sync()
        return (time.perf_counter_ns() - t0) / n / 1e3

    bare, wrapped = [], []
    try:
        for r in range(7):
            first_bare = r % 2 == 0
            for fn in (
                (allreduce_mean_hook, wrapper) if first_bare else (wrapper, allreduce_mean_hook)
            ):
                (bare if fn is allreduce_mean_hook else wrapped).append(loop(fn))
    finally:
        if resolver is not None:
            resolver.close()
    return {
        "bare_us": statistics.median(bare),
        "wrapped_us": statistics.median(wrapped),
        "cost_us": statistics.median(w - b for w, b in zip(wrapped, bare)),
        "errors": sum(errors.snapshot().values()),
    }


def _scrape(url: str, n: int) -> tuple[list[float], int]:
    out, size = [], 0
    for _ in range(n):
        t0 = time.perf_counter()
        with urllib.request.urlopen(url, timeout=10) as resp:
            size = len(resp.read())
        out.append((time.perf_counter() - t0) * 1e3)
    return out, size


def scrape_ms(url: str | None, arm: Arm, block: int) -> dict[str, Any]:
    """Time ``/metrics`` scrapes idle and while ``arm`` trains (a scraper every 0.2 s)."""
    if url is None:
        return {"error": "the endpoint is not serving"}
    idle, size = _scrape(url, 50)
    busy: list[float] = []
    stop = threading.Event()

    def scraper() -> None:
        while not stop.is_set():
            busy.extend(_scrape(url, 1)[0])
            stop.wait(0.2)

    thread = threading.Thread(target=scraper, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    try:
        while len(busy) < 20 and time.monotonic() < deadline:
            arm.block(block)
    finally:
        stop.set()
        thread.join()
    return {"idle": summary(idle), "training": summary(busy or [float("nan")]), "bytes": size}
