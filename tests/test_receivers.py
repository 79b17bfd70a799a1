"""Alerts that reach a person: receivers from the generator's settings, checked by amtool.

With none set, every alert goes to the compose stack's printing receiver (``ddp-exporter
receiver``); with a webhook, Slack, PagerDuty or e-mail set, each severity's receiver gets the
integrations meant for it, and ``amtool check-config`` accepts the whole file.
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from harness import wait_for
from promstack import require

from exporter.deploy import alertmanager, stack
from exporter.mixin.__main__ import main as mixin_main
from exporter.mixin.config import DEFAULT
from exporter.tools.receiver import AlertReceiver, alert_line

pytestmark = pytest.mark.tool

EVERY = replace(
    DEFAULT,
    webhook_url="https://hooks.internal/ddp",
    slack_webhook_url="https://hooks.slack.com/services/T000/B000/XXXX",
    pagerduty_routing_key="0123456789abcdef0123456789abcdef",
    email_to="ml-oncall@example.com",
    email_smarthost="smtp.example.com:587",
)


def _amtool_check(path: Path) -> None:
    amtool = require("amtool")
    proc = subprocess.run(
        [amtool, "check-config", str(path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "cfg",
    [
        DEFAULT,
        EVERY,
        replace(DEFAULT, webhook_url="http://10.0.0.5:8080/hook"),
        replace(DEFAULT, slack_webhook_url=EVERY.slack_webhook_url),
        replace(DEFAULT, pagerduty_routing_key=EVERY.pagerduty_routing_key),
        replace(
            DEFAULT,
            email_to="a@example.com,b@example.org",
            email_smarthost="mx:25",
            email_from="alerts@example.net",
        ),
    ],
    ids=["none", "every", "webhook", "slack", "pagerduty", "email"],
)
def test_amtool_accepts_every_receiver_combination(tmp_path: Path, cfg) -> None:
    path = tmp_path / "alertmanager.yml"
    path.write_text(alertmanager.render_alertmanager(cfg))
    _amtool_check(path)


def test_each_severity_gets_the_integrations_meant_for_it() -> None:
    receivers = {r["name"]: r for r in alertmanager.alertmanager_config(EVERY)["receivers"]}
    kinds = {name: {k for k in r if k.endswith("_configs")} for name, r in receivers.items()}
    assert kinds == {
        "ddp-critical": {"webhook_configs", "slack_configs", "email_configs", "pagerduty_configs"},
        "ddp-warning": {"webhook_configs", "slack_configs", "email_configs"},
        "ddp-info": {"webhook_configs", "slack_configs"},
    }
    assert receivers["ddp-critical"]["pagerduty_configs"][0]["routing_key"] == (
        EVERY.pagerduty_routing_key
    )
    glob = alertmanager.alertmanager_config(EVERY)["global"]
    assert glob == {
        "smtp_smarthost": "smtp.example.com:587",
        "smtp_from": "alertmanager@example.com",
    }
    printing = alertmanager.alertmanager_config(DEFAULT)
    assert "global" not in printing
    assert {r["webhook_configs"][0]["url"] for r in printing["receivers"]} == {
        alertmanager.PRINTING_RECEIVER_URL
    }


def test_the_compose_stack_prints_alerts_only_when_no_receiver_is_set() -> None:
    assert "receiver" in stack.compose(DEFAULT)["services"]
    assert stack.compose(DEFAULT)["services"]["alertmanager"]["depends_on"] == ["receiver"]
    assert alertmanager.PRINTING_RECEIVER_URL.startswith(f"http://receiver:{stack.RECEIVER_PORT}/")
    for cfg in (EVERY, replace(DEFAULT, webhook_url="https://hooks.internal/ddp")):
        services = stack.compose(cfg)["services"]
        assert "receiver" not in services and "depends_on" not in services["alertmanager"]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("email_to", "ml@example.com", "needs email_smarthost"),
        ("webhook_url", "hooks.internal/ddp", "http(s):// URL"),
        ("slack_webhook_url", "not a url", "http(s):// URL"),
        ("email_smarthost", "smtp.example.com", "host:port"),
    ],
)
def test_a_receiver_setting_that_cannot_work_is_refused(field, value, message) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        replace(DEFAULT, **{field: value})


def test_generate_set_writes_the_receivers_into_the_alertmanager_file(tmp_path: Path) -> None:
    assert (
        mixin_main(
            [
                "generate",
                "--out",
                str(tmp_path),
                "--set",
                f"slack_webhook_url={EVERY.slack_webhook_url}",
                "--set",
                "pagerduty_routing_key=abc",
            ]
        )
        == 0
    )
    written = yaml.safe_load((tmp_path / "dashboards/alertmanager/alertmanager.yml").read_text())
    critical = next(r for r in written["receivers"] if r["name"] == "ddp-critical")
    assert critical["slack_configs"][0]["api_url"] == EVERY.slack_webhook_url
    assert critical["pagerduty_configs"][0]["routing_key"] == "abc"
    compose = yaml.safe_load((tmp_path / "docker-compose.yml").read_text())
    assert "receiver" not in compose["services"]
    _amtool_check(tmp_path / "dashboards/alertmanager/alertmanager.yml")


def test_the_printing_receiver_prints_one_line_per_alert() -> None:
    lines: list[str] = []
    receiver = AlertReceiver(lambda a: lines.append(alert_line(a)))
    try:
        body = {
            "alerts": [
                {
                    "status": "firing",
                    "labels": {
                        "alertname": "DDPRankDown",
                        "severity": "critical",
                        "run": "r",
                        "rank": "1",
                    },
                    "annotations": {"summary": "A rank is down."},
                },
                {
                    "status": "resolved",
                    "labels": {
                        "alertname": "DDPExporterMisconfigured",
                        "severity": "warning",
                        "run": "r",
                        "variable": "DDP_EXPORTER_PORT",
                    },
                },
            ]
        }
        req = urllib.request.Request(
            receiver.url,
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert resp.status == 200
        wait_for(lambda: len(lines) == 2, 5, "both alerts printed")
    finally:
        receiver.close()
    assert lines[0] == "ALERT DDPRankDown severity=critical rank=1  run=r: A rank is down."
    assert lines[1].startswith("RESOLVED DDPExporterMisconfigured severity=warning rank=- ")
    assert "variable=DDP_EXPORTER_PORT" in lines[1]
    assert len(receiver.alerts) == 1  # only firing alerts are kept
