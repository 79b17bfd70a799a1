"""Watch an unmodified training command: ``ddp-exporter run -- torchrun ... train.py``.

``ddp-exporter run`` puts :data:`BOOT_DIR` first on the job's ``PYTHONPATH`` and sets
``DDP_EXPORTER_AUTORUN=1``. Python then runs the ``sitecustomize`` in there at the start of
every process of the job; it calls :func:`arm`, which waits for torch to be imported
(:mod:`exporter.autorun.postimport`) and then puts the hooks of
:class:`~exporter.autorun.instrumentor.AutoInstrumentor` in place: the rank is instrumented at
its first optimizer step with the model and the optimizer the script made. A ``sitecustomize``
the job had before still runs, after this one.

Nothing here imports torch until the job does, and nothing happens without the variable.
"""

from __future__ import annotations

import atexit
import importlib
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from .. import settings
from .postimport import when_imported

if TYPE_CHECKING:  # the instrumentor imports torch: only once the job does
    from .instrumentor import AutoInstrumentor

__all__ = ["BOOT_DIR", "arm", "run_hidden_sitecustomize"]

#: The folder ``ddp-exporter run`` puts first on ``PYTHONPATH``: it holds the sitecustomize.
BOOT_DIR = Path(__file__).resolve().parent / "boot"

_armed: list[object] = []


def arm() -> bool:
    """Instrument this process at its first optimizer step, if ``DDP_EXPORTER_AUTORUN`` says so.

    Return whether it is armed. Safe to call more than once; never raises.
    """
    if _armed or not settings.autorun():
        return bool(_armed)
    _armed.append(True)
    when_imported("torch", _torch_imported)
    return True


def _torch_imported(torch: ModuleType) -> None:
    # Inside the script's `import torch`: whatever goes wrong is said, never raised into it.
    try:
        from .instrumentor import AutoInstrumentor

        hooks = AutoInstrumentor().instrument()
        _armed.append(hooks)
        atexit.register(_say_if_never_stepped, hooks, os.getpid())
    except Exception as exc:  # noqa: BLE001
        sys.stderr.write(f"ddp-exporter run: not instrumented ({exc!r})\n")


def _say_if_never_stepped(hooks: AutoInstrumentor, pid: int) -> None:
    """Say at exit what a rank that never stepped an optimizer was missing."""
    import multiprocessing

    from .instrumentor import say

    if hooks.triggered or multiprocessing.parent_process() is not None or os.getpid() != pid:
        return  # it did, or this is a DataLoader worker, a child it forked, another helper
    if settings.RANK not in os.environ:
        return  # the launcher's own process, not a rank
    if not (hooks.iterated or hooks.had_process_group):
        return  # a helper the rank started (a compile worker): it trains nothing
    say(
        f"rank {os.environ[settings.RANK]} never called optimizer.step(): nothing was "
        "instrumented; a loop without an optimizer marks its steps with `with exporter.step():` "
        "after calling exporter.instrument()"
    )


def run_hidden_sitecustomize(own: str) -> None:
    """Import the ``sitecustomize`` that the one in ``own`` (a folder) hides on ``sys.path``.

    ``own`` is off ``sys.path`` while it runs and back at its place after; what the hidden one
    changes on ``sys.path`` stays.
    """
    own_dir = os.path.realpath(own)
    mine = sys.modules.pop("sitecustomize", None)
    removed = [(i, p) for i, p in enumerate(sys.path) if os.path.realpath(p or ".") == own_dir]
    for _, entry in reversed(removed):
        sys.path.remove(entry)
    try:
        importlib.import_module("sitecustomize")
    except ImportError as exc:
        if exc.name != "sitecustomize":
            raise
    finally:
        for index, entry in removed:
            sys.path.insert(index, entry)
        if mine is not None:
            sys.modules.setdefault("sitecustomize", mine)
