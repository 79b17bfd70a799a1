"""Name the backend that runs each process group, and find the Flight Recorder that records it.

torch's ``"nccl"`` can build two implementations. The legacy ``ProcessGroupNCCL`` feeds NCCL's
own Flight Recorder (``_dump_nccl_trace``). ``nccl2``, torchcomms ported into torch, keeps a
recorder per backend through a ``FlightRecorderHook``, read with
``_dump_fr_trace_json(backend="nccl2")``: neither ``_dump_nccl_trace`` nor the generic
``_dump_fr_trace`` (gloo's) holds its entries. ``TORCH_DIST_USE_NCCL2`` decides what
``"nccl"`` builds, and ``dist.get_backend()`` answers ``"nccl"`` either way, so the backend is
named by the implementation's own ``name()``.

Every name here comes from private torch APIs: feature-detected, and where torch hides one the
answer is the registered name (:func:`backend_name`) or nothing (the other functions).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "NATIVE_RECORDERS",
    "BackendRecorder",
    "backend_name",
    "backend_recorders",
    "group_backends",
    "unrecorded_groups",
]

#: Backends whose collectives the pickled dumps hold: NCCL's recorder (the legacy
#: ProcessGroupNCCL) and the generic one (gloo). Any other backend records, if at all, in a
#: recorder of its own (:class:`BackendRecorder`).
NATIVE_RECORDERS = frozenset({"gloo", "nccl"})


def _implementation(pg: Any, device: str) -> str:
    """Return the name of the implementation behind ``pg`` on ``device``, ``""`` if hidden."""
    try:
        return str(pg._get_backend(torch.device(device)).name() or "")
    except Exception:  # noqa: BLE001 - private API: hidden means unknown
        return ""


def _devices(pg: Any) -> list[str]:
    try:
        return [torch.device(d).type for d in getattr(pg, "_device_types", [])]
    except Exception:  # noqa: BLE001 - private API
        return []


def backend_name(pg: Any = None, device: torch.device | None = None) -> str:
    """Return the backend running ``pg``'s collectives on ``device`` (``nccl2``, ``nccl``, ``gloo``).

    ``pg``: the default group when None; ``device``: the group's first device when None or not
    one of the group's. ``"none"`` before ``init_process_group``; the registered name
    (``dist.get_backend``) where torch hides the implementation.
    """
    try:
        if not dist.is_initialized():
            return "none"
        group = pg if pg is not None else dist.distributed_c10d._get_default_group()
        registered = str(dist.get_backend(group))
    except Exception:  # noqa: BLE001 - a group torch no longer knows
        return "none"
    devices = _devices(group)
    if device is not None and device.type in devices:
        return _implementation(group, device.type) or registered
    return (_implementation(group, devices[0]) if devices else "") or registered


def group_backends(groups: dict[Any, str] | None = None) -> dict[str, tuple[str, ...]]:
    """Return each process group's name and the backends that run it, one per device type.

    ``groups``: ``{ProcessGroup: name}``, by default every group torch knows (private; ``{}``
    where hidden).
    """
    if groups is None:
        try:
            groups = dict(dist.distributed_c10d._world.pg_names)
        except Exception:  # noqa: BLE001 - private API
            return {}
    out: dict[str, tuple[str, ...]] = {}
    for pg, name in groups.items():
        names = {_implementation(pg, d) for d in _devices(pg)} - {""}
        out[str(name)] = tuple(sorted(names))
    return out


class BackendRecorder:
    """Read the Flight Recorder of one backend that records through torch's hook (``nccl2``).

    Called like the pickled dump functions (``includeCollectives``, ``includeStackTraces``,
    ``onlyActive``) and returns the dump as a dict; the JSON dump has no stack-trace switch.
    """

    def __init__(self, backend: str, dump_json: Callable[..., Any]) -> None:
        """Read ``backend``'s recorder through ``dump_json`` (torch's ``_dump_fr_trace_json``)."""
        self.backend = backend
        self._dump_json = dump_json

    def __repr__(self) -> str:
        return f"BackendRecorder({self.backend!r})"

    def __call__(
        self,
        includeCollectives: bool = True,  # noqa: N803 - torch's names for the dump's switches
        includeStackTraces: bool = True,  # noqa: N803, ARG002
        onlyActive: bool = False,  # noqa: N803
    ) -> dict[str, Any]:
        """Return the recorder's dump (``pg_status``, ``entries``, ...); may raise."""
        raw = self._dump_json(
            includeCollectives=includeCollectives, onlyActive=onlyActive, backend=self.backend
        )
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise TypeError(f"{self.backend} Flight Recorder dump is {type(data).__name__}")
        return data


def backend_recorders(
    backends: Iterable[str], dump_json: Callable[..., Any] | None = None
) -> tuple[BackendRecorder, ...]:
    """Return a reader for each of ``backends`` whose own recorder this torch can dump.

    ``dump_json``: torch's ``_dump_fr_trace_json`` by default. A torch whose function takes no
    ``backend`` (before nccl2), or refuses one, gets none for it.
    """
    if dump_json is None:
        c10d = getattr(torch._C, "_distributed_c10d", None)
        dump_json = getattr(c10d, "_dump_fr_trace_json", None)
    if not callable(dump_json):
        return ()
    found = []
    for backend in sorted(set(backends) - NATIVE_RECORDERS):
        recorder = BackendRecorder(backend, dump_json)
        try:
            recorder(includeCollectives=False, onlyActive=True)
        except Exception:  # noqa: BLE001 - TypeError: no backend argument; else not recorded
            continue
        found.append(recorder)
    return tuple(found)


def unrecorded_groups(
    backends: dict[str, tuple[str, ...]], recorded: Iterable[str], seen: Iterable[str] = ()
) -> dict[str, str]:
    """Return ``{group: backend}`` for the groups run by a backend no recorder read here holds.

    ``backends``: :func:`group_backends`'s answer; ``recorded``: the backends with a reader
    (:func:`backend_recorders`), besides :data:`NATIVE_RECORDERS`; ``seen``: groups found in a
    recorder's entries whatever their backend (torch 2.14's hook, attached by hand, records
    into the generic recorder).
    """
    known, seen = NATIVE_RECORDERS | set(recorded), set(seen)
    out = {}
    for group, names in backends.items():
        missing = [n for n in names if n not in known]
        if missing and group not in seen:
            out[group] = ",".join(missing)
    return out
