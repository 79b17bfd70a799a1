"""Build the server's TLS context from ``tls_server_config`` and check a client's names."""

from __future__ import annotations

import ipaddress
import ssl
from typing import Any

from .config import TLSServerConfig, WebConfigError

__all__ = ["allowed_client", "server_context"]

#: The subject alternative names a client is matched by, as Python's ssl names them.
_SAN_KINDS = ("DNS", "email", "IP Address", "URI")


def server_context(cfg: TLSServerConfig, path: str) -> ssl.SSLContext:
    """Return a server-side context for ``cfg`` (read from the file at ``path``).

    Raises :class:`WebConfigError` naming the field whose file cannot be loaded.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version, ctx.maximum_version = cfg.min_version, cfg.max_version
    try:
        # An encrypted key fails at once instead of OpenSSL asking a terminal for its pass phrase.
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file, password=_no_pass_phrase)
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise WebConfigError(
            path,
            "tls_server_config.cert_file",
            f"{cfg.cert_file} with key_file {cfg.key_file}: {_why(exc)}",
        ) from exc
    if cfg.client_ca_file:
        try:
            ctx.load_verify_locations(cafile=cfg.client_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise WebConfigError(
                path, "tls_server_config.client_ca_file", f"{cfg.client_ca_file}: {_why(exc)}"
            ) from exc
    ctx.verify_mode = cfg.client_auth
    return ctx


def _no_pass_phrase() -> bytes:
    raise ValueError("an encrypted key_file: give the key without a pass phrase")


def _why(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or getattr(exc, "reason", None) or str(exc)


def _names(cert: dict[str, Any]) -> set[str]:
    names = set()
    for kind, value in cert.get("subjectAltName", ()):
        if kind not in _SAN_KINDS:  # DirName, othername: not names exporter-toolkit matches
            continue
        if kind == "IP Address":
            try:
                value = str(ipaddress.ip_address(value.strip()))
            except ValueError:
                continue
        names.add(value)
    return names


def allowed_client(cert: dict[str, Any] | None, sans: tuple[str, ...]) -> bool:
    """Say whether a verified client certificate carries one of ``sans`` (any, when empty).

    Compared as exporter-toolkit compares them: DNS names, e-mail addresses, IP addresses and
    URIs of the certificate's subject alternative names, exactly.
    """
    if not sans:
        return True
    if not cert:
        return False
    wanted = set()
    for name in sans:
        try:
            wanted.add(str(ipaddress.ip_address(name)))
        except ValueError:
            wanted.add(name)
    return bool(_names(cert) & wanted)
