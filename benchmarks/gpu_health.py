"""Time what a GPU health reading costs: the whole reading, and each NVML call it makes.

On a GPU with the gpu extra: opens the NVML source of GPU 0 as a CUDA rank would, times
``--n`` whole readings (what one scrape adds, on the endpoint's thread), then each kind of
NVML call alone on the same handle, and how long closing the Xid watch takes.

    python benchmarks/gpu_health.py --n 200 --json health.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import torch  # noqa: E402

from exporter.errors import ErrorCounter  # noqa: E402
from exporter.sources.gpu.nvml import nvml_source  # noqa: E402


def _time_us(call, n: int) -> float:
    """Return the median of ``n`` timings of ``call()``, in µs."""
    times = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def _calls(nvml, handle) -> dict:
    """Return each NVML call a reading makes, by name, ready to time."""
    return {
        "clock sm": lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM),
        "max clock sm": lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM),
        "temperature": lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU),
        "power": lambda: nvml.nvmlDeviceGetPowerUsage(handle),
        "power limit": lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle),
        "utilization": lambda: nvml.nvmlDeviceGetUtilizationRates(handle),
        "clock events": lambda: nvml.nvmlDeviceGetCurrentClocksEventReasons(handle),
        "ecc (one counter)": lambda: nvml.nvmlDeviceGetTotalEccErrors(
            handle, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_VOLATILE_ECC
        ),
        "remapped rows": lambda: nvml.nvmlDeviceGetRemappedRows(handle),
        "pcie replays": lambda: nvml.nvmlDeviceGetPcieReplayCounter(handle),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200, help="timings of each")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_health: no CUDA device")
    torch.cuda.init()
    source, watch = nvml_source(torch.device("cuda", 0), ErrorCounter())
    if source is None:
        sys.exit("gpu_health: NVML does not open GPU 0 (see the log line)")
    out: dict = {"gpu": source.identity.name, "reading_us": _time_us(source, args.n), "calls": {}}
    nvml, handle = source.nvml, source.handle
    for name, call in _calls(nvml, handle).items():
        try:
            out["calls"][name] = _time_us(call, args.n)
        except nvml.NVMLError as exc:
            out["calls"][name] = f"not supported ({exc})"
    start = time.perf_counter()
    if watch is not None:
        watch.close()
    out["xid_watch_close_ms"] = (time.perf_counter() - start) * 1e3
    source.close()
    for name, us in out["calls"].items():
        print(f"{name:20} {us if isinstance(us, str) else f'{us:8.1f} µs'}")
    print(f"whole reading        {out['reading_us']:8.1f} µs")
    print(f"xid watch close      {out['xid_watch_close_ms']:8.1f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    print(f"reading_us={out['reading_us']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
