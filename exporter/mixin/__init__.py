"""Generate the monitoring mixin: recording and alert rules, dashboards and the runbook.

Everything is derived from :mod:`exporter.catalog` and one
:class:`~exporter.mixin.config.MixinConfig`; what deploys it (the compose stack, Kubernetes,
shards, Alertmanager) is :mod:`exporter.deploy`, the reference pages :mod:`exporter.docsite`.
Run ``ddp-exporter mixin generate --out DIR`` (or ``python -m exporter.mixin generate``) to
write them for your configuration, ``ddp-exporter mixin check`` at the repository's root to
verify the committed copies are up to date (:mod:`exporter.generate.command`).
"""

from __future__ import annotations

from .config import DEFAULT, FAST, MixinConfig

__all__ = ["DEFAULT", "FAST", "MixinConfig"]
