"""Build the Alertmanager configuration: routes by severity, grouping, inhibition, receivers.

Receivers come from the configuration: a webhook of one's own and Slack get every alert,
e-mail critical and warning ones, PagerDuty pages for critical ones. With none set, every alert
goes to the generated stack's printing receiver (``ddp-exporter receiver``, the compose
service ``receiver``), so ``docker compose up`` shows alerts without editing YAML.
"""

from __future__ import annotations

from typing import Any

from ..mixin.config import DEFAULT, MixinConfig
from ..mixin.render import dump_yaml
from ..mixin.rules import FLEET_ALERTS

__all__ = [
    "GROUP_BY",
    "PRINTING_RECEIVER_URL",
    "RECEIVERS",
    "alertmanager_config",
    "integrations",
    "render_alertmanager",
]

#: Where alerts go when no receiver is configured: the compose stack's printing receiver.
PRINTING_RECEIVER_URL = "http://receiver:5001/ddp-alerts"

#: One notification per alert name and run: all ranks of one run's incident arrive together.
GROUP_BY: tuple[str, ...] = ("alertname", "run")

#: Receiver of each severity (the root route's receiver takes anything unlabelled).
RECEIVERS: dict[str, str] = {
    "critical": "ddp-critical",
    "warning": "ddp-warning",
    "info": "ddp-info",
}

_EXAMPLES = """\
# Receivers come from the generator's settings: ddp-exporter mixin generate --set
# webhook_url=URL, slack_webhook_url=URL, pagerduty_routing_key=KEY, email_to=ADDRESS with
# email_smarthost=HOST:PORT (and email_from). Further options of each integration, e.g.:
#
#   - name: ddp-critical
#     pagerduty_configs:
#       - routing_key: <PagerDuty Events v2 integration key>
#         severity: critical
#     slack_configs:
#       - api_url: https://hooks.slack.com/services/<your webhook path>
#         channel: '#training-alerts'
#         send_resolved: true
#         title: '[{{ .Status | toUpper }}] {{ .CommonLabels.alertname }} run {{ .CommonLabels.run }}'
#         text: '{{ range .Alerts }}{{ .Annotations.description }} {{ .Annotations.runbook_url }}
#           {{ end }}'
#     email_configs:
#       - to: ml-oncall@example.com
#         from: alertmanager@example.com
#         smarthost: smtp.example.com:587
#         auth_username: alertmanager@example.com
#         auth_password_file: /etc/alertmanager/smtp_password
"""


def _clustered(cfg: MixinConfig, labels: tuple[str, ...]) -> list[str]:
    """Return ``labels`` with the cluster label first: a run name repeats across clusters."""
    return [cfg.cluster_label, *labels] if cfg.cluster_label else list(labels)


_SLACK_TITLE = "[{{ .Status | toUpper }}] {{ .CommonLabels.alertname }} run {{ .CommonLabels.run }}"
_SLACK_TEXT = (
    "{{ range .Alerts }}{{ .Annotations.description }} {{ .Annotations.runbook_url }}\n{{ end }}"
)


def integrations(cfg: MixinConfig, severity: str) -> dict[str, list[dict[str, Any]]]:
    """Return the notification integrations of the receiver of ``severity`` alerts."""
    out: dict[str, list[dict[str, Any]]] = {}
    if not cfg.receivers_set:
        out["webhook_configs"] = [{"url": PRINTING_RECEIVER_URL, "send_resolved": True}]
        return out
    if cfg.webhook_url:
        out["webhook_configs"] = [{"url": cfg.webhook_url, "send_resolved": True}]
    if cfg.slack_webhook_url:
        out["slack_configs"] = [
            {
                "api_url": cfg.slack_webhook_url,
                "send_resolved": True,
                "title": _SLACK_TITLE,
                "text": _SLACK_TEXT,
            }
        ]
    if cfg.email_to and severity in ("critical", "warning"):
        out["email_configs"] = [{"to": cfg.email_to, "send_resolved": True}]
    if cfg.pagerduty_routing_key and severity == "critical":
        out["pagerduty_configs"] = [
            {
                "routing_key": cfg.pagerduty_routing_key,
                "severity": "critical",
                "description": "{{ .CommonLabels.alertname }} run {{ .CommonLabels.run }}: "
                "{{ .CommonAnnotations.summary }}",
            }
        ]
    return out


def _email_global(cfg: MixinConfig) -> dict[str, Any]:
    if not cfg.email_to:
        return {}
    sender = cfg.email_from or "alertmanager@" + cfg.email_to.split(",")[0].split("@")[1].strip()
    return {"global": {"smtp_smarthost": cfg.email_smarthost, "smtp_from": sender}}


def alertmanager_config(cfg: MixinConfig = DEFAULT) -> dict[str, Any]:
    """Return the Alertmanager configuration as a dict."""

    fleet = "|".join(FLEET_ALERTS)

    def receiver(severity: str) -> dict[str, Any]:
        return {"name": RECEIVERS[severity], **integrations(cfg, severity)}

    return {
        **_email_global(cfg),
        "route": {
            "receiver": RECEIVERS["warning"],
            "group_by": _clustered(cfg, GROUP_BY),
            "group_wait": "30s",
            "group_interval": "5m",
            "repeat_interval": "4h",
            "routes": [
                # A node across runs: one notification per node, a reminder a day (draining
                # takes a person), whatever runs are on.
                {
                    "receiver": RECEIVERS["warning"],
                    "matchers": [f'alertname=~"{fleet}"'],
                    "group_by": _clustered(cfg, ("alertname", "node")),
                    "repeat_interval": "24h",
                },
                {
                    "receiver": RECEIVERS["critical"],
                    "matchers": ['severity="critical"'],
                    "group_wait": "10s",
                    "group_interval": "1m",
                    "repeat_interval": "1h",
                },
                {"receiver": RECEIVERS["warning"], "matchers": ['severity="warning"']},
                {
                    "receiver": RECEIVERS["info"],
                    "matchers": ['severity="info"'],
                    "repeat_interval": "24h",
                },
            ],
        },
        "inhibit_rules": [
            {
                # A critical alert on a rank (e.g. DDPCollectiveTimeoutImminent critical,
                # DDPTrainingStalled) silences the warnings of the same run and rank.
                "source_matchers": ['severity="critical"'],
                # A run's critical page says nothing about a node's history across runs.
                "target_matchers": ['severity="warning"', f'alertname!~"{fleet}"'],
                "equal": _clustered(cfg, ("run", "rank")),
            },
            {
                # The straggler whose GPU is throttled is named with that cause: the plain
                # compute straggler of the same rank says less.
                "source_matchers": ['alertname="DDPGPUThrottledStraggler"'],
                "target_matchers": ['alertname="DDPRankStraggler"', 'cause="compute"'],
                "equal": _clustered(cfg, ("run", "rank")),
            },
        ],
        "receivers": [receiver(s) for s in ("critical", "warning", "info")],
    }


def render_alertmanager(cfg: MixinConfig = DEFAULT) -> str:
    """Return alertmanager.yml text with the generated header and commented receiver examples."""
    return dump_yaml(alertmanager_config(cfg)) + "\n" + _EXAMPLES
