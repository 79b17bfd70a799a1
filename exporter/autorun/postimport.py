"""Run a function right after a module is first imported, without importing it first.

``ddp-exporter run`` arms its hooks when the training script imports torch, not before: the
same ``sitecustomize`` runs in every Python process of the job (the launcher's agent, a
DataLoader worker started with ``spawn``, any helper), and importing torch in each would cost
them seconds. :func:`when_imported` puts a finder at the front of ``sys.meta_path`` that lets
the real finders find the module and wraps its loader, so that the callback runs when the
module's own code has run; a look-up that imports nothing leaves it in place. The module keeps
its own loader afterwards.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

__all__ = ["when_imported"]


class _Loader(importlib.abc.Loader):
    """The real loader, and the callback once the module's code has run."""

    def __init__(self, real: Any, finder: _Finder) -> None:
        self._real = real
        self._finder = finder

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        module: ModuleType | None = self._real.create_module(spec)
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The module's own loader again, for whoever reads it (importlib.resources, reloads).
        module.__loader__ = self._real
        if module.__spec__ is not None:
            module.__spec__.loader = self._real
        self._finder.retire()
        self._real.exec_module(module)
        self._finder.then(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Find ``name`` with the other finders and hand back a spec whose loader calls back.

    It stays first on ``sys.meta_path`` until the module is really imported: a mere look-up
    (``importlib.util.find_spec("torch")``, as libraries check what is installed) must not use
    it up.
    """

    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self._name = name
        self.then = then
        self._busy = threading.local()  # this thread is asking the other finders

    def retire(self) -> None:
        """Leave ``sys.meta_path``: the module is being imported."""
        if self in sys.meta_path:
            sys.meta_path.remove(self)

    def find_spec(
        self, fullname: str, path: Any = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self._name or getattr(self._busy, "on", False):
            return None
        self._busy.on = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy.on = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader, self)
        return spec


def when_imported(name: str, then: Callable[[ModuleType], None]) -> None:
    """Call ``then(module)`` once the top-level module ``name`` is imported (now if it is).

    ``then`` runs inside the import statement that first imports ``name``: an exception it
    raises is the importer's, so it must catch its own.
    """
    module = sys.modules.get(name)
    if module is not None:
        then(module)
        return
    sys.meta_path.insert(0, _Finder(name, then))
