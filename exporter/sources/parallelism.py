"""Tell which kind of data parallelism a model uses, and refuse what cannot be watched.

``instrument()`` takes a DDP model, an FSDP2 model (``fully_shard`` on the root or on any
submodule), a classic ``FullyShardedDataParallel`` model, any other ``nn.Module`` of a
distributed job (tensor or pipeline parallel, a hand-written loop) or no model at all. The
kind decides how communication is timed (DDP's reducer or comm hook, else the
``torch.distributed`` collectives themselves: :mod:`exporter.sources.collectives`) and is
published as ``ddp_rank_info{parallelism}``; everything else (steps, memory, heartbeats, the
Flight Recorder's in-flight state, hangs) is the same for every kind.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from .. import catalog

__all__ = ["compute_device", "kind_of", "trained_model_kind"]


def _fsdp_classes() -> tuple[type, ...]:
    """Return the FSDP2 and classic FSDP module classes this torch has (feature-detected)."""
    found: list[type] = []
    try:
        from torch.distributed.fsdp import FSDPModule  # torch >= 2.6

        found.append(FSDPModule)
    except ImportError:
        try:  # torch 2.4-2.5
            from torch.distributed._composable.fsdp import FSDPModule

            found.append(FSDPModule)
        except ImportError:
            pass
    return tuple(found)


def _classic_fsdp() -> type | None:
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:  # a torch built without distributed
        return None
    fsdp: type = FullyShardedDataParallel  # a class; torch reads as untyped
    return fsdp


def kind_of(model: object) -> str:
    """Return ``model``'s parallelism, one of :data:`exporter.catalog.PARALLELISMS`.

    Raises TypeError, naming what was given and what is accepted, for anything else.
    """
    if model is None:
        return "none"
    if isinstance(model, DistributedDataParallel):
        return "ddp"
    if not isinstance(model, torch.nn.Module):
        raise TypeError(
            "exporter.instrument(model): expected a DistributedDataParallel, FSDP2 "
            "(fully_shard) or FullyShardedDataParallel model, another torch.nn.Module, or None "
            f"(no model: steps from the DataLoader, the optimizer or exporter.step()); got "
            f"{type(model).__module__}.{type(model).__qualname__}"
        )
    fsdp2, classic = _fsdp_classes(), _classic_fsdp()
    modules = list(model.modules())  # the root, or only some submodules, may be sharded
    if fsdp2 and any(isinstance(m, fsdp2) for m in modules):
        return "fsdp2"
    if classic is not None and any(isinstance(m, classic) for m in modules):
        return "fsdp"
    return "module"  # a DDP inside a module too: its reducer is not the exporter's to time


def _current_cuda() -> int | None:
    return torch.cuda.current_device() if torch.cuda.is_available() else None


def _default_backend() -> str:
    """Return the default process group's backend, "" without one."""
    if not (dist.is_available() and dist.is_initialized()):
        return ""
    try:
        return str(dist.get_backend())
    except (RuntimeError, ValueError):
        return ""


def compute_device(
    model: Any,
    current_cuda: Callable[[], int | None] = _current_cuda,
    backend: Callable[[], str] = _default_backend,
) -> torch.device:
    """Return the device ``model`` computes and communicates on.

    Its first parameter's device, but for a DTensor parameter kept on the CPU over a CUDA mesh
    (FSDP2's ``CPUOffloadPolicy``: the shards rest on the CPU, forward, backward and the
    collectives run on the GPU) the current CUDA device. Without a model (a loop of
    collectives) or a parameter, the collectives' device: the current CUDA device where the
    default process group runs NCCL, else the CPU. ``current_cuda``: that device's index, None
    without CUDA; ``backend``: the default group's backend, "" without one (tests pass
    stand-ins).
    """
    params = model.parameters() if model is not None else iter(())
    first = next(params, None)
    if first is None:
        index = current_cuda() if "nccl" in backend() else None
        return torch.device("cpu") if index is None else torch.device("cuda", index)
    mesh = getattr(first, "device_mesh", None)
    if first.device.type == "cpu" and getattr(mesh, "device_type", None) == "cuda":
        index = current_cuda()
        if index is not None:
            return torch.device("cuda", index)
    return torch.device(first.device)


def trained_model_kind(model: object) -> str | None:
    """Return the parallelism of a framework's prepared model, None when there is no job to watch.

    For the Lightning and Hugging Face callbacks: a DDP, FSDP2 or FSDP model, or any module
    once a process group exists (DeepSpeed's engine, a tensor-parallel model); None for a
    one-process fit (no process group) or something that is not a module.
    """
    try:
        kind = kind_of(model)
    except TypeError:
        return None
    if kind == "none":
        return None
    if kind == "ddp" or (dist.is_available() and dist.is_initialized()):
        return kind
    return None


assert set(catalog.PARALLELISMS) == {"ddp", "fsdp2", "fsdp", "module", "none"}
