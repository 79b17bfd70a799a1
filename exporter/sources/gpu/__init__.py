"""Read the health of each rank's GPU: NVML on a GPU, a recorded reading where there is none.

:mod:`.health` holds a reading, :mod:`.nvml` reads one from the driver (the ``gpu`` extra),
:mod:`.recorded` serves recorded ones to tests and drills.
"""

from .health import GPUHealth, GPUIdentity, HealthSource
from .recorded import Recorded, load_recording

__all__ = ["GPUHealth", "GPUIdentity", "HealthSource", "Recorded", "load_recording"]
