"""Time DDP's gradient communication with DDP's own reducer timers, leaving its allreduce alone.

DDP's reducer records, per iteration, when backward compute ends and when its bucket
communication starts and ends, for the iterations its runtime-logging sample rate selects
(private API: ``DistributedDataParallel._set_ddp_runtime_logging_sample_rate``). Its logger
turns them into durations and timestamps (``Logger.set_runtime_stats_and_log``), which DDP
itself does only at the start of the *next* forward: read then, a step's communication would
land in the step after it, and a long wait (the others waiting out rank 0's checkpoint) would be
booked as compute of the step it belongs to. So as a step closes (its backward finished) this
source has the logger convert the iteration just finished, then reads it back with
``_get_ddp_logging_data()`` (both under the reducer's lock; 12 µs with 48 parameter tensors, see
``benchmarks/hotpath.py``). DDP's own call at the next forward converts the same events again,
so its logging data is unchanged (its running averages count each iteration twice, which leaves
them the same). Per iteration this gives what the step split and the latency histogram need:

* communication time: first bucket's launch to the last bucket's completion;
* exposed communication: the part of it after backward compute ended (DDP waited for it), the
  same quantity the timing hook measures from the last bucket's launch;
* bytes: the sizes of DDP's buckets, every one of which is reduced each synchronising iteration.

CPU only. On CUDA the reducer's timer synchronises the host with each recorded event when the
logger converts them (``CudaTimer::measureDifference`` calls ``cudaEventSynchronize``); with the
sample rate at 1 that would be one added host-device synchronisation per iteration, so CUDA
models are timed by marks of their own (CUDA events resolved off the training thread:
:mod:`exporter.sources.ddpevents`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ErrorCounter
from ..log import log

__all__ = [
    "ReducerReading",
    "ReducerTiming",
    "TORCH_DEFAULT_SAMPLE_RATE",
    "unsupported",
]

#: DDP's own runtime-logging sample rate (``kDDPRuntimeLoggingSampleRate``), restored on close:
#: torch has no getter for the rate in force.
TORCH_DEFAULT_SAMPLE_RATE = 100

_NS = 1e-9


@dataclass(frozen=True)
class ReducerReading:
    """One finished iteration as DDP's reducer timed it."""

    #: First bucket launched to last bucket completed, seconds.
    comm_s: float
    #: Communication after backward compute ended (not overlapped), seconds.
    exposed_s: float
    #: Bytes of gradient buckets reduced.
    nbytes: int


def unsupported(model: Any) -> str | None:
    """Return why ``model``'s reducer cannot time communication here, None when it can."""
    for name in ("_set_ddp_runtime_logging_sample_rate", "_get_ddp_logging_data"):
        if not callable(getattr(model, name, None)):
            return f"this torch's DistributedDataParallel has no {name}()"
    if not callable(getattr(getattr(model, "logger", None), "set_runtime_stats_and_log", None)):
        return "this torch's DistributedDataParallel has no logger.set_runtime_stats_and_log()"
    params = next(iter(model.parameters()), None)
    if params is None:
        return "the model has no parameters"
    if params.device.type != "cpu":
        return (
            f"parameters on {params.device.type}: DDP's timer would synchronise the host each "
            "iteration"
        )
    return None


class ReducerTiming:
    """Read DDP's reducer timers once per step; give up for good on the first error."""

    name = "reducer"

    def __init__(self, model: Any, errors: ErrorCounter) -> None:
        self._model = model
        self._errors = errors
        self._iteration = 0
        self._last_end = 0
        self._sizes: tuple[str, int] = ("", 0)
        self._on = False
        self._rate_set = False

    def instrument(self) -> bool:
        """Have DDP time every iteration; return True (the reducer times any hook)."""
        self._model._set_ddp_runtime_logging_sample_rate(1)
        self._on = self._rate_set = True
        return True

    def read(self) -> ReducerReading | None:
        """Return the iteration DDP timed since the last read, None when there is none new."""
        if not self._on:
            return None
        try:
            return self._read()
        except Exception as exc:  # noqa: BLE001 - a private API: stop reading, keep training
            self._on = False
            self._errors.record("comm_timing", exc)
            log.warning("ddp-exporter: DDP's reducer timers unreadable (%r): comm time lost", exc)
            return None

    def _read(self) -> ReducerReading | None:
        self._model.logger.set_runtime_stats_and_log()  # the iteration that just finished
        data = self._model._get_ddp_logging_data()
        iteration = int(data.get("iteration", 0))
        if iteration <= self._iteration:
            return None  # no synchronising iteration since the last read
        self._iteration = iteration
        end = int(data.get("backward_comm_time_end", 0) or 0)
        start = int(data.get("backward_comm_time_start", 0) or 0)
        if not (end and start) or end == self._last_end:
            # No communication in that iteration: a forward with grad enabled but no backward
            # (an evaluation without no_grad) leaves DDP's timer holding the previous one's.
            return None
        self._last_end = end
        compute_end = int(data.get("backward_compute_time_end", 0) or 0)
        exposed = end - max(start, compute_end)
        return ReducerReading(
            comm_s=max(end - start, 0) * _NS,
            exposed_s=max(exposed, 0) * _NS,
            nbytes=self._bucket_bytes(data),
        )

    def _bucket_bytes(self, data: dict[str, Any]) -> int:
        # "525312, 526336": rebuilt after the first iteration, fixed from then on.
        text = str(data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes") or "")
        if text != self._sizes[0]:
            total = sum(int(part) for part in text.split(",") if part.strip())
            self._sizes = (text, total)
        return self._sizes[1]

    def uninstrument(self) -> None:
        """Stop reading and give DDP back its own sample rate; idempotent."""
        self._on = False
        if not self._rate_set:
            return
        self._rate_set = False
        try:
            self._model._set_ddp_runtime_logging_sample_rate(TORCH_DEFAULT_SAMPLE_RATE)
        except Exception as exc:  # noqa: BLE001
            self._errors.record("comm_timing", exc)
