"""Describe dashboards as thin specs, and write their PromQL for one configuration.

A dashboard is a :class:`DashboardSpec`: a list of :class:`PanelSpec` (title, kind, PromQL
targets, unit). :class:`Queries` writes the targets: every selector filtered on the template
variables (``run`` and ``rank``, ``rank`` limited by ``node`` through ``ddp_rank_info``) and,
first, on the cluster variable; every ``by``/``on`` clause with the cluster label
(:class:`~exporter.mixin.cluster.Clauses`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ... import catalog
from ..cluster import Clauses, clauses
from ..config import MixinConfig
from ..promql import string

__all__ = ["NODE", "RUN", "TOP_RANKS", "VARS", "DashboardSpec", "PanelSpec", "Queries", "Target"]

#: Filter on the dashboard variables, for exporter series and recorded series alike.
VARS = 'run=~"$run", rank=~"$rank"'
#: Filter on the run variable alone (a series of the run, not of a rank).
RUN = 'run=~"$run"'
#: Filter on the node variable (the fleet's series: nodes, not runs).
NODE = 'node=~"$node"'
#: Ranks shown where one series per rank would be too many to read (and to send) at scale.
TOP_RANKS = 10


@dataclass(frozen=True)
class Target:
    """One PromQL query of a panel and its legend."""

    expr: str
    legend: str = ""


@dataclass(frozen=True)
class PanelSpec:
    """Describe one panel: what it shows, how, and when it is expected to have data.

    ``needs`` names a condition without which the panel is legitimately empty: ``""`` (always
    has data on a healthy run), ``"gpu"`` (CUDA ranks), ``"alerts"`` (an alert is firing),
    ``"errors"`` (the exporter counted an error), ``"hang"`` (a hang episode is open),
    ``"deadline"`` (the job knows its wall-clock deadline and total steps), ``"sections"`` (an
    ``exporter.deadline`` section is running), ``"abort"`` (the run has ``on_hang="abort"``), ``"fleet"`` (the fleet group has evaluated once,
    ``fleet_interval``), ``"blame"`` (some node was blamed in a run, or a rank cost its run time).
    """

    title: str
    targets: tuple[Target, ...]
    kind: str = "timeseries"  # timeseries | bars | bargauge | stat | table
    unit: str = "short"
    description: str = ""
    width: int = 12
    height: int = 8
    needs: str = ""
    min: float | None = None
    max: float | None = None
    thresholds: tuple[tuple[str, float | None], ...] = ()


@dataclass(frozen=True)
class DashboardSpec:
    """Describe one dashboard: file stem, uid, title and panels."""

    stem: str
    uid: str
    title: str
    description: str
    panels: tuple[PanelSpec, ...] = field(default_factory=tuple)
    #: Start of the default time range (the fleet looks back days, the rest minutes).
    time_from: str = "now-30m"


@dataclass(frozen=True)
class Queries:
    """Write the PromQL of dashboard panels for one configuration."""

    cfg: MixinConfig

    @property
    def clauses(self) -> Clauses:
        """Return the writer of ``by``/``on`` clauses with the cluster label."""
        return clauses(self.cfg)

    def by(self, labels: str) -> str:
        """Return ``by (cluster, labels)``."""
        return self.clauses.by(labels)

    def on(self, labels: str) -> str:
        """Return ``on (cluster, labels)``."""
        return self.clauses.on(labels)

    def filtered(self, name: str, *matchers: str) -> str:
        """Return ``name{cluster=~"$cluster", matchers...}`` (empty matchers dropped)."""
        label = self.cfg.cluster_label
        cluster = f'{label}=~"$cluster"' if label else ""
        return f"{name}{{{', '.join(m for m in (cluster, *matchers) if m)}}}"

    def series(self, metric: catalog.MetricDef, suffix: str = "", *extra: str) -> str:
        """Return an exporter series with the configured selector, filtered on the variables."""
        return self.filtered(metric.name + suffix, self.cfg.selector, VARS, *extra)

    def rec(self, name: str, *extra: str) -> str:
        """Return a recorded series filtered on the dashboard variables."""
        return self.filtered(name, VARS, *extra)

    def up(self) -> str:
        """Return the ``up`` selector of the exporter's scrape targets (labels from file_sd)."""
        return self.filtered("up", self.cfg.selector, f"job={string(self.cfg.job)}", VARS)

    def mean(self, metric: catalog.MetricDef, by: str, *extra: str) -> str:
        """Return the mean per event of a histogram/summary over ``$__rate_interval``."""
        s, c = self.series(metric, "_sum", *extra), self.series(metric, "_count", *extra)
        return (
            f"sum {self.by(by)} (rate({s}[$__rate_interval]))\n/\n"
            f"sum {self.by(by)} (rate({c}[$__rate_interval]))"
        )

    def rate(self, metric: catalog.MetricDef, by: str) -> str:
        """Return a per-second rate of a counter over ``$__rate_interval``."""
        return f"sum {self.by(by)} (rate({self.series(metric)}[$__rate_interval]))"
