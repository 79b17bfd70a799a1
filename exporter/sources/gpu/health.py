"""Hold one reading of a rank's GPU health: identity, clocks, throttling, power, errors.

A reading is plain data, so a recorded one (JSON, from a real GPU) can stand in for NVML where
there is no GPU: tests and the demo inject a source returning readings, never patch a library.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ...catalog import GPU_CLOCK_EVENT_REASONS

__all__ = [
    "CLOCK_EVENT_REASONS",
    "ECC_COUNTERS",
    "NVLINK_ERRORS",
    "REMAPPED_ROWS",
    "RETIREMENT_CAUSES",
    "GPUHealth",
    "GPUIdentity",
    "HealthSource",
    "reasons_of",
]

#: NVML's clock-event (throttle) reasons (the bounded ``reason`` label) and each one's bit
#: (nvmlClocksEventReason*: GpuIdle 0x1 up to DisplayClockSetting 0x100).
CLOCK_EVENT_REASONS: dict[str, int] = {
    name: 1 << bit for bit, name in enumerate(GPU_CLOCK_EVENT_REASONS)
}
#: ECC error counters as ``(error_type, counter)``: NVML's volatile ones reset with the driver.
ECC_COUNTERS: tuple[tuple[str, str], ...] = (
    ("corrected", "volatile"),
    ("uncorrected", "volatile"),
    ("corrected", "aggregate"),
    ("uncorrected", "aggregate"),
)
#: Row remapping (Ampere and later): rows remapped by cause, and the two flags.
REMAPPED_ROWS: tuple[str, ...] = ("correctable", "uncorrectable", "pending", "failure")
#: Page retirement (before Ampere): retired pages by cause.
RETIREMENT_CAUSES: tuple[str, ...] = ("multiple_single_bit", "double_bit")
#: NVLink data-link error counters, summed over the GPU's active links.
NVLINK_ERRORS: tuple[str, ...] = ("replay", "recovery", "crc_flit", "crc_data")


def reasons_of(mask: int) -> tuple[str, ...]:
    """Return the names of the clock-event reasons set in NVML's bit ``mask``."""
    return tuple(name for name, bit in CLOCK_EVENT_REASONS.items() if mask & bit)


@dataclass(frozen=True)
class GPUIdentity:
    """Which GPU a rank runs on, as NVML and nvidia-smi name it (and DCGM labels it)."""

    uuid: str
    pci_bus_id: str
    index: int
    name: str


@dataclass(frozen=True)
class GPUHealth:
    """One reading of a GPU's health; None (or absent keys) where the GPU does not support it."""

    identity: GPUIdentity
    sm_clock_hz: float | None = None
    sm_clock_max_hz: float | None = None
    #: Active clock-event reasons (names of :data:`CLOCK_EVENT_REASONS`); None: not readable.
    clock_events: tuple[str, ...] | None = None
    temperature_celsius: float | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    #: Share of the last sample period a kernel ran (0..1).
    utilization_ratio: float | None = None
    #: ``(error_type, counter)`` -> errors, keys of :data:`ECC_COUNTERS` the GPU reports.
    ecc_errors: Mapping[tuple[str, str], int] = field(default_factory=dict)
    #: Keys of :data:`REMAPPED_ROWS` -> rows (pending and failure: 0 or 1).
    remapped_rows: Mapping[str, int] = field(default_factory=dict)
    #: Keys of :data:`RETIREMENT_CAUSES` -> retired pages.
    retired_pages: Mapping[str, int] = field(default_factory=dict)
    pcie_replays: int | None = None
    #: Keys of :data:`NVLINK_ERRORS` -> errors summed over active links (empty: no NVLink).
    nvlink_errors: Mapping[str, int] = field(default_factory=dict)
    #: Xid events seen on this GPU since the rank started watching.
    xid_errors: int = 0
    #: ``(xid, Unix time)`` of the last Xid event seen, else None.
    last_xid: tuple[int, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the reading as JSON-ready data (a recorded reading)."""
        out = asdict(self)
        out["ecc_errors"] = {f"{t}/{c}": n for (t, c), n in self.ecc_errors.items()}
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GPUHealth:
        """Return the reading that :meth:`to_dict` wrote (a recorded reading)."""
        known = set(cls.__dataclass_fields__)
        extra = set(data) - known
        if extra:
            raise ValueError(f"unknown GPU health fields {sorted(extra)}")
        values = dict(data)
        values["identity"] = GPUIdentity(**data["identity"])
        ecc = data.get("ecc_errors", {})
        values["ecc_errors"] = {tuple(k.split("/", 1)): int(n) for k, n in ecc.items()}
        if data.get("clock_events") is not None:
            values["clock_events"] = tuple(data["clock_events"])
        if data.get("last_xid") is not None:
            xid, when = data["last_xid"]
            values["last_xid"] = (int(xid), float(when))
        return cls(**values)


#: A callable returning the rank's GPU health now (read at scrape time), None without a GPU.
HealthSource = Callable[[], GPUHealth | None]
