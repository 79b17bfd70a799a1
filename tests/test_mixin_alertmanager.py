"""Test the generated Alertmanager config with amtool and a real Alertmanager."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from harness import wait_for
from promstack import require, run_alertmanager

from exporter.deploy import alertmanager
from exporter.mixin.config import DEFAULT
from exporter.mixin.render import GENERATED_BY


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "alertmanager.yml"
    path.write_text(alertmanager.render_alertmanager(DEFAULT))
    return path


@pytest.mark.unit
def test_rendered_config_shape() -> None:
    text = alertmanager.render_alertmanager(DEFAULT)
    assert text.startswith(f"# {GENERATED_BY}")
    for word in ("slack_configs", "email_configs", "pagerduty_configs"):
        assert f"#     {word}:" in text  # commented examples
    cfg = yaml.safe_load(text)
    # A run name repeats across clusters: the cluster label is part of every grouping.
    assert cfg["route"]["group_by"] == ["cluster", "alertname", "run"]
    assert cfg["route"]["routes"][0]["group_by"] == ["cluster", "alertname", "node"]
    inhibit, gpu = cfg["inhibit_rules"]
    assert inhibit["source_matchers"] == ['severity="critical"']
    assert inhibit["target_matchers"] == ['severity="warning"', 'alertname!~"DDPSuspectNode"']
    assert inhibit["equal"] == ["cluster", "run", "rank"]
    assert gpu["source_matchers"] == ['alertname="DDPGPUThrottledStraggler"']
    assert gpu["target_matchers"] == ['alertname="DDPRankStraggler"', 'cause="compute"']
    assert gpu["equal"] == ["cluster", "run", "rank"]
    flat = yaml.safe_load(alertmanager.render_alertmanager(replace(DEFAULT, cluster_label="")))
    assert flat["route"]["group_by"] == ["alertname", "run"]
    assert flat["inhibit_rules"][0]["equal"] == ["run", "rank"]
    for receiver in cfg["receivers"]:  # none configured: the stack's printing receiver
        assert receiver["webhook_configs"][0]["url"] == alertmanager.PRINTING_RECEIVER_URL


@pytest.mark.tool
def test_amtool_check_config(config_file: Path) -> None:
    amtool = require("amtool")
    proc = subprocess.run(
        [amtool, "check-config", str(config_file)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


@pytest.mark.tool
@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        (["alertname=DDPRankDown", "severity=critical", "run=r", "rank=1"], "ddp-critical"),
        (["alertname=DDPRankStraggler", "severity=warning", "run=r", "rank=1"], "ddp-warning"),
        (["alertname=DDPInputBound", "severity=info", "run=r", "rank=0"], "ddp-info"),
        (["alertname=Other", "run=r"], "ddp-warning"),
        (["alertname=DDPSuspectNode", "severity=warning", "node=gpu-7"], "ddp-warning"),
    ],
)
def test_amtool_routes(config_file: Path, labels: list[str], receiver: str) -> None:
    amtool = require("amtool")
    proc = subprocess.run(
        [
            amtool,
            "config",
            "routes",
            "test",
            f"--config.file={config_file}",
            f"--verify.receivers={receiver}",
            *labels,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == receiver


def _post(url: str, alerts: list[dict]) -> None:
    req = urllib.request.Request(
        f"{url}/api/v2/alerts",
        data=json.dumps(alerts).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=5) as resp:  # noqa: S310 (loopback)
        assert resp.status == 200


def _get(url: str) -> list[dict]:
    with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 (loopback)
        return json.loads(resp.read())


@pytest.mark.stack
def test_grouping_and_inhibition_in_a_real_alertmanager(tmp_path: Path) -> None:
    require("prometheus-alertmanager")

    def alert(name: str, severity: str, run: str, rank: str, **more: str) -> dict:
        labels = {"alertname": name, "severity": severity, "run": run, "rank": rank, **more}
        return {"labels": labels, "annotations": {"summary": name}}

    with run_alertmanager(tmp_path, alertmanager.render_alertmanager(DEFAULT)) as am:
        _post(
            am.url,
            [
                alert("DDPCollectiveTimeoutImminent", "critical", "r1", "1"),
                alert("DDPCollectiveTimeoutImminent", "warning", "r1", "1"),
                alert("DDPRankStraggler", "warning", "r1", "3", cause="compute"),
                alert("DDPRankStraggler", "warning", "r1", "4", cause="compute"),
                alert("DDPGPUThrottledStraggler", "warning", "r1", "4", reason="hw_slowdown"),
                alert("DDPTrainingStalled", "critical", "r1", "0"),
                alert("DDPTrainingStalled", "critical", "r1", "2"),
                alert("DDPTrainingStalled", "critical", "r2", "0"),
            ],
        )

        def settled() -> list[dict] | None:
            alerts = _get(f"{am.url}/api/v2/alerts")
            suppressed = [a for a in alerts if a["status"]["state"] == "suppressed"]
            return alerts if len(alerts) == 8 and len(suppressed) == 2 else None

        alerts = wait_for(settled, 20, "8 alerts in alertmanager, 2 of them suppressed")

        def state(name: str, severity: str, rank: str) -> dict:
            (a,) = [
                a
                for a in alerts
                if (a["labels"]["alertname"], a["labels"]["severity"], a["labels"]["rank"])
                == (name, severity, rank)
            ]
            return a["status"]

        # Critical silences the warning of the same run and rank only.
        assert state("DDPCollectiveTimeoutImminent", "warning", "1")["state"] == "suppressed"
        assert state("DDPCollectiveTimeoutImminent", "warning", "1")["inhibitedBy"]
        assert state("DDPCollectiveTimeoutImminent", "critical", "1")["state"] == "active"
        assert state("DDPRankStraggler", "warning", "3")["state"] == "active"
        # The straggler whose GPU is throttled is named by that alert alone.
        assert state("DDPRankStraggler", "warning", "4")["state"] == "suppressed"
        assert state("DDPGPUThrottledStraggler", "warning", "4")["state"] == "active"

        groups = _get(f"{am.url}/api/v2/alerts/groups")
        keys = sorted(
            (g["receiver"]["name"], g["labels"]["alertname"], g["labels"]["run"], len(g["alerts"]))
            for g in groups
        )
        # One group per (alertname, run): both ranks of r1's DDPTrainingStalled together.
        assert ("ddp-critical", "DDPTrainingStalled", "r1", 2) in keys
        assert ("ddp-critical", "DDPTrainingStalled", "r2", 1) in keys
        assert ("ddp-warning", "DDPRankStraggler", "r1", 2) in keys
        assert all(set(g["labels"]) == {"alertname", "run"} for g in groups)
