"""Render dashboard specs as Grafana 11/12 dashboard JSON, with grafanalib.

One function turns a :class:`~exporter.mixin.dashboards.panels.DashboardSpec` into grafanalib
objects and lays its panels out on the 24-column grid; the template variables (datasource,
cluster, run, node, rank) head every dashboard. Every datasource reference is ``{"type":
"prometheus", "uid": "${datasource}"}`` and the datasource variable defaults to the
provisioned fixed uid. What grafanalib still writes for Grafana < 7 is left out
(:func:`modernize`).
"""

from __future__ import annotations

import json
from typing import Any

from grafanalib import core as g
from grafanalib._gen import DashboardEncoder

from ... import catalog
from ..alert import selector
from ..config import DEFAULT, MixinConfig
from .panels import DashboardSpec, PanelSpec

__all__ = [
    "BUILTIN_ANNOTATION",
    "DATASOURCE",
    "LEGACY_KEYS",
    "SCHEMA_VERSION",
    "build",
    "json_roundtrip",
    "modernize",
]

#: Dashboard JSON schema version of Grafana 11.0, so every Grafana 11 loads it as is. Grafana 12's
#: later steps (40: string refresh, 41: drop timepicker.time_options, 42: hideFrom.tooltip in
#: overrides) change nothing in these dashboards; tests/test_mixin_dashboards.py checks that.
SCHEMA_VERSION = 39

#: Datasource reference used by every panel, target and query variable.
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def _thresholds(spec: PanelSpec) -> dict[str, Any]:
    """Return a Grafana thresholds object (first step has value null)."""
    steps = spec.thresholds or (("green", None),)
    return {"mode": "absolute", "steps": [{"color": c, "value": v} for c, v in steps]}


def _panel(spec: PanelSpec, pos: g.GridPos, panel_id: int) -> g.Panel:
    """Return the grafanalib panel of ``spec`` at ``pos``."""
    if not spec.description or not spec.unit:
        # Grafana shows the description as the panel's (i) tooltip: the only help a reader gets.
        raise ValueError(f"panel {spec.title!r} needs a description and a unit")
    instant = spec.kind in ("bargauge", "table")
    targets = [
        g.Target(
            expr=t.expr,
            legendFormat=t.legend,
            refId=chr(ord("A") + i),
            datasource=DATASOURCE,
            instant=instant,
            format="table" if spec.kind == "table" else "time_series",
            intervalFactor=1,
        )
        for i, t in enumerate(spec.targets)
    ]
    defaults: dict[str, Any] = {
        "unit": spec.unit,
        "thresholds": _thresholds(spec),
        "color": {"mode": "thresholds" if spec.kind in ("stat", "bargauge") else "palette-classic"},
    }
    if spec.min is not None:
        defaults["min"] = spec.min
    if spec.max is not None:
        defaults["max"] = spec.max
    common: dict[str, Any] = {
        "title": spec.title,
        "description": spec.description or None,
        "dataSource": DATASOURCE,
        "targets": targets,
        "gridPos": pos,
        "id": panel_id,
        "maxDataPoints": None,
    }
    extra: dict[str, Any] = {"fieldConfig": {"defaults": defaults, "overrides": []}}
    if spec.kind in ("timeseries", "bars"):
        return g.TimeSeries(
            **common,
            unit=spec.unit,
            drawStyle="bars" if spec.kind == "bars" else "line",
            fillOpacity=80 if spec.kind == "bars" else 10,
            stacking={"mode": "normal", "group": "A"} if spec.kind == "bars" else {},
            legendDisplayMode="table",
            legendPlacement="right" if spec.width == 24 else "bottom",
            legendCalcs=["lastNotNull", "max"],
            tooltipMode="multi",
            tooltipSort="desc",
            extraJson=extra,
        )
    if spec.kind == "stat":
        return g.Stat(
            **common,
            format=spec.unit,
            reduceCalc="lastNotNull",
            graphMode="area",
            noValue="0",
            extraJson=extra,
        )
    if spec.kind == "bargauge":
        extra["options"] = {
            "displayMode": "gradient",
            "orientation": "horizontal",
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "showUnfilled": True,
            "minVizHeight": 10,
            "minVizWidth": 0,
            "valueMode": "color",
            "namePlacement": "auto",
            "sizing": "auto",
        }
        return g.BarGauge(
            **common,
            format=spec.unit,
            min=spec.min if spec.min is not None else 0,
            max=spec.max if spec.max is not None else 100,
            displayMode=g.GAUGE_DISPLAY_MODE_GRADIENT,
            thresholds=[],
            extraJson=extra,
        )
    if spec.kind == "table":
        extra["transformations"] = [
            {"id": "organize", "options": {"excludeByName": {"Time": True, "__name__": True}}}
        ]
        return g.Table(**common, unit=spec.unit, extraJson=extra)
    raise ValueError(f"unknown panel kind {spec.kind!r}")


def _layout(specs: tuple[PanelSpec, ...]) -> list[g.GridPos]:
    """Return grid positions filling rows of 24 columns left to right."""
    out, x, y, row_h = [], 0, 0, 0
    for spec in specs:
        if x + spec.width > 24:
            x, y, row_h = 0, y + row_h, 0
        out.append(g.GridPos(h=spec.height, w=spec.width, x=x, y=y))
        x += spec.width
        row_h = max(row_h, spec.height)
    return out


def _variables(cfg: MixinConfig) -> list[g.Template]:
    """Return the template variables: datasource, cluster (unless disabled), run, node, rank."""
    info = catalog.RANK_INFO.name
    extra = f"{cfg.selector}, " if cfg.selector else ""

    def query_var(name: str, label: str, query: str) -> g.Template:
        return g.Template(
            name=name,
            label=label,
            query=query,
            dataSource=DATASOURCE,
            includeAll=True,
            multi=True,
            allValue=".*",
            default="$__all",
            refresh=g.REFRESH_ON_TIME_RANGE_CHANGE,
        )

    datasource = g.Template(
        name="datasource",
        label="Data source",
        query="prometheus",
        type="datasource",
        default=cfg.datasource_uid,
    )
    label = cfg.cluster_label
    if label:  # every other variable lists the chosen clusters' values only
        extra += f'{label}=~"$cluster", '
    variables = [
        datasource,
        query_var("run", "Run", f"label_values({info}{{{extra.rstrip(', ')}}}, run)"),
        query_var("node", "Node", f'label_values({info}{{{extra}run=~"$run"}}, node)'),
        query_var(
            "rank", "Rank", f'label_values({info}{{{extra}run=~"$run", node=~"$node"}}, rank)'
        ),
    ]
    if label:
        # All matches an absent label too: one Prometheus per cluster has no cluster label.
        variables.insert(
            1, query_var("cluster", "Cluster", f"label_values({selector(cfg, info)}, {label})")
        )
    return variables


def build(spec: DashboardSpec, cfg: MixinConfig = DEFAULT) -> dict[str, Any]:
    """Return the Grafana JSON model of one dashboard spec."""
    panels = [
        _panel(p, pos, i + 1) for i, (p, pos) in enumerate(zip(spec.panels, _layout(spec.panels)))
    ]
    dash = g.Dashboard(
        title=spec.title,
        uid=spec.uid,
        description=spec.description,
        tags=["ddp-exporter"],
        timezone="browser",
        refresh=cfg.dashboard_refresh,
        time=g.Time(spec.time_from, "now"),
        schemaVersion=SCHEMA_VERSION,
        sharedCrosshair=True,
        templating=g.Templating(list=_variables(cfg)),
        links=[
            g.DashboardLink(
                title="DDP dashboards",
                type="dashboards",
                tags=["ddp-exporter"],
                asDropdown=True,
                includeVars=True,
                keepTime=True,
            )
        ],
        panels=panels,
    ).auto_panel_ids()
    data = json_roundtrip(dash)
    data["id"] = None
    data["version"] = 1
    for var in data["templating"]["list"]:
        if var["includeAll"]:  # Grafana's shape of a multi-value "All" selection
            var["current"] = {"selected": True, "text": ["All"], "value": ["$__all"]}
    return modernize(data)


#: Keys grafanalib still writes for Grafana < 7 (Angular graph/table/singlestat era); Grafana
#: 11/12 ignore or migrate them, so the generated JSON leaves them out.
LEGACY_KEYS: dict[str, tuple[str, ...]] = {
    "dashboard": ("rows", "style", "hideControls", "sharedCrosshair", "__inputs", "gnetId"),
    "timepicker": ("time_options", "nowDelay"),
    "panel": ("span", "minSpan", "height", "error", "cacheTimeout", "editable"),
    # The old React table kept these at panel level; now they live in fieldConfig/options.
    "table": ("columns", "fontSize", "mappings", "color"),
    # Gauge options grafanalib puts on bar gauges; fieldOptions is the pre-7 bar gauge model.
    "bargauge": ("fieldOptions", "showThresholdLabels", "showThresholdMarkers"),
    "target": ("query", "target", "metric", "step"),
    "variable": ("useTags", "tagsQuery", "tagValuesQuery", "auto", "auto_min", "auto_count"),
}

#: The annotation every dashboard saved by Grafana carries (alerts and annotations overlay).
BUILTIN_ANNOTATION = {
    "builtIn": 1,
    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
    "enable": True,
    "hide": True,
    "iconColor": "rgba(0, 211, 255, 1)",
    "name": "Annotations & Alerts",
    "type": "dashboard",
}


def _drop_nulls(obj: Any) -> Any:
    """Return ``obj`` without ``null`` values, except a threshold step's base ``value: null``."""
    if isinstance(obj, dict):
        is_step = "color" in obj and "value" in obj
        return {
            k: _drop_nulls(v) for k, v in obj.items() if v is not None or (is_step and k == "value")
        }
    if isinstance(obj, list):
        return [_drop_nulls(v) for v in obj]
    return obj


def modernize(data: dict[str, Any]) -> dict[str, Any]:
    """Return grafanalib's dashboard JSON as Grafana 11/12 saves it: no legacy keys, no nulls."""
    for key in LEGACY_KEYS["dashboard"]:
        data.pop(key, None)
    for key in LEGACY_KEYS["timepicker"]:
        data.get("timepicker", {}).pop(key, None)
    # sharedCrosshair=True in the pre-schema model is graphTooltip 1 (shared crosshair) today.
    data["graphTooltip"] = 1
    data["annotations"] = {"list": [dict(BUILTIN_ANNOTATION)]}
    for panel in data["panels"]:
        for key in LEGACY_KEYS["panel"]:
            panel.pop(key, None)
        if panel["type"] == "table":
            for key in LEGACY_KEYS["table"]:
                panel.pop(key, None)
        if panel["type"] == "bargauge":
            for key in LEGACY_KEYS["bargauge"]:
                panel["options"].pop(key, None)
        if panel["type"] == "timeseries":
            panel["options"]["legend"]["showLegend"] = True
        for target in panel["targets"]:
            for key in LEGACY_KEYS["target"]:
                target.pop(key, None)
    for var in data["templating"]["list"]:
        for key in LEGACY_KEYS["variable"]:
            var.pop(key, None)
        var.get("current", {}).pop("tags", None)
    return _drop_nulls(data)


def json_roundtrip(obj: Any) -> dict[str, Any]:
    """Return grafanalib objects as plain JSON-compatible data."""
    return json.loads(json.dumps(obj, cls=DashboardEncoder))
