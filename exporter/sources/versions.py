"""Report the static facts of a rank (``ddp_rank_info``), versions that must agree included."""

from __future__ import annotations

import platform
import socket

import torch
import torch.distributed as dist

from ..settings import Identity
from ..version import __version__

__all__ = ["nccl_version", "rank_info", "versions"]


def nccl_version() -> str:
    """Return the NCCL version torch was built with, or ``"none"`` when it has no NCCL."""
    try:
        if not dist.is_available() or not dist.is_nccl_available():
            return "none"
        version = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - a CPU build or a broken CUDA install: no NCCL to report
        return "none"
    if isinstance(version, tuple):
        return ".".join(str(v) for v in version)
    return str(version)


def versions() -> dict[str, str]:
    """Return torch, Python, CUDA and NCCL versions as ``ddp_rank_info`` label values."""
    return {
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "cuda_version": torch.version.cuda or "none",
        "nccl_version": nccl_version(),
    }


def rank_info(
    identity: Identity,
    backend: str,
    device: str,
    inflight: str,
    comm_timing: str,
    parallelism: str = "ddp",
) -> dict[str, str]:
    """Return the labels of ``ddp_rank_info``: who the rank is, where, with what versions.

    ``inflight`` and ``comm_timing`` name the sources in use: ``flight_recorder`` or
    ``comm_hook``; ``reducer``, ``hook``, ``collectives`` (no DDP: the ``torch.distributed``
    collectives are timed) or ``none`` (a hook registered before the exporter's).
    ``parallelism``: the model's kind (:mod:`exporter.sources.parallelism`).
    """
    return {
        "local_rank": str(identity.local_rank),
        "node": identity.node or socket.gethostname(),
        "world_size": str(identity.world_size),
        "backend": str(backend),
        "device": device,
        "torch_version": torch.__version__,
        "exporter_version": __version__,
        "inflight_source": inflight,
        "comm_timing": comm_timing,
        "parallelism": parallelism,
        **versions(),
        "attempt": identity.attempt,
    }
