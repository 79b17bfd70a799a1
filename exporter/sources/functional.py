"""Time the functional collectives (DTensor, tensor parallelism, ``clip_grad_norm_``) where the rank waits.

DTensor issues its communication as *functional* collectives, not through the
``torch.distributed`` functions :mod:`exporter.sources.collectives` wraps: a redistribution
(tensor parallelism's all-reduces and all-gathers, ``full_tensor()``, the total-norm reduction of
``clip_grad_norm_`` on FSDP2's DTensor parameters) calls
``torch.distributed._functional_collectives``, which calls the ops of
``torch.ops._c10d_functional`` (``all_reduce``, ``all_gather_into_tensor``,
``reduce_scatter_tensor``, ...). Such an op only launches the collective and returns its output;
the rank waits later, in ``wait_tensor`` (an ``AsyncCollectiveTensor`` calls it on first use). A
wait the exporter does not see is counted as compute: on the healthy ranks, the time they wait
for a straggler, which dilutes it.

:class:`FunctionalCollectiveTiming` replaces those ops on the ``torch.ops._c10d_functional``
namespace with thin callables (checked on torch 2.13: every Python caller looks them up there at
call time, the ``_functional_collectives`` functions, their autograd backward and DTensor alike;
``torch.compile`` traces through them unchanged). A launch is counted under its kind and its
process group, named as torch names it (the ``pg`` label of the ``torch.distributed`` wrappers);
its ``wait_tensor`` on the training thread is the step's comm_wait, and ends its latency (launch
to the wait's return). Its output is matched to its wait by storage, as torch's own work
registry does, so a wait on a view of the output counts too.

Not seen: a collective launched or waited for where no Python looks the ops up (a compiled
graph, which calls their overloads; C++ callers). A collective launched here whose wait is not
seen (never waited, or waited through an overload) is counted untimed. On a CUDA device
``wait_tensor`` only orders streams: launches and bytes are counted, latencies are not, and the
compute stream's wait is timed on the device (:mod:`exporter.sources.devicewaits`) where a
``device`` is given.
Cost: two thin calls per collective (``benchmarks/hotpath.py``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import torch

from .. import catalog
from ..errors import ErrorCounter
from ..log import log
from .devicewaits import DeviceWaits
from .flight import pg_timeout_seconds
from .patching import Patcher, payload_bytes
from .recorder import CollectiveStats, Recorder

__all__ = ["FUNCTIONAL_OPS", "FunctionalCollectiveTiming", "MAX_UNWAITED", "functional_namespace"]

#: Outputs remembered until their wait; beyond, the oldest is forgotten (counted untimed), so a
#: program that never waits holds no bookkeeping without bound.
MAX_UNWAITED = 1024

#: ``_c10d_functional`` op -> ``op`` label. Point-to-point ops are not here: peers differ per call.
FUNCTIONAL_OPS: dict[str, str] = {
    "all_reduce": "allreduce",
    "all_reduce_": "allreduce",
    "all_reduce_coalesced": "allreduce",
    "all_reduce_coalesced_": "allreduce",
    "all_gather_into_tensor": "allgather",
    "all_gather_into_tensor_out": "allgather",
    "all_gather_into_tensor_coalesced": "allgather",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_out": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "all_to_all_single": "alltoall",
    "broadcast": "broadcast",
    "broadcast_": "broadcast",
}
assert set(FUNCTIONAL_OPS.values()) <= set(catalog.COLLECTIVE_OPS)

_WAIT = "wait_tensor"


def functional_namespace() -> Any:
    """Return ``torch.ops._c10d_functional``, or None where this torch has none (private API)."""
    try:
        ns = torch.ops._c10d_functional
        ns.wait_tensor  # noqa: B018 - resolving it loads the op, or raises where there is none
    except (AttributeError, RuntimeError):
        return None
    return ns


def _never() -> bool:
    return False


#: Whether torch.compile is tracing the caller (then the graph, not this call, runs the op).
_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", _never)


def _group_at(packet: Any) -> int:
    """Return the position of the op's ``group_name`` argument, -1 if it has none."""
    try:
        names = [a.name for a in packet.default._schema.arguments]
    except (AttributeError, RuntimeError):
        return -1
    return names.index("group_name") if "group_name" in names else -1


def _key(t: Any) -> int:
    """Return what matches an output to its wait: its storage, as torch's work registry keys it."""
    try:
        return t.untyped_storage().data_ptr() or id(t)
    except (AttributeError, RuntimeError, TypeError):  # no storage (a tensor subclass)
        return id(t)


class _Op:
    """Stand in for one ``_c10d_functional`` op: call it through the timing, delegate the rest.

    Everything but the call (``.default``, ``.overloads()``, the schema) is the op's own, so code
    that compares or looks up its overloads sees torch's objects. A plain class with a
    ``__dict__``: torch.compile guards on the object's attributes.
    """

    def __init__(self, packet: Any) -> None:
        self._ddpx_packet = packet

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_ddpx_packet"], name)

    def __repr__(self) -> str:
        return repr(self._ddpx_packet)


def _stand_in(packet: Any, call: Any) -> _Op:
    """Return an :class:`_Op` for ``packet`` whose ``__call__`` is ``call(self, ...)`` itself.

    A method of a class of its own rather than a method calling ``call``: one Python frame less
    per collective, and a plain method, which torch.compile traces.
    """
    cls: type[_Op] = type(f"_Op_{call.__name__}", (_Op,), {"__call__": call, "__slots__": ()})
    return cls(packet)


class FunctionalCollectiveTiming(Patcher):
    """Time the ``_c10d_functional`` ops and their ``wait_tensor`` for one recorder.

    ``training_thread``: the thread whose waits are the step's comm_wait (default: the main thread).
    ``timed``: observe latencies and waits (False on CUDA, see the module docstring).
    ``namespace``: where the ops live (tests pass a stand-in); by default torch's.
    ``device``: what times the compute stream's waits where they are not timed on the host.
    """

    def __init__(
        self,
        recorder: Recorder,
        errors: ErrorCounter,
        *,
        training_thread: int | None = None,
        timed: bool = True,
        namespace: Any = None,
        device: DeviceWaits | None = None,
    ) -> None:
        super().__init__(
            recorder, errors, training_thread=training_thread, timed=timed, namespace=namespace
        )
        self._device = None if timed else device
        # (group name as the op got it, op label) -> stats; a group's timeout is looked up once.
        self._stats: dict[tuple[str, str], CollectiveStats] = {}
        # Outputs launched, not waited for yet: storage key -> [stats or None once done, t0].
        self._pending: OrderedDict[int, list[Any]] = OrderedDict()

    def instrument(self) -> bool:
        """Put the stand-ins in place (idempotent); return whether the waits are timed.

        Where this torch has no functional collectives (or no ``wait_tensor``), nothing is
        replaced and one line is logged: there are none to see. Where replacing them fails (a
        private API changed), what was replaced is restored, the error counted
        (``comm_timing``) and logged once: DTensor's collectives then go untimed.
        """
        if self._patched:
            return True
        ns = self._ns if self._ns is not None else functional_namespace()
        if ns is None or not callable(getattr(ns, _WAIT, None)):
            log.info(
                "ddp-exporter: torch %s has no functional collectives to time (DTensor, "
                "tensor parallelism)",
                torch.__version__,
            )
            return False
        self._ns = ns
        try:
            self._replace_all()
        except Exception as exc:  # noqa: BLE001 - a private API: never in the way of training
            self.uninstrument()
            self._errors.record("comm_timing", exc)
            return False
        return True

    def _replace_all(self) -> None:
        """Replace the wait, then every launch op this torch has (with a group argument)."""
        ns = self._ns
        wait = getattr(ns, _WAIT)
        self._replace(_WAIT, wait, _stand_in(wait, self._wrap_wait(wait)))
        for name, op in FUNCTIONAL_OPS.items():
            try:
                packet = getattr(ns, name)
            except (AttributeError, RuntimeError):
                continue  # an older torch without this op
            at = _group_at(packet)
            if at < 0:
                continue  # another signature: left alone
            self._replace(name, packet, _stand_in(packet, self._wrap_launch(packet, name, op, at)))

    def uninstrument(self) -> None:
        """Restore every op that still holds this instance's stand-in; idempotent."""
        self._restore()

    # -- bookkeeping ----------------------------------------------------------------------------
    def _stats_for(self, group_name: Any, op: str) -> CollectiveStats:
        name = str(group_name)
        stats = self._stats.get((group_name, op))
        if stats is None:
            with self._lock:
                timeout = None
                try:  # private: the group object by its name, for its timeout
                    pg = torch.distributed.distributed_c10d._resolve_process_group(name)
                    timeout = pg_timeout_seconds(pg)
                except Exception:  # noqa: BLE001 - unknown timeout, still counted
                    pass
                stats = self._rec.collective_stats(op, name, timeout)
                self._stats[(group_name, op)] = stats
        return stats

    def _remember(self, out: Any, stats: CollectiveStats, t0: float) -> None:
        """Remember a launch's output(s) until a wait on one of them (bounded)."""
        entry = [stats, t0]
        pending = self._pending
        for t in out if isinstance(out, (list, tuple)) else (out,):
            key = _key(t)
            old = pending.pop(key, None)
            pending[key] = entry
            if old is not None and old[0] is not None:
                # Its storage was freed and reused: that collective was never waited for here.
                self._forget(old)
        if len(pending) > MAX_UNWAITED:
            self._forget(pending.popitem(last=False)[1])

    def _forget(self, entry: list[Any]) -> None:
        stats, t0 = entry
        if stats is not None:
            entry[0] = None
            self._rec.collective_finished(stats, t0, timed=False)

    # -- stand-ins --------------------------------------------------------------------------------
    def _wrap_launch(self, packet: Any, name: str, op: str, at: int) -> Any:
        errors, remember, issue = self._errors, self._remember, self._issue
        stats_of, launched = self._stats, self._rec.collective_launched

        def launch(_self: Any, *args: Any, **kwargs: Any) -> Any:
            if _is_compiling():  # traced into a graph: the graph's ops, not this call
                return packet(*args, **kwargs)
            try:
                group = args[at] if at < len(args) else kwargs["group_name"]
                stats = stats_of.get((group, op)) or self._stats_for(group, op)
                payload = args[0]
                nbytes = (
                    payload.nbytes if isinstance(payload, torch.Tensor) else payload_bytes(payload)
                )
                t0 = launched(stats, nbytes)
            except Exception as exc:  # noqa: BLE001 - never in the way of the collective
                errors.record("comm_timing", exc)
                return packet(*args, **kwargs)
            return issue(packet, args, kwargs, stats, t0, remember)

        launch.__name__ = name
        return launch

    def _wrap_wait(self, wait: Any) -> Any:
        rec, errors, training, timed = self._rec, self._errors, self._thread, self._timed
        pending, clock, device = self._pending, rec.clock, self._device

        def wait_tensor(_self: Any, *args: Any, **kwargs: Any) -> Any:
            if _is_compiling():
                return wait(*args, **kwargs)
            t0 = clock()
            mark = device.begin() if device is not None else None
            try:
                return wait(*args, **kwargs)
            finally:
                if mark is not None and device is not None:
                    device.end(mark)
                try:
                    waited = clock() - t0
                    entry = pending.pop(_key(args[0]), None) if args else None
                    stats = entry[0] if entry is not None else None
                    launched = 0.0
                    if entry is not None and stats is not None:
                        entry[0] = None  # done: the other outputs of a coalesced launch too
                        launched = entry[1]
                    blocked = waited if timed and threading.get_ident() == training else 0.0
                    rec.collective_waited(stats, launched, timed, blocked)
                except Exception as exc:  # noqa: BLE001
                    errors.record("comm_timing", exc)

        wait_tensor.__name__ = _WAIT
        return wait_tensor
