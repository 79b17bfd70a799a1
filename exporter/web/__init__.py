"""Secure a rank's endpoint the way Prometheus exporters do: a web configuration file.

``DDP_EXPORTER_WEB_CONFIG`` (or ``instrument(web_config=...)``) names a file in the format of
Prometheus's exporter-toolkit (:mod:`exporter.web.config`): TLS, client certificates and basic
authentication, applied to every path a rank serves. Reading it needs the ``web`` extra
(PyYAML, and bcrypt for ``basic_auth_users``).
"""

from __future__ import annotations

from .config import TLSServerConfig, WebConfig, WebConfigError, load
from .policy import Policy, Served, prepare
from .server import WebServer

__all__ = [
    "Policy",
    "Served",
    "TLSServerConfig",
    "WebConfig",
    "WebConfigError",
    "WebServer",
    "load",
    "prepare",
]
