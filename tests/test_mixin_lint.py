"""Lint the generated rules and dashboards by the monitoring-mixin conventions.

The checks of ``mixtool lint`` and Grafana's dashboard-linter (neither installable from the
registries here), applied to every generated file:

- alerts: a CamelCase name of at most 40 characters, at most 20 rules per group, a severity of
  info/warning/critical, a plain-text ``summary`` that starts with a capital and ends with a
  period, a templated ``description``, a ``runbook_url``;
- rules and dashboards: the cluster label (``cluster_label``) kept in every aggregation and
  vector match (a dashboard may total or rank what its cluster variable selected), so that the same run name in two clusters stays two runs;
- dashboards: a uid and a title, a datasource variable and a cluster variable, every query on
  the datasource variable and filtered on the cluster and on the run (or node) variables (the
  exporter's job/instance: a run's ranks change scrape instance across restarts), rates over
  ``$__rate_interval``, a unit on every panel, counters only inside ``rate``/``increase``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from exporter.mixin.cluster import aggregations
from exporter.mixin.config import DEFAULT

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
#: Every generated rule file: the single server's, a shard's and the global server's, and the
#: Kubernetes PrometheusRule (its ``spec``).
RULE_FILES = [
    ROOT / "dashboards" / "prometheus" / "rules.yml",
    ROOT / "deploy" / "sharded" / "rules-shard.yml",
    ROOT / "deploy" / "sharded" / "rules-global.yml",
    ROOT / "deploy" / "kubernetes" / "prometheusrule.yaml",
]
#: Every generated dashboard: the JSON files and the Kubernetes ConfigMaps' copies.
DASHBOARDS = sorted((ROOT / "dashboards" / "grafana").glob("*.json")) + [
    ROOT / "deploy" / "kubernetes" / "grafana-dashboards.yaml"
]
LABEL = DEFAULT.cluster_label
_CAMEL = re.compile(r"^[A-Z][a-z0-9]*(?:[A-Z][a-z0-9]*)*$")
_CLAUSE = re.compile(r"\b(by|on) *\(([^()]*)\)")
# A counter selector and the function that encloses it: ``rate(ddp_steps_total{...}[1m])``.
_COUNTER = re.compile(r"(\w*)\(\s*(\w+_total)\b")
_RANGE = re.compile(r"\[([^\]]+)\]")


def _groups(path: Path) -> list[dict]:
    doc = yaml.safe_load(path.read_text())
    return (doc["spec"] if doc.get("kind") == "PrometheusRule" else doc)["groups"]


def _rules() -> list[tuple[str, dict]]:
    return [(g["name"], rule) for path in RULE_FILES for g in _groups(path) for rule in g["rules"]]


def _dashboards(path: Path) -> list[dict]:
    if path.suffix == ".json":
        return [json.loads(path.read_text())]
    maps = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return [json.loads(text) for m in maps for text in m["data"].values()]


def _cluster_problems(expr: str, totals: bool = False) -> list[str]:
    """Return each aggregation or vector match of ``expr`` that drops the cluster label.

    ``totals``: an aggregation without a clause is allowed (a dashboard's total or top N over
    what the cluster variable selected).
    """
    problems = []
    for op, mode, labels in aggregations(expr):
        if totals and not mode:
            continue
        if mode != "without" and LABEL not in labels:
            problems.append(f"{op} {mode} ({', '.join(labels)}) drops {LABEL}")
    for kind, labels in _CLAUSE.findall(expr):
        names = [name.strip() for name in labels.split(",") if name.strip()]
        if kind == "on" and LABEL not in names:
            problems.append(f"on ({labels}) matches across clusters")
    return problems


def test_alert_names_severities_and_annotations_follow_the_mixin_conventions() -> None:
    alerts = [(group, rule) for group, rule in _rules() if "alert" in rule]
    assert len(alerts) >= 17
    for _, rule in alerts:
        name, notes = rule["alert"], rule["annotations"]
        assert _CAMEL.match(name) and len(name) <= 40, name
        assert rule["labels"]["severity"] in ("info", "warning", "critical"), name
        summary = notes["summary"]
        assert "{{" not in summary and summary[0].isupper() and summary.endswith("."), (
            name,
            summary,
        )
        assert "{{" in notes["description"], (name, "description is not templated")
        assert notes["runbook_url"].startswith("https://"), name


def test_rule_groups_are_small_and_every_rule_keeps_the_cluster_label() -> None:
    for path in RULE_FILES:
        for group in _groups(path):
            assert len(group["rules"]) <= 20, (path.name, group["name"], len(group["rules"]))
    problems = {r.get("record") or r["alert"]: _cluster_problems(r["expr"]) for _, r in _rules()}
    assert not {k: v for k, v in problems.items() if v}


@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.stem for p in DASHBOARDS])
def test_dashboard_follows_the_dashboard_linter_rules(path: Path) -> None:
    for dash in _dashboards(path):
        _lint_dashboard(dash)


def _lint_dashboard(dash: dict) -> None:
    assert dash["uid"] and dash["title"], dash.get("title")
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert "cluster" in variables and variables["cluster"]["allValue"] == ".*"
    for name in ("cluster", "run", "node", "rank"):
        assert variables[name]["datasource"]["uid"] == "${datasource}", name
    problems = []
    for panel in dash["panels"]:
        title = panel["title"]
        if panel["type"] == "row":
            continue
        if not panel["fieldConfig"]["defaults"].get("unit"):
            problems.append(f"{title}: no unit")
        for target in panel["targets"]:
            expr = target["expr"]
            if target["datasource"]["uid"] != "${datasource}":
                problems.append(f"{title}: not on the datasource variable")
            if f'{LABEL}=~"$cluster"' not in expr:
                problems.append(f"{title}: not filtered on $cluster: {expr}")
            if not re.search(r'(run|node)=~"\$(run|node)"', expr):
                problems.append(f"{title}: not filtered on $run or $node: {expr}")
            problems += [f"{title}: {p}" for p in _cluster_problems(expr, totals=True)]
            for fn, counter in _COUNTER.findall(expr):
                if fn not in ("rate", "increase"):
                    problems.append(f"{title}: counter {counter} outside rate/increase")
            for window in _RANGE.findall(expr):
                # Raw series are rated over $__rate_interval; recorded windows are the rules'.
                if window != "$__rate_interval" and "rate(" in expr and ":" not in expr:
                    problems.append(f"{title}: fixed range [{window}]")
    assert not problems, "\n".join(problems)


def test_the_cluster_checks_bite_and_the_label_can_be_renamed_or_disabled() -> None:
    from dataclasses import replace

    from exporter.mixin import rules

    assert _cluster_problems("sum by (run) (x)") and _cluster_problems("a / on (run) b")
    assert _cluster_problems("max(x)") and not _cluster_problems("max(x)", totals=True)
    assert not _cluster_problems("sum by (cluster, run) (x) / on (cluster, run) y")
    assert not _cluster_problems("sum without (rank) (x)")

    def exprs(cfg) -> str:
        return "\n".join(r["expr"] for g in rules.rule_groups(cfg)["groups"] for r in g["rules"])

    assert "by (dc, run, rank)" in exprs(replace(DEFAULT, cluster_label="dc"))
    flat = exprs(replace(DEFAULT, cluster_label=""))
    assert "cluster" not in flat and "by (run, rank)" in flat
    for bad in ("bad-name", "run", "1x"):
        with pytest.raises(ValueError, match="cluster_label"):
            replace(DEFAULT, cluster_label=bad)


@pytest.mark.parametrize("label", ["cluster", "dc", ""])
def test_every_clause_is_written_with_the_cluster_label(label: str) -> None:
    """Nothing is patched in afterwards: adding the label to what was built changes nothing."""
    from dataclasses import replace

    from exporter.mixin import dashboards, rules
    from exporter.mixin.cluster import scoped

    cfg = replace(DEFAULT, cluster_label=label)
    panels = [t.expr for d in dashboards.dashboard_specs(cfg) for p in d.panels for t in p.targets]
    exprs = [r["expr"] for g in rules.rule_groups(cfg)["groups"] for r in g["rules"]] + panels
    assert len(exprs) > 100
    assert [e for e in exprs if scoped(cfg, e) != e] == []
    if label:  # every panel filters on the cluster variable too
        assert all(f'{label}=~"$cluster"' in e for e in panels)
