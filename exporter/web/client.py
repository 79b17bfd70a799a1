"""Read a rank's endpoint as Prometheus would: an HTTP client configuration file.

The tools that read ranks (``ddp-exporter top --http-config FILE``) take the file format of
Prometheus's own scrape clients (``promtool --http.config.file``), so that the CA, certificate
and credentials Prometheus scrapes with serve here too, and a password never appears on a
command line::

    tls_config:
      ca_file: ddp-ca.crt          # relative paths: to the file's own folder
      cert_file: client.crt
      key_file: client.key
    basic_auth:
      username: prometheus
      password_file: ddp-password  # or authorization: {credentials_file: token}
"""

from __future__ import annotations

import base64
import os
import ssl
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from .config import TLS_VERSIONS, WebConfigError, read_yaml

__all__ = ["HTTPClient", "load_client"]

_TOP = {"tls_config", "basic_auth", "authorization"}
_TLS = {"ca_file", "cert_file", "key_file", "insecure_skip_verify", "min_version"}
_BASIC = {"username", "password", "password_file"}
_AUTHZ = {"type", "credentials", "credentials_file"}


@dataclass(frozen=True)
class HTTPClient:
    """How to open a rank's (or Prometheus's) URL: a TLS context and an Authorization header."""

    #: The TLS context of ``tls_config``; None: https URLs are verified against the system CAs.
    context: ssl.SSLContext | None = None
    authorization: str | None = None
    #: Whether the file has a ``tls_config`` (even an empty one: the system's CAs).
    tls: bool = False
    #: The same as a Prometheus scrape job says it (``scheme``, ``tls_config``, ``basic_auth``,
    #: ``authorization``), paths made absolute: what a Prometheus started for the job needs.
    scrape: dict[str, Any] = field(default_factory=dict)

    def open(self, url: str, timeout: float, headers: dict[str, str] | None = None) -> Any:
        """Open ``url`` with this configuration (a context manager, as urlopen returns)."""
        request = urllib.request.Request(url, headers=headers or {})
        if self.authorization:
            request.add_header("Authorization", self.authorization)
        context = self.context if url.startswith("https:") else None
        handlers: list[Any] = [_NoRedirect()]
        if context is not None:
            handlers.append(urllib.request.HTTPSHandler(context=context))
        return urllib.request.build_opener(*handlers).open(request, timeout=timeout)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Refuse a redirect: the credentials would go wherever it points (an endpoint has none)."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _section(data: dict[str, Any], key: str, known: set[str], path: str) -> dict[str, Any]:
    value = data.get(key) or {}
    if not isinstance(value, dict):
        raise WebConfigError(path, key, "expected a mapping")
    for name in value:
        if name not in known:
            raise WebConfigError(path, f"{key}.{name}", "unknown field")
    return value


def _secret(section: dict[str, Any], key: str, inline: str, path: str, folder: str) -> str | None:
    given = section.get(inline)
    name = section.get(f"{inline}_file")
    if given is not None and name is not None:
        raise WebConfigError(path, f"{key}.{inline}", f"give {inline} or {inline}_file, not both")
    if name is None:
        return None if given is None else str(given)
    try:
        with open(os.path.join(folder, str(name)), encoding="utf-8") as f:
            return f.read().strip()
    except OSError as exc:
        raise WebConfigError(path, f"{key}.{inline}_file", f"{name}: {exc.strerror}") from exc


def _context(tls: dict[str, Any], path: str, folder: str) -> ssl.SSLContext:
    def file(key: str) -> str | None:
        value = tls.get(key)
        return os.path.join(folder, str(value)) if value else None

    try:
        # With a ca_file, only that CA (as Prometheus does); else the system's.
        ctx = ssl.create_default_context(cafile=file("ca_file"))
    except (OSError, ssl.SSLError) as exc:
        raise WebConfigError(path, "tls_config.ca_file", str(exc)) from exc
    if bool(file("cert_file")) != bool(file("key_file")):
        raise WebConfigError(path, "tls_config.key_file", "cert_file and key_file go together")
    cert, key = file("cert_file"), file("key_file")
    if cert and key:
        try:
            ctx.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as exc:
            raise WebConfigError(path, "tls_config.cert_file", str(exc)) from exc
    if tls.get("insecure_skip_verify") is True:
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    if tls.get("min_version"):
        if tls["min_version"] not in TLS_VERSIONS:
            raise WebConfigError(
                path, "tls_config.min_version", f"one of {', '.join(TLS_VERSIONS)}"
            )
        ctx.minimum_version = TLS_VERSIONS[tls["min_version"]]
    return ctx


def load_client(path: str | os.PathLike[str]) -> HTTPClient:
    """Read the HTTP client configuration file at ``path``.

    Raises :class:`~exporter.web.config.WebConfigError` naming the field at fault, ImportError
    (naming the extra) where PyYAML is missing.
    """
    name = os.fspath(path)
    data = read_yaml(name, "an HTTP client configuration") or {}
    if not isinstance(data, dict):
        raise WebConfigError(name, "", "expected a mapping")
    for key in data:
        if key not in _TOP:
            raise WebConfigError(name, str(key), "unknown field")
    folder = os.path.dirname(os.path.abspath(name))
    tls = _section(data, "tls_config", _TLS, name)
    basic = _section(data, "basic_auth", _BASIC, name)
    authz = _section(data, "authorization", _AUTHZ, name)
    if basic and authz:
        raise WebConfigError(name, "authorization", "give basic_auth or authorization, not both")
    header = None
    if basic:
        user = str(basic.get("username", ""))
        password = _secret(basic, "basic_auth", "password", name, folder) or ""
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        header = f"Basic {token}"
    elif authz:
        credentials = _secret(authz, "authorization", "credentials", name, folder)
        if credentials is None:
            raise WebConfigError(name, "authorization.credentials", "missing")
        header = f"{authz.get('type', 'Bearer')} {credentials}"
    given = "tls_config" in data
    context = _context(tls, name, folder) if given else None
    return HTTPClient(context, header, given, _scrape(data, folder))


def _scrape(data: dict[str, Any], folder: str) -> dict[str, Any]:
    """Return the file as a Prometheus scrape job's parts, every ``*_file`` made absolute."""

    def absolute(section: dict[str, Any]) -> dict[str, Any]:
        return {
            k: os.path.join(folder, str(v)) if k.endswith("_file") else v
            for k, v in section.items()
        }

    out: dict[str, Any] = {}
    if "tls_config" in data:
        out["scheme"] = "https"
        out["tls_config"] = absolute(data.get("tls_config") or {})
    for key in ("basic_auth", "authorization"):
        if data.get(key):
            out[key] = absolute(data[key])
    return out
