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

The names above are loaded on first use, so the offline parts of the package (``python -m
exporter.mixin``, ``ddp-exporter top`` and ``hangs``) import no torch. See docs/development.md
for the layout: settings and catalog, sources, export and hangs, observer, API, tools.
"""

from __future__ import annotations

import importlib
from typing import Any

from .version import __version__

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

#: Public name -> the module (relative to this package) that defines it.
_PUBLIC = {
    "DEFAULT_PORT": "settings.names",
    "InitWatch": "initwatch",
    "Observer": "observer",
    "active": "api",
    "deadline": "sources.sections",
    "instrument": "api",
    "step": "api",
    "watch_init": "api",
}


def __getattr__(name: str) -> Any:
    """Import the module defining the public ``name`` on first access (PEP 562)."""
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later accesses skip this function
    return value


def __dir__() -> list[str]:
    """List the public names with the loaded ones."""
    return sorted(set(globals()) | set(__all__))
