"""Hold who gets the alerts (exporter.deploy.alertmanager) and how Grafana finds its data."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .domain import Domain

__all__ = ["ReceiverConfig"]


@dataclass(frozen=True)
class ReceiverConfig(Domain):
    """Say where alerts go; none set, the compose stack's printer shows them."""

    TITLE = "who gets the alerts (exporter.deploy.alertmanager); none set: the stack's printer"

    #: A webhook of your own that gets every alert (Alertmanager's webhook JSON).
    webhook_url: str = ""
    #: A Slack incoming-webhook URL: every alert, to the channel the webhook posts to.
    slack_webhook_url: str = ""
    #: A PagerDuty Events v2 integration (routing) key: critical alerts page.
    pagerduty_routing_key: str = ""
    #: E-mail address(es, comma-separated) for critical and warning alerts; needs
    #: ``email_smarthost``.
    email_to: str = ""
    #: SMTP server ``host:port`` that sends the e-mail (STARTTLS required, as Alertmanager's
    #: default is).
    email_smarthost: str = ""
    #: Sender address of the e-mail (default: alertmanager@ the recipient's domain).
    email_from: str = ""
    # Grafana's two fields stand under this heading of the reference page and after the
    # receivers in dashboards/mixin.json: they stay in this domain so that both keep their order.
    #: Fixed uid of the Prometheus datasource, so provisioned dashboards resolve it.
    datasource_uid: str = "ddp-prometheus"
    #: Grafana dashboard refresh interval.
    dashboard_refresh: str = "10s"

    def validate(self) -> None:
        """Refuse a URL, SMTP server or address a receiver could not deliver to, and a
        datasource uid or dashboard refresh Grafana would not read."""
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,40}", self.datasource_uid):
            # Grafana's own rule for a uid; any other makes every provisioned panel lose its data.
            raise ValueError(
                "datasource_uid must be 1 to 40 letters, digits, '-' or '_' (Grafana's rule for "
                f"a uid): {self.datasource_uid!r}"
            )
        if not re.fullmatch(r"[1-9][0-9]*[smhd]", self.dashboard_refresh):
            raise ValueError(
                "dashboard_refresh must be a duration of one unit, such as 10s, 1m or 1h: "
                f"{self.dashboard_refresh!r}"
            )
        for name in ("webhook_url", "slack_webhook_url"):
            url = getattr(self, name)
            if url and not re.fullmatch(r"https?://\S+", url):
                raise ValueError(f"{name} must be an http(s):// URL: {url!r}")
        if self.email_to and not self.email_smarthost:
            raise ValueError("email_to needs email_smarthost (the SMTP server, host:port)")
        if self.email_smarthost and not re.fullmatch(r"\S+:\d+", self.email_smarthost):
            raise ValueError(f"email_smarthost must be host:port: {self.email_smarthost!r}")
        for name in ("email_to", "email_from"):
            for address in filter(None, getattr(self, name).split(",")):
                if not re.fullmatch(r"[^@\s,]+@[^@\s,]+", address.strip()):
                    raise ValueError(f"{name} is not an e-mail address: {address!r}")

    @property
    def receivers_set(self) -> bool:
        """Say whether any receiver of one's own is configured (else the stack's printer)."""
        return bool(
            self.webhook_url
            or self.slack_webhook_url
            or self.pagerduty_routing_key
            or self.email_to
        )
