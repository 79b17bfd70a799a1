"""Observe the device time of collectives the Flight Recorder timed (CUDA, outside DDP).

On a GPU the host does not see a collective end: an NCCL ``Work.wait()`` only orders streams,
and FSDP2 issues its collectives on streams of its own. The ``torch.distributed`` and
functional wrappers (:mod:`exporter.sources.collectives`, :mod:`exporter.sources.functional`)
count such a collective complete, untimed. Where NCCL times its collectives
(``TORCH_NCCL_ENABLE_TIMING=1``, or ``ProcessGroup._enable_collectives_timing()``), its Flight
Recorder holds each retired collective's device time (``duration_ms``: its start and end events
on NCCL's stream), and :class:`RecorderDurations` observes those as the latencies of the
collectives the wrappers counted: never more than they counted complete, so the untimed count
is what no duration covered.

Read at scrape time, off the training thread, and at most once every :data:`READ_EVERY_S`:
reading a recorder's entries holds the interpreter lock for tens of milliseconds (2,000 entries:
a read of about 50 ms, up to 120, ``benchmarks/durations.py``), time mostly taken from the
training thread. Each read observes the collectives retired since the last one that the ring
buffer (``TORCH_FR_BUFFER_SIZE``) still holds: a sample of the latest, the others untimed.
Collectives issued before the exporter started are not observed. Where a read finds retired
collectives and none carries a duration, timing is off: one line says so and reading stops.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from .. import catalog
from ..errors import ErrorCounter
from ..log import log
from .flight import dump_functions, entry_group, entry_op, read_trace
from .recorder import Recorder

__all__ = ["READS_BEFORE_GIVING_UP", "READ_EVERY_S", "RECORDER_OPS", "RecorderDurations"]

#: Reads that found retired collectives, none of them timed, after which reading stops (NCCL's
#: timing is chosen when a group is made: the first such read already tells).
READS_BEFORE_GIVING_UP = 2
#: The shortest time between two reads of the recorders' entries, seconds.
READ_EVERY_S = 30.0

#: The Flight Recorder's op names (``profiling_name`` after the backend's prefix) -> ``op``.
RECORDER_OPS: dict[str, str] = {
    "all_reduce": "allreduce",
    "allreduce": "allreduce",
    "allreduce_coalesced": "allreduce",
    "all_reduce_coalesced": "allreduce",
    "all_gather": "allgather",
    "allgather": "allgather",
    "_allgather_base": "allgather",
    "_all_gather_base": "allgather",
    "all_gather_into_tensor": "allgather",
    "allgather_into_tensor_coalesced": "allgather",
    "all_gather_into_tensor_coalesced": "allgather",
    "reduce_scatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "all_to_all": "alltoall",
    "alltoall": "alltoall",
    "alltoall_base": "alltoall",
    "all_to_all_single": "alltoall",
    "barrier": "barrier",
}
assert set(RECORDER_OPS.values()) <= set(catalog.COLLECTIVE_OPS)


def _record_id(entry: dict[str, Any]) -> int:
    try:
        return int(entry.get("record_id", -1))
    except (TypeError, ValueError):
        return -1


class RecorderDurations:
    """Turn the Flight Recorders' ``duration_ms`` into the latencies of counted collectives.

    ``dumps``: the recorders' dump functions (default: this torch's,
    :func:`~exporter.sources.flight.dump_functions`). Entries created before this is made are
    the past: not observed. ``read_every_s``: the shortest time between two reads.
    """

    def __init__(
        self,
        recorder: Recorder,
        errors: ErrorCounter,
        dumps: Any = None,
        *,
        read_every_s: float = READ_EVERY_S,
    ) -> None:
        self._recorder = recorder
        self._errors = errors
        self._dumps = tuple(dump_functions() if dumps is None else dumps)
        self._lock = threading.Lock()
        self._since_ns = time.time_ns()
        self._every_s = read_every_s
        self._last_read: float | None = None
        #: Per recorder: every entry up to this record id is settled (observed or skipped).
        self._settled: list[int] = [-1 for _ in self._dumps]
        #: Per recorder: ids above the mark already observed (retired before an older entry).
        self._seen: list[set[int]] = [set() for _ in self._dumps]
        self._untimed_reads = 0
        #: False once timing proved off (or no recorder): nothing more is read.
        self.active = bool(self._dumps)
        #: Durations observed so far.
        self.observed = 0

    @property
    def settled(self) -> tuple[int, ...]:
        """Return, per recorder, the record id up to which its entries have been read."""
        return tuple(self._settled)

    def drain(self) -> int:
        """Observe the durations retired since the last read; return how many (never raises)."""
        now = time.monotonic()
        if not self.active or (
            self._last_read is not None and now - self._last_read < self._every_s
        ):
            return 0
        if not self._lock.acquire(blocking=False):
            return 0  # another scrape is reading now
        self._last_read = now
        try:
            found, timed = 0, 0
            for index, dump in enumerate(self._dumps):
                try:
                    entries = read_trace(dump).get("entries") or []
                    retired, observed = self._read(index, entries)
                except Exception as exc:  # noqa: BLE001 - private API, its entries' shapes
                    self._errors.record("comm_timing", exc)
                    continue
                found, timed = found + retired, timed + observed
            self._give_up_if_untimed(found, timed)
            self.observed += timed
            return timed
        finally:
            self._lock.release()

    def _read(self, index: int, entries: list[dict[str, Any]]) -> tuple[int, int]:
        """Observe one recorder's new retired entries; return (retired seen, observed)."""
        mark, seen = self._settled[index], self._seen[index]
        retired = observed = 0
        oldest_open: int | None = None
        newest = mark
        for e in entries:
            rid = _record_id(e)
            if rid <= mark or rid in seen:
                continue
            newest = max(newest, rid)
            if e.get("is_p2p") or int(e.get("time_created_ns") or 0) < self._since_ns:
                seen.add(rid)  # not a collective, or one from before the exporter
                continue
            if not e.get("retired"):
                oldest_open = rid if oldest_open is None else min(oldest_open, rid)
                continue
            seen.add(rid)
            retired += 1
            ms = e.get("duration_ms")
            if ms is not None and self._observe(e, float(ms) / 1e3):
                observed += 1
        # Settled: everything below the oldest entry still in flight (all, if none is).
        self._settled[index] = newest if oldest_open is None else max(mark, oldest_open - 1)
        self._seen[index] = {rid for rid in seen if rid > self._settled[index]}
        return retired, observed

    def _observe(self, entry: dict[str, Any], seconds: float) -> bool:
        op = RECORDER_OPS.get(entry_op(entry))
        stats = self._recorder.find_collective(op, entry_group(entry)[1]) if op else None
        return stats is not None and self._recorder.collective_timed_on_device(stats, seconds)

    def _give_up_if_untimed(self, retired: int, timed: int) -> None:
        if timed:
            self._untimed_reads = 0
            return
        if not retired:
            return  # nothing retired: nothing learnt about timing
        self._untimed_reads += 1
        if self._untimed_reads >= READS_BEFORE_GIVING_UP and self.observed == 0:
            self.active = False
            log.info(
                "ddp-exporter: the Flight Recorder times no collective on this GPU, so the "
                "latencies of collectives outside DDP are not observed (counted untimed); set "
                "TORCH_NCCL_ENABLE_TIMING=1 before init_process_group to observe them"
            )
