"""A rank's endpoint under a web configuration file: TLS, client certificates, basic auth.

Real certificates (openssl), a real MetricsServer, real HTTPS clients: what is served, what is
refused with which answer, a renewed certificate served without a restart, and a file that
cannot be served leaving nothing served, never plain HTTP.
"""

from __future__ import annotations

import logging
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from harness import child_env, wait_for
from prometheus_client import CollectorRegistry, Counter
from webpki import (
    PASSWORD,
    USER,
    bcrypt_hash,
    client_file,
    fetch,
    make_pki,
    renew_server,
    write_config,
)

from exporter.export.server import MetricsServer
from exporter.tools.top import fetch as fetch_rows
from exporter.web import WebConfigError, prepare
from exporter.web.client import load_client

pytestmark = pytest.mark.tool  # openssl makes the certificates

CLI = [sys.executable, "-m", "exporter.tools.cli"]

pytest.importorskip("bcrypt")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def _config(pki, folder: Path, *, extra_tls: str = "", users: bool = True) -> Path:
    lines = [
        "tls_server_config:",
        f"  cert_file: {pki.path('server.crt')}",
        f"  key_file: {pki.path('server.key')}",
        "  client_auth_type: RequireAndVerifyClientCert",
        f"  client_ca_file: {pki.path('ca.crt')}",
        "  client_allowed_sans: [prometheus]",
        *([extra_tls] if extra_tls else []),
    ]
    if users:
        lines += ["basic_auth_users:", f"  {USER}: {bcrypt_hash()}"]
    return write_config(folder / "web.yml", "\n".join(lines) + "\n")


@pytest.fixture
def served(pki, tmp_path):
    registry = CollectorRegistry()
    Counter("ddp_test_total", "A counter to find in the answer.", registry=registry).inc()
    server = MetricsServer(registry, "127.0.0.1", 0, web_config=str(_config(pki, tmp_path)))
    assert server.start() is not None
    try:
        yield server
    finally:
        server.close()


def _url(server: MetricsServer, path: str = "/metrics", scheme: str = "https") -> str:
    return f"{scheme}://localhost:{server.port}{path}"


def test_served_only_over_tls_with_a_trusted_client_certificate_and_the_password(served, pki):
    good = {"ca": pki.path("ca.crt"), "cert": pki.pair("client")}
    assert served.url == f"https://127.0.0.1:{served.port}/metrics"
    status, body = fetch(_url(served), **good, user=(USER, PASSWORD))
    assert status == 200 and b"ddp_test_total 1.0" in body
    # The same answer for every path the rank serves, /sd included.
    assert fetch(_url(served, "/sd"), **good)[0] == 401
    assert fetch(_url(served), **good, user=(USER, "wrong"))[0] == 401
    assert fetch(_url(served), **good, user=("nobody", PASSWORD))[0] == 401
    status, body = fetch(_url(served), **good)
    assert status == 401 and b"ddp_test" not in body
    # Plain HTTP to the TLS port: a plain 400 saying so, nothing else.
    status, body = fetch(_url(served, scheme="http"))
    assert status == 400 and b"HTTP request to an HTTPS server" in body


@pytest.mark.parametrize(
    "client",
    ["no certificate", "another CA's certificate", "a name not allowed", "untrusted server"],
)
def test_a_client_the_configuration_does_not_admit_gets_nothing(served, pki, client):
    kwargs = {
        "no certificate": {"ca": pki.path("ca.crt")},
        "another CA's certificate": {"ca": pki.path("ca.crt"), "cert": pki.pair("stranger")},
        "a name not allowed": {"ca": pki.path("ca.crt"), "cert": pki.pair("other")},
        "untrusted server": {"ca": pki.path("rogue.crt"), "cert": pki.pair("client")},
    }[client]
    with pytest.raises((OSError, ssl.SSLError)):
        fetch(_url(served), **kwargs, user=(USER, PASSWORD))
    # ... and the endpoint still serves the client it admits.
    good = {"ca": pki.path("ca.crt"), "cert": pki.pair("client")}
    assert fetch(_url(served), **good, user=(USER, PASSWORD))[0] == 200


def test_a_silent_connection_does_not_hold_the_endpoint(served, pki):
    with socket.create_connection(("127.0.0.1", served.port)):
        good = {"ca": pki.path("ca.crt"), "cert": pki.pair("client")}
        assert fetch(_url(served), **good, user=(USER, PASSWORD), timeout=5)[0] == 200


def _serial(port: int, pki) -> int:
    context = ssl.create_default_context(cafile=pki.path("ca.crt"))
    context.load_cert_chain(*pki.pair("client"))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname="localhost") as conn:
            der = conn.getpeercert(binary_form=True)
    return hash(der)


def test_a_renewed_certificate_is_served_and_a_broken_file_serves_nothing(pki, tmp_path, caplog):
    # Its own copy of the server's files: renewing them must not disturb the other tests.
    for name in ("server.crt", "server.key"):
        (tmp_path / name).write_bytes(Path(pki.path(name)).read_bytes())
    text = _config(pki, tmp_path, users=False).read_text()
    text = text.replace(pki.path("server.crt"), "server.crt").replace(
        pki.path("server.key"), "server.key"
    )
    config = write_config(tmp_path / "web.yml", text)  # relative: to the file's folder
    server = MetricsServer(CollectorRegistry(), "127.0.0.1", 0, web_config=str(config))
    assert server.start() is not None
    try:
        first = _serial(server.port, pki)
        # Renewed in place (what cert-manager or a cron job does): the same name, a new cert.
        renew_server(pki)
        for name in ("server.crt", "server.key"):
            (tmp_path / name).write_bytes(Path(pki.path(name)).read_bytes())
        wait_for(lambda: _serial(server.port, pki) != first, 30, "the renewed certificate")

        caplog.set_level(logging.ERROR, logger="exporter")
        config.write_text(text + "  min_version: TLS9\n")
        good = {"ca": pki.path("ca.crt"), "cert": pki.pair("client")}

        def refused() -> bool:
            try:
                return fetch(_url(server), **good)[0] == 503
            except OSError:
                return True

        wait_for(refused, 30, "nothing served from a broken file")
        with pytest.raises(OSError):  # not even the plain 400: nothing at all
            fetch(_url(server, scheme="http"))
        lines = [r.getMessage() for r in caplog.records if "web configuration" in r.getMessage()]
        assert len(lines) == 1 and "tls_server_config.min_version" in lines[0], lines
        config.write_text(text)
        wait_for(lambda: fetch(_url(server), **good)[0] == 200, 30, "served again once fixed")
    finally:
        server.close()


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("tls_server_config:\n  cert_file: x.crt\n", "tls_server_config.key_file"),
        (
            "tls_server_config:\n  cert_file: nope.crt\n  key_file: nope.key\n",
            "tls_server_config.cert_file",
        ),
        (
            "tls_server_config:\n  cipher_suites: [TLS_AES_128_GCM_SHA256]\n",
            "tls_server_config.cipher_suites",
        ),
        (
            "tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: RequireAnyClientCert\n",
            "tls_server_config.client_auth_type",
        ),
        (
            "tls_server_config:\n  cert_file: a\n  key_file: b\n  client_ca_file: ca.crt\n",
            "tls_server_config.client_ca_file",
        ),
        (
            "tls_server_config:\n  cert_file: a\n  key_file: b\n  client_allowed_sans: [x]\n",
            "tls_server_config.client_allowed_sans",
        ),
        ("basic_auth_users:\n  alice: hunter2\n", "basic_auth_users.alice"),
        ("rate_limit:\n  burst: 3\n", "rate_limit"),
        ("tls_sever_config: {}\n", "tls_sever_config"),
        ("- a list\n", ""),
    ],
)
def test_a_file_that_cannot_be_served_names_its_field_and_serves_nothing(
    tmp_path, caplog, text, field
):
    path = write_config(tmp_path / "web.yml", text)
    caplog.set_level(logging.ERROR, logger="exporter")
    server = MetricsServer(CollectorRegistry(), "127.0.0.1", 0, web_config=str(path))
    try:
        assert server.start() is not None
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 1, lines
        assert lines[0].startswith(f"ddp-exporter: DDP_EXPORTER_WEB_CONFIG={path}: {field}"), lines
        assert "nothing is served until it is fixed (never in the clear)" in lines[0]
        with pytest.raises(OSError):  # not even an error page: nothing at all
            fetch(_url(server, scheme="http"))
    finally:
        server.close()
    with pytest.raises(WebConfigError) as caught:
        prepare(str(path))
    assert caught.value.field == field


def test_a_file_written_after_the_start_is_served_from_then_on(pki, tmp_path, caplog):
    """What cert-manager does: the pod starts before its certificate is written."""
    path = tmp_path / "web.yml"
    caplog.set_level(logging.WARNING, logger="exporter")
    server = MetricsServer(CollectorRegistry(), "127.0.0.1", 0, web_config=str(path))
    try:
        assert server.start() is not None
        assert "web.yml: cannot be read (No such file or directory)" in caplog.text
        with pytest.raises(OSError):
            fetch(_url(server, scheme="http"))
        _config(pki, tmp_path)
        good = {"ca": pki.path("ca.crt"), "cert": pki.pair("client")}

        def served() -> bool:
            try:
                return fetch(_url(server), **good, user=(USER, PASSWORD))[0] == 200
            except OSError:
                return False

        wait_for(served, 30, "the file written after the start to be served")
        assert "fixed: serving again" in caplog.text
    finally:
        server.close()


def test_a_long_or_strange_password_is_a_401_never_an_error(served, pki):
    good = {"ca": pki.path("ca.crt"), "cert": pki.pair("client")}
    for user, password in (("nobody", "x" * 100), (USER, PASSWORD + "x" * 100), (USER, "")):
        assert fetch(_url(served), **good, user=(user, password))[0] == 401


def test_top_reads_tls_ranks_with_an_http_client_file_and_only_with_it(served, pki, tmp_path):
    target = f"localhost:{served.port}"
    (row,) = fetch_rows([target], client=load_client(client_file(pki, tmp_path)))
    assert row.up
    (row,) = fetch_rows([target])
    assert not row.up
    # An empty tls_config still means https (the system's CAs): never the password in the clear.
    text = "tls_config: {}\nbasic_auth:\n  username: u\n  password: p\n"
    assert load_client(write_config(tmp_path / "empty.yml", text)).tls
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    (row,) = fetch_rows([target], client=load_client(client_file(pki, wrong, password="no")))
    assert not row.up


def test_top_refuses_an_http_client_file_it_cannot_use_in_one_line(tmp_path):
    bad = write_config(
        tmp_path / "client.yml", "basic_auth:\n  username: u\n  password_file: gone\n"
    )
    res = subprocess.run(
        [*CLI, "top", "--targets", "localhost:1", "--http-config", str(bad), "--once"],
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env(),
    )
    assert res.returncode == 2, res.stderr
    assert "--http-config" in res.stderr and "basic_auth.password_file: gone" in res.stderr
    assert "Traceback" not in res.stderr


def test_a_slow_client_is_cut_at_the_deadline_and_one_too_many_is_closed(pki, tmp_path):
    from exporter.web import Policy, WebServer

    policy = Policy(str(_config(pki, tmp_path, users=False)))
    app = lambda environ, start: (start("200 OK", []), [b"ok"])[1]  # noqa: E731
    server = WebServer("127.0.0.1", 0, app, policy, connection_s=1.0, most=1)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    context = ssl.create_default_context(cafile=pki.path("ca.crt"))
    context.load_cert_chain(*pki.pair("client"))
    try:
        raw = socket.create_connection(("127.0.0.1", server.server_port), timeout=10)
        with context.wrap_socket(raw, server_hostname="localhost") as slow:
            # The one slot is taken: another connection is closed at once, unserved.
            with socket.create_connection(("127.0.0.1", server.server_port), timeout=10) as more:
                assert more.recv(1) == b""
            # A request sent a byte at a time (the whole of it would take 8 s): cut at the
            # 1 s deadline, never answered.
            start, ended = time.monotonic(), None
            for byte in b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n":
                try:
                    slow.sendall(bytes([byte]))
                except OSError:
                    ended = time.monotonic()
                    break
                time.sleep(0.2)
            if ended is None:  # every byte went into buffers: the end comes, not an answer
                try:
                    assert slow.recv(1) == b""
                except OSError:
                    pass
                ended = time.monotonic()
            assert ended - start < 5, ended - start
    finally:
        server.shutdown()
        server.server_close()
