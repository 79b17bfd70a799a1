"""Report the versions that must agree on every rank of a job (ddp_rank_info, DDPVersionSkew)."""

from __future__ import annotations

import platform

import torch
import torch.distributed as dist

__all__ = ["nccl_version", "versions"]


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
