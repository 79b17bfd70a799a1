"""Run Prometheus and Alertmanager on loopback with the FAST generated rules.

Used by ``ddp-exporter demo --stack`` and by the fault drills: Prometheus scrapes the ranks
listed in a file_sd directory every second, evaluates the FAST variant of the generated rules
(same expressions, short windows), and sends alerts to Alertmanager, whose generated routes
deliver to a webhook receiver served here. Processes are started as plain children on free
loopback ports and killed by :meth:`LocalStack.close`.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

__all__ = ["LocalStack", "MissingBinaryError", "find_binaries", "free_port"]

_INSTALL = "apt-get install prometheus prometheus-alertmanager"


class MissingBinaryError(RuntimeError):
    """Prometheus or Alertmanager is not installed."""


def find_binaries() -> tuple[str, str]:
    """Return the prometheus and alertmanager paths, or raise MissingBinaryError saying how to install."""
    prom = shutil.which("prometheus")
    am = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    missing = [n for n, p in (("prometheus", prom), ("alertmanager", am)) if p is None]
    if missing:
        raise MissingBinaryError(
            f"{' and '.join(missing)} not found on PATH; install them with `{_INSTALL}` "
            "(Debian/Ubuntu) or put the official binaries on PATH"
        )
    return prom, am  # type: ignore[return-value]


def free_port() -> int:
    """Return a TCP port that is free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fast_routes(node: dict[str, Any]) -> None:
    # Local runs measure detection, not batching: deliver each alert group at once.
    node["group_wait"], node["group_interval"] = "1s", "1s"
    for child in node.get("routes", []):
        _fast_routes(child)


class _Receiver:
    """Webhook receiver: keep every firing alert with its arrival time, call ``on_alert``."""

    def __init__(self, on_alert: Callable[[dict[str, Any]], None] | None) -> None:
        self.alerts: list[tuple[float, dict[str, Any]]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                now = time.monotonic()
                for alert in body.get("alerts", []):
                    if alert.get("status") == "firing":
                        outer.alerts.append((now, alert))
                        if on_alert is not None:
                            on_alert(alert)
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/alerts"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


class LocalStack:
    """Prometheus + Alertmanager + webhook receiver on loopback, over a file_sd directory."""

    def __init__(
        self,
        workdir: Path,
        file_sd_dir: Path,
        on_alert: Callable[[dict[str, Any]], None] | None = None,
        ready_timeout: float = 30.0,
    ) -> None:
        from .mixin.alertmanager import alertmanager_config
        from .mixin.config import FAST
        from .mixin.rules import render_rules

        prom_bin, am_bin = find_binaries()
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._procs: list[subprocess.Popen[bytes]] = []
        self._receiver = _Receiver(on_alert)
        try:
            am_cfg = alertmanager_config(dataclasses.replace(FAST, webhook_url=self._receiver.url))
            _fast_routes(am_cfg["route"])
            (self.workdir / "alertmanager.yml").write_text(yaml.safe_dump(am_cfg))
            am_port = free_port()
            self.alertmanager_url = f"http://127.0.0.1:{am_port}"
            self._start(
                [am_bin, f"--config.file={self.workdir / 'alertmanager.yml'}",
                 f"--storage.path={self.workdir / 'am-data'}",
                 f"--web.listen-address=127.0.0.1:{am_port}",
                 f"--cluster.listen-address=127.0.0.1:{free_port()}"],
                "alertmanager.log",
            )  # fmt: skip
            (self.workdir / "rules.yml").write_text(render_rules(FAST))
            prom_cfg = {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s",
                           "scrape_timeout": "900ms"},
                "rule_files": [str(self.workdir / "rules.yml")],
                "alerting": {"alertmanagers": [
                    {"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
                "scrape_configs": [{
                    "job_name": FAST.job, "honor_labels": True,
                    "file_sd_configs": [{"files": [str(Path(file_sd_dir) / "*.json")],
                                         "refresh_interval": "1s"}],
                }],
            }  # fmt: skip
            (self.workdir / "prometheus.yml").write_text(yaml.safe_dump(prom_cfg, sort_keys=False))
            prom_port = free_port()
            self.prometheus_url = f"http://127.0.0.1:{prom_port}"
            self._start(
                [prom_bin, f"--config.file={self.workdir / 'prometheus.yml'}",
                 f"--storage.tsdb.path={self.workdir / 'prom-data'}",
                 f"--web.listen-address=127.0.0.1:{prom_port}"],
                "prometheus.log",
            )  # fmt: skip
            for url in (self.alertmanager_url, self.prometheus_url):
                self._wait_ready(url, ready_timeout)
        except BaseException:
            self.close()
            raise

    def _start(self, cmd: list[str], log: str) -> None:
        with open(self.workdir / log, "wb") as out:
            self._procs.append(
                subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=self.workdir)
            )

    def _wait_ready(self, url: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for p in self._procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{p.args[0]} exited {p.returncode}; see {self.workdir}")
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{url} not ready after {timeout}s; logs in {self.workdir}")

    @property
    def alerts(self) -> list[tuple[float, dict[str, Any]]]:
        """Return every firing alert delivered so far, with its monotonic arrival time."""
        return list(self._receiver.alerts)

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Run an instant PromQL query against the local Prometheus."""
        url = f"{self.prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=5) as resp:
            body = json.loads(resp.read())
        if body.get("status") != "success":
            raise RuntimeError(f"query {expr!r} failed: {body}")
        return body["data"]["result"]

    def close(self) -> None:
        """Stop every process this stack started; idempotent."""
        for p in self._procs:
            if p.poll() is None:
                p.terminate()
        for p in self._procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self._procs = []
        self._receiver.server.shutdown()
        self._receiver.server.server_close()

    def __enter__(self) -> LocalStack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
