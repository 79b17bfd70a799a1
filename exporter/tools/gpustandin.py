"""Stand a recorded GPU in for each rank of the demo trainer, and make it throttle or fail.

Where there is no GPU (CI, a laptop, the demo), a real GPU's recorded NVML reading
(:mod:`exporter.sources.gpu`) is served as each rank's own GPU through ``instrument(gpu_source=)``,
so that the GPU alerts can be drilled end to end: the rank's GPU gets its own index and UUID.
"""

from __future__ import annotations

import time
from dataclasses import replace

from exporter.sources.gpu import Recorded, load_recording

__all__ = ["GPU_FAULTS", "inject", "standin"]

#: What a stand-in GPU can do: slow down in hardware, or raise an Xid (79: fallen off the bus).
GPU_FAULTS = ("throttle", "xid")


def standin(path: str, rank: int) -> Recorded:
    """Return the first reading of the recording at ``path`` as rank ``rank``'s own GPU."""
    reading = load_recording(path)[0]
    gpu = reading.identity
    uuid = f"{gpu.uuid[:-4]}{rank:04d}"
    return Recorded(replace(reading, identity=replace(gpu, uuid=uuid, index=rank)))


def inject(source: Recorded, fault: str) -> None:
    """Make the stand-in GPU ``source`` throttle (a hardware slowdown) or raise Xid 79."""
    if fault == "xid":
        source.add_xid(79, time.time())
        return
    now = source()
    clock = (now.sm_clock_max_hz or 1.98e9) * 0.55
    source.serve(replace(now, sm_clock_hz=clock, clock_events=("hw_slowdown",)))
