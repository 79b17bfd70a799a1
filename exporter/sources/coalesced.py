"""Count the one collective torch's coalescing manager issues at its exit (DeepSpeed's ZeRO).

Inside ``_coalescing_manager`` (private: DeepSpeed's ZeRO gathers and reduces its partitions
through it) each collective call only queues its op and returns (:func:`coalescing`). At its
exit the manager issues one coalesced collective through a process-group method
(``allreduce_coalesced``, ``all_gather_single_coalesced``, ``reduce_scatter_single_coalesced``),
which no ``torch.distributed`` wrapper sees, and, unless ``async_ops``, waits for its Work. So
:class:`CoalescingManagers` wraps the manager where its callers look it up: the
``torch.distributed`` namespace and ``distributed_c10d``, where DeepSpeed calls it at each use
(``from torch.distributed import _coalescing_manager`` binds it at import: a module that did so
before ``instrument()``, as Megatron-core's DDP does, keeps the original). At the exit the
queued ops give the collective's op and bytes; it is counted like any other: a synchronous one
done when the manager returns, an asynchronous one at the ``wait()`` of its Work (the manager's
``cm.wait()`` waits for each). A manager with nothing queued (c10d's own ``batch_isend_irecv``
coalesces point-to-point calls through it), with a queue torch refuses (mixed kinds), or left
by an exception is passed through untouched.

Only :data:`QUEUED` collectives on the manager's own group are queued (:func:`queued`): any other
collective called inside one (a broadcast, a barrier, another group's, another thread's) is
issued at once, and counted as usual.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from ..errors import ErrorCounter
from .devicewaits import DeviceWaits
from .patching import MethodPatches, call_arg, payload_bytes
from .recorder import CollectiveStats, Recorder

__all__ = ["MANAGER", "QUEUED", "CoalescingManagers", "manager_owners", "queued"]

#: The private name of torch's coalescing manager.
MANAGER = "_coalescing_manager"

#: torch's process-group module, None where torch is built without distributed support.
_C10D: Any = getattr(dist, "distributed_c10d", None)

#: The process groups' registry, where the coalescing manager keeps its queue (private).
_WORLD = getattr(_C10D, "_world", None)


#: The ``torch.distributed`` collectives that torch queues while a coalescing manager is open on
#: their group (its "fast path"; older releases name two of them ``*_into_tensor``/``*_tensor``).
QUEUED = frozenset(
    {
        "all_reduce",
        "all_gather_single",
        "all_gather_into_tensor",
        "reduce_scatter_single",
        "reduce_scatter_tensor",
    }
)


def _queue(group: Any) -> list[Any] | None:
    """Return the ops queued for ``group`` (None: the default group), None where no coalescing
    manager is open on it."""
    state = getattr(_WORLD, "pg_coalesce_state", None)
    if not state:
        return None
    ops: list[Any] | None = state.get(group if group is not None else _C10D._get_default_group())
    return ops


def queued(group: Any) -> bool:
    """Return whether a :data:`QUEUED` collective on ``group`` (None: the default group) called
    now only queues its op, as torch decides: a coalescing manager is open on that group.

    The call then returns at once (a synchronous one too): the manager issues one coalesced
    collective at its exit and waits for its Work there. Torch keeps the queue of a manager left
    by an exception, and queues into it from then on, as this says.
    """
    try:
        return _queue(group) is not None
    except Exception:  # noqa: BLE001 - no default group: nothing is queued
        return False


def manager_owners(namespace: Any) -> list[Any]:
    """Return where callers look the manager up: ``namespace``, and c10d's module beside
    ``torch.distributed``."""
    return [namespace, _C10D] if namespace is dist and _C10D is not None else [namespace]


#: (process-group stats, call time) of a coalesced collective issued at a manager's exit.
Launched = tuple[CollectiveStats, float]


class CoalescingManagers:
    """Wrap the coalescing manager so that its coalesced collective is counted; undo it.

    ``ops``: name of a queued op's function -> the ``op`` label (``all_reduce``: allreduce).
    ``stats_for(group, op)``: the statistics of one group's op. ``settle(work, stats, t0)``:
    what records the collective issued at ``t0`` once the manager returns its Work (None:
    already waited for). ``device``: on a GPU, what marks the compute stream around a
    synchronous manager's exit (NCCL may run the coalesced collective on the caller's stream
    and return no Work to wait for, as for any synchronous collective).
    """

    def __init__(
        self,
        recorder: Recorder,
        errors: ErrorCounter,
        ops: dict[str, str],
        stats_for: Callable[[Any, str], CollectiveStats],
        settle: Callable[[Any, CollectiveStats, float], None],
        device: DeviceWaits | None = None,
    ) -> None:
        self._rec, self._errors, self._ops = recorder, errors, ops
        self._stats_for, self._settle = stats_for, settle
        self.device = device
        self._patches = MethodPatches()

    def instrument(self, owners: list[Any]) -> None:
        """Wrap the manager in each of ``owners`` that has one (idempotent)."""
        if not self._patches:
            self._patches.apply([(owner, MANAGER, self._wrap) for owner in owners])

    def uninstrument(self) -> None:
        """Restore each manager that still holds this instance's wrapper; idempotent."""
        self._patches.restore()

    def _wrap(self, manager: Callable[..., Any]) -> Callable[..., Any]:
        try:
            names = list(inspect.signature(manager).parameters)
        except (TypeError, ValueError):  # no signature to read: leave it alone
            return manager
        group_at = names.index("group") if "group" in names else -1
        async_at = names.index("async_ops") if "async_ops" in names else -1

        @functools.wraps(manager)
        def coalescing_manager(*args: Any, **kwargs: Any) -> Any:
            group = call_arg(args, kwargs, "group", group_at)
            async_ops = bool(call_arg(args, kwargs, "async_ops", async_at))
            return _Managed(self, manager(*args, **kwargs), group, async_ops)

        return coalescing_manager

    def launched(self, group: Any) -> Launched | None:
        """Record the coalesced collective about to be issued for ``group``'s queue, if any."""
        try:
            ops = _queue(group)
            if not ops or any(q.op is not ops[0].op for q in ops):
                return None  # nothing to issue, or a queue torch refuses (mixed kinds)
            op = self._ops.get(getattr(ops[0].op, "__name__", ""))
            if op is None:
                return None
            nbytes = sum(payload_bytes(getattr(q, "tensor", None)) for q in ops)
            stats = self._stats_for(group, op)
            return stats, self._rec.collective_launched(stats, nbytes)
        except Exception as exc:  # noqa: BLE001 - never in the way of the collective
            self._errors.record("comm_timing", exc)
            return None

    def returned(self, launched: Launched, cm: Any, async_ops: bool) -> None:
        """Record what the manager's exit left: the Work to wait for, or a completed collective."""
        stats, t0 = launched
        try:
            works = getattr(cm, "works", None) if async_ops else None
            self._settle(works[-1] if works else None, stats, t0)
        except Exception as exc:  # noqa: BLE001
            self._rec.collective_finished(stats, t0, timed=False)
            self._errors.record("comm_timing", exc)

    def failed(self, launched: Launched) -> None:
        """End a coalesced collective whose issue raised: untimed, never left in flight."""
        self._rec.collective_finished(launched[0], launched[1], timed=False)


class _Managed:
    """One use of the manager: delegates to torch's, counts the collective at its exit."""

    __slots__ = ("_owner", "_inner", "_group", "_async", "_cm")

    def __init__(self, owner: CoalescingManagers, inner: Any, group: Any, async_ops: bool):
        self._owner, self._inner, self._group, self._async = owner, inner, group, async_ops
        self._cm: Any = None

    def __enter__(self) -> Any:
        self._cm = self._inner.__enter__()
        return self._cm

    def __exit__(self, typ: Any, value: Any, tb: Any) -> Any:
        if typ is not None:  # torch issues nothing: its error goes on as it would
            return self._inner.__exit__(typ, value, tb)
        launched = self._owner.launched(self._group)
        device = self._owner.device
        try:
            if device is not None and not self._async:
                out = device.marked_call(self._inner.__exit__, None, None, None)
            else:
                out = self._inner.__exit__(None, None, None)
        except BaseException:
            if launched is not None:
                self._owner.failed(launched)
            raise
        if launched is not None:
            self._owner.returned(launched, self._cm, self._async)
        return out
