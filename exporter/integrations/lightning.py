"""Instrument a Lightning ``Trainer``: ``Trainer(callbacks=[ExporterCallback()])``.

The callback instruments the model the strategy built (DDP, ``FSDPStrategy``'s FSDP,
``ModelParallelStrategy``'s FSDP2 model), the train DataLoader and the optimizer once training
starts, and closes the exporter at teardown. Steps are Lightning's
optimizer steps, so ``accumulate_grad_batches`` is respected (DDP's ``no_sync()`` covers the
accumulating batches). Validation runs in the section ``evaluation`` and ``trainer.save_checkpoint``
in the section ``checkpoint`` (``exporter.deadline``), so neither is taken for a hang or a stall.
Needs the extra ``ddp-exporter[lightning]``.
"""

from __future__ import annotations

from typing import Any

import torch

from . import missing_extra

try:
    from lightning.pytorch import LightningModule, Trainer
    from lightning.pytorch.callbacks import Callback
except ImportError as exc:
    raise missing_extra(exc, "lightning") from exc

from ..api import instrument
from ..log import log
from ..observer import Observer
from ..sources.parallelism import trained_model_kind
from .sections import (
    CHECKPOINT,
    CHECKPOINT_SECONDS,
    EVALUATION,
    EVALUATION_SECONDS,
    MethodSection,
    section,
)

__all__ = ["ExporterCallback"]


class ExporterCallback(Callback):
    """Export this rank's DDP metrics from a Lightning fit.

    ``instrument_kwargs`` are passed to :func:`exporter.instrument` (``port``, ``addr``,
    ``run``, ...). Only the first optimizer is timed (Lightning's automatic optimization has
    one). A strategy without a process group (one device) is logged and skipped.
    Validation is declared as the section ``evaluation`` (deadline ``evaluation_seconds``) and
    ``trainer.save_checkpoint`` as ``checkpoint`` (``checkpoint_seconds``).
    """

    def __init__(
        self,
        *,
        checkpoint_seconds: float = CHECKPOINT_SECONDS,
        evaluation_seconds: float = EVALUATION_SECONDS,
        **instrument_kwargs: Any,
    ) -> None:
        for key in ("dataloader", "optimizer"):
            if key in instrument_kwargs:
                raise TypeError(f"ExporterCallback: {key}= is taken from the Trainer")
        self._kwargs = instrument_kwargs
        self._checkpoint = section(CHECKPOINT, checkpoint_seconds, "checkpoint_seconds")
        self._evaluation = section(EVALUATION, evaluation_seconds, "evaluation_seconds")
        self._saving: MethodSection | None = None
        self._validating = 0
        self.observer: Observer | None = None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Run ``trainer.save_checkpoint`` inside the section ``checkpoint``."""
        if self._saving is None:
            self._saving = MethodSection(trainer, "save_checkpoint", self._checkpoint)
            self._saving.apply()

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Enter the section ``evaluation`` (also the sanity check before training)."""
        self._evaluation.__enter__()
        self._validating += 1

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Leave the section ``evaluation``."""
        if self._validating:
            self._validating -= 1
            self._evaluation.__exit__(None, None, None)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Instrument the strategy's model, the train DataLoader and the optimizer."""
        if self.observer is not None:
            return
        model = trainer.strategy.model
        if trained_model_kind(model) is None:
            log.warning(
                "ddp-exporter: Lightning strategy %s runs no distributed job (model %s, no "
                "process group); nothing is exported",
                type(trainer.strategy).__name__,
                type(model).__name__,
            )
            return
        loader = trainer.train_dataloader
        if not isinstance(loader, torch.utils.data.DataLoader):
            loader = None  # several loaders: steps and phases still come from the optimizer
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        # The step a resumed run starts from: the hang action measures progress in run steps.
        options = {"start_step": int(trainer.global_step), **self._kwargs}
        self.observer = instrument(model, dataloader=loader, optimizer=optimizer, **options)
        if loader is not None:
            self._time_live_iterator(trainer, self.observer)

    @staticmethod
    def _time_live_iterator(trainer: Trainer, obs: Observer) -> None:
        """Time the batches of the epoch whose iterator Lightning made before on_train_start."""
        # The fit loop calls iter() on the loader (and prefetches a batch) before any callback
        # runs; the instrumented loader times every later iter(), this one is wrapped in place.
        try:
            iterators = (
                trainer.fit_loop._combined_loader._iterator.iterators
            )  # private: feature-detected
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
        """Close the exporter (a clean end): restore what was patched; stop serving."""
        self._close(clean=True)

    def on_exception(
        self, trainer: Trainer, pl_module: LightningModule, exception: BaseException
    ) -> None:
        """Close the exporter when the fit fails (no clean end)."""
        self._close(clean=False)

    def _close(self, clean: bool) -> None:
        while self._validating:  # a validation the exception cut short
            self._validating -= 1
            self._evaluation.__exit__(None, None, None)
        if self._saving is not None:
            self._saving.restore()
            self._saving = None
        if self.observer is not None:
            self.observer.close(clean=clean)
            self.observer = None
