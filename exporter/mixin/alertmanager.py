"""Build the Alertmanager configuration: routes by severity, grouping, inhibition, receivers."""

from __future__ import annotations

from typing import Any

from .config import DEFAULT, MixinConfig
from .render import dump_yaml
from .rules import FLEET_ALERTS

__all__ = ["GROUP_BY", "RECEIVERS", "alertmanager_config", "render_alertmanager"]

#: One notification per alert name and run: all ranks of one run's incident arrive together.
GROUP_BY: tuple[str, ...] = ("alertname", "run")

#: Receiver of each severity (the root route's receiver takes anything unlabelled).
RECEIVERS: dict[str, str] = {
    "critical": "ddp-critical",
    "warning": "ddp-warning",
    "info": "ddp-info",
}

_EXAMPLES = """\
# Other receivers: add any of these next to webhook_configs in a receiver above, e.g.
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


def alertmanager_config(cfg: MixinConfig = DEFAULT) -> dict[str, Any]:
    """Return the Alertmanager configuration as a dict."""

    fleet = "|".join(FLEET_ALERTS)

    def webhook(name: str) -> dict[str, Any]:
        return {
            "name": name,
            "webhook_configs": [{"url": cfg.webhook_url, "send_resolved": True}],
        }

    return {
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
            }
        ],
        "receivers": [webhook(RECEIVERS[s]) for s in ("critical", "warning", "info")],
    }


def render_alertmanager(cfg: MixinConfig = DEFAULT) -> str:
    """Return alertmanager.yml text with the generated header and commented receiver examples."""
    return dump_yaml(alertmanager_config(cfg)) + "\n" + _EXAMPLES
