"""Certificates for the web configuration tests, made with the real ``openssl``.

One CA signs the server (``localhost``, ``127.0.0.1``) and a client (``prometheus``); a second,
untrusted CA signs a client of its own; a web configuration file ties them together.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
import urllib.error
import urllib.request
from base64 import b64encode
from dataclasses import dataclass
from pathlib import Path

import pytest

__all__ = [
    "PASSWORD",
    "PKI",
    "USER",
    "bcrypt_hash",
    "fetch",
    "make_pki",
    "renew_server",
    "write_config",
]

USER, PASSWORD = "prometheus", "s3cret scrape"
SERVER_SANS = "DNS:localhost,IP:127.0.0.1"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _ca(folder: Path, name: str) -> None:
    req = "req -x509 -newkey rsa:2048 -nodes -days 2".split()
    _openssl(
        *req, "-keyout", f"{name}.key", "-out", f"{name}.crt", "-subj", f"/CN={name}", cwd=folder
    )


def _signed(folder: Path, name: str, ca: str, san: str, usage: str) -> None:
    key, csr = f"{name}.key", f"{name}.csr"
    _openssl(
        *"req -newkey rsa:2048 -nodes".split(),
        "-keyout",
        key,
        "-out",
        csr,
        "-subj",
        f"/CN={name}",
        cwd=folder,
    )
    (folder / f"{name}.ext").write_text(f"subjectAltName={san}\nextendedKeyUsage={usage}\n")
    sign = ["x509", "-req", "-in", csr, "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key"]
    extra = ["-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext"]
    _openssl(*sign, *extra, "-out", f"{name}.crt", cwd=folder)


@dataclass(frozen=True)
class PKI:
    """The folder of the certificates: :meth:`path` names a file in it."""

    folder: Path

    def path(self, name: str) -> str:
        return str(self.folder / name)

    def pair(self, name: str) -> tuple[str, str]:
        """Return ``(certificate, key)`` of ``name``."""
        return self.path(f"{name}.crt"), self.path(f"{name}.key")


def make_pki(folder: Path) -> PKI:
    """Make the CAs and certificates in ``folder``; skip where openssl is missing."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    folder.mkdir(parents=True, exist_ok=True)
    _ca(folder, "ca")
    _ca(folder, "rogue")
    _signed(folder, "server", "ca", SERVER_SANS, "serverAuth")
    _signed(folder, "client", "ca", "DNS:prometheus", "clientAuth")
    _signed(folder, "other", "ca", "DNS:someone-else", "clientAuth")
    _signed(folder, "stranger", "rogue", "DNS:prometheus", "clientAuth")
    return PKI(folder)


def renew_server(pki: PKI) -> None:
    """Sign a new server certificate (and key) under the same names, as a renewal does."""
    _signed(pki.folder, "server", "ca", SERVER_SANS, "serverAuth")


def write_config(path: Path, text: str) -> Path:
    """Write a web configuration file, user-only as a file naming credentials should be."""
    path.write_text(text)
    path.chmod(0o600)
    return path


def client_file(pki: PKI, folder: Path, *, password: str = PASSWORD) -> Path:
    """Write an HTTP client configuration (the CA, the client's certificate, the password in a
    file of its own, named relative to the configuration's folder); return its path."""
    write_config(folder / "password", password + "\n")
    text = "\n".join(
        [
            "tls_config:",
            f"  ca_file: {pki.path('ca.crt')}",
            f"  cert_file: {pki.path('client.crt')}",
            f"  key_file: {pki.path('client.key')}",
            "basic_auth:",
            f"  username: {USER}",
            "  password_file: password",
            "",
        ]
    )
    return write_config(folder / "client.yml", text)


def bcrypt_hash(password: str = PASSWORD) -> str:
    import bcrypt

    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()


def fetch(
    url: str,
    *,
    ca: str | None = None,
    cert: tuple[str, str] | None = None,
    user: tuple[str, str] | None = None,
    timeout: float = 10.0,
) -> tuple[int, bytes]:
    """GET ``url``; return ``(status, body)``; raise for a connection or TLS failure."""
    context = None
    if url.startswith("https:"):
        context = ssl.create_default_context(cafile=ca)
        if cert is not None:
            context.load_cert_chain(*cert)
    request = urllib.request.Request(url)
    if user is not None:
        token = b64encode(f"{user[0]}:{user[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
