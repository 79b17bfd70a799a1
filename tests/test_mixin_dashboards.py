"""Test the generated Grafana dashboards: structure Grafana 11/12 loads, and valid PromQL."""

from __future__ import annotations

import json
import re
import subprocess
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
SUBSTITUTE = {"$__rate_interval": "15s", "$run": ".*", "$rank": ".*", "$node": ".*"}


def substitute(expr: str) -> str:
    """Return ``expr`` with Grafana variables replaced by concrete values."""
    for var, value in SUBSTITUTE.items():
        expr = expr.replace(var, value)
    return expr


def test_five_dashboards_with_fixed_uids() -> None:
    assert set(BUILT) == {"overview", "stragglers", "collectives", "memory", "liveness"}
    uids = {d["uid"] for d in BUILT.values()}
    assert len(uids) == 5 and all(u.startswith("ddp-") for u in uids)


@pytest.mark.parametrize("stem", sorted(BUILT))
def test_dashboard_loads_in_grafana_11(stem: str) -> None:
    dash = BUILT[stem]
    assert dash["schemaVersion"] == dashboards.SCHEMA_VERSION >= 39
    assert dash["id"] is None and dash["title"].startswith("DDP / ")
    names = [v["name"] for v in dash["templating"]["list"]]
    assert names == ["datasource", "run", "node", "rank"]
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


def test_overview_has_the_required_panels() -> None:
    exprs = " ".join(t["expr"] for p in BUILT["overview"]["panels"] for t in p["targets"])
    types = {p["title"]: p["type"] for p in BUILT["overview"]["panels"]}
    assert "ALERTS" in exprs and "up{" in exprs
    assert rules.recorded(DEFAULT).straggler_score in exprs
    assert types["Straggler score per rank"] == "bargauge"
    assert catalog.STEPS.name in exprs and catalog.STEP_DURATION.name in exprs


def test_panels_cover_their_topics() -> None:
    def exprs(stem: str) -> str:
        return " ".join(t["expr"] for p in BUILT[stem]["panels"] for t in p["targets"])

    assert catalog.STEP_PHASE.name in exprs("stragglers")
    for m in (catalog.COLLECTIVE_DURATION, catalog.COLLECTIVE_BYTES, catalog.INFLIGHT_AGE,
              catalog.COLLECTIVE_TIMEOUT, catalog.LAST_ENQUEUED_SEQ):  # fmt: skip
        assert m.name in exprs("collectives")
    for m in (catalog.GPU_MEM_ALLOCATED, catalog.GPU_MEM_RESERVED, catalog.GPU_MEM_PEAK,
              catalog.GPU_MEM_TOTAL, catalog.HOST_MEM_RESIDENT):  # fmt: skip
        assert m.name in exprs("memory")
    live = exprs("liveness")
    assert f"time() - max by (run, rank) ({catalog.HEARTBEAT.name}" in live
    assert catalog.PEER_HEARTBEAT_AGE.name in live and "up{" in live


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


def test_every_panel_query_parses(tmp_path: Path) -> None:
    """Feed every panel query to promtool as a recording rule: it parses each one."""
    promtool = require("promtool")
    exprs = [
        substitute(t["expr"]) for d in BUILT.values() for p in d["panels"] for t in p["targets"]
    ]
    exprs += [substitute(re.sub(r"^label_values\((.*), \w+\)$", r"\1", v["query"]))
              for v in BUILT["overview"]["templating"]["list"][1:]]  # fmt: skip
    groups = {"groups": [{"name": "panels", "rules": [
        {"record": f"panel:query:{i}", "expr": e} for i, e in enumerate(exprs)]}]}  # fmt: skip
    path = tmp_path / "panels.yml"
    path.write_text(yaml.safe_dump(groups))
    proc = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_committed_json_is_the_rendered_json() -> None:
    root = Path(__file__).resolve().parents[1] / "dashboards" / "grafana"
    for stem, dash in BUILT.items():
        assert json.loads((root / f"{stem}.json").read_text()) == dash
