"""Hold how Prometheus reaches ranks that serve TLS or ask for a password (docs/security.md)."""

from __future__ import annotations

from dataclasses import dataclass

from .domain import Domain

__all__ = ["ScrapeConfig"]


@dataclass(frozen=True)
class ScrapeConfig(Domain):
    """Say the scheme, certificates and credentials the generated scrape jobs use."""

    TITLE = "ranks served over TLS or with a password (DDP_EXPORTER_WEB_CONFIG, docs/security.md)"

    #: ``https``: the ranks serve TLS; the generated scrape jobs verify them against
    #: ``scrape_ca_file`` (their /sd and file_sd targets say https themselves).
    scrape_scheme: str = "http"
    #: The CA that signed the ranks' certificates: a path on the Prometheus server.
    scrape_ca_file: str = ""
    #: Prometheus's client certificate and its key, for ranks that require one: paths on the
    #: Prometheus server.
    scrape_cert_file: str = ""
    scrape_key_file: str = ""
    #: The name the ranks' certificates carry, where it is not the address scraped (a
    #: PodMonitor scrapes pod IPs): every rank's certificate names it.
    scrape_server_name: str = ""
    #: Basic authentication: the user, and a file on the Prometheus server holding its password
    #: (a password never goes into the generated files).
    scrape_username: str = ""
    scrape_password_file: str = ""
    #: Kubernetes: the Secret (in ``k8s_namespace``) the PodMonitor reads the same from, keys
    #: ``ca.crt`` (where ``scrape_ca_file`` is set), ``tls.crt`` and ``tls.key`` (where
    #: ``scrape_cert_file`` is), ``username`` and ``password``.
    k8s_scrape_secret: str = "ddp-exporter-scrape"

    def validate(self) -> None:
        """Refuse an unknown scheme, half a credential pair and TLS files for plain HTTP."""
        if self.scrape_scheme not in ("http", "https"):
            raise ValueError(f"scrape_scheme must be http or https: {self.scrape_scheme!r}")
        if bool(self.scrape_cert_file) != bool(self.scrape_key_file):
            raise ValueError("scrape_cert_file and scrape_key_file go together")
        if bool(self.scrape_username) != bool(self.scrape_password_file):
            raise ValueError("scrape_username and scrape_password_file go together")
        tls_only = self.scrape_ca_file or self.scrape_cert_file or self.scrape_server_name
        if self.scrape_scheme == "http" and tls_only:
            raise ValueError(
                "scrape_ca_file, scrape_cert_file and scrape_server_name need scrape_scheme https"
            )
