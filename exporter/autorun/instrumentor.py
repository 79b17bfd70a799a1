"""Find an unmodified script's model, optimizer and DataLoader, and instrument them at its first step.

``ddp-exporter run`` arms this in every process of the job once it imports torch (see
:mod:`exporter.autorun`). Four global hooks, all public torch APIs or undone exactly:

- a module registration hook sees every module that gets a child module while the script
  builds its model, and remembers (weakly) which modules are nobody's child: the outermost
  ones, a ``DistributedDataParallel`` wrapper or an FSDP2 model among them;
- ``DataLoader.__iter__`` hands out iterators that time their batches once this rank is
  instrumented, the iterator of the epoch already running included;
- a global optimizer step pre-hook waits for the first ``optimizer.step()``. By then the
  process group exists and the model has run; the outermost module holding the stepping
  optimizer's parameters is the model, and :func:`exporter.instrument` runs with it and that
  optimizer. The step now stepping is counted, so the rank's step count is the script's;
- ``torch.distributed.destroy_process_group`` notes that the process had a process group
  before it destroys it: a rank that never stepped says so at exit, a destroyed group or not.

A script that calls :func:`exporter.instrument` itself keeps its own handle: this stands down.
Where nothing can be found (no process group, no optimizer step), one line says what is
missing and what still works.
"""

from __future__ import annotations

import functools
import sys
import threading
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.nn.modules.module import register_module_module_registration_hook
from torch.optim.optimizer import register_optimizer_step_pre_hook

from ..errors import ErrorCounter
from ..sources.instrumentors import TimedIterator, innermost_optimizer
from ..sources.parallelism import kind_of

if TYPE_CHECKING:  # the API and the observer load only in the process that trains (first step)
    from ..observer import Observer

__all__ = ["PREFIX", "AutoInstrumentor", "LazyTimedIterator", "say"]

#: What prefixes every line this module writes on the rank's standard error.
PREFIX = "ddp-exporter run:"


class LazyTimedIterator:
    """A DataLoader iterator that times its batches once its loader is the one being trained on.

    Made for every ``iter(loader)`` under ``ddp-exporter run``: before the first step nothing is
    instrumented and a batch costs one attribute check; after it, the training loader's batches
    go through :class:`~exporter.sources.instrumentors.TimedIterator` into the rank's recorder.
    """

    __slots__ = ("_it", "_loader", "_owner", "_timed", "__weakref__")

    def __init__(self, it: Iterator[Any], loader: Any, owner: AutoInstrumentor) -> None:
        self._it = it
        self._loader = weakref.ref(loader)
        self._owner = owner
        self._timed: Iterator[Any] | None = None

    def __iter__(self) -> LazyTimedIterator:
        return self

    def __next__(self) -> Any:
        timed = self._timed
        if timed is None:
            timed = self._timed = self._owner.timed(self)
            if timed is None:
                self._owner.seen(self)
                return next(self._it)
        return next(timed)

    def __len__(self) -> int:
        return len(self._it)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._it, name)

    @property
    def loader(self) -> Any:
        """Return the DataLoader this iterator came from (None once it is gone)."""
        return self._loader()

    @property
    def inner(self) -> Iterator[Any]:
        """Return the DataLoader's own iterator."""
        return self._it


class AutoInstrumentor:
    """The hooks of one process: armed by :meth:`instrument`, undone by :meth:`uninstrument`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._handles: list[Any] = []
        self._registrations: Any = None  # the module registration hook's handle
        # DataLoader.__iter__ before and after it was replaced here.
        self._orig_iter: Any = None
        self._new_iter: Any = None
        # torch.distributed.destroy_process_group before and after it was replaced here.
        self._orig_destroy: Any = None
        self._new_destroy: Any = None
        self._had_group = False
        # Modules that got a child, and modules that are someone's child: weakly, so that a
        # model the script drops is not kept alive.
        self._parents: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        self._children: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        #: The iterator that handed out the last batch before the first step, and its loader.
        self._last_iterator: weakref.ref[LazyTimedIterator] | None = None
        self._train_loader: weakref.ref[Any] | None = None
        self.triggered = False
        #: The handle made here (None: not yet, or the script instrumented itself).
        self.observer: Observer | None = None
        self.errors = ErrorCounter()

    @property
    def iterated(self) -> bool:
        """Say whether this process iterated a DataLoader (a training process, not a helper)."""
        return self._last_iterator is not None

    @property
    def had_process_group(self) -> bool:
        """Say whether this process has, or destroyed, a default process group (a rank)."""
        return self._had_group or (dist.is_available() and dist.is_initialized())

    @property
    def armed(self) -> bool:
        """Say whether the hooks are in place."""
        return bool(self._handles)

    # -- arming --------------------------------------------------------------------------
    def instrument(self) -> AutoInstrumentor:
        """Put the hooks in place (once); return self."""
        with self._lock:
            if self._handles:
                return self
            self._registrations = register_module_module_registration_hook(self._registered)
            self._handles = [self._registrations, register_optimizer_step_pre_hook(self._stepping)]
            loader_class = torch.utils.data.DataLoader
            self._orig_iter = orig = loader_class.__iter__
            owner = self

            def __iter__(loader: Any) -> Any:  # noqa: N807 - the method it stands in for
                it = orig(loader)
                try:
                    return LazyTimedIterator(it, loader, owner)
                except Exception as exc:  # noqa: BLE001
                    owner.errors.record("dataloader", exc)
                    return it

            loader_class.__iter__ = __iter__
            self._new_iter = __iter__
            if dist.is_available():
                self._wrap_destroy()
        return self

    def _wrap_destroy(self) -> None:
        # At exit the group a script destroyed is gone: note it here, while it exists.
        self._orig_destroy = orig = dist.destroy_process_group
        owner = self

        @functools.wraps(orig)
        def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
            if not owner._had_group:
                owner._had_group = owner.had_process_group
            return orig(*args, **kwargs)

        dist.destroy_process_group = destroy_process_group
        self._new_destroy = destroy_process_group

    def uninstrument(self) -> None:
        """Remove the hooks, put ``DataLoader.__iter__`` and ``destroy_process_group`` back.

        A second call does nothing. The rank's handle, once made, stays: closing it is
        :func:`exporter.instrument`'s business (at exit, or the script's ``close()``).
        """
        with self._lock:
            for handle in self._handles:
                handle.remove()
            self._handles = []
            loader_class = torch.utils.data.DataLoader
            if self._orig_iter is not None and loader_class.__iter__ is self._new_iter:
                loader_class.__iter__ = self._orig_iter
            self._orig_iter = None
            if self._orig_destroy is not None and dist.destroy_process_group is self._new_destroy:
                dist.destroy_process_group = self._orig_destroy
            self._orig_destroy = None

    # -- the hooks -----------------------------------------------------------------------
    def _registered(self, module: Any, name: str, child: Any) -> None:
        try:
            self._parents.add(module)
            if child is not None:
                self._children.add(child)
        except Exception as exc:  # noqa: BLE001
            self.errors.record("step", exc)

    def seen(self, iterator: LazyTimedIterator) -> None:
        """Remember ``iterator`` as the one that last handed out a batch (before the first step)."""
        if not self.triggered:
            self._last_iterator = weakref.ref(iterator)

    def timed(self, iterator: LazyTimedIterator) -> Iterator[Any] | None:
        """Return ``iterator``'s timed form once this rank is instrumented and it is the training
        loader's; its plain DataLoader iterator for any other loader; None before the first step.
        """
        if not self.triggered:
            return None
        obs = self.observer
        train = self._train_loader() if self._train_loader is not None else None
        if obs is None or obs.closed or train is None or iterator.loader is not train:
            return iterator.inner
        return TimedIterator(iterator.inner, obs.recorder, obs.errors)

    def _stepping(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        # One Python call per optimizer step from here on: the hook cannot be removed while
        # torch iterates the global hooks that called it.
        if self.triggered:
            return
        with self._lock:  # two threads stepping at once: one instruments
            first, self.triggered = not self.triggered, True
        if not first:
            return
        # The model is made by now: stop watching module registrations (removable here, unlike
        # this hook, since torch is not iterating them).
        self._registrations.remove()
        try:
            self._first_step(optimizer)
        except Exception as exc:  # noqa: BLE001 - never break the step
            self.errors.record("step", exc)
            say(f"not instrumented at the first optimizer step ({exc!r}); training goes on")

    def _first_step(self, optimizer: Any) -> None:
        from .. import api

        if api.active() is not None:
            return  # the script instrumented itself: its handle stays the only one
        if not (dist.is_available() and dist.is_initialized()):
            say(
                "no process group at the first optimizer step: a one-process job, nothing to "
                "watch (the exporter watches ranks of a torch.distributed job)"
            )
            return
        model = self._model_of(optimizer)
        last = self._last_iterator() if self._last_iterator is not None else None
        loader = last.loader if last is not None else None
        self._train_loader = weakref.ref(loader) if loader is not None else None
        obs = api.instrument(model, optimizer=optimizer)
        obs.errors.merge(self.errors)
        self.errors = obs.errors
        self.observer = obs
        # The step now stepping: its optimizer.step() closes it, and the count is the script's.
        obs.recorder.open_step()
        say(_found(obs, model, optimizer, loader))

    def _model_of(self, optimizer: Any) -> torch.nn.Module | None:
        """Return the outermost module holding ``optimizer``'s parameters, None if none does."""
        first = next(
            (p for group in optimizer.param_groups for p in group["params"]),
            None,
        )
        if first is None:
            return None
        children = set(map(id, self._children))
        for module in list(self._parents):
            if id(module) in children:
                continue
            if any(p is first for p in module.parameters()):
                # torch.compile's wrapper: the compiled module is what the script trains.
                inner = getattr(module, "_orig_mod", None)
                return inner if isinstance(inner, torch.nn.Module) else module
        return None


def _found(obs: Observer, model: Any, optimizer: Any, loader: Any) -> str:
    """Return the line saying what rank ``obs`` watches and what it could not find."""
    what = [
        f"model {type(model).__name__} ({kind_of(model)})" if model is not None else "no model",
        f"optimizer {type(innermost_optimizer(optimizer)).__name__}",
        f"DataLoader {type(loader).__name__}" if loader is not None else "no DataLoader",
    ]
    missing = ""
    if model is None:
        missing += "; no module holds the optimizer's parameters: collectives are timed"
    if loader is None:
        missing += "; no DataLoader was iterated before the first step: data wait not measured"
    # "rank R: metrics at URL", as every instrumented rank of the demo says it.
    where = f": metrics at {obs.url}" if obs.url else ": no endpoint"
    return f"rank {obs.rank}{where}; instrumented at its first optimizer step: {', '.join(what)}{missing}"


def say(line: str) -> None:
    """Write one line on standard error: ``ddp-exporter run`` users read it in the job's log."""
    try:
        # One write: the ranks of a node share the launcher's standard error.
        sys.stderr.write(f"{PREFIX} {line}\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001, S110 - a closed stderr must not break the step
        pass
