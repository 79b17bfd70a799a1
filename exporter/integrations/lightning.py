"""Instrument a Lightning ``Trainer``: ``Trainer(callbacks=[ExporterCallback()])``.

The callback instruments the DDP module the strategy built, the train DataLoader and the
optimizer once training starts, and closes the exporter at teardown. Steps are Lightning's
optimizer steps, so ``accumulate_grad_batches`` is respected (DDP's ``no_sync()`` covers the
accumulating batches). Needs the extra ``ddp-exporter[lightning]``.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback
from torch.nn.parallel import DistributedDataParallel

from ..api import instrument
from ..log import log
from ..observer import Observer

__all__ = ["ExporterCallback"]


class ExporterCallback(Callback):
    """Export this rank's DDP metrics from a Lightning fit.

    ``instrument_kwargs`` are passed to :func:`exporter.instrument` (``port``, ``addr``,
    ``run``, ...). Only the first optimizer is timed (Lightning's automatic optimization has
    one). A strategy that does not wrap the model in DDP (one device) is logged and skipped.
    """

    def __init__(self, **instrument_kwargs: Any) -> None:
        for key in ("dataloader", "optimizer"):
            if key in instrument_kwargs:
                raise TypeError(f"ExporterCallback: {key}= is taken from the Trainer")
        self._kwargs = instrument_kwargs
        self.observer: Observer | None = None

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Instrument the strategy's DDP module, the train DataLoader and the optimizer."""
        if self.observer is not None:
            return
        model = trainer.strategy.model
        if not isinstance(model, DistributedDataParallel):
            log.warning(
                "ddp-exporter: Lightning strategy %s did not wrap the model in "
                "DistributedDataParallel (got %s); nothing is exported",
                type(trainer.strategy).__name__,
                type(model).__name__,
            )
            return
        loader = trainer.train_dataloader
        if not isinstance(loader, torch.utils.data.DataLoader):
            loader = None  # several loaders: steps and phases still come from the optimizer
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        self.observer = instrument(model, dataloader=loader, optimizer=optimizer, **self._kwargs)
        if loader is not None:
            self._time_live_iterator(trainer, self.observer)

    @staticmethod
    def _time_live_iterator(trainer: Trainer, obs: Observer) -> None:
        """Time the batches of the epoch whose iterator Lightning made before on_train_start."""
        # The fit loop calls iter() on the loader (and prefetches a batch) before any callback
        # runs; the instrumented loader times every later iter(), this one is wrapped in place.
        try:
            iterators = trainer.fit_loop._combined_loader._iterator.iterators
            for i, it in enumerate(iterators):
                iterators[i] = obs.timed_batches(it)
        except Exception as exc:  # noqa: BLE001 - another Lightning layout: later epochs still timed
            obs.errors.record("dataloader", exc)

    def on_before_optimizer_step(
        self, trainer: Trainer, pl_module: LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        """Start the optimizer phase here, after the closure's forward and backward."""
        # Lightning runs training_step and backward in a closure that optimizer.step() calls,
        # so the optimizer's pre-hook fires before the forward; the update starts only here.
        # Only the first optimizer has the exporter's step hooks; others are left alone.
        if self.observer is not None:
            self.observer.optimizer_phase_begins(optimizer)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Close the exporter: restore the DataLoader, optimizer and comm hook; stop serving."""
        self._close()

    def on_exception(
        self, trainer: Trainer, pl_module: LightningModule, exception: BaseException
    ) -> None:
        """Close the exporter when the fit fails."""
        self._close()

    def _close(self) -> None:
        if self.observer is not None:
            self.observer.close()
            self.observer = None
