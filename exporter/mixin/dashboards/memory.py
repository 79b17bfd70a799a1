"""Build the Memory dashboard: GPU memory against the device's total, host memory per rank, and
each rank's GPU health (clocks, slowdown reasons, power, errors)."""

from __future__ import annotations

from ... import catalog
from ..alerts.gpu import SLOWDOWN_REASONS
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
        "GPU memory (allocated, reserved, peak against total), host resident memory and the "
        "GPU's health per rank.",
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
            *_gpu_health(cfg),
        ),
    )


def _gpu_health(cfg: MixinConfig) -> tuple[PanelSpec, ...]:
    """Return the GPU health panels (ranks with the gpu extra on CUDA)."""
    q = Queries(cfg)
    rank = q.by("run, rank")
    ranks = "rank {{rank}}"
    slowdown = f'reason=~"{"|".join(SLOWDOWN_REASONS)}"'
    errors = "$__rate_interval"
    uncorrected = ('error_type="uncorrected"', 'counter="volatile"')
    ecc = q.series(catalog.GPU_ECC_ERRORS, "", *uncorrected)
    return (
        PanelSpec(
            "GPU SM clock per rank",
            (
                Target(f"max {rank} ({q.series(catalog.GPU_SM_CLOCK)})", ranks),
                Target(f"max {rank} ({q.series(catalog.GPU_SM_CLOCK_MAX)})", "max rank {{rank}}"),
            ),
            description=(
                "Each rank's GPU's SM clock against its maximum. A rank whose clock sits below "
                "its peers' computes slower: DDPGPUThrottledStraggler names it when it straggles."
            ),
            unit="hertz",
            needs="gpu",
        ),
        PanelSpec(
            "GPU slowdown reasons",
            (
                Target(
                    f"max {q.by('run, rank, reason')} "
                    f"({q.series(catalog.GPU_CLOCK_EVENT, '', slowdown)}) > 0",
                    "rank {{rank}}: {{reason}}",
                ),
            ),
            description=(
                "The clock-event reasons holding a rank's GPU's clocks down (hardware, thermal "
                "or power-brake slowdown, a power cap). The same reason on every GPU slows every "
                "rank alike."
            ),
            needs="gpu",
        ),
        PanelSpec(
            "GPU power / limit",
            (
                Target(
                    f"max {rank} ({q.series(catalog.GPU_POWER)})\n/ {q.on('run, rank')}\n"
                    f"max {rank} ({q.series(catalog.GPU_POWER_LIMIT)})",
                    ranks,
                ),
            ),
            description="Power each rank's GPU draws as a fraction of the limit the driver enforces.",
            unit="percentunit",
            needs="gpu",
        ),
        PanelSpec(
            "GPU errors",
            (
                Target(
                    f"sum {rank} (increase({q.series(catalog.GPU_XID_ERRORS)}[{errors}]))",
                    "Xid rank {{rank}}",
                ),
                Target(
                    f"sum {rank} (increase({ecc}[{errors}]))", "uncorrectable ECC rank {{rank}}"
                ),
            ),
            description=(
                "Xid events and uncorrectable ECC errors per rank: each pages at once "
                "(DDPGPUError)."
            ),
            needs="gpu",
        ),
    )
