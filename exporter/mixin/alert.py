"""Describe one alerting rule, and write the label selector every generated expression uses.

Shared by the per-run rules (:mod:`exporter.mixin.rules`) and the fleet rules
(:mod:`exporter.mixin.fleet`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .config import MixinConfig, duration_seconds

__all__ = ["SCOPES", "Alert", "selector"]

#: What one alert is about: a rank (the default: its ``rank`` label names it), a whole run (one
#: alert per run, no ``rank``), a node across runs (``node``, no run), or the monitoring itself
#: (a Prometheus shard: ``instance``).
SCOPES = ("rank", "run", "node", "monitoring")


def selector(cfg: MixinConfig, metric: str, *matchers: str) -> str:
    """Return ``metric{...}`` with the configured selector and ``matchers`` (empty ones dropped)."""
    parts = [m for m in (cfg.selector, *matchers) if m]
    return f"{metric}{{{', '.join(parts)}}}" if parts else metric


@dataclass(frozen=True)
class Alert:
    """Describe one alerting rule and the runbook text that goes with it."""

    name: str
    severity: str
    expr: str
    for_: str
    summary: str
    description: str
    meaning: str
    confirm: str
    action: str
    #: One of :data:`SCOPES`.
    scope: str = "rank"

    def __post_init__(self) -> None:
        if self.scope not in SCOPES:
            raise ValueError(f"{self.name}: scope {self.scope!r} is not one of {SCOPES}")

    @property
    def anchor(self) -> str:
        """Return the runbook section anchor of this alert (its lower-cased name)."""
        return self.name.lower()

    def rule(self, cfg: MixinConfig) -> dict[str, Any]:
        """Return the Prometheus rule dict of this alert."""
        out: dict[str, Any] = {"alert": self.name, "expr": self.expr}
        if duration_seconds(self.for_) > 0:
            out["for"] = self.for_
        out["labels"] = {"severity": self.severity}
        out["annotations"] = {
            "summary": self.summary,
            "description": self.description,
            "runbook_url": f"{cfg.runbook_base_url}#{self.anchor}",
        }
        return out
