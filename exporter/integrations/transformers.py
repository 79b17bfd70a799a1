"""Instrument a Hugging Face ``transformers.Trainer``: ``trainer.add_callback(ExporterCallback(trainer))``.

The DDP (or FSDP) module exists only once ``train()`` has prepared the model with accelerate, and
callbacks are not handed it (their ``model`` is the unwrapped model), so the callback holds
the trainer and instruments ``trainer.model_wrapped`` at ``on_train_begin``, with the prepared
train DataLoader and the optimizer. Steps are optimizer steps: ``gradient_accumulation_steps``
is respected (the accumulating micro-batches run under ``no_sync()``). ``trainer.evaluate`` runs
in the section ``evaluation`` and the Trainer's checkpoint save (``_save_checkpoint``, a private
method: feature-detected) in ``checkpoint`` (``exporter.deadline``), so neither is taken for a
hang or a stall. Closes at ``on_train_end``. Needs the extra ``ddp-exporter[transformers]``.
"""

from __future__ import annotations

from typing import Any

import torch

from . import missing_extra

try:
    from transformers import Trainer, TrainerCallback
except ImportError as exc:
    raise missing_extra(exc, "transformers") from exc

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


class ExporterCallback(TrainerCallback):
    """Export this rank's metrics from ``trainer.train()`` (DDP, or FSDP through accelerate).

    ``instrument_kwargs`` are passed to :func:`exporter.instrument`. When the trainer runs no
    distributed job (one process), this is logged and nothing is exported. Evaluation and
    checkpoint saving are declared as the sections ``evaluation`` (``evaluation_seconds``) and
    ``checkpoint`` (``checkpoint_seconds``).
    """

    def __init__(
        self,
        trainer: Trainer,
        *,
        checkpoint_seconds: float = CHECKPOINT_SECONDS,
        evaluation_seconds: float = EVALUATION_SECONDS,
        **instrument_kwargs: Any,
    ) -> None:
        if not isinstance(trainer, Trainer):
            raise TypeError(
                "ExporterCallback(trainer): expected a transformers.Trainer, got "
                f"{type(trainer).__qualname__}; use trainer.add_callback(ExporterCallback(trainer))"
            )
        for key in ("dataloader", "optimizer"):
            if key in instrument_kwargs:
                raise TypeError(f"ExporterCallback: {key}= is taken from the Trainer")
        self._trainer = trainer
        self._kwargs = instrument_kwargs
        self._sections = [
            MethodSection(
                trainer, "evaluate", section(EVALUATION, evaluation_seconds, "evaluation_seconds")
            ),
            MethodSection(
                trainer,
                "_save_checkpoint",
                section(CHECKPOINT, checkpoint_seconds, "checkpoint_seconds"),
            ),
        ]
        self.observer: Observer | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Instrument the prepared (DDP or FSDP) model, the DataLoader and the optimizer."""
        for wrapped in self._sections:
            wrapped.apply()
        if self.observer is not None:
            return
        model = self._trainer.model_wrapped
        if trained_model_kind(model) is None:
            log.warning(
                "ddp-exporter: the Trainer runs no distributed job (model %s, no process "
                "group; launch with torchrun); nothing is exported",
                type(model).__name__,
            )
            return
        loader = kwargs.get("train_dataloader")
        if not isinstance(loader, torch.utils.data.DataLoader):
            loader = None
        optimizer = kwargs.get("optimizer") or self._trainer.optimizer
        # The step a resumed run starts from: the hang action measures progress in run steps.
        options = {"start_step": int(getattr(state, "global_step", 0) or 0), **self._kwargs}
        self.observer = instrument(model, dataloader=loader, optimizer=optimizer, **options)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Close the exporter (a clean end): restore what was patched and stop serving."""
        for wrapped in self._sections:
            wrapped.restore()
        if self.observer is not None:
            self.observer.close(clean=True)
            self.observer = None
