"""Read memory figures at scrape time: GPU allocator stats on CUDA, process RSS on the host.

The GPU source is a small callable so tests (no CUDA here) can inject a fake one instead of
patching torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from prometheus_client import ProcessCollector

__all__ = ["GPUMemory", "MemorySource", "cuda_memory_source", "host_resident_bytes"]


@dataclass(frozen=True)
class GPUMemory:
    """GPU memory figures of one device, in bytes."""

    allocated: int
    reserved: int
    peak: int
    total: int


#: A callable returning the current GPU memory figures, or None when there is no GPU.
MemorySource = Callable[[], GPUMemory | None]


def cuda_memory_source(device: torch.device) -> MemorySource:
    """Return a source reading the caching allocator's counters (no synchronisation)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    total = torch.cuda.get_device_properties(index).total_memory

    def read() -> GPUMemory:
        return GPUMemory(
            allocated=torch.cuda.memory_allocated(index),
            reserved=torch.cuda.memory_reserved(index),
            peak=torch.cuda.max_memory_allocated(index),
            total=total,
        )

    return read


_process = ProcessCollector(registry=None)


def host_resident_bytes() -> float | None:
    """Return this process's resident set size from prometheus_client's process collector."""
    for family in _process.collect():
        if family.name == "process_resident_memory_bytes":
            for sample in family.samples:
                return sample.value
    return None
