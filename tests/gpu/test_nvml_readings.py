"""GPU health from NVML against nvidia-smi on the same device (skipped, with why, without one).

Each figure the exporter serves is compared with ``nvidia-smi --query-gpu`` read right after
it; the reading is recorded (``GPU_CHECK_OUT``: scripts/gpu-check.sh's report folder) for the
CPU tests' injected source, with the cost of one reading.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
import torch

from exporter.errors import ErrorCounter
from exporter.sources.gpu.health import CLOCK_EVENT_REASONS
from exporter.sources.gpu.nvml import nvml_source

pytestmark = [
    pytest.mark.job,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason=f"no CUDA device (torch {torch.__version__}); run scripts/gpu-check.sh on a GPU",
    ),
]

#: nvidia-smi's field -> how to compare it with the reading (exact, or within a tolerance).
FIELDS = (
    "uuid",
    "pci.bus_id",
    "index",
    "name",
    "clocks.sm",
    "clocks.max.sm",
    "temperature.gpu",
    "power.draw",
    "enforced.power.limit",
    "utilization.gpu",
    "clocks_event_reasons.active",
    "ecc.errors.corrected.volatile.total",
    "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.corrected.aggregate.total",
    "ecc.errors.uncorrected.aggregate.total",
    "retired_pages.single_bit_ecc.count",
    "retired_pages.double_bit.count",
)


def _smi(index: int) -> dict[str, str]:
    """Return nvidia-smi's value of each field it knows (one query per field: old builds lack some)."""
    out = {}
    for name in FIELDS:
        done = subprocess.run(
            ["nvidia-smi", f"--id={index}", f"--query-gpu={name}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if done.returncode == 0 and done.stdout.strip():
            out[name] = done.stdout.strip()
    return out


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


@pytest.fixture(scope="module")
def reading():
    pytest.importorskip("pynvml", reason="nvidia-ml-py (the gpu extra) is not installed")
    torch.cuda.init()
    errors = ErrorCounter()
    source, watch = nvml_source(torch.device("cuda", 0), errors)
    assert source is not None, "NVML did not open this GPU (see the log line)"
    try:
        before = source()
        smi = _smi(before.identity.index)
        after = source()
        start = time.perf_counter()
        for _ in range(200):
            source()
        cost_us = (time.perf_counter() - start) / 200 * 1e6
    finally:
        if watch is not None:
            watch.close()
        source.close()
    record = {
        "reading": after.to_dict(),
        "nvidia_smi": smi,
        "read_us": cost_us,
        "xid_watch": watch is not None,
    }
    folder = os.environ.get("GPU_CHECK_OUT")
    if folder:
        with open(os.path.join(folder, "gpu-health.json"), "w") as f:
            json.dump(record, f, indent=1)
    print("gpu health:", json.dumps(record))
    return before, after, smi, cost_us, errors


def test_identity_equals_nvidia_smi(reading):
    _, r, smi, _, _ = reading
    gpu = r.identity
    assert gpu.uuid == smi["uuid"] and gpu.name == smi["name"], (gpu, smi)
    assert gpu.pci_bus_id.lower() == smi["pci.bus_id"].lower(), (gpu, smi)
    assert str(gpu.index) == smi["index"]


def test_clocks_power_and_temperature_equal_nvidia_smi(reading):
    before, r, smi, _, _ = reading
    assert r.sm_clock_max_hz == float(smi["clocks.max.sm"]) * 1e6
    # Read between two readings of ours: an idle GPU's clock moves, never out of their span.
    lo = min(before.sm_clock_hz, r.sm_clock_hz) * 0.85
    hi = max(before.sm_clock_hz, r.sm_clock_hz) * 1.15
    assert lo <= float(smi["clocks.sm"]) * 1e6 <= hi, (before.sm_clock_hz, r.sm_clock_hz, smi)
    assert abs(r.temperature_celsius - float(smi["temperature.gpu"])) <= 3
    assert abs(r.power_watts - float(smi["power.draw"])) <= max(25.0, 0.2 * r.power_watts)
    assert abs(r.power_limit_watts - float(smi["enforced.power.limit"])) < 1.0
    assert abs(r.utilization_ratio * 100 - float(smi["utilization.gpu"])) <= 20
    if "clocks_event_reasons.active" in smi:
        mask = int(smi["clocks_event_reasons.active"], 16)
        known = sum(CLOCK_EVENT_REASONS.values())
        # gpu_idle comes and goes between two reads of an idle GPU; the rest holds still.
        idle = CLOCK_EVENT_REASONS["gpu_idle"]
        ours = {n for n in r.clock_events if n != "gpu_idle"}
        theirs = {n for n, bit in CLOCK_EVENT_REASONS.items() if mask & known & bit & ~idle}
        assert ours == theirs, (r.clock_events, smi["clocks_event_reasons.active"])


def test_error_counters_equal_nvidia_smi(reading):
    _, r, smi, _, errors = reading
    for (error_type, counter), n in r.ecc_errors.items():
        theirs = _number(smi.get(f"ecc.errors.{error_type}.{counter}.total", ""))
        if theirs is not None:
            assert n == theirs, (error_type, counter, n, smi)
    pages = {"multiple_single_bit": "single_bit_ecc", "double_bit": "double_bit"}
    for cause, n in r.retired_pages.items():
        theirs = _number(smi.get(f"retired_pages.{pages[cause]}.count", ""))
        if theirs is not None:
            assert n == theirs, (cause, n, smi)
    assert set(r.remapped_rows) in (set(), {"correctable", "uncorrectable", "pending", "failure"})
    assert not any(errors.snapshot().values()), errors.snapshot()
