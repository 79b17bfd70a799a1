"""GPU health per rank on CPU: a recorded reading of a real GPU injected, scraped over HTTP.

NVML cannot run here (no driver): its real module is asked and must say so in one line, and
every other series stays. The healthy reading is a real H200's, read through NVML by
scripts/gpu-check.sh (tests/gpu/test_nvml_readings.py, which compares it with nvidia-smi); the
throttled and the erroring ones are that reading with the fields a throttled or failing GPU
reports changed.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import train_epoch
from harness import parse, scrape_text, value, wait_for

import exporter
import exporter.tools.top as top
from exporter import catalog
from exporter.errors import ErrorCounter
from exporter.sources.gpu import GPUHealth, Recorded, load_recording
from exporter.sources.gpu.nvml import NvmlSource, XidWatch, load_nvml, nvml_source

pytestmark = pytest.mark.unit

RECORDING = Path(__file__).parent / "recordings" / "gpu-h200.json"


def healthy() -> GPUHealth:
    (reading,) = load_recording(RECORDING)
    return reading


def throttled() -> GPUHealth:
    """The same GPU held down by its hardware slowdown: what a failing fan or PSU shows."""
    r = healthy()
    return replace(r, sm_clock_hz=1.1e9, clock_events=("hw_slowdown", "hw_thermal_slowdown"))


def test_a_recording_reads_back_as_written(tmp_path):
    r = replace(throttled(), last_xid=(79, 1_700_000_000.0), xid_errors=1)
    path = tmp_path / "r.json"
    path.write_text(json.dumps([r.to_dict(), healthy().to_dict()]))
    assert load_recording(path) == [r, healthy()]
    with pytest.raises(ValueError, match="unknown GPU health fields.*'clock'"):
        GPUHealth.from_dict({**healthy().to_dict(), "clock": 1})


def test_every_health_series_is_served_at_scrape_time(ddp):
    model, loader, opt = ddp
    source = Recorded(healthy())
    obs = exporter.instrument(model, optimizer=opt, port=0, addr="127.0.0.1", gpu_source=source)
    train_epoch(model, loader, opt)
    assert source.reads == 0  # nothing on the training path
    text = scrape_text(obs.url)
    s = parse(text)
    assert source.reads == 1
    gpu = healthy().identity
    ((info, _),) = s["ddp_rank_gpu_info"]
    assert info["gpu_uuid"] == gpu.uuid and info["pci_bus_id"] == gpu.pci_bus_id, info
    assert info["gpu_index"] == str(gpu.index) and info["gpu_name"] == gpu.name, info
    assert value(s, "ddp_gpu_sm_clock_hertz") == healthy().sm_clock_hz
    assert value(s, "ddp_gpu_power_limit_watts") == healthy().power_limit_watts
    events = {lab["reason"]: v for lab, v in s["ddp_gpu_clock_event_active"]}
    assert set(events) == set(catalog.GPU_CLOCK_EVENT_REASONS) and not any(events.values())
    kinds = {(lab["error_type"], lab["counter"]) for lab, _ in s["ddp_gpu_ecc_errors_total"]}
    assert len(kinds) == 4
    assert (
        value(s, "ddp_gpu_xid_errors_total") == 0 and "ddp_gpu_last_xid_timestamp_seconds" not in s
    )
    gpu_lines = [x for x in text.splitlines() if x.startswith(("ddp_gpu_", "ddp_rank_gpu_info"))]
    gpu_lines = [x for x in gpu_lines if not x.startswith("ddp_gpu_memory_")]
    assert len(gpu_lines) == catalog.gpu_health_series(), gpu_lines

    source.serve(throttled())
    source.add_xid(79, 1_700_000_000.0)
    s = parse(scrape_text(obs.url))
    assert value(s, "ddp_gpu_clock_event_active", reason="hw_slowdown") == 1
    assert value(s, "ddp_gpu_clock_event_active", reason="sw_power_cap") == 0
    assert value(s, "ddp_gpu_sm_clock_hertz") == 1.1e9
    assert value(s, "ddp_gpu_xid_errors_total") == 1
    assert value(s, "ddp_gpu_last_xid_timestamp_seconds", xid="79") == 1_700_000_000.0
    # `ddp-exporter top` reads the same endpoint: the GPU, its clock and its slowdown reasons.
    (row,) = top.fetch([f"127.0.0.1:{obs.port}"])
    assert (row.gpu_index, row.gpu_clock) == (str(gpu.index), 1.1e9), row
    assert row.gpu_slowdown == ["hw_slowdown", "hw_thermal_slowdown"], row


def test_a_failing_reading_is_counted_and_the_rest_served(ddp):
    def broken():
        raise RuntimeError("GPU is lost")

    obs = exporter.instrument(ddp[0], port=0, addr="127.0.0.1", gpu_source=broken)
    for expected in (1, 2):
        s = parse(scrape_text(obs.url))
        assert value(s, "ddp_exporter_errors_total", where="gpu") == expected
        assert "ddp_rank_gpu_info" not in s and value(s, "ddp_steps_total") == 0
    obs.close()
    with pytest.raises(TypeError, match=r"gpu_source=\.\.\.\): expected a callable"):
        exporter.instrument(ddp[0], port=0, gpu_source=5)


def test_without_a_driver_nvml_says_so_in_one_line_and_nothing_else_changes(caplog):
    pytest.importorskip("pynvml", reason="the gpu extra (nvidia-ml-py) is a test requirement")
    errors = ErrorCounter()
    with caplog.at_level(logging.INFO, logger="exporter"):
        assert load_nvml() is None
        assert nvml_source(torch.device("cuda", 0), errors) == (None, None)
    lines = [r.getMessage() for r in caplog.records]
    assert lines and all("GPU health off: NVML cannot start" in x for x in lines), lines
    assert not any(errors.snapshot().values())


class _Nvml:
    """NVML's module as the exporter calls it, for a GPU that fails: the real one needs a driver.

    Passed to :class:`NvmlSource` as its module (the injected source), never patched into
    ``pynvml``. ``xid`` queues an Xid event; ``lost`` makes every read fail as a GPU that fell
    off the bus; ``broken`` makes waiting for events fail at once.
    """

    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):  # noqa: N801, N818 - NVML's names
        pass

    NVMLError_NoPermission = NVMLError_FunctionNotFound = NVMLError_NotSupported

    class NVMLError_Timeout(NVMLError):  # noqa: N801, N818
        pass

    class NVMLError_GpuIsLost(NVMLError):  # noqa: N801, N818
        pass

    NVML_CLOCK_SM = NVML_TEMPERATURE_GPU = NVML_VOLATILE_ECC = 0
    NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 0, 1
    NVML_AGGREGATE_ECC = 1
    NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
    NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
    nvmlEventTypeXidCriticalError = 8  # noqa: N815

    def __init__(self) -> None:
        self.xid: int | None = None
        self.lost = self.broken = False

    def _value(self, value):
        def call(*_args):
            if self.lost:
                raise self.NVMLError_GpuIsLost("GPU is lost")
            return value

        return call

    def __getattr__(self, name: str):
        values = {
            "nvmlDeviceGetPciInfo": type("Pci", (), {"busId": b"00000000:00:06.0"})(),
            "nvmlDeviceGetUUID": "GPU-958a0db7-0f4d-47b7-4660-79326b4e9043",
            "nvmlDeviceGetIndex": 0,
            "nvmlDeviceGetName": b"NVIDIA H200",
            "nvmlDeviceGetClockInfo": 1980,
            "nvmlDeviceGetMaxClockInfo": 1980,
            "nvmlDeviceGetTemperature": 37,
            "nvmlDeviceGetPowerUsage": 123855,
            "nvmlDeviceGetEnforcedPowerLimit": 700000,
            "nvmlDeviceGetUtilizationRates": type("U", (), {"gpu": 0})(),
            "nvmlDeviceGetCurrentClocksEventReasons": 0,
            "nvmlDeviceGetTotalEccErrors": 0,
            "nvmlDeviceGetRemappedRows": (0, 0, 0, 0),
            "nvmlDeviceGetPcieReplayCounter": 1,
            "nvmlEventSetCreate": object(),
            "nvmlDeviceRegisterEvents": None,
            "nvmlEventSetFree": None,
            "nvmlShutdown": None,
        }
        if name in values:
            return self._value(values[name])
        if name in ("nvmlDeviceGetNvLinkState", "nvmlDeviceGetRetiredPages"):

            def unsupported(*_args):
                raise self.NVMLError_NotSupported("Not Supported")

            return unsupported
        raise AttributeError(name)

    def nvmlEventSetWait_v2(self, _set, timeout_ms):  # noqa: N802
        if self.broken:
            raise self.NVMLError("Unknown Error")
        if self.xid is None:
            time.sleep(timeout_ms / 1000)
            raise self.NVMLError_Timeout("Timeout")
        xid, self.xid = self.xid, None
        return type("Event", (), {"eventType": 8, "eventData": xid})()


def _xid_threads() -> int:
    return sum(t.name == "ddp-exporter-xid" for t in threading.enumerate())


def test_a_gpu_that_fell_off_the_bus_still_shows_itself_and_its_xid():
    nvml, errors = _Nvml(), ErrorCounter()
    source = NvmlSource(nvml, object(), errors)
    watch = XidWatch(source, errors).start()
    try:
        assert source().sm_clock_hz == 1.98e9 and source().xid_errors == 0
        nvml.xid = 79
        wait_for(lambda: source.xid[0] == 1, 10, "the Xid event counted")
        nvml.lost = True
        r = source()
        assert r.identity.uuid == "GPU-958a0db7-0f4d-47b7-4660-79326b4e9043", r
        assert (r.xid_errors, r.last_xid[0], r.sm_clock_hz) == (1, 79, None), r
        assert errors.snapshot()["gpu"] == 1
        # Waiting for events now fails at once: the watch ends instead of spinning.
        nvml.broken = True
        wait_for(lambda: _xid_threads() == 0, 10, "the Xid watch to end")
        assert errors.snapshot()["gpu"] >= 2 and source().xid_errors == 1
    finally:
        watch.close()
