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
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import train_epoch
from harness import parse, scrape_text, value

import exporter
import exporter.tools.top as top
from exporter import catalog
from exporter.errors import ErrorCounter
from exporter.sources.gpu import GPUHealth, Recorded, load_recording
from exporter.sources.gpu.nvml import load_nvml, nvml_source

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
