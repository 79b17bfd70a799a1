"""Turn a reading of a rank's GPU health into the ``ddp_gpu_*`` families at scrape time."""

from __future__ import annotations

from prometheus_client.core import Metric

from .. import catalog as c
from ..sources.gpu.health import CLOCK_EVENT_REASONS, GPUHealth

__all__ = ["add_gpu_health"]


def _gauge(fams: dict[str, Metric], m: c.MetricDef, labels: list[str], value: float | None) -> None:
    if value is not None:
        fams[m.name].add_metric(labels, value)


def add_gpu_health(fams: dict[str, Metric], base: list[str], h: GPUHealth) -> None:
    """Add the samples of one reading ``h`` to the families ``fams`` (keyed by metric name)."""
    gpu = h.identity
    info = {"gpu_uuid": gpu.uuid, "pci_bus_id": gpu.pci_bus_id}
    info.update(gpu_index=str(gpu.index), gpu_name=gpu.name)
    fams[c.GPU_INFO.name].add_metric(base, info)
    _gauge(fams, c.GPU_SM_CLOCK, base, h.sm_clock_hz)
    _gauge(fams, c.GPU_SM_CLOCK_MAX, base, h.sm_clock_max_hz)
    if h.clock_events is not None:
        for reason in CLOCK_EVENT_REASONS:
            _gauge(fams, c.GPU_CLOCK_EVENT, base + [reason], float(reason in h.clock_events))
    _gauge(fams, c.GPU_TEMPERATURE, base, h.temperature_celsius)
    _gauge(fams, c.GPU_POWER, base, h.power_watts)
    _gauge(fams, c.GPU_POWER_LIMIT, base, h.power_limit_watts)
    _gauge(fams, c.GPU_UTILIZATION, base, h.utilization_ratio)
    for (error_type, counter), n in h.ecc_errors.items():
        _gauge(fams, c.GPU_ECC_ERRORS, base + [error_type, counter], n)
    for kind, rows in h.remapped_rows.items():
        _gauge(fams, c.GPU_REMAPPED_ROWS, base + [kind], rows)
    for cause, pages in h.retired_pages.items():
        _gauge(fams, c.GPU_RETIRED_PAGES, base + [cause], pages)
    _gauge(fams, c.GPU_PCIE_REPLAYS, base, h.pcie_replays)
    for kind, n in h.nvlink_errors.items():
        _gauge(fams, c.GPU_NVLINK_ERRORS, base + [kind], n)
    _gauge(fams, c.GPU_XID_ERRORS, base, h.xid_errors)
    if h.last_xid is not None:
        xid, when = h.last_xid
        _gauge(fams, c.GPU_LAST_XID, base + [str(xid)], when)
