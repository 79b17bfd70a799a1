"""Hook the DataLoader, the optimizer and the model's first forward in place, and restore
exactly what was changed.

Nothing is copied: the user's DataLoader object gets a subclass of its own class as
``__class__`` (Python looks ``__iter__`` up on the type), and the optimizer gets step
pre/post hooks. ``uninstrument`` restores the class and removes the hooks; both are safe to
call twice.
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..errors import ErrorCounter
from .recorder import Recorder

__all__ = [
    "DataLoaderInstrumentor",
    "FirstForward",
    "OptimizerInstrumentor",
    "TimedIterator",
    "innermost_optimizer",
]


def innermost_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Return the optimizer whose ``step()`` really runs under wrappers that forward to it.

    accelerate's ``AcceleratedOptimizer`` subclasses ``torch.optim.Optimizer`` without running
    its ``__init__``: it has no step-hook registry of its own and calls the wrapped optimizer's
    ``step()`` (only on steps that synchronise gradients), so the hooks go on that one.
    """
    for _ in range(8):  # wrappers of wrappers, bounded
        inner = getattr(optimizer, "optimizer", None)
        if "_optimizer_step_pre_hooks" in vars(optimizer) or not isinstance(
            inner, torch.optim.Optimizer
        ):
            break
        optimizer = inner
    return optimizer


class FirstForward:
    """A forward pre-hook that calls ``callback(module, args)``; a copy of it does nothing.

    The hook sits in the model's hook table, which ``copy.deepcopy(model)`` and
    ``torch.save(model)`` copy with the model: an EMA copy made before the first forward would
    otherwise drag in the exporter's locks and threads and fail (TypeError: cannot pickle).
    A copy's hook is ``functools.partial(typing.cast)``: ``cast(module, args)`` returns the
    inputs unchanged, and a saved model loads without the exporter installed.
    """

    __slots__ = ("_callback",)

    def __init__(self, callback: Callable[[Any, Any], None]) -> None:
        self._callback = callback

    def __call__(self, module: Any, args: Any) -> None:
        self._callback(module, args)

    def __deepcopy__(self, memo: dict[int, Any]) -> Callable[[Any, Any], Any]:
        return functools.partial(typing.cast)

    def __reduce__(self) -> tuple[Any, ...]:
        return (functools.partial, (typing.cast,))


class TimedIterator:
    """Time each ``next()`` of a DataLoader iterator into the data phase."""

    __slots__ = ("_it", "_rec", "_errors")

    def __init__(self, it: Iterator[Any], rec: Recorder, errors: ErrorCounter) -> None:
        self._it = it
        self._rec = rec
        self._errors = errors

    def __iter__(self) -> TimedIterator:
        return self

    def __next__(self) -> Any:
        try:
            t0 = self._rec.data_begin()
        except Exception as exc:  # noqa: BLE001
            self._errors.record("dataloader", exc)
            return next(self._it)
        try:
            return next(self._it)
        finally:
            try:
                self._rec.data_end(t0)
            except Exception as exc:  # noqa: BLE001
                self._errors.record("dataloader", exc)

    def __len__(self) -> int:
        # A DataLoader's iterator has a length; another raises TypeError here, as len() of it.
        return len(self._it)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        # Code that pokes at the DataLoader iterator (e.g. _num_yielded) still reaches it.
        return getattr(self._it, name)


#: object's own ``__class__`` slot: it still works on classes that shadow ``__class__`` with a
#: read-only property, as accelerate's DataLoaderShard does to pass isinstance(x, DataLoader).
_CLASS_SLOT = object.__dict__["__class__"]


def _set_class(obj: object, cls: type) -> None:
    _CLASS_SLOT.__set__(obj, cls)


class DataLoaderInstrumentor:
    """Time a DataLoader's batches without replacing the object the user holds."""

    def __init__(self, loader: torch.utils.data.DataLoader, rec: Recorder, errors: ErrorCounter):
        self.loader = loader
        self._rec = rec
        self._errors = errors
        self._orig_class: type | None = None

    def instrument(self) -> DataLoaderInstrumentor:
        """Swap in a timing subclass of the loader's own class (once); return self."""
        if self._orig_class is not None:
            return self
        orig = type(self.loader)
        rec, errors = self._rec, self._errors

        def __iter__(  # noqa: N807 - the method being overridden
            loader_self: torch.utils.data.DataLoader,
        ) -> TimedIterator:
            return TimedIterator(orig.__iter__(loader_self), rec, errors)

        timed = type(orig.__name__, (orig,), {"__iter__": __iter__, "__module__": orig.__module__})
        timed.__qualname__ = orig.__qualname__
        _set_class(self.loader, timed)
        self._orig_class = orig
        return self

    def timed(self, iterator: Iterator[Any]) -> TimedIterator:
        """Return ``iterator`` timing each batch (an iterator made before :meth:`instrument`)."""
        if isinstance(iterator, TimedIterator):
            return iterator
        return TimedIterator(iterator, self._rec, self._errors)

    def uninstrument(self) -> None:
        """Restore the loader's original class; a second call does nothing."""
        if self._orig_class is None:
            return
        _set_class(self.loader, self._orig_class)
        self._orig_class = None


class OptimizerInstrumentor:
    """Time ``optimizer.step()`` with the optimizer's own pre/post step hooks."""

    def __init__(self, optimizer: torch.optim.Optimizer, rec: Recorder, errors: ErrorCounter):
        self.optimizer = innermost_optimizer(optimizer)
        self._rec = rec
        self._errors = errors
        self._handles: list[torch.utils.hooks.RemovableHandle] = []

    def _pre(
        self, optimizer: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        try:
            self._rec.optimizer_begin()
        except Exception as exc:  # noqa: BLE001
            self._errors.record("optimizer", exc)

    def _post(
        self, optimizer: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        try:
            self._rec.optimizer_end()
        except Exception as exc:  # noqa: BLE001
            self._errors.record("optimizer", exc)

    def instrument(self) -> OptimizerInstrumentor:
        """Register the hooks (once); return self."""
        if not self._handles:
            self._handles = [
                self.optimizer.register_step_pre_hook(self._pre),
                self.optimizer.register_step_post_hook(self._post),
            ]
        return self

    def uninstrument(self) -> None:
        """Remove the hooks; a second call does nothing."""
        for h in self._handles:
            h.remove()
        self._handles = []
