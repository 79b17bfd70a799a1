"""Aggregate hot-path events (steps, phases, collectives) into fixed-size state.

Everything here is on the training path, so it is built to be cheap: preallocated histogram
buckets, one short lock per event, no per-event allocation in the aggregation, and all
formatting deferred to scrape time (:meth:`Recorder.snapshot`).
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import catalog

__all__ = ["Histogram", "CollectiveStats", "Recorder", "Snapshot", "STEP_SOURCES"]

#: Where step boundaries can come from, strongest first. exporter.step() overrides them all.
STEP_SOURCES: tuple[str, ...] = ("explicit", "optimizer", "dataloader", "comm_hook")

_DATA, _COMPUTE, _COMM, _OPT = range(4)
assert catalog.PHASES == ("data", "compute", "comm_wait", "optimizer")


class Histogram:
    """Count observations into fixed buckets; the caller holds the recorder's lock."""

    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        """Add one observation."""
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """Return Prometheus-style cumulative ``(le, count)`` pairs, ``+Inf`` last."""
        out, acc = [], 0
        for bound, n in zip(self.bounds, self.counts):
            acc += n
            out.append((repr(float(bound)), acc))
        out.append(("+Inf", acc + self.counts[-1]))
        return out


class CollectiveStats:
    """Hold one (op, process group)'s latency histogram, bytes and comm-hook bookkeeping."""

    __slots__ = ("op", "pg", "hist", "bytes", "enqueued", "completed", "pending", "timeout_s")

    def __init__(self, op: str, pg: str, timeout_s: float | None = None) -> None:
        self.op = op
        self.pg = pg
        self.hist = Histogram(catalog.COLLECTIVE_BUCKETS)
        self.bytes = 0
        self.enqueued = 0
        self.completed = 0
        # Launch times (perf_counter) of collectives not yet completed, oldest first; bounded
        # because DDP never has more buckets in flight than it has buckets.
        self.pending: deque[float] = deque(maxlen=4096)
        self.timeout_s = timeout_s


@dataclass
class Snapshot:
    """Plain copy of the recorder's state, taken under its lock at scrape time."""

    steps: int
    step_hist: list[tuple[str, int]]
    step_sum: float
    step_count: int
    phase_sum: list[float]
    collectives: list[tuple[str, str, list[tuple[str, int]], float, int, int]] = field(
        default_factory=list
    )
    last_progress_unix: float = 0.0
    #: ``(op, pg, n)``: collectives of each (op, pg) that completed untimed, in the order of
    #: ``collectives``.
    untimed: list[tuple[str, str, int]] = field(default_factory=list)


class Recorder:
    """Turn events from the hooks into step, phase and collective aggregates.

    Step boundaries come from one source at a time (``mode``): the optimizer's step, the
    DataLoader's ``next()``, the comm hook's last bucket, or ``exporter.step()``. A step's phases
    are: data (time inside ``next()``), optimizer (time inside ``optimizer.step()``), comm_wait
    (DDP: from the launch of the step's last gradient bucket to the completion of its latest
    collective, communication the backward pass had to wait for; without DDP: the training
    thread's time inside ``Work.wait()``, on a CUDA device the compute stream's waits
    (:mod:`exporter.sources.devicewaits`); with either, its time inside the waits of functional
    collectives, DTensor's: see :meth:`comm_blocked`), and compute (the rest). A wait inside
    ``optimizer.step()`` is communication too: it moves from the optimizer phase to comm_wait.

    A declared section (``exporter.deadline``) entered on the training thread that interrupts
    training (no step activity inside it: a checkpoint, rank 0's evaluation) is left out of the
    step it interrupts: its time is not training, and counted as compute it would make the
    rank look like a straggler. A section with training inside (an epoch, an evaluation loop
    of ``exporter.step()`` blocks) is counted as usual from its first step activity on.
    """

    def __init__(self, mode: str, clock: Callable[[], float] = time.perf_counter) -> None:
        if mode not in STEP_SOURCES:
            raise ValueError(f"step mode must be one of {STEP_SOURCES}, got {mode!r}")
        self.mode = mode
        self.clock = clock
        self.lock = threading.Lock()
        self.steps = 0
        self.step_hist = Histogram(catalog.STEP_BUCKETS)
        self.phase_sum = [0.0, 0.0, 0.0, 0.0]
        self.collectives: list[CollectiveStats] = []
        # Offsets turn perf_counter readings into Unix time at scrape.
        self._perf0 = clock()
        self._unix0 = time.time()
        self.last_progress = self._perf0
        # Sections on the training thread: nesting depth, and since when the current one has
        # been left out of the step (None: no section, or one with training inside).
        self._depth = 0
        self._paused: float | None = None
        # Hook-free timing: read DDP's reducer timers as each step closes (time_comm_with).
        self._comm_reader: Callable[[], Any] | None = None
        self._comm_stats: CollectiveStats | None = None
        # Without DDP: a step's comm_wait is the time the training thread waited for
        # collectives (comm_blocked), not a bucket's launch-to-completion.
        self._exposed_from_waits = False
        # Communication timed on the device after its step closed (add_comm_wait): taken from
        # compute no scrape has read yet, else owed by the next steps' compute, so that the
        # compute total never goes down. An owed balance not paid off within _owed_limit step
        # closes is dropped (device waits beyond the host's compute).
        self._compute_read = 0.0
        self._owed = 0.0
        self._owed_closes = 0
        self._owed_limit = 2
        self._reset_step(None)

    # -- step state ------------------------------------------------------------------------
    def _reset_step(self, start: float | None) -> None:
        self._start = start
        self._excluded = 0.0
        self._data = 0.0
        self._opt = 0.0
        self._last_launch = 0.0
        self._last_done = 0.0
        self._opt_t0 = 0.0
        self._blocked = 0.0
        self._blocked_opt = 0.0  # the part of _blocked inside optimizer.step()

    def _finish_step(self, now: float, reading: Any = None) -> None:
        """Close the current step at ``now`` and open the next; caller holds the lock.

        ``reading``: DDP's reducer timing of the last finished iteration (hook-free mode), or
        None; its exposed communication is the step's comm_wait.
        """
        start = self._start
        self._paused = None  # a step ends inside the section: it has training in it
        if reading is not None:
            stats = self._comm_stats
            assert stats is not None  # time_comm_with sets the reader and its stats together
            self._count_iteration(stats, reading.nbytes, reading.comm_s)
        if start is not None:
            duration = now - start - self._excluded
            if duration < 0.0:
                duration = 0.0
            data, opt = self._data, self._opt
            # Waits inside optimizer.step() (a DTensor optimizer's collectives) are
            # communication, not optimizer time.
            opt = opt - self._blocked_opt if opt > self._blocked_opt else 0.0
            if reading is not None:
                comm = reading.exposed_s + self._blocked
            elif self._exposed_from_waits:
                comm = self._blocked
            else:
                comm = self._last_done - self._last_launch if self._last_launch else 0.0
                comm += self._blocked  # waits outside DDP's buckets (functional collectives)
            rest = duration - data - opt
            if comm < 0.0:
                comm = 0.0
            elif comm > rest:
                comm = rest if rest > 0.0 else 0.0
            compute = rest - comm
            if compute < 0.0:
                compute = 0.0
            if self._owed > 0.0:
                paid = min(self._owed, compute)
                compute -= paid
                comm += paid
                self._pay_owed(paid)
            ps = self.phase_sum
            ps[_DATA] += data
            ps[_COMPUTE] += compute
            ps[_COMM] += comm
            ps[_OPT] += opt
            self.step_hist.observe(duration)
            self.steps += 1
        self._reset_step(now)
        self.last_progress = now

    def time_comm_with(self, reader: Callable[[], Any], stats: CollectiveStats) -> None:
        """Take communication time from ``reader()`` as each step closes (hook-free timing).

        ``reader`` runs on the training thread, outside the lock, and returns an object with
        ``comm_s``, ``exposed_s`` and ``nbytes`` for an iteration finished since its last call,
        or None; it must not raise. ``stats`` receives one observation per iteration.
        """
        with self.lock:
            self._comm_reader = reader
            self._comm_stats = stats

    def time_comm_by_waits(self) -> None:
        """Take each step's comm_wait from :meth:`comm_blocked` (collectives without DDP)."""
        with self.lock:
            self._exposed_from_waits = True

    def _read_comm(self) -> Any:
        reader = self._comm_reader
        return reader() if reader is not None else None

    def block_begin(self) -> str:
        """Open an ``exporter.step()`` block's step; return the step source it takes over from."""
        with self.lock:
            before, self.mode = self.mode, "explicit"
        self.open_step()
        return before

    def block_end(self, before: str) -> None:
        """Close the block's step; give the boundaries back to ``before`` where it is the
        optimizer or DDP.

        A job whose optimizer or DDP closes its steps may mark others (evaluation batches) with
        ``exporter.step()``: each block is a step, and its own source closes steps again after
        it. A DataLoader's fetches come between a loop's blocks (``for batch in loader: with
        exporter.step():``): given the boundaries back, each would close a step of its own, so
        there the blocks keep them.
        """
        self.boundary("explicit")
        if before in ("optimizer", "comm_hook"):
            with self.lock:
                self.mode = before

    # -- events ------------------------------------------------------------------------------
    def section_begin(self) -> None:
        """Enter a declared section on the training thread (left out until training resumes)."""
        now = self.clock()
        with self.lock:
            self._depth += 1
            if self._depth == 1:
                self._paused = now

    def section_end(self) -> None:
        """Leave a declared section on the training thread."""
        now = self.clock()
        with self.lock:
            self._depth = max(self._depth - 1, 0)
            if self._depth == 0 and self._paused is not None:
                self._excluded += now - self._paused
                self._paused = None

    def data_begin(self) -> float:
        """Mark the start of a DataLoader ``next()``; return the timestamp for data_end."""
        now = self.clock()
        if self.mode == "dataloader" or self._start is None or self._paused is not None:
            reading = self._read_comm() if self.mode == "dataloader" else None
            with self.lock:
                self._paused = None  # training inside a section: counted as usual
                if self.mode == "dataloader":
                    self._finish_step(now, reading)
                elif self._start is None:
                    self._start = now
        return now

    def data_end(self, t0: float) -> None:
        """Add the time since ``t0`` to the step's data phase."""
        now = self.clock()
        with self.lock:
            self._data += now - t0
            self.last_progress = now

    def optimizer_begin(self) -> None:
        """Mark the start of ``optimizer.step()``."""
        self._opt_t0 = self.clock()
        if self._paused is not None:
            with self.lock:
                self._paused = None  # training inside a section: counted as usual

    def optimizer_end(self) -> None:
        """Add the optimizer time and, in optimizer mode, close the step."""
        now = self.clock()
        reading = self._read_comm() if self.mode == "optimizer" else None
        with self.lock:
            if self._opt_t0:
                self._opt += now - self._opt_t0
                self._opt_t0 = 0.0
            if self.mode == "optimizer":
                self._finish_step(now, reading)
            else:
                self.last_progress = now

    def open_step(self) -> None:
        """Open a step if none is open (the first forward, or entering ``exporter.step()``)."""
        now = self.clock()
        with self.lock:
            self._paused = None  # a step inside a section: counted as usual
            if self._start is None:
                self._start = now

    def boundary(self, source: str) -> None:
        """Close the current step if ``source`` is the active step-boundary source."""
        now = self.clock()
        reading = self._read_comm() if self.mode == source else None
        with self.lock:
            if self.mode == source:
                self._finish_step(now, reading)

    def collective_stats(self, op: str, pg: str, timeout_s: float | None) -> CollectiveStats:
        """Return the (cached) stats object for ``(op, pg)``."""
        with self.lock:
            st = self._find(op, pg)
            if st is None:
                st = CollectiveStats(op, pg, timeout_s)
                self.collectives.append(st)
            return st

    def find_collective(self, op: str, pg: str) -> CollectiveStats | None:
        """Return the stats object for ``(op, pg)`` if a collective of it was counted, else None."""
        with self.lock:
            return self._find(op, pg)

    def _find(self, op: str, pg: str) -> CollectiveStats | None:
        return next((st for st in self.collectives if st.op == op and st.pg == pg), None)

    def bucket_launched(self, stats: CollectiveStats, nbytes: int) -> float:
        """Record the launch of one gradient bucket's collective; return its start time."""
        now = self.clock()
        with self.lock:
            self._paused = None  # backward inside a section: counted as usual
            if self._start is None:
                self._start = now
            self._last_launch = now
            stats.enqueued += 1
            stats.bytes += nbytes
            stats.pending.append(now)
            self.last_progress = now
        return now

    def collective_launched(self, stats: CollectiveStats, nbytes: int) -> float:
        """Record the call of one ``torch.distributed`` collective; return its start time.

        Unlike a DDP bucket it opens no step: a collective outside training (a barrier before
        the first step, a metric's all_reduce in evaluation) is no training activity.
        """
        now = self.clock()
        with self.lock:
            stats.enqueued += 1
            stats.bytes += nbytes
            stats.pending.append(now)
        return now

    def collective_finished(self, stats: CollectiveStats, t0: float, timed: bool = True) -> None:
        """Record the completion of a collective called at ``t0`` (any thread).

        ``timed``: observe its latency (False where completion is not seen on the host: a CUDA
        collective's future completes when it is enqueued; or the call raised).
        """
        now = self.clock()
        with self.lock:
            if timed:
                self._collective_done(stats, t0, now - t0, now)
            else:
                self._settle(stats, t0)

    def comm_blocked(self, seconds: float) -> None:
        """Add ``seconds`` the training thread waited for a collective to this step's comm_wait.

        Not inside a section that interrupts training: that time is out of the step already.
        """
        with self.lock:
            self._add_blocked(seconds)

    def _add_blocked(self, seconds: float) -> None:
        if self._paused is None:
            self._blocked += seconds
            if self._opt_t0:
                self._blocked_opt += seconds

    def collective_waited(
        self, stats: CollectiveStats | None, t0: float, timed: bool, blocked: float
    ) -> None:
        """Record a wait that ended a collective called at ``t0`` (``stats`` None: unknown).

        The training thread waited ``blocked`` seconds (0 elsewhere): this step's comm_wait.
        ``timed``: observe the collective's latency, launch to now (see
        :meth:`collective_finished`). One lock for both, on the training path.
        """
        now = self.clock()
        with self.lock:
            if stats is not None:
                if timed:
                    self._collective_done(stats, t0, now - t0, now)
                else:
                    self._settle(stats, t0)
            if blocked:
                self._add_blocked(blocked)

    def bucket_done(self, stats: CollectiveStats, t0: float, is_last: bool) -> None:
        """Record the completion of a collective launched at ``t0`` (wall-clock timing)."""
        now = self.clock()
        with self.lock:
            self._collective_done(stats, t0, now - t0, now)
            # The exposed tail ends at the latest bucket's completion, no other collective's.
            if now > self._last_done:
                self._last_done = now
            if is_last and self.mode == "comm_hook":
                self._finish_step(now)

    def bucket_timed(self, stats: CollectiveStats, t0: float, seconds: float) -> None:
        """Record a collective whose duration was measured elsewhere (CUDA events)."""
        with self.lock:
            self._collective_done(stats, t0, seconds, None)

    def collective_timed_on_device(self, stats: CollectiveStats, seconds: float) -> bool:
        """Observe a device-measured latency of a collective counted complete untimed.

        Return False, observing nothing, where every completed one is timed already: a
        duration never times a collective the wrappers did not count.
        """
        with self.lock:
            if stats.hist.count >= stats.completed:
                return False
            stats.hist.observe(seconds)
            return True

    def _collective_done(
        self, stats: CollectiveStats, t0: float, seconds: float, now: float | None
    ) -> None:
        stats.hist.observe(seconds)
        self._settle(stats, t0)
        if now is not None:
            self.last_progress = now

    @staticmethod
    def _settle(stats: CollectiveStats, t0: float) -> None:
        """Count the collective launched at ``t0`` complete: no longer in flight."""
        stats.completed += 1
        try:
            stats.pending.remove(t0)
        except ValueError:
            pass

    def iteration_timed(
        self, stats: CollectiveStats, span_s: float, exposed_s: float, nbytes: int
    ) -> None:
        """Record one DDP iteration's communication, measured off the training path.

        ``span_s``: its first bucket launched to its last completed (one latency observation);
        ``exposed_s``: the part the step waited for, moved from compute to comm_wait as in
        :meth:`add_comm_wait` (the step it belongs to may have closed already).
        """
        with self.lock:
            self._count_iteration(stats, nbytes, span_s)
            self._move_to_comm(exposed_s, 1)

    def iteration_untimed(self, stats: CollectiveStats, nbytes: int) -> None:
        """Count one DDP iteration's communication that could not be timed."""
        with self.lock:
            self._count_iteration(stats, nbytes, None)

    @staticmethod
    def _count_iteration(stats: CollectiveStats, nbytes: int, span_s: float | None) -> None:
        """Count one DDP iteration (all its buckets) complete; observe ``span_s`` unless None."""
        stats.enqueued += 1
        stats.completed += 1
        stats.bytes += nbytes
        if span_s is not None:
            stats.hist.observe(span_s)

    def add_comm_wait(self, seconds: float, spread: int = 1) -> None:
        """Move ``seconds`` of compute to comm_wait: communication timed on the device later.

        Taken from the compute counted since the last :meth:`snapshot`, else from the compute of
        the steps that close next; ``spread``: over how many steps such waits were sampled (what
        is still owed after twice that many step closes is dropped).
        """
        with self.lock:
            self._move_to_comm(seconds, spread)

    def _move_to_comm(self, seconds: float, spread: int) -> None:
        ps = self.phase_sum
        moved = min(seconds, ps[_COMPUTE] - self._compute_read)
        if moved > 0.0:
            ps[_COMPUTE] -= moved
            ps[_COMM] += moved
            seconds -= moved
        if seconds > 0.0:
            self._owed += seconds
            self._owed_limit = max(self._owed_limit, 2 * spread)

    def _pay_owed(self, paid: float) -> None:
        """Count ``paid`` of the owed balance paid by the step closing now; drop it when stale."""
        self._owed -= paid
        if self._owed <= 0.0:
            self._owed, self._owed_closes = 0.0, 0
            return
        self._owed_closes += 1
        if self._owed_closes >= self._owed_limit:
            self._owed, self._owed_closes = 0.0, 0

    # -- scrape ------------------------------------------------------------------------------
    @property
    def paused(self) -> bool:
        """Whether a section that interrupts training is open (a plain read, off the lock)."""
        return self._paused is not None

    def open_since(self) -> float | None:
        """Return when the open step started (perf_counter), None before the first step opens.

        Read off the training path (the goodput account, each tick); a plain attribute read.
        """
        return self._start

    def unix(self, perf: float) -> float:
        """Convert a perf_counter reading to Unix time."""
        return self._unix0 + (perf - self._perf0)

    def snapshot(self) -> Snapshot:
        """Copy the aggregates under the lock; formatting happens outside it."""
        with self.lock:
            # What a scraper has read must never go down (a counter): see add_comm_wait.
            self._compute_read = self.phase_sum[_COMPUTE]
            colls = [
                (
                    st.op,
                    st.pg,
                    st.hist.cumulative(),
                    st.hist.sum,
                    st.hist.count,
                    st.bytes,
                )
                for st in self.collectives
            ]
            return Snapshot(
                steps=self.steps,
                step_hist=self.step_hist.cumulative(),
                step_sum=self.step_hist.sum,
                step_count=self.step_hist.count,
                phase_sum=list(self.phase_sum),
                collectives=colls,
                last_progress_unix=self.unix(self.last_progress),
                untimed=[(st.op, st.pg, st.completed - st.hist.count) for st in self.collectives],
            )

    def collective_totals(self) -> tuple[float, int]:
        """Return the summed latency (seconds) and count of every collective timed so far."""
        with self.lock:
            total = sum(st.hist.sum for st in self.collectives)
            count = sum(st.hist.count for st in self.collectives)
        return total, count

    def inflight(self) -> list[tuple[str, int, int, float]]:
        """Return the bookkeeping per pg: ``(pg, enqueued, completed, oldest age s)``.

        A group's collectives of every kind (all-gathers and reductions of FSDP2) share one
        sequence, as the Flight Recorder numbers them.
        """
        now = self.clock()
        with self.lock:
            out: dict[str, list[Any]] = {}  # pg -> [pg, enqueued, completed, oldest age]
            for st in self.collectives:
                age = now - st.pending[0] if st.pending else 0.0
                row = out.setdefault(st.pg, [st.pg, 0, 0, 0.0])
                row[1] += st.enqueued
                row[2] += st.completed
                row[3] = max(row[3], age)
            return [tuple(row) for row in out.values()]
