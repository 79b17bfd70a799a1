"""Build the Grafana dashboards: one module per dashboard, one renderer.

Each dashboard module (:mod:`.overview`, :mod:`.stragglers`, :mod:`.collectives`,
:mod:`.memory`, :mod:`.liveness`, :mod:`.goodput`, :mod:`.fleet`) has ``dashboard(cfg)``, a thin spec:
panels with their PromQL, written by :class:`~.panels.Queries` with every selector filtered on
the template variables and every clause keeping the cluster label. :mod:`.grafana` renders a
spec as the JSON model Grafana 11 and 12 load.
"""

from __future__ import annotations

from ..config import DEFAULT, MixinConfig
from ..render import dump_json
from . import collectives, fleet, goodput, liveness, memory, overview, stragglers
from .grafana import (
    BUILTIN_ANNOTATION,
    DATASOURCE,
    LEGACY_KEYS,
    SCHEMA_VERSION,
    build,
    json_roundtrip,
    modernize,
)
from .panels import TOP_RANKS, VARS, DashboardSpec, PanelSpec, Target

__all__ = [
    "BUILTIN_ANNOTATION",
    "DASHBOARDS",
    "DATASOURCE",
    "LEGACY_KEYS",
    "SCHEMA_VERSION",
    "TOP_RANKS",
    "VARS",
    "DashboardSpec",
    "PanelSpec",
    "Target",
    "build",
    "dashboard_specs",
    "json_roundtrip",
    "modernize",
    "render_dashboards",
]


#: The dashboard modules, in the order of the dashboards' links and reference page.
DASHBOARDS = (overview, stragglers, collectives, memory, liveness, goodput, fleet)


def dashboard_specs(cfg: MixinConfig = DEFAULT) -> tuple[DashboardSpec, ...]:
    """Return every dashboard as a spec."""
    return tuple(module.dashboard(cfg) for module in DASHBOARDS)


def render_dashboards(cfg: MixinConfig = DEFAULT) -> dict[str, str]:
    """Return ``{file name: JSON text}`` of every dashboard."""
    return {f"{d.stem}.json": dump_json(build(d, cfg)) for d in dashboard_specs(cfg)}
