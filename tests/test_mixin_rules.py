"""Test the generated Prometheus rules with promtool: syntax, and unit tests of every alert."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from promstack import require

from exporter import catalog
from exporter.deploy import sharding
from exporter.mixin import rules
from exporter.mixin.config import DEFAULT, FAST, MixinConfig

PROMTOOL_TESTS = Path(__file__).parent / "promtool"
UNIT_FILES = sorted(PROMTOOL_TESTS.glob("*.yml"))


def _write_fast_rules(directory: Path) -> None:
    """Write the FAST rules twice: without annotations (behaviour tests) and with them."""
    (directory / "rules_annotated.yml").write_text(rules.render_rules(FAST))
    groups = rules.rule_groups(FAST)
    for group in groups["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (directory / "rules.yml").write_text(yaml.safe_dump(groups, sort_keys=False))
    # The global server of a sharded setup: the fleet group alone (tests/promtool/federated.yml).
    fleet = sharding.global_rule_groups(FAST)
    for rule in fleet["groups"][0]["rules"]:
        rule.pop("annotations", None)
    (directory / "rules_global.yml").write_text(yaml.safe_dump(fleet, sort_keys=False))


@pytest.mark.tool
@pytest.mark.parametrize("cfg", [DEFAULT, FAST], ids=["default", "fast"])
def test_promtool_check_rules(tmp_path: Path, cfg: MixinConfig) -> None:
    promtool = require("promtool")
    path = tmp_path / "rules.yml"
    path.write_text(rules.render_rules(cfg))
    proc = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


#: Job names may be any string, quoted where an expression names them; the selector any list of
#: label matchers PromQL reads, with what a template must not take literally (%, braces).
ODD_STRINGS = MixinConfig(
    job='train "a"\\b\nc',
    federate_job="fed'\"{{x}}",
    selector='env="a\\"b%c{{d}}", tier!~\'x|y\'',
)


@pytest.mark.tool
def test_promtool_parses_the_rules_whatever_the_job_names_and_the_selector(tmp_path: Path) -> None:
    promtool = require("promtool")
    files = {"rules.yml": rules.render_rules(ODD_STRINGS), **sharding.render_sharded(ODD_STRINGS)}
    for name, text in files.items():
        if not name.endswith("rules.yml") and "/rules-" not in name:
            continue
        path = tmp_path / name.replace("/", "_")
        path.write_text(text)
        proc = subprocess.run(
            [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 0, name + proc.stdout + proc.stderr


@pytest.mark.tool
@pytest.mark.parametrize("unit", UNIT_FILES, ids=[p.stem for p in UNIT_FILES])
def test_promtool_unit(tmp_path: Path, unit: Path) -> None:
    promtool = require("promtool")
    _write_fast_rules(tmp_path)
    shutil.copy(unit, tmp_path / unit.name)
    proc = subprocess.run(
        [promtool, "test", "rules", unit.name],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.unit
def test_every_alert_has_positive_and_negative_unit_cases() -> None:
    positive: set[str] = set()
    negative: set[str] = set()
    for unit in UNIT_FILES:
        for test in yaml.safe_load(unit.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                (positive if case.get("exp_alerts") else negative).add(case["alertname"])
    assert set(rules.ALERT_NAMES) <= positive, set(rules.ALERT_NAMES) - positive
    assert set(rules.ALERT_NAMES) <= negative, set(rules.ALERT_NAMES) - negative


@pytest.mark.unit
def test_alert_contract() -> None:
    for alert in rules.every_alert(DEFAULT):
        rule = alert.rule(DEFAULT)
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}
        ann = rule["annotations"]
        assert ann["summary"] and "{{" not in ann["summary"], alert.name
        if alert.name in rules.FLEET_ALERTS:
            # About a node across runs: it names the node, never one run or rank.
            assert "{{ $labels.node }}" in ann["description"], alert.name
            assert "$labels.run" not in ann["description"], alert.name
        elif alert.name in rules.MONITORING_ALERTS:
            assert "{{ $labels.instance }}" in ann["description"], alert.name
        else:
            assert "{{ $labels.run }}" in ann["description"], alert.name
        # A condition of one rank names it; a condition of the run is one alert without rank.
        if alert.name not in (*rules.RUN_ALERTS, *rules.FLEET_ALERTS, *rules.MONITORING_ALERTS):
            assert "{{ $labels.rank }}" in ann["description"], alert.name
        assert ann["runbook_url"] == f"{DEFAULT.runbook_base_url}#{alert.name.lower()}"
    names = [a.name for a in rules.every_alert(DEFAULT)]
    assert set(names) == set(rules.ALERT_NAMES)
    groups = rules.rule_groups(DEFAULT)["groups"]
    in_groups = [r["alert"] for g in groups for r in g["rules"] if "alert" in r]
    assert sorted(set(in_groups)) == sorted(set(names))  # each alert in exactly one group
    assert len([a for a in in_groups if a == "DDPSuspectNode"]) == 1


@pytest.mark.unit
def test_timeout_imminent_has_warning_and_critical_levels() -> None:
    levels = {a.severity for a in rules.alerts(DEFAULT) if a.name == "DDPCollectiveTimeoutImminent"}
    assert levels == {"warning", "critical"}


@pytest.mark.unit
def test_straggler_never_blames_collective_latency() -> None:
    (straggler,) = [a for a in rules.alerts(DEFAULT) if a.name == "DDPRankStraggler"]
    assert catalog.COLLECTIVE_DURATION.name not in straggler.expr
    by_phase, *by_link = straggler.expr.split("\nor\n")
    assert "comm_wait" not in by_phase and '"cause"' in by_phase
    # cause=link blames by store round trip (behind the link, or the store's own node's);
    # exposed communication only gates it (the job waits), the same on every rank of a job
    # slowed by a link.
    assert len(by_link) == 2
    for link in by_link:
        assert catalog.STORE_ROUND_TRIP.name in link and '"link"' in link
        assert 'phase="comm_wait"} >' in link


def _shape(text: str) -> str:
    """Return an expression with durations and numbers blanked, to compare configs' shapes."""
    text = re.sub(r"\d+(ms|[smhd])\b", "D", text)  # [20s], [1500ms], rate1m, mean_rate5m ...
    return re.sub(r"\b\d+(\.\d+)?\b", "N", text)


@pytest.mark.unit
def test_fast_variant_has_the_same_expressions() -> None:
    default = rules.rule_groups(DEFAULT)["groups"]
    fast = rules.rule_groups(FAST)["groups"]
    for gd, gf in zip(default, fast, strict=True):
        for rd, rf in zip(gd["rules"], gf["rules"], strict=True):
            assert _shape(rd["expr"]) == _shape(rf["expr"])
            assert rd.get("labels") == rf.get("labels")


@pytest.mark.unit
def test_expressions_use_only_catalog_metrics_and_defined_records() -> None:
    groups = rules.rule_groups(DEFAULT)["groups"]
    defined = {r["record"] for g in groups for r in g["rules"] if "record" in r}
    known = set()
    for m in catalog.METRICS:
        known |= {m.name, f"{m.name}_sum", f"{m.name}_count", f"{m.name}_bucket"}
    for group in groups:
        for rule in group["rules"]:
            for token in re.findall(r"[a-z_]+(?::[a-z0-9_]+)+|\bddp_[a-z0-9_]+", rule["expr"]):
                assert token in defined or token in known, (token, rule.get("record"))
    for record in defined:
        level, metric, ops = record.split(":")
        assert level and ops
        assert any(metric in (m.name, m.family) for m in catalog.METRICS), record


@pytest.mark.tool
def test_a_stalled_job_of_1024_ranks_is_one_alert_per_fact(tmp_path: Path) -> None:
    """At 1024 ranks a stalled run (every rank inside one collective) pages once, not 1024 times."""
    promtool = require("promtool")
    _write_fast_rules(tmp_path)
    ranks = 1024
    series = []
    for r in range(ranks):
        lab = f'run="big", rank="{r}"'
        series += [
            {"series": f"ddp_rank_info{{{lab}}}", "values": "1x40"},
            {"series": f"ddp_steps_total{{{lab}}}", "values": "0+10x10 100x30"},
            {
                "series": f'ddp_collective_last_enqueued_seq{{{lab}, pg="0"}}',
                "values": "0+1x10 11x30",
            },
            {
                "series": f'ddp_collective_inflight_age_seconds{{{lab}, pg="0"}}',
                "values": "0x10 0+5x30",
            },
            {"series": f'ddp_collective_timeout_seconds{{{lab}, pg="0"}}', "values": "100x40"},
        ]
    one = [{"exp_labels": {"severity": "critical", "run": "big"}}]
    waiting = {"run": "big", "pg": "0", "role": "waiting"}
    unit = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "5s",
        "tests": [
            {
                "interval": "5s",
                "input_series": series,
                "alert_rule_test": [
                    {"eval_time": "190s", "alertname": "DDPTrainingStalled", "exp_alerts": one},
                    {
                        "eval_time": "190s",
                        "alertname": "DDPCollectiveStalled",
                        "exp_alerts": [{"exp_labels": {"severity": "warning", **waiting}}],
                    },
                    {
                        "eval_time": "190s",
                        "alertname": "DDPCollectiveTimeoutImminent",
                        "exp_alerts": [
                            {"exp_labels": {"severity": "warning", **waiting}},
                            {"exp_labels": {"severity": "critical", **waiting}},
                        ],
                    },
                    {"eval_time": "190s", "alertname": "DDPRankDown", "exp_alerts": []},
                ],
            }
        ],
    }
    (tmp_path / "big.yml").write_text(yaml.safe_dump(unit, sort_keys=False))
    proc = subprocess.run(
        [promtool, "test", "rules", "big.yml"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
