"""Generate the monitoring mixin: recording/alert rules, dashboards, Alertmanager, runbook, stack.

Everything is derived from :mod:`exporter.catalog` and one
:class:`~exporter.mixin.config.MixinConfig`.
Run ``python -m exporter.mixin generate`` to rewrite the committed files and
``python -m exporter.mixin check`` to verify they are up to date.
"""

from __future__ import annotations

from .config import DEFAULT, FAST, MixinConfig

__all__ = ["DEFAULT", "FAST", "MixinConfig"]
