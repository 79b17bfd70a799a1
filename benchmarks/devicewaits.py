"""Measure the host cost of timing the compute stream's waits on the device (CUDA without DDP).

Per FSDP2 all-gather wait, on the thread that waits: the exporter's wrapper on a step it does not
time, and on a step it times (two events recorded, the stream made to wait for the all-gather's
event between them), against FSDP2's own wait alone; the same for a ``Work.wait()`` (a loop's
collective, a DDP step's own), whose marks also check the thread and the stream, and for
classic FSDP's wait before a module's forward (its mark closed by the prefetch that follows).
With CUDA: real CUDA events on the current stream, the all-gather's event recorded on a side
stream, the pairs resolved between repeats (off the training thread in the exporter). Without
CUDA: a stand-in event source (the Python part only).

    python benchmarks/devicewaits.py [--n CALLS] [--repeats R] [--json OUT]

The figure the docs quote is ``amortised_us``: the cost per wait at the default sampling
(``DDP_EXPORTER_DEVICE_WAIT_EVERY``), one step in ``every`` timed. An FSDP2 step makes about
three such waits per ``fully_shard`` group (two all-gathers, one reduce-scatter), and one at the
end of backward.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import statistics
import sys
import time
import types
from typing import Any

import torch

from exporter import settings
from exporter.errors import ErrorCounter
from exporter.sources.classicwaits import ClassicFsdp, ClassicFsdpWaitTiming
from exporter.sources.devicewaits import DeviceWaits
from exporter.sources.fsdpwaits import Fsdp2, FsdpWaitTiming
from exporter.sources.recorder import Recorder
from exporter.sources.waits import WaitTiming


class _StandInEvents:
    """Marks from the host clock, complete at once (no device)."""

    def usable(self) -> bool:
        return True

    def on_default_stream(self) -> bool:
        return True

    def record(self) -> float:
        return time.perf_counter()

    def wait(self, event: Any) -> None:
        pass

    def elapsed(self, start: float, end: float) -> float:
        return end - start


class _Result:
    def __init__(self, event: Any) -> None:
        self.all_gather_event, self.all_gather_work = event, None


def _fsdp2(cuda: bool) -> Fsdp2:
    """FSDP2 as far as the all-gather wrapper sees it; the wait is FSDP2's own."""

    class Group:
        def wait_for_unshard(self) -> None:
            if cuda:
                torch.cuda.current_stream().wait_event(self._all_gather_result.all_gather_event)

    class State:
        def _root_post_backward_final_callback(self) -> None:
            pass

    return Fsdp2(Group, State)


def _classic(cuda: bool, event: Any) -> ClassicFsdp:
    """Classic FSDP as far as its pre-forward wrappers see it: FSDP's own wait, then its call
    of the prefetch (looked up in its module, where the mark closes)."""
    runtime = types.SimpleNamespace()

    def unshard(state: Any, handle: Any) -> None:
        if cuda:
            torch.cuda.current_stream().wait_event(event)
        runtime._prefetch_handle(state, handle, None)

    def hook(*args: Any) -> None:
        pass

    runtime._pre_forward_unshard, runtime._prefetch_handle = unshard, hook
    runtime._pre_backward_hook = runtime._post_backward_final_callback = hook
    return ClassicFsdp(runtime, types.SimpleNamespace(_pre_forward_unshard=unshard))


def _work(cuda: bool, event: Any) -> Any:
    """A collective's work as far as ``Work.wait()`` goes: the current stream waits for it."""

    class Work:
        def wait(self) -> None:
            if cuda:
                torch.cuda.current_stream().wait_event(event)

    return Work


def _ns_per_call(call: Any, n: int) -> float:
    gc.collect()
    t0 = time.perf_counter_ns()
    for _ in range(n):
        call()
    return (time.perf_counter_ns() - t0) / n


def _arms(call: Any, part: Any, waits: DeviceWaits, rec: Recorder, n: int, repeats: int) -> dict:
    """Return the median µs per call of ``call`` bare, wrapped on a step not timed and timed."""
    cuda = torch.cuda.is_available()
    times: dict[str, list[float]] = {"bare": [], "not_timed": [], "timed": []}
    _ns_per_call(call, max(1, n // 10))  # warm-up
    try:
        for r in range(repeats):
            arms = ["bare", "not_timed", "timed"]
            for arm in arms if r % 2 == 0 else reversed(arms):
                if arm != "bare":
                    part.instrument()
                    # The step count decides: the last step of each `every` is timed.
                    rec.steps = waits.every - 1 if arm == "timed" else 0
                times[arm].append(_ns_per_call(call, n) / 1e3)
                part.uninstrument()
                if cuda:
                    torch.cuda.synchronize()
                waits.drain()
    finally:
        part.uninstrument()
    return {arm: statistics.median(v) for arm, v in times.items()}


def _parts(events: Any, n: int) -> dict[str, float]:
    """Return the µs per call of each event-source call a timed wait makes (``record`` twice)."""
    kept: list[Any] = []  # the events live until the end, as pending pairs do
    parts = {
        "usable_us": _ns_per_call(events.usable, n) / 1e3,
        "on_default_stream_us": _ns_per_call(events.on_default_stream, n) / 1e3,
        "record_us": _ns_per_call(lambda: kept.append(events.record()), n) / 1e3,
    }
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return parts


def _costs(med: dict, every: int) -> dict[str, float]:
    not_timed, timed = med["not_timed"] - med["bare"], med["timed"] - med["bare"]
    return {
        "bare_us": med["bare"],
        "not_timed_us": not_timed,
        "timed_us": timed,
        "amortised_us": (timed + (every - 1) * not_timed) / every,
    }


def measure(n: int, repeats: int) -> dict[str, Any]:
    """Return the per-wait host times (µs), bare, not timed and timed, medians over repeats:
    FSDP2's all-gather wait (top level), ``Work.wait()`` (``work_wait``) and classic FSDP's
    pre-forward wait (``classic_fsdp``)."""
    # FSDP2's hooks import torch._dynamo as they first run: torch.compiler.is_compiling(), which
    # every wrapper asks first, costs more then.
    importlib.import_module("torch._dynamo")
    cuda = torch.cuda.is_available()
    fsdp2 = _fsdp2(cuda)
    group = fsdp2.group()
    if cuda:
        side = torch.cuda.Stream()
        event = torch.cuda.Event()
        event.record(side)
    else:
        event = object()
    group._all_gather_result = _Result(event)
    every = settings.DEFAULT_DEVICE_WAIT_EVERY
    rec, errors = Recorder("explicit"), ErrorCounter()
    # Resolved between repeats, not by its thread during them: the training thread's cost alone.
    waits = DeviceWaits(
        rec,
        errors,
        every=every,
        events=None if cuda else _StandInEvents(),
        gpu=torch.cuda.current_device() if cuda else None,
        interval_s=3600,
    )
    work_class = _work(cuda, event)
    work = work_class()
    try:
        # Looked up at each call, as the caller does: the wrappers replace the class's method.
        unshard = FsdpWaitTiming(waits, fsdp2)
        fsdp = _arms(lambda: group.wait_for_unshard(), unshard, waits, rec, n, repeats)
        part = WaitTiming(rec, errors, work_class=work_class, device=waits)
        work_wait = _arms(lambda: work.wait(), part, waits, rec, n, repeats)
        classic = _classic(cuda, event)
        front, handle = classic.front, object()
        forward = ClassicFsdpWaitTiming(waits, classic)
        classic_fsdp = _arms(
            lambda: front._pre_forward_unshard(None, handle), forward, waits, rec, n, repeats
        )
        parts = _parts(waits.events, n)
    finally:
        waits.close()
    return {
        "device": "cuda" if cuda else "cpu",
        "events": "cuda" if cuda else "stand-in",
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "calls": n,
        "repeats": repeats,
        **_costs(fsdp, every),
        "work_wait": _costs(work_wait, every),
        "classic_fsdp": _costs(classic_fsdp, every),
        "parts": parts,
        "every": every,
        "errors": sum(errors.snapshot().values()),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=20_000, help="waits per repeat and arm")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args(argv)
    r = measure(args.n, args.repeats)
    w, c, parts = r["work_wait"], r["classic_fsdp"], r["parts"]
    print(
        f"device waits ({r['events']} events): FSDP2's wait alone {r['bare_us']:.2f} us; the "
        f"wrapper adds {r['not_timed_us']:.2f} us on a step not timed, {r['timed_us']:.2f} us on "
        f"a timed step; {r['amortised_us']:.2f} us per wait at one step in {r['every']}. "
        f"Work.wait(): adds {w['not_timed_us']:.2f} us not timed, {w['timed_us']:.2f} us timed, "
        f"{w['amortised_us']:.2f} us per wait. Classic FSDP's: adds {c['not_timed_us']:.2f} us "
        f"not timed, {c['timed_us']:.2f} us timed, {c['amortised_us']:.2f} us per wait; errors "
        f"{r['errors']}. Per call: usable() {parts['usable_us']:.2f} us, on_default_stream() "
        f"{parts['on_default_stream_us']:.2f} us, record() {parts['record_us']:.2f} us"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
