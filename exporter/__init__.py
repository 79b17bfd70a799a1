"""Per-rank Prometheus metrics for PyTorch DDP jobs that name the straggling, hung or dead rank.

Usage::

    import exporter
    exporter.watch_init()  # optional, before init_process_group: watch init (see initwatch)
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
from .initwatch import InitWatch, watch_init

__all__ = [
    "DEFAULT_PORT",
    "InitWatch",
    "Observer",
    "active",
    "deadline",
    "instrument",
    "step",
    "watch_init",
    "__version__",
]
