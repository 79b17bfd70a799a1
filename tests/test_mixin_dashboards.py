"""Test the generated Grafana dashboards: structure Grafana 11/12 loads, and valid PromQL."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from promstack import require

from exporter import catalog
from exporter.mixin import dashboards, rules
from exporter.mixin.config import DEFAULT

DS = {"type": "prometheus", "uid": "${datasource}"}
BUILT = {d.stem: dashboards.build(d, DEFAULT) for d in dashboards.dashboard_specs(DEFAULT)}

#: Values the dashboard variables take when the live and parse tests run the queries.
SUBSTITUTE = {
    "$__rate_interval": "15s",
    "$cluster": ".*",
    "$run": ".*",
    "$rank": ".*",
    "$node": ".*",
}


def substitute(expr: str) -> str:
    """Return ``expr`` with Grafana variables replaced by concrete values."""
    for var, value in SUBSTITUTE.items():
        expr = expr.replace(var, value)
    return expr


@pytest.mark.unit
def test_seven_dashboards_with_fixed_uids() -> None:
    stems = {"overview", "stragglers", "collectives", "memory", "liveness", "goodput", "fleet"}
    assert set(BUILT) == stems
    uids = {d["uid"] for d in BUILT.values()}
    assert len(uids) == 7 and all(u.startswith("ddp-") for u in uids)


@pytest.mark.unit
@pytest.mark.parametrize("stem", sorted(BUILT))
def test_dashboard_loads_in_grafana_11(stem: str) -> None:
    dash = BUILT[stem]
    assert dash["schemaVersion"] == dashboards.SCHEMA_VERSION >= 39
    assert "id" not in dash and dash["title"].startswith("DDP / ")
    names = [v["name"] for v in dash["templating"]["list"]]
    assert names == ["datasource", "cluster", "run", "node", "rank"]
    ds_var = dash["templating"]["list"][0]
    assert ds_var["type"] == "datasource" and ds_var["query"] == "prometheus"
    assert ds_var["current"]["value"] == DEFAULT.datasource_uid
    for var in dash["templating"]["list"][1:]:
        assert var["datasource"] == DS
        assert catalog.RANK_INFO.name in var["query"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in dash["panels"]:
        assert panel["type"] in {"timeseries", "stat", "bargauge", "table"}
        assert panel["datasource"] == DS, panel["title"]
        pos = panel["gridPos"]
        assert 0 <= pos["x"] and pos["x"] + pos["w"] <= 24
        mine = {
            (x, y)
            for x in range(pos["x"], pos["x"] + pos["w"])
            for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not cells & mine, f"overlap at {panel['title']}"
        cells |= mine
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DS
            assert target["expr"] and target["refId"]


@pytest.mark.unit
def test_overview_has_the_required_panels() -> None:
    exprs = " ".join(t["expr"] for p in BUILT["overview"]["panels"] for t in p["targets"])
    types = {p["title"]: p["type"] for p in BUILT["overview"]["panels"]}
    assert "ALERTS" in exprs and "up{" in exprs
    assert rules.recorded(DEFAULT).straggler_score in exprs
    assert types["Straggler score per rank"] == "bargauge"
    assert catalog.STEPS.name in exprs and catalog.STEP_DURATION.name in exprs


@pytest.mark.unit
def test_panels_cover_their_topics() -> None:
    def exprs(stem: str) -> str:
        return " ".join(t["expr"] for p in BUILT[stem]["panels"] for t in p["targets"])

    assert catalog.STEP_PHASE.name in exprs("stragglers")
    for m in (
        catalog.COLLECTIVE_DURATION,
        catalog.COLLECTIVE_BYTES,
        catalog.INFLIGHT_AGE,
        catalog.COLLECTIVE_TIMEOUT,
        catalog.LAST_ENQUEUED_SEQ,
    ):
        assert m.name in exprs("collectives")
    for m in (
        catalog.GPU_MEM_ALLOCATED,
        catalog.GPU_MEM_RESERVED,
        catalog.GPU_MEM_PEAK,
        catalog.GPU_MEM_TOTAL,
        catalog.HOST_MEM_RESIDENT,
    ):
        assert m.name in exprs("memory")
    fleet = exprs("fleet")
    assert "DDPSuspectNode" in fleet and 'node=~"$node"' in fleet
    assert BUILT["fleet"]["time"]["from"] == f"now-{DEFAULT.fleet_window}"
    goodput = exprs("goodput")
    r = rules.recorded(DEFAULT)
    for name in (r.ettr, r.ettr_short, r.ettr_long, r.goodput_short, r.goodput, r.blame_long):
        assert name in goodput, name
    assert r.blame_node in goodput  # which node cost the most hours
    live = exprs("liveness")
    assert f"time() - max by (cluster, run, rank) ({catalog.HEARTBEAT.name}" in live
    assert catalog.PEER_HEARTBEAT_AGE.name in live and "up{" in live


@pytest.mark.unit
def test_every_metric_name_comes_from_the_catalog_or_a_rule() -> None:
    groups = rules.rule_groups(DEFAULT)["groups"]
    recorded = {r["record"] for g in groups for r in g["rules"] if "record" in r}
    known = {"up", "ALERTS"}
    for m in catalog.METRICS:
        known |= {m.name, f"{m.name}_sum", f"{m.name}_count", f"{m.name}_bucket"}
    for dash in BUILT.values():
        for panel in dash["panels"]:
            for t in panel["targets"]:
                for token in re.findall(r"[a-z_]+(?::[a-z0-9_]+)+|\bddp_[a-z0-9_]+", t["expr"]):
                    assert token in recorded or token in known, (token, panel["title"])


@pytest.mark.tool
def test_every_panel_query_parses(tmp_path: Path) -> None:
    """Feed every panel query to promtool as a recording rule: it parses each one."""
    promtool = require("promtool")
    exprs = [
        substitute(t["expr"]) for d in BUILT.values() for p in d["panels"] for t in p["targets"]
    ]
    exprs += [
        substitute(re.sub(r"^label_values\((.*), \w+\)$", r"\1", v["query"]))
        for v in BUILT["overview"]["templating"]["list"][1:]
    ]
    groups = {
        "groups": [
            {
                "name": "panels",
                "rules": [{"record": f"panel:query:{i}", "expr": e} for i, e in enumerate(exprs)],
            }
        ]
    }
    path = tmp_path / "panels.yml"
    path.write_text(yaml.safe_dump(groups))
    proc = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.unit
def test_committed_json_is_the_rendered_json() -> None:
    root = Path(__file__).resolve().parents[1] / "dashboards" / "grafana"
    for stem, dash in BUILT.items():
        assert json.loads((root / f"{stem}.json").read_text()) == dash


# --- Grafana 11/12 readiness ---------------------------------------------------------------

#: Panel plugins built into Grafana 11/12 as React panels (no Angular, no external plugin).
CORE_REACT_PANELS = {
    "timeseries",
    "stat",
    "bargauge",
    "gauge",
    "table",
    "barchart",
    "piechart",
    "heatmap",
    "histogram",
    "state-timeline",
    "status-history",
    "text",
    "logs",
    "nodeGraph",
    "xychart",
    "trend",
    "candlestick",
    "canvas",
    "geomap",
    "news",
    "dashlist",
    "alertlist",
    "annolist",
}

#: The grafana-foundation-sdk build whose models are Grafana 12's schema (dashboard
#: schemaVersion 42). The same name without a pin resolves to an epoch-versioned Grafana 10.1
#: build, so pyproject pins it and this test refuses anything else.
FOUNDATION_SDK = "0.0.21"


def _walk(obj: object, path: str = ""):
    """Yield ``(path, key, value)`` of every dict entry below ``obj``."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield path, key, value
            yield from _walk(value, f"{path}/{key}")
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            yield from _walk(value, f"{path}[{i}]")


@pytest.mark.unit
@pytest.mark.parametrize("stem", sorted(BUILT))
def test_no_legacy_keys_grafana_would_migrate(stem: str) -> None:
    dash = BUILT[stem]
    for key in dashboards.LEGACY_KEYS["dashboard"]:
        assert key not in dash, key  # e.g. a top-level rows: [] is the pre-5 row layout
    assert not set(dashboards.LEGACY_KEYS["timepicker"]) & set(dash.get("timepicker", {}))
    assert dash["graphTooltip"] == 1
    for panel in dash["panels"]:
        assert panel["type"] in CORE_REACT_PANELS, panel["type"]
        legacy = [k for k in ("panel", panel["type"]) if k in dashboards.LEGACY_KEYS]
        for group in legacy:
            for key in dashboards.LEGACY_KEYS[group]:
                assert key not in panel and key not in panel.get("options", {}), (
                    panel["title"],
                    key,
                )
        thresholds = panel["fieldConfig"]["defaults"]["thresholds"]
        assert isinstance(thresholds["steps"], list) and thresholds["steps"], panel["title"]
        assert thresholds["steps"][0]["value"] is None  # the base step
        assert all(isinstance(s["value"], (int, float)) for s in thresholds["steps"][1:])
        for target in panel["targets"]:
            assert not set(dashboards.LEGACY_KEYS["target"]) & set(target), panel["title"]
    for var in dash["templating"]["list"]:
        assert not set(dashboards.LEGACY_KEYS["variable"]) & set(var), var["name"]
    # null means "unset" only for a threshold's base step; anywhere else it is a legacy default
    nulls = [f"{p}/{k}" for p, k, v in _walk(dash) if v is None and k != "value"]
    assert nulls == []


@pytest.mark.unit
@pytest.mark.parametrize("stem", sorted(BUILT))
def test_grafana_12_schema_migrations_change_nothing(stem: str) -> None:
    """Grafana 12 migrates schemaVersion 39 up to 42; each of those steps must be a no-op here.

    The steps (Grafana's dashboard schemaversion migrations): 40 replaces a non-string
    ``refresh`` by "", 41 deletes ``timepicker.time_options``, 42 adds ``tooltip: true`` to a
    ``custom.hideFrom`` override that hides a field from the visualisation.
    """
    dash = BUILT[stem]
    assert dash["schemaVersion"] == 39
    assert isinstance(dash["refresh"], str) and dash["refresh"]
    assert "time_options" not in dash.get("timepicker", {})
    for panel in dash["panels"]:
        for override in panel["fieldConfig"].get("overrides", []):
            for prop in override.get("properties", []):
                assert prop["id"] != "custom.hideFrom", panel["title"]


@pytest.mark.unit
@pytest.mark.parametrize("stem", sorted(BUILT))
def test_every_panel_has_a_description_and_a_unit(stem: str) -> None:
    for panel in BUILT[stem]["panels"]:
        assert len(panel.get("description", "")) > 20, panel["title"]
        assert panel["fieldConfig"]["defaults"].get("unit"), panel["title"]


@pytest.mark.unit
def test_a_panel_without_a_description_is_refused() -> None:
    spec = dashboards.DashboardSpec(
        "x", "ddp-x", "DDP / X", "test", (dashboards.PanelSpec("bare", (dashboards.Target("up"),)),)
    )
    with pytest.raises(ValueError, match="needs a description"):
        dashboards.build(spec)


@pytest.mark.unit
def test_every_rate_uses_rate_interval() -> None:
    """rate()/irate()/increase() over a counter must span $__rate_interval (4 scrapes at any zoom)."""
    ranges = re.compile(r"\b(rate|irate|increase)\(([^()]*?)\[([^\]]+)\]\)")
    checked = 0
    for dash in BUILT.values():
        for panel in dash["panels"]:
            for target in panel["targets"]:
                expr = target["expr"]
                calls = len(re.findall(r"\b(?:rate|irate|increase)\(", expr))
                found = ranges.findall(expr)
                assert len(found) == calls, (panel["title"], expr)  # every call was matched
                for func, _, window in found:
                    assert window == "$__rate_interval", (panel["title"], func, window)
                checked += len(found)
    assert checked > 10


@pytest.mark.unit
@pytest.mark.skipif(sys.version_info < (3, 11), reason="grafana-foundation-sdk needs Python 3.11")
@pytest.mark.filterwarnings("ignore:Prefer using dashboardv2:DeprecationWarning")
@pytest.mark.parametrize("stem", sorted(BUILT))
def test_round_trips_through_grafana_12_models(stem: str) -> None:
    """Load each dashboard into Grafana's own generated models; nothing may be lost or changed."""
    assert metadata.version("grafana-foundation-sdk").lstrip("v") == FOUNDATION_SDK
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.cog.plugins import register_default_plugins
    from grafana_foundation_sdk.models import prometheus
    from grafana_foundation_sdk.models.dashboard import Dashboard

    register_default_plugins()
    dash = json.loads(json.dumps(BUILT[stem]))
    model = Dashboard.from_json(dash)
    back = json.loads(json.dumps(model, cls=JSONEncoder))
    lost = _lost(dash, back)
    assert lost == [], lost  # the SDK only ADDS keys: the schema's defaults
    for src, panel in zip(dash["panels"], model.panels):
        # options parsed by the panel plugin's own model: a known, core panel type
        assert type(panel.options).__module__.endswith(f".models.{src['type']}"), src["type"]
        assert all(isinstance(t, prometheus.Dataquery) for t in panel.targets), src["title"]


def _lost(a: object, b: object, path: str = "") -> list[str]:
    """Return what of ``a`` is missing or different in ``b`` (keys ``b`` adds are fine)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [
            m
            for k, v in a.items()
            for m in ([f"dropped {path}/{k}"] if k not in b else _lost(v, b[k], f"{path}/{k}"))
        ]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [m for i, (x, y) in enumerate(zip(a, b)) for m in _lost(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"changed {path}: {a!r} -> {b!r}"]
