"""Read a web configuration file, in the format of Prometheus's exporter-toolkit.

The file node_exporter, dcgm-exporter and every exporter built on exporter-toolkit read with
``--web.config.file``::

    tls_server_config:
      cert_file: server.crt        # relative paths: to the file's own folder
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert
      client_ca_file: ca.crt
      client_allowed_sans: [prometheus.example.org]
      min_version: TLS12
    basic_auth_users:
      prometheus: $2y$10$...       # a bcrypt hash (htpasswd -nBC 10 "" | tr -d ':\\n')

Read strictly, as exporter-toolkit reads it: an unknown field is an error. A field this
exporter cannot honour is refused rather than ignored: a cipher list or a rate limit silently
dropped would serve more than the file says.
"""

from __future__ import annotations

import os
import re
import ssl
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CLIENT_AUTH",
    "TLS_VERSIONS",
    "TLSServerConfig",
    "WebConfig",
    "WebConfigError",
    "load",
    "parse",
    "read_yaml",
]

#: exporter-toolkit's ``client_auth_type`` values this exporter serves, as Python's verify modes.
CLIENT_AUTH = {
    "": ssl.CERT_NONE,
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}

#: ``client_auth_type`` values exporter-toolkit knows and Python's TLS cannot do: accepting a
#: client certificate without verifying it.
_UNVERIFIED = ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")

TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}

_TLS_FIELDS = {
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "client_allowed_sans",
    "min_version",
    "max_version",
    "prefer_server_cipher_suites",
}
#: Fields of exporter-toolkit this exporter refuses, with the reason given.
_REFUSED = {
    "tls_server_config.cert": "inline certificates are not supported: use cert_file",
    "tls_server_config.key": "inline keys are not supported: use key_file",
    "tls_server_config.client_ca": "inline CAs are not supported: use client_ca_file",
    "tls_server_config.cipher_suites": "not supported: Go's cipher names have no mapping here",
    "tls_server_config.curve_preferences": "not supported",
    "http_server_config.headers": "not supported",
    "rate_limit": "not supported",
}
_HTTP_FIELDS = {"http2", "headers"}
_TOP = {"tls_server_config", "http_server_config", "basic_auth_users", "rate_limit"}

#: A bcrypt hash as htpasswd, Python's bcrypt and Go's bcrypt write it.
_BCRYPT = re.compile(r"^\$2[aby]\$(0[4-9]|[12]\d|3[01])\$[./A-Za-z0-9]{53}$")


class WebConfigError(ValueError):
    """A web configuration file that cannot be served as written.

    ``field`` is the dotted path of the field at fault (empty for the file as a whole).
    """

    def __init__(self, path: str, field: str, why: str) -> None:
        self.path, self.field, self.why = path, field, why
        where = f"{path}: {field}" if field else path
        super().__init__(f"{where}: {why}")


@dataclass(frozen=True)
class TLSServerConfig:
    """``tls_server_config``: the server's certificate and who may connect."""

    cert_file: str
    key_file: str
    #: ``ssl.CERT_NONE``, ``ssl.CERT_OPTIONAL`` or ``ssl.CERT_REQUIRED``.
    client_auth: ssl.VerifyMode = ssl.CERT_NONE
    client_ca_file: str | None = None
    #: A client certificate must carry one of these subject alternative names (empty: any).
    client_allowed_sans: tuple[str, ...] = ()
    min_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2
    max_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_3

    def files(self) -> tuple[str, ...]:
        """Return the files this configuration reads (to notice when one changes)."""
        extra = (self.client_ca_file,) if self.client_ca_file else ()
        return (self.cert_file, self.key_file, *extra)


@dataclass(frozen=True)
class WebConfig:
    """A web configuration file, read and checked: what the metrics server applies."""

    path: str
    tls: TLSServerConfig | None = None
    #: user -> bcrypt hash; empty: no authentication.
    users: dict[str, bytes] = field(default_factory=dict)

    @property
    def scheme(self) -> str:
        """Return ``https`` when the endpoint serves TLS, else ``http``."""
        return "https" if self.tls is not None else "http"

    def files(self) -> tuple[str, ...]:
        """Return the configuration file and every file it names."""
        return (self.path, *(self.tls.files() if self.tls else ()))


def load(path: str | os.PathLike[str]) -> WebConfig:
    """Read and check the web configuration file at ``path``.

    Raises :class:`WebConfigError` naming the file and the field for anything that cannot be
    served as written, ImportError (naming the extra) where PyYAML is missing.
    """
    name = os.fspath(path)
    data = read_yaml(name, "a web configuration file")
    return parse(data, name)


def read_yaml(name: str, what: str) -> Any:
    """Return the YAML of the file ``name`` (``what`` it is, for the missing-extra message).

    Raises :class:`WebConfigError` for a file that cannot be read or is not YAML, ImportError
    (naming the extra) where PyYAML is missing.
    """
    try:
        import yaml
    except ImportError as exc:
        raise ImportError(f"reading {what} needs PyYAML: pip install 'ddp-exporter[web]'") from exc
    try:
        with open(name, encoding="utf-8") as f:
            return yaml.safe_load(f)
    except OSError as exc:
        raise WebConfigError(name, "", f"cannot be read ({exc.strerror or exc})") from exc
    except UnicodeDecodeError as exc:
        raise WebConfigError(name, "", "not UTF-8 text") from exc
    except yaml.YAMLError as exc:
        raise WebConfigError(name, "", f"not YAML ({exc})".replace("\n", " ")) from exc


def parse(data: Any, path: str) -> WebConfig:
    """Check the parsed YAML ``data`` of the file at ``path``; see :func:`load`."""
    data = {} if data is None else data
    _mapping(data, path, "")
    _known(data, _TOP, path, "")
    tls = _tls(data.get("tls_server_config"), path)
    http = data.get("http_server_config")
    if http is not None:
        _mapping(http, path, "http_server_config")
        _known(http, _HTTP_FIELDS, path, "http_server_config.")
        if "http2" in http and not isinstance(http["http2"], bool):
            raise WebConfigError(path, "http_server_config.http2", "expected true or false")
    return WebConfig(path=path, tls=tls, users=_users(data.get("basic_auth_users"), path))


def _mapping(value: Any, path: str, where: str) -> None:
    if not isinstance(value, dict):
        raise WebConfigError(path, where, f"expected a mapping, got {type(value).__name__}")


def _known(data: dict[str, Any], known: set[str], path: str, prefix: str) -> None:
    for key in data:
        name = f"{prefix}{key}"
        if name in _REFUSED:
            raise WebConfigError(path, name, _REFUSED[name])
        if key not in known:
            raise WebConfigError(path, name, "unknown field")


def _text(data: dict[str, Any], key: str, path: str) -> str:
    value = data.get(key)
    if value is None or value == "":
        return ""
    if not isinstance(value, str):
        raise WebConfigError(path, f"tls_server_config.{key}", "expected a string")
    return value


def _tls(data: Any, path: str) -> TLSServerConfig | None:
    if data is None:
        return None
    _mapping(data, path, "tls_server_config")
    _known(data, _TLS_FIELDS, path, "tls_server_config.")
    folder = os.path.dirname(os.path.abspath(path))

    def file(key: str) -> str:
        text = _text(data, key, path)
        return os.path.join(folder, text) if text else ""

    cert, key, ca = file("cert_file"), file("key_file"), file("client_ca_file")
    auth_name = _text(data, "client_auth_type", path)
    if not (cert or key or ca or auth_name):
        return None  # exporter-toolkit: TLS is off when none of its fields is set
    for name, value in (("cert_file", cert), ("key_file", key)):
        if not value:
            raise WebConfigError(path, f"tls_server_config.{name}", "missing")
    if auth_name in _UNVERIFIED:
        raise WebConfigError(
            path,
            "tls_server_config.client_auth_type",
            f"{auth_name} is not supported (a client certificate is always verified here): "
            "use RequireAndVerifyClientCert with client_ca_file",
        )
    if auth_name not in CLIENT_AUTH:
        raise WebConfigError(
            path, "tls_server_config.client_auth_type", f"unknown value {auth_name!r}"
        )
    auth = CLIENT_AUTH[auth_name]
    if ca and auth == ssl.CERT_NONE:
        raise WebConfigError(
            path, "tls_server_config.client_ca_file", "set without a client_auth_type"
        )
    if auth != ssl.CERT_NONE and not ca:
        raise WebConfigError(
            path, "tls_server_config.client_ca_file", f"missing: {auth_name} verifies against it"
        )
    sans = _sans(data.get("client_allowed_sans"), auth, path)
    # TLS 1.0 and 1.1 are deprecated and refused by OpenSSL 3 at its default level: a floor
    # below 1.2 is raised to it (only stricter than asked); a ceiling below it cannot serve.
    low = max(_version(data, "min_version", "TLS12", path), ssl.TLSVersion.TLSv1_2)
    high = _version(data, "max_version", "TLS13", path)
    if high < ssl.TLSVersion.TLSv1_2:
        raise WebConfigError(path, "tls_server_config.max_version", "TLS12 or TLS13")
    if low > high:
        raise WebConfigError(path, "tls_server_config.min_version", "above max_version")
    if not isinstance(data.get("prefer_server_cipher_suites", True), bool):
        raise WebConfigError(
            path, "tls_server_config.prefer_server_cipher_suites", "expected true or false"
        )
    return TLSServerConfig(cert, key, auth, ca or None, sans, low, high)


def _sans(value: Any, auth: ssl.VerifyMode, path: str) -> tuple[str, ...]:
    if value is None:
        return ()
    where = "tls_server_config.client_allowed_sans"
    if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
        raise WebConfigError(path, where, "expected a list of names")
    if auth != ssl.CERT_REQUIRED:
        raise WebConfigError(path, where, "needs client_auth_type RequireAndVerifyClientCert")
    return tuple(value)


def _version(data: dict[str, Any], key: str, default: str, path: str) -> ssl.TLSVersion:
    name = _text(data, key, path) or default
    if name not in TLS_VERSIONS:
        raise WebConfigError(
            path, f"tls_server_config.{key}", f"expected one of {', '.join(TLS_VERSIONS)}"
        )
    return TLS_VERSIONS[name]


def _users(value: Any, path: str) -> dict[str, bytes]:
    if value is None:
        return {}
    _mapping(value, path, "basic_auth_users")
    users = {}
    for user, hashed in value.items():
        where = f"basic_auth_users.{user}"
        if not isinstance(user, str) or not user or ":" in user:
            raise WebConfigError(path, where, "a user name is a string without ':'")
        if not isinstance(hashed, str) or not _BCRYPT.match(hashed):
            raise WebConfigError(path, where, "expected a bcrypt hash ($2y$10$...)")
        users[user] = hashed.encode()
    return users
