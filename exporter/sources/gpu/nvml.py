"""Read a rank's GPU health from NVML (``nvidia-ml-py``, the ``gpu`` extra), off the training thread.

NVML is the library under ``nvidia-smi`` and DCGM: it reads clocks, throttle reasons, power and
error counters from the driver without a CUDA context, so a reading never synchronises the
GPU. The collector calls an :class:`NvmlSource` at scrape time; Xid events arrive on NVML's
event set, waited on by one daemon thread (:class:`XidWatch`). A field the GPU does not support
is read once, then left out; without the module or the driver one line says so and nothing
else changes.
"""

from __future__ import annotations

import os
import threading
import time
from types import ModuleType
from typing import Any

import torch

from ...background import DONE, BackgroundLoop
from ...errors import ErrorCounter
from ...log import log
from .health import (
    ECC_COUNTERS,
    NVLINK_ERRORS,
    REMAPPED_ROWS,
    RETIREMENT_CAUSES,
    GPUHealth,
    GPUIdentity,
    reasons_of,
)

__all__ = ["NvmlSource", "XidWatch", "load_nvml", "nvml_source"]

#: How long one wait on NVML's event set blocks (ms): bounds how long closing takes.
_EVENT_WAIT_MS = 250


def load_nvml() -> ModuleType | None:
    """Return the initialised ``pynvml`` module, or None (logged once) where it cannot run."""
    try:
        import pynvml
    except ImportError:
        log.info(
            "ddp-exporter: GPU health off: nvidia-ml-py is not installed "
            "(pip install 'ddp-exporter[gpu]'); every other series is unaffected"
        )
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        log.info("ddp-exporter: GPU health off: NVML cannot start (%s)", exc)
        return None
    module: ModuleType = pynvml
    return module


def _handle(nvml: ModuleType, device: torch.device) -> Any:
    """Return NVML's handle of the GPU torch calls ``device``, whatever CUDA_VISIBLE_DEVICES says.

    NVML numbers every GPU of the host; CUDA numbers the visible ones: match by UUID, else by
    PCI address, else (nothing masked) by index.
    """
    index = device.index if device.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    uuid = getattr(props, "uuid", None)
    if uuid is not None:
        text = str(uuid)
        return nvml.nvmlDeviceGetHandleByUUID(text if text.startswith("GPU-") else f"GPU-{text}")
    bus = getattr(props, "pci_bus_id", None)
    if bus is not None:
        domain, dev = getattr(props, "pci_domain_id", 0), getattr(props, "pci_device_id", 0)
        return nvml.nvmlDeviceGetHandleByPciBusId(f"{domain:08X}:{bus:02X}:{dev:02X}.0")
    if os.environ.get("CUDA_VISIBLE_DEVICES") is None:
        return nvml.nvmlDeviceGetHandleByIndex(index)
    raise LookupError("torch names neither the UUID nor the PCI address of its GPU")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlSource:
    """Read one GPU's health through NVML; the callable a collector reads at scrape time."""

    def __init__(self, nvml: ModuleType, handle: Any, errors: ErrorCounter | None = None) -> None:
        #: NVML's module and this GPU's handle (the Xid watch and the benchmark use them).
        self.nvml, self.handle = nvml, handle
        self._unsupported: set[str] = set()
        self._counter = errors
        self._lock = threading.Lock()
        pci = nvml.nvmlDeviceGetPciInfo(handle)
        self.identity = GPUIdentity(
            uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
            pci_bus_id=_text(pci.busId),
            index=int(nvml.nvmlDeviceGetIndex(handle)),
            name=_text(nvml.nvmlDeviceGetName(handle)),
        )
        self._links = self._active_links()
        # Fixed for the GPU, and the slowest call of a reading (about a millisecond on an H200).
        self._sm_max = self._get("sm_clock_max", nvml.nvmlDeviceGetMaxClockInfo, nvml.NVML_CLOCK_SM)
        #: Xid events ``(count, (xid, Unix time) of the last or None)``, set by :class:`XidWatch`.
        self.xid: tuple[int, tuple[int, float] | None] = (0, None)

    def _get(self, key: str, call: Any, *args: Any) -> Any:
        """Return ``call(handle, *args)``; None (and never asked again) where not supported."""
        if key in self._unsupported:
            return None
        nvml = self.nvml
        try:
            return call(self.handle, *args)
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_NoPermission):
            self._unsupported.add(key)
            return None
        except nvml.NVMLError_FunctionNotFound:  # an older driver than the module
            self._unsupported.add(key)
            return None

    def _active_links(self) -> list[int]:
        nvml, active = self.nvml, []
        for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                if nvml.nvmlDeviceGetNvLinkState(self.handle, link):
                    active.append(link)
            except nvml.NVMLError:
                break  # no NVLink, or past the GPU's last link
        return active

    def _clock_events(self) -> tuple[str, ...] | None:
        nvml = self.nvml
        call = (
            getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        mask = self._get("clock_events", call)
        return None if mask is None else reasons_of(int(mask))

    def _errors(self) -> dict[str, Any]:
        nvml, g = self.nvml, self._get
        types = {"corrected": nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED}
        types["uncorrected"] = nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        counters = {"volatile": nvml.NVML_VOLATILE_ECC, "aggregate": nvml.NVML_AGGREGATE_ECC}
        ecc = {}
        for t, c in ECC_COUNTERS:
            n = g(f"ecc/{t}/{c}", nvml.nvmlDeviceGetTotalEccErrors, types[t], counters[c])
            if n is not None:
                ecc[(t, c)] = int(n)
        rows = g("remapped_rows", nvml.nvmlDeviceGetRemappedRows)
        remapped = dict(zip(REMAPPED_ROWS, map(int, rows))) if rows is not None else {}
        retired = {}
        causes = (
            nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
            nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
        )
        for name, cause in zip(RETIREMENT_CAUSES, causes):
            pages = g(f"retired/{name}", nvml.nvmlDeviceGetRetiredPages, cause)
            if pages is not None:
                retired[name] = len(pages)
        nvlink = {}
        if self._links:
            kinds = (
                nvml.NVML_NVLINK_ERROR_DL_REPLAY,
                nvml.NVML_NVLINK_ERROR_DL_RECOVERY,
                nvml.NVML_NVLINK_ERROR_DL_CRC_FLIT,
                nvml.NVML_NVLINK_ERROR_DL_CRC_DATA,
            )
            for name, kind in zip(NVLINK_ERRORS, kinds):
                counts = [
                    g(f"nvlink/{name}", nvml.nvmlDeviceGetNvLinkErrorCounter, link, kind)
                    for link in self._links
                ]
                if all(n is not None for n in counts):
                    nvlink[name] = int(sum(counts))
        return {"ecc": ecc, "remapped": remapped, "retired": retired, "nvlink": nvlink}

    def __call__(self) -> GPUHealth:
        """Return the GPU's health now (some tens of NVML calls, no CUDA call).

        A GPU NVML can no longer read (fallen off the bus, a reset) still gives its identity
        and its Xid events, the evidence of what happened to it; the error is counted.
        """
        try:
            return self._read()
        except self.nvml.NVMLError as exc:
            if self._counter is not None:
                self._counter.record("gpu", exc)
            count, last = self.xid
            return GPUHealth(identity=self.identity, xid_errors=count, last_xid=last)

    def _read(self) -> GPUHealth:
        nvml, g = self.nvml, self._get
        with self._lock:  # two scrapes at once read one after the other
            sm = g("sm_clock", nvml.nvmlDeviceGetClockInfo, nvml.NVML_CLOCK_SM)
            temp = g("temperature", nvml.nvmlDeviceGetTemperature, nvml.NVML_TEMPERATURE_GPU)
            power = g("power", nvml.nvmlDeviceGetPowerUsage)
            limit = g("power_limit", nvml.nvmlDeviceGetEnforcedPowerLimit)
            util = g("utilization", nvml.nvmlDeviceGetUtilizationRates)
            events = self._clock_events()
            errors = self._errors()
            replays = g("pcie_replays", nvml.nvmlDeviceGetPcieReplayCounter)
        count, last = self.xid
        return GPUHealth(
            identity=self.identity,
            sm_clock_hz=None if sm is None else sm * 1e6,
            sm_clock_max_hz=None if self._sm_max is None else self._sm_max * 1e6,
            clock_events=events,
            temperature_celsius=None if temp is None else float(temp),
            power_watts=None if power is None else power / 1000.0,
            power_limit_watts=None if limit is None else limit / 1000.0,
            utilization_ratio=None if util is None else util.gpu / 100.0,
            ecc_errors=errors["ecc"],
            remapped_rows=errors["remapped"],
            retired_pages=errors["retired"],
            pcie_replays=None if replays is None else int(replays),
            nvlink_errors=errors["nvlink"],
            xid_errors=count,
            last_xid=last,
        )

    def close(self) -> None:
        """Release NVML (it counts its users: other libraries keep theirs)."""
        self.nvml.nvmlShutdown()


class XidWatch:
    """Wait for Xid events on one GPU on a daemon thread; count them into the source."""

    def __init__(self, source: NvmlSource, errors: ErrorCounter) -> None:
        nvml = source.nvml
        self.nvml, self._source = nvml, source
        self._set = nvml.nvmlEventSetCreate()
        try:
            nvml.nvmlDeviceRegisterEvents(
                source.handle, nvml.nvmlEventTypeXidCriticalError, self._set
            )
        except nvml.NVMLError:
            nvml.nvmlEventSetFree(self._set)
            raise
        self._errors = errors
        self._loop = BackgroundLoop(
            "ddp-exporter-xid", self._wait, 0.0, errors=errors, where="gpu", final=self._free
        )

    def start(self) -> XidWatch:
        """Start waiting; return self."""
        self._loop.start()
        return self

    def _wait(self) -> Any:
        nvml = self.nvml
        try:
            data = nvml.nvmlEventSetWait_v2(self._set, _EVENT_WAIT_MS)
        except nvml.NVMLError_Timeout:
            return None
        except nvml.NVMLError as exc:
            # Waiting fails at once from now on (the GPU is gone, the driver reset): a loop
            # that kept asking would spin. Counted, logged once; the Xids seen stay served.
            self._errors.record("gpu", exc)
            log.info("ddp-exporter: Xid events no longer watched on this GPU (%s)", exc)
            return DONE
        if data.eventType & nvml.nvmlEventTypeXidCriticalError:
            count, _ = self._source.xid
            self._source.xid = (count + 1, (int(data.eventData), time.time()))
        return None

    def _free(self) -> None:
        self.nvml.nvmlEventSetFree(self._set)

    def close(self) -> None:
        """Stop waiting (within one wait) and free the event set."""
        self._loop.close(timeout=2 * _EVENT_WAIT_MS / 1000)


def nvml_source(
    device: torch.device, errors: ErrorCounter
) -> tuple[NvmlSource | None, XidWatch | None]:
    """Return the NVML source of ``device`` and its Xid watch; None where either cannot run."""
    nvml = load_nvml()
    if nvml is None:
        return None, None
    try:
        source = NvmlSource(nvml, _handle(nvml, device), errors)
    except Exception as exc:  # noqa: BLE001 - no GPU health is no reason to stop training
        log.info("ddp-exporter: GPU health off: NVML does not find this rank's GPU (%s)", exc)
        return None, None
    try:
        watch = XidWatch(source, errors).start()
    except nvml.NVMLError as exc:
        log.info("ddp-exporter: Xid events not watched on this GPU (%s)", exc)
        watch = None
    return source, watch
