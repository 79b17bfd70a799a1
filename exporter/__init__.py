"""Per-rank Prometheus metrics for PyTorch DDP jobs that name the straggling, hung or dead rank.

Usage::

    import exporter
    obs = exporter.instrument(ddp_model, dataloader=loader, optimizer=opt)
    ...
    obs.close()            # idempotent; also runs at interpreter exit
    with exporter.step():  # explicit step boundary, for loops without an optimizer
        ...
    with exporter.deadline("checkpoint", seconds=600):  # alert while it runs past 600 s
        save_checkpoint()
"""

from __future__ import annotations

__version__ = "0.1.0"

from .core import DEFAULT_PORT, Observer, active, instrument, step
from .deadline import deadline

__all__ = ["DEFAULT_PORT", "Observer", "active", "deadline", "instrument", "step", "__version__"]
