"""Microbenchmark the exporter's training-path events: cost per event in microseconds.

Each case times a loop of the instrumented call against the same loop over the bare call
(``time.perf_counter_ns``, ``--n`` calls per repeat, ``--repeats`` repeats); the cost per
event is ``instrumented - bare`` per call, from the min and from the median of the repeats.

    python benchmarks/hotpath.py
    python benchmarks/hotpath.py --n 200000 --repeats 9

Cases:

* ``comm_hook``: CommHookWrapper called with a real ``GradBucket`` (captured from a 1-rank gloo
  DDP backward) around an inner hook that returns a completed future, so the done callback
  (``bucket_done``) runs inline; bare = the inner hook alone. One event = one bucket.
* ``recorder.bucket``: ``Recorder.bucket_launched`` + ``bucket_done`` (bare: empty loop).
* ``recorder.data``: ``data_begin`` + ``data_end``; ``recorder.optimizer``: ``optimizer_begin``
  + ``optimizer_end`` with the step boundary (bare: empty loop).
* ``optimizer.step``: a real ``SGD.step()`` on one scalar parameter with and without the
  exporter's step pre/post hooks (includes torch's hook dispatch).
* ``dataloader.next``: ``next()`` through the exporter's timed iterator vs the bare iterator
  (over a list iterator, to isolate the wrapper), and through a real instrumented DataLoader
  vs a plain one (informational: the loader's own cost dominates).
* ``dist.all_reduce`` (synchronous) and ``all_gather_single(async_op=True).wait()`` on the
  1-rank gloo group with and without :class:`CollectiveTiming`'s wrappers (FSDP2, FSDP and loops
  without DDP): one event = one collective (call, future callback, timed ``Work.wait``).
* four ``all_reduce(async_op=True)`` queued in torch's coalescing manager, then ``cm.wait()``
  (DeepSpeed's ZeRO), with and without the wrappers: one event = one coalesced
  collective (the queued calls pass through, the manager's exit and the wait are timed).
* ``funcol.all_reduce`` and its ``wait()`` (a functional collective, as DTensor issues them) on
  the 1-rank gloo group with and without :class:`FunctionalCollectiveTiming`'s stand-ins for
  the ``_c10d_functional`` ops (any parallelism): one event = one collective (launch, wait).
* ``backward, marks``: a backward of a ``Linear(4, 4)`` (with DDP's ``require_backward_grad_sync``
  flag, so that no allreduce's jitter hides the difference) with and without the events mode's
  marks (:class:`IterationEvents` on the host clock): their cost per iteration, the same
  whatever the model and its number of buckets (not a per-event cost).
* The forward pre-hook is not timed: it runs before the first forward only, then removes itself.

Also printed (not event costs): the stand-in allreduce hook's extra ``mul_`` pass over a
25 MB bucket, which DDP's built-in C++ allreduce fuses into its gradient copy; and the per-step
conversion and read of DDP's reducer timers (``ReducerTiming.read``, the default mode's one
cost per step).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from exporter.errors import ErrorCounter  # noqa: E402
from exporter.sources.collectives import CollectiveTiming  # noqa: E402
from exporter.sources.commhook import CommHookWrapper  # noqa: E402
from exporter.sources.ddpevents import HostMarks, IterationEvents  # noqa: E402
from exporter.sources.functional import FunctionalCollectiveTiming  # noqa: E402
from exporter.sources.instrumentors import (  # noqa: E402
    DataLoaderInstrumentor,
    OptimizerInstrumentor,
    TimedIterator,
)
from exporter.sources.recorder import Recorder  # noqa: E402
from exporter.sources.reducer import ReducerTiming  # noqa: E402

GOAL_US = 2.0


def _time(loop: Callable[[int], None], n: int, repeats: int) -> list[float]:
    """Return ns per iteration for each repeat."""
    loop(max(1, n // 10))  # warm-up
    out = []
    for _ in range(repeats):
        gc.collect()
        t0 = time.perf_counter_ns()
        loop(n)
        out.append((time.perf_counter_ns() - t0) / n)
    return out


def _pair(
    name: str,
    bare: Callable[[int], None],
    instr: Callable[[int], None],
    n: int,
    repeats: int,
    on: Callable[[], None] = lambda: None,
    off: Callable[[], None] = lambda: None,
) -> tuple:
    """Time ``bare`` and ``instr`` in alternating repeats (drift cancels); return a table row.

    ``on``/``off`` switch the instrumentation when both loops run the same code.
    """
    b_ns: list[float] = []
    i_ns: list[float] = []
    for r in range(repeats):
        for which in (0, 1) if r % 2 == 0 else (1, 0):
            if which:
                on()
                i_ns += _time(instr, n, 1)
                off()
            else:
                b_ns += _time(bare, n, 1)
    d_min = (min(i_ns) - min(b_ns)) / 1e3
    d_med = statistics.median(i - b for i, b in zip(i_ns, b_ns)) / 1e3
    return (name, min(b_ns) / 1e3, min(i_ns) / 1e3, d_min, d_med)


def _grad_bucket() -> tuple[object, DDP]:
    """Capture a real GradBucket from one backward of a 1-rank gloo DDP model."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    dist.init_process_group("gloo", rank=0, world_size=1)
    model = DDP(torch.nn.Linear(256, 256))
    got: list = []

    def capture(state, bucket):
        got.append(bucket)
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    model.register_comm_hook(None, capture)
    model(torch.randn(8, 256)).sum().backward()
    return got[-1], model


def _hook_and_recorder_rows(n: int, reps: int) -> list[tuple]:
    """Time the comm hook wrapper on a real GradBucket and the recorder's events."""
    rows: list[tuple] = []
    errors = ErrorCounter()
    # -- comm hook wrapper with a real GradBucket ----------------------------------------------
    bucket, _model = _grad_bucket()
    buf = bucket.buffer()

    def done_hook(state, b):
        fut = torch.futures.Future()
        fut.set_result(buf)
        return fut

    rec = Recorder("optimizer")
    errors = ErrorCounter()
    stats = rec.collective_stats("allreduce", "0", 1800.0)
    wrapper = CommHookWrapper(rec, errors, stats, done_hook, None)

    def hook_bare(k: int) -> None:
        for _ in range(k):
            done_hook(None, bucket)

    def hook_instr(k: int) -> None:
        for _ in range(k):
            wrapper(None, bucket)

    rows.append(_pair("comm_hook (per bucket)", hook_bare, hook_instr, n, reps))
    assert stats.completed > 0 and not stats.pending, "wrapper did not complete its buckets"

    # -- recorder events directly --------------------------------------------------------------
    def empty(k: int) -> None:
        for _ in range(k):
            pass

    def rec_bucket(k: int) -> None:
        launched, done = rec.bucket_launched, rec.bucket_done
        for _ in range(k):
            done(stats, launched(stats, 1024), False)

    def rec_data(k: int) -> None:
        begin, end = rec.data_begin, rec.data_end
        for _ in range(k):
            end(begin())

    def rec_opt(k: int) -> None:
        begin, end = rec.optimizer_begin, rec.optimizer_end
        for _ in range(k):
            begin()
            end()

    rows.append(_pair("recorder.bucket_launched+done", empty, rec_bucket, n, reps))
    rows.append(_pair("recorder.data_begin+end", empty, rec_data, n, reps))
    rows.append(_pair("recorder.optimizer_begin+end", empty, rec_opt, n, reps))

    return rows


def _hook_rows_of_loops(n: int, reps: int) -> list[tuple]:
    """Time the optimizer's step hooks and the DataLoader wrappers."""
    rows: list[tuple] = []
    errors = ErrorCounter()
    # -- real optimizer step with and without the hooks ----------------------------------------
    param = torch.nn.Parameter(torch.zeros(1))
    param.grad = torch.zeros(1)
    opt = torch.optim.SGD([param], lr=0.0)

    def opt_step(k: int) -> None:
        step = opt.step
        for _ in range(k):
            step()

    m = max(1000, n // 10)
    oi = OptimizerInstrumentor(opt, Recorder("optimizer"), errors)
    rows.append(
        _pair("optimizer.step() hooks", opt_step, opt_step, m, reps, oi.instrument, oi.uninstrument)
    )

    # -- DataLoader next() ---------------------------------------------------------------------
    items = list(range(n + n // 10 + 1))
    drec = Recorder("optimizer")

    def it_bare(k: int) -> None:
        it = iter(items)
        for _ in range(k):
            next(it)

    def it_instr(k: int) -> None:
        it = TimedIterator(iter(items), drec, errors)
        for _ in range(k):
            next(it)

    rows.append(_pair("dataloader next() wrapper", it_bare, it_instr, n, reps))

    data = torch.utils.data.TensorDataset(torch.zeros(m + m // 10 + 1, 4))
    loader = torch.utils.data.DataLoader(data, batch_size=1)

    def loader_next(k: int) -> None:
        it = iter(loader)
        for _ in range(k):
            next(it)

    di = DataLoaderInstrumentor(loader, Recorder("optimizer"), errors)
    rows.append(
        _pair(
            "real DataLoader next() (info)",
            loader_next,
            loader_next,
            m,
            reps,
            di.instrument,
            di.uninstrument,
        )
    )

    return rows


def _per_step(n: int, reps: int) -> tuple[list[float], list[float]]:
    """Time the stand-in hook's pass over a 25 MB bucket and reading the reducer's timers."""
    errors = ErrorCounter()
    # -- structural: the stand-in hook's extra pass over a 25 MB bucket ------------------------
    big = torch.ones(25 * 2**20 // 4)
    mul_ns = _time(lambda k: [big.mul_(1.0) for _ in range(k)], 20, reps)

    # -- per step: reading DDP's reducer timers (the default, hook-free mode) -----------------
    layers = [torch.nn.Linear(64, 64) for _ in range(24)]  # 48 parameter tensors
    ddp = DDP(torch.nn.Sequential(*layers))
    timing = ReducerTiming(ddp, errors)
    timing.instrument()
    for _ in range(3):
        ddp(torch.randn(8, 64)).sum().backward()
    read_ns = _time(lambda k: [timing.read() for _ in range(k)], max(n // 100, 100), reps)
    timing.uninstrument()

    return mul_ns, read_ns


def _marks_and_collective_rows(n: int, reps: int) -> list[tuple]:
    """Time the events mode's marks and the collective wrappers (FSDP2, loops, DTensor)."""
    rows: list[tuple] = []
    errors = ErrorCounter()
    # -- per iteration: the marks of the events mode (three calls, whatever the buckets) -------
    # A plain module with DDP's flag: the same hook and callbacks, without a 1-rank gloo
    # allreduce whose jitter (tens of us) would hide them.
    marked = torch.nn.Linear(4, 4)
    marked.require_backward_grad_sync = True
    mrec = Recorder("optimizer")
    marks = IterationEvents(
        marked, mrec, errors, mrec.collective_stats("allreduce", "0", None), HostMarks()
    )
    xm = torch.randn(2, 4)

    def backward(k: int) -> None:
        for _ in range(k):
            marked(xm).sum().backward()

    rows.append(
        _pair(
            "backward, marks (per iter)",
            backward,
            backward,
            max(1000, n // 20),
            reps,
            marks.instrument,
            marks.uninstrument,
        )
    )
    marks.close()

    # -- FSDP2 / loops without DDP: the torch.distributed collective wrappers ------------------
    ctim = CollectiveTiming(Recorder("optimizer"), errors)
    small, out2 = torch.ones(1), torch.empty(1)
    calls = max(1000, n // 100)

    def sync_allreduce(k: int) -> None:
        for _ in range(k):
            dist.all_reduce(small)

    def async_allgather(k: int) -> None:
        for _ in range(k):
            dist.all_gather_single(out2, small, async_op=True).wait()

    rows.append(
        _pair(
            "dist.all_reduce wrapper (sync)",
            sync_allreduce,
            sync_allreduce,
            calls,
            reps,
            ctim.instrument,
            ctim.uninstrument,
        )
    )
    rows.append(
        _pair(
            "all_gather_single+wait wrapper",
            async_allgather,
            async_allgather,
            calls,
            reps,
            ctim.instrument,
            ctim.uninstrument,
        )
    )

    # DeepSpeed's ZeRO buckets: one coalesced collective of 4 queued all-reduces.
    four = [torch.ones(1) for _ in range(4)]
    c10d = dist.distributed_c10d

    def coalesced_allreduce(k: int) -> None:
        for _ in range(k):
            with c10d._coalescing_manager(async_ops=True) as cm:  # looked up at each use
                for t in four:
                    dist.all_reduce(t, async_op=True)
            cm.wait()

    rows.append(
        _pair(
            "coalescing manager, 4 all_reduce",
            coalesced_allreduce,
            coalesced_allreduce,
            calls,
            reps,
            ctim.instrument,
            ctim.uninstrument,
        )
    )

    # -- DTensor's functional collectives, any parallelism ----------------------------------------
    import torch.distributed._functional_collectives as funcol

    ftim = FunctionalCollectiveTiming(Recorder("optimizer"), errors)

    def functional_allreduce(k: int) -> None:
        for _ in range(k):
            funcol.all_reduce(small, "sum", "0").wait()

    rows.append(
        _pair(
            "funcol.all_reduce+wait stand-ins",
            functional_allreduce,
            functional_allreduce,
            calls,
            reps,
            ftim.instrument,
            ftim.uninstrument,
        )
    )
    return rows


def _report(
    rows: list[tuple], n: int, reps: int, mul_ns: list[float], read_ns: list[float]
) -> None:
    """Print the table and the figures the docs quote."""
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs; {n} calls x {reps} repeats")
    print(f"{'event':<32} {'bare us':>9} {'instr us':>9} {'cost us(min)':>13} {'cost us(med)':>13}")
    worst = 0.0
    for name, b, i, dmin, dmed in rows:
        print(f"{name:<32} {b:9.3f} {i:9.3f} {dmin:13.3f} {dmed:13.3f}")
        if "(info)" not in name and "(per iter)" not in name:
            worst = max(worst, dmed)
    print(
        f"stand-in allreduce hook mul_ pass over a 25 MB bucket: {min(mul_ns) / 1e3:.0f} us "
        "(DDP's built-in allreduce fuses this division into its gradient copy)"
    )
    print(
        f"converting and reading DDP's reducer timers, once per step (default mode; 48 "
        f"parameter tensors): "
        f"{min(read_ns) / 1e3:.1f} us (min) / {statistics.median(read_ns) / 1e3:.1f} us (median)"
    )
    print(
        "forward pre-hook: runs before the first forward only, then removes itself (no per-step cost)"
    )
    print(f"worst per-event cost (median) {worst:.3f} us; goal <= {GOAL_US} us")
    print(f"hotpath_worst_us={worst:.3f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=100_000, help="calls per repeat")
    p.add_argument("--repeats", type=int, default=9)
    args = p.parse_args(argv)
    n, reps = args.n, args.repeats
    torch.set_num_threads(1)
    rows = _hook_and_recorder_rows(n, reps) + _hook_rows_of_loops(n, reps)
    mul_ns, read_ns = _per_step(n, reps)
    rows += _marks_and_collective_rows(n, reps)
    dist.destroy_process_group()
    _report(rows, n, reps, mul_ns, read_ns)
    return 0


if __name__ == "__main__":
    sys.exit(main())
