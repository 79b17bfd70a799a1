"""Build the Memory dashboard: GPU memory against the device's total, host memory per rank."""

from __future__ import annotations

from ... import catalog
from ..config import DEFAULT, MixinConfig
from ..recording import recorded
from .panels import DashboardSpec, PanelSpec, Queries, Target

__all__ = ["dashboard"]

#: What the GPU memory panel draws per rank: the gauge and its legend.
GPU_MEMORY: tuple[tuple[catalog.MetricDef, str], ...] = (
    (catalog.GPU_MEM_ALLOCATED, "allocated"),
    (catalog.GPU_MEM_RESERVED, "reserved"),
    (catalog.GPU_MEM_PEAK, "peak"),
    (catalog.GPU_MEM_TOTAL, "total"),
)


def dashboard(cfg: MixinConfig = DEFAULT) -> DashboardSpec:
    """Return the Memory dashboard of ``cfg``."""
    q, r = Queries(cfg), recorded(cfg)
    rank = q.by("run, rank")
    ranks = "rank {{rank}}"
    return DashboardSpec(
        "memory",
        "ddp-memory",
        "DDP / Memory",
        "GPU memory (allocated, reserved, peak against total) and host resident memory per rank.",
        (
            PanelSpec(
                "GPU memory per rank",
                tuple(
                    Target(f"max {rank} ({q.series(m)})", f"{label} rank {{{{rank}}}}")
                    for m, label in GPU_MEMORY
                ),
                description=(
                    "CUDA allocated, reserved, peak and total device memory per rank. Empty "
                    "on CPU-only runs."
                ),
                unit="bytes",
                needs="gpu",
            ),
            PanelSpec(
                "GPU reserved / total",
                (Target(q.rec(r.gpu_reserved_ratio), ranks),),
                description=(
                    "Memory the CUDA caching allocator reserved as a fraction of the device's "
                    "total. Empty on CPU-only runs."
                ),
                kind="bargauge",
                unit="percentunit",
                min=0,
                max=1,
                thresholds=(("green", None), ("orange", 0.8), ("red", cfg.gpu_memory_ratio)),
                needs="gpu",
            ),
            PanelSpec(
                "Host resident memory per rank",
                (Target(f"max {rank} ({q.series(catalog.HOST_MEM_RESIDENT)})", ranks),),
                description=("Resident set size of each rank's process."),
                unit="bytes",
                width=24,
            ),
        ),
    )
