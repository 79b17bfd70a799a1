"""Generate the monitoring mixin: recording/alert rules, dashboards, Alertmanager, runbook, stack.

Everything is derived from :mod:`exporter.catalog` and one
:class:`~exporter.mixin.config.MixinConfig`.
Run ``ddp-exporter mixin generate --out DIR`` (or ``python -m exporter.mixin generate``) to
write them for your configuration, ``ddp-exporter mixin check`` at the repository's root to
verify the committed copies are up to date (:mod:`exporter.mixin.command`).
"""

from __future__ import annotations

from .config import DEFAULT, FAST, MixinConfig

__all__ = ["DEFAULT", "FAST", "MixinConfig"]
