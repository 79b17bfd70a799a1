"""Time the ``torch.distributed`` collectives of a job that has no DDP (FSDP2, FSDP, a plain loop).

DDP's gradient communication is timed by DDP's reducer or a comm hook
(:mod:`exporter.sources.reducer`, :mod:`exporter.sources.commhook`); FSDP2, classic FSDP and a
hand-written loop call ``torch.distributed`` directly (FSDP2: ``all_gather_single`` with
``async_op=True`` and a later ``Work.wait()``; on gloo its gradient reduction is an
``all_reduce``). The Flight Recorder sees those collectives but, on gloo, records neither when
they started nor when they finished (checked on torch 2.13: ``state`` stays ``scheduled``), and
NCCL's completion hook refuses gloo. So :class:`CollectiveTiming` wraps, OpenTelemetry style,
the public collectives of the ``torch.distributed`` namespace (the name every caller looks up;
``distributed_c10d``'s own globals stay untouched, so one collective calling another is counted
once), ``Work.wait``, and the coalescing manager, whose one coalesced collective no function
of the namespace issues (:mod:`exporter.sources.coalesced`):

* latency: call to completion as its caller sees it: a synchronous call's return, an
  asynchronous one's ``Work.wait()`` return (an upper bound when the collective had finished
  before the wait; a future callback would be exact but costs ~65 µs of thread handoff per
  collective on gloo, ``benchmarks/hotpath.py``);
* bytes: the payload this rank sends (the input tensor);
* comm_wait: the time the *training thread* spends inside ``Work.wait()`` (torch's synchronous
  collectives wait with it too; where it cannot be wrapped, inside the synchronous call):
  communication it had to wait for (a straggler's peers wait there; the
  straggler itself does not, so blame by compute stays right);
* in-flight bookkeeping for the fallback when no Flight Recorder is usable.

An asynchronous collective consumed through ``Work.get_future()`` (a DDP comm hook's, a
``then()`` chain) is never waited for on the training thread: it is counted complete, untimed
(``ddp_collective_untimed_total``), when its future is taken, and not held until then.

On a CUDA device the latency is not observed (an NCCL future completes when the collective is
enqueued, and ``Work.wait`` only orders streams): bytes, counts and in-flight state are. There
the wait of the device's default stream inside ``Work.wait()``, on the training thread or in a
backward pass, is timed on the device where a :class:`~exporter.sources.devicewaits.DeviceWaits`
is given: the compute stream of a plain loop waiting for its collectives (a wait on a stream of
FSDP's own, or on a checkpoint's thread, is not the compute's). So is a synchronous collective
on the default stream as a whole: NCCL runs it on the caller's stream and returns no Work, so
no ``Work.wait()`` is called (a wait inside it, where a backend does return one, is its part).
Cost: about 10 µs per collective on the calling thread (``benchmarks/hotpath.py``).
:meth:`CollectiveTiming.uninstrument` restores exactly the objects it replaced, unless someone
replaced them again since (then it leaves theirs and forgets its own).
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from .. import catalog
from ..errors import ErrorCounter
from .coalesced import QUEUED, CoalescingManagers, manager_owners, queued
from .devicewaits import DeviceWaits
from .flight import pg_timeout_seconds
from .patching import Patcher, call_arg, patch_method, payload_bytes, restore_method
from .recorder import CollectiveStats, Recorder

__all__ = [
    "COLLECTIVES",
    "CollectiveSpec",
    "CollectiveTiming",
    "MAX_UNWAITED",
    "specs",
]

#: Asynchronous collectives remembered until their ``wait()``; beyond, the oldest is forgotten
#: (counted complete, untimed), so that a program that never waits holds no tensors alive.
MAX_UNWAITED = 256

#: torch.distributed function -> (``op`` label, the argument carrying the payload this rank
#: sends, None: none). Point-to-point calls are not here: their peers differ per call.
COLLECTIVES: dict[str, tuple[str, str | None]] = {
    "all_reduce": ("allreduce", "tensor"),
    "all_gather": ("allgather", "tensor"),
    "all_gather_into_tensor": ("allgather", "input_tensor"),
    "all_gather_single": ("allgather", "input_tensor"),
    "reduce_scatter": ("reduce_scatter", "input_list"),
    "reduce_scatter_tensor": ("reduce_scatter", "input"),
    "reduce_scatter_single": ("reduce_scatter", "input"),
    "broadcast": ("broadcast", "tensor"),
    "reduce": ("reduce", "tensor"),
    "all_to_all": ("alltoall", "input_tensor_list"),
    "all_to_all_single": ("alltoall", "input"),
    "barrier": ("barrier", None),
}
assert {op for op, _ in COLLECTIVES.values()} <= set(catalog.COLLECTIVE_OPS)


class CollectiveSpec:
    """Where one function's payload, group and ``async_op`` arguments sit, read once from its
    signature."""

    __slots__ = ("op", "payload", "payload_at", "group_at", "async_at", "may_queue")

    def __init__(self, fn: Callable[..., Any], op: str, payload: str | None) -> None:
        names = list(inspect.signature(fn).parameters)
        self.op = op
        self.payload = payload
        self.payload_at = names.index(payload) if payload in names else -1
        self.group_at = names.index("group") if "group" in names else -1
        self.async_at = names.index("async_op") if "async_op" in names else -1
        #: Whether torch queues this collective inside a coalescing manager on its group.
        self.may_queue = getattr(fn, "__name__", "") in QUEUED

    #: The argument ``name`` (at position ``at``) of a call, None where not given.
    arg = staticmethod(call_arg)

    def queued(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Say whether a call only queues its op in a coalescing manager (nothing issued yet)."""
        return self.may_queue and queued(self.arg(args, kwargs, "group", self.group_at))

    def synchronous(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Say whether a call waits for its collective (``async_op`` not set)."""
        return not self.arg(args, kwargs, "async_op", self.async_at)


def specs(namespace: Any) -> dict[str, tuple[Callable[..., Any], CollectiveSpec]]:
    """Return each collective of :data:`COLLECTIVES` in ``namespace``, with its spec.

    A function this torch lacks, or whose signature cannot be read, is left out.
    """
    found = {}
    for name, (op, payload) in COLLECTIVES.items():
        fn = getattr(namespace, name, None)
        if not callable(fn):
            continue  # an older torch without this collective
        try:
            found[name] = (fn, CollectiveSpec(fn, op, payload))
        except (TypeError, ValueError):
            continue  # no signature to read: leave it alone
    return found


class CollectiveTiming(Patcher):
    """Wrap the ``torch.distributed`` collectives and ``Work.wait`` for one recorder.

    ``training_thread``: the thread whose waits are the step's comm_wait (default: the main thread).
    ``timed``: observe latencies (False on CUDA, see the module docstring).
    ``device``: where ``timed`` is False, what times the default stream's waits on the device.
    """

    def __init__(
        self,
        recorder: Recorder,
        errors: ErrorCounter,
        *,
        training_thread: int | None = None,
        timed: bool = True,
        namespace: Any = dist,
        work_class: Any = None,
        device: DeviceWaits | None = None,
    ) -> None:
        super().__init__(
            recorder, errors, training_thread=training_thread, timed=timed, namespace=namespace
        )
        self._device = None if timed else device
        self._work = work_class if work_class is not None else getattr(dist, "Work", None)
        self._wait: tuple[Any, Any] | None = None
        self._future: tuple[Any, Any] | None = None
        # Process group -> (op -> stats): a group's name is read once, not per call.
        self._stats: dict[Any, dict[str, CollectiveStats]] = {}
        # Asynchronous collectives not waited for yet: id(work) -> (work, stats, call time).
        self._works: OrderedDict[int, tuple[Any, CollectiveStats, float]] = OrderedDict()
        ops = {name: op for name, (op, _) in COLLECTIVES.items()}
        self._managers = CoalescingManagers(
            recorder, errors, ops, self._stats_for, self._settle, self._device
        )

    def instrument(self) -> bool:
        """Put the wrappers in place (idempotent); return whether any collective is wrapped."""
        if self._patched:
            return True
        for name, (fn, spec) in specs(self._ns).items():
            self._replace(name, fn, self._wrap(fn, spec))
        if self._patched:  # a wait has a Work; None: an immutable Work, waits go unseen
            self._wait = patch_method(self._work, "wait", self._wrap_wait)
        if self._wait is not None:  # so has a future; None: bounded by MAX_UNWAITED instead
            self._future = patch_method(self._work, "get_future", self._wrap_get_future)
        if self._patched:
            self._managers.instrument(manager_owners(self._ns))
        return bool(self._patched)

    def uninstrument(self) -> None:
        """Restore every replaced object that still holds this instance's wrapper; idempotent."""
        self._restore()
        self._managers.uninstrument()
        restore_method(self._work, "wait", self._wait)
        restore_method(self._work, "get_future", self._future)
        self._wait = self._future = None

    # -- wrappers ------------------------------------------------------------------------------
    def _stats_for(self, group: Any, op: str) -> CollectiveStats:
        if group is None:
            group = dist.distributed_c10d._get_default_group()
        per_op = self._stats.get(group)
        if per_op is None or op not in per_op:
            with self._lock:
                name = str(getattr(group, "group_name", "") or "0")
                stats = self._rec.collective_stats(op, name, pg_timeout_seconds(group))
                self._stats.setdefault(group, {})[op] = stats
            per_op = self._stats[group]
        return per_op[op]

    def _wrap(self, fn: Callable[..., Any], spec: CollectiveSpec) -> Callable[..., Any]:
        rec, errors, issue, settle = self._rec, self._errors, self._issue, self._settle
        device = self._device

        @functools.wraps(fn)
        def collective(*args: Any, **kwargs: Any) -> Any:
            if spec.queued(args, kwargs):  # only queued: nothing to time, nothing in flight
                return fn(*args, **kwargs)
            try:
                group = spec.arg(args, kwargs, "group", spec.group_at)
                stats = self._stats_for(group, spec.op)
                nbytes = payload_bytes(spec.arg(args, kwargs, spec.payload, spec.payload_at))
                t0 = rec.collective_launched(stats, nbytes)
            except Exception as exc:  # noqa: BLE001 - never in the way of the collective
                errors.record("comm_timing", exc)
                return fn(*args, **kwargs)
            if device is not None and spec.synchronous(args, kwargs):
                return device.marked_call(issue, fn, args, kwargs, stats, t0, settle)
            return issue(fn, args, kwargs, stats, t0, settle)

        return collective

    def _settle(self, work: Any, stats: CollectiveStats, t0: float) -> None:
        """Record what a collective returned: done (synchronous), untimed, or to wait for."""
        rec = self._rec
        if work is None:  # synchronous: completed on return
            rec.collective_finished(stats, t0, self._timed)
            # torch waits for a synchronous collective with Work.wait(), which is timed
            # already where it could be wrapped.
            if self._timed and self._wait is None and threading.get_ident() == self._thread:
                rec.comm_blocked(rec.clock() - t0)
        elif self._wait is None:  # waits unseen: nothing will say when it ends
            rec.collective_finished(stats, t0, timed=False)
        else:
            self._track(work, stats, t0)

    def _track(self, work: Any, stats: CollectiveStats, t0: float) -> None:
        """Remember an asynchronous collective until its ``wait()`` returns (bounded)."""
        works = self._works
        # The Work is kept with its id so that the id cannot be reused while it is remembered.
        works[id(work)] = (work, stats, t0)
        if len(works) > MAX_UNWAITED:  # never waited (against torch's contract): forget it
            _, (_, old_stats, old_t0) = works.popitem(last=False)
            self._rec.collective_finished(old_stats, old_t0, timed=False)

    def _wrap_wait(self, wait: Callable[..., Any]) -> Callable[..., Any]:
        rec, errors, training, timed = self._rec, self._errors, self._thread, self._timed
        works = self._works
        inner = self._device.marked(wait) if self._device is not None else wait

        @functools.wraps(wait)
        def timed_wait(work: Any, *args: Any, **kwargs: Any) -> Any:
            t0 = rec.clock()
            try:
                return inner(work, *args, **kwargs)
            finally:
                try:
                    mine = works.pop(id(work), None)
                    if mine is not None and mine[0] is work:
                        rec.collective_finished(mine[1], mine[2], timed)
                    if timed and threading.get_ident() == training:
                        rec.comm_blocked(rec.clock() - t0)
                except Exception as exc:  # noqa: BLE001
                    errors.record("comm_timing", exc)

        return timed_wait

    def _wrap_get_future(self, get_future: Callable[..., Any]) -> Callable[..., Any]:
        rec, errors, works = self._rec, self._errors, self._works

        @functools.wraps(get_future)
        def untimed_future(work: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                mine = works.pop(id(work), None)
                if mine is not None and mine[0] is work:
                    # Its completion is a callback's business, off the training thread.
                    rec.collective_finished(mine[1], mine[2], timed=False)
            except Exception as exc:  # noqa: BLE001
                errors.record("comm_timing", exc)
            return get_future(work, *args, **kwargs)

        return untimed_future
