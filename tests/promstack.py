"""Start real Prometheus and Alertmanager processes for tests, and find their tools.

Reusable by any test (mixin, fault drills): each helper binds loopback only, picks a free port,
waits for readiness against a deadline (never a bare sleep), and kills the process at teardown.
A missing binary skips the test with the reason; CI installs the Debian packages
``prometheus`` (promtool, prometheus) and ``prometheus-alertmanager`` (amtool,
prometheus-alertmanager).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness import wait_for

from exporter.tools.localstack import free_port

__all__ = [
    "Alertmanager",
    "Prometheus",
    "free_port",
    "require",
    "run_alertmanager",
    "run_prometheus",
    "write_file_sd",
]


#: Debian package that provides each binary (for skip messages).
_PACKAGES = {
    "promtool": "prometheus",
    "prometheus": "prometheus",
    "amtool": "prometheus-alertmanager",
    "prometheus-alertmanager": "prometheus-alertmanager",
    "alertmanager": "prometheus-alertmanager",
}


def require(binary: str) -> str:
    """Return the path of ``binary`` or skip the test saying which package provides it."""
    path = shutil.which(binary)
    if path is None:
        pytest.skip(f"{binary} not installed (apt-get install {_PACKAGES.get(binary, binary)})")
    return path


def _http_json(url: str, timeout: float = 5.0) -> Any:
    """GET ``url`` and return its decoded JSON body."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (loopback only)
        return json.loads(resp.read().decode())


def _ready(url: str) -> bool:
    """Return True when ``url`` answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def write_file_sd(path: Path, targets: list[tuple[str, dict[str, str]]]) -> None:
    """Write a Prometheus file_sd JSON file atomically: one group per (host:port, labels)."""
    groups = [{"targets": [t], "labels": labels} for t, labels in targets]
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(groups, indent=2))
    tmp.replace(path)


@dataclass
class Prometheus:
    """A running Prometheus on loopback."""

    url: str
    process: subprocess.Popen[bytes]
    workdir: Path

    def api(self, path: str, **params: str) -> Any:
        """Call the HTTP API and return ``data``; raise on an error status."""
        query = urllib.parse.urlencode(params)
        body = _http_json(f"{self.url}/api/v1/{path}?{query}")
        if body.get("status") != "success":
            raise RuntimeError(f"{path} {params}: {body}")
        return body["data"]

    def query(self, expr: str, **params: str) -> list[dict[str, Any]]:
        """Run an instant query and return its result vector; raise on a query error."""
        try:
            data = self.api("query", query=expr, **params)
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"query failed: {expr!r}: {exc.read().decode()}") from exc
        return data["result"]

    def targets_up(self) -> list[dict[str, Any]]:
        """Return the active targets whose last scrape succeeded."""
        active = self.api("targets", state="active")["activeTargets"]
        return [t for t in active if t.get("health") == "up"]


@contextlib.contextmanager
def _launch(
    name: str, cmd: list[str], workdir: Path, port: int, timeout: float
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Start ``cmd`` logging to ``workdir/<name>.log``; yield (url, process) once ready; stop it."""
    log_path = workdir / f"{name}.log"
    log = log_path.open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
    url = f"http://127.0.0.1:{port}"
    try:

        def probe() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited {proc.returncode}: {log_path.read_text()}")
            return _ready(f"{url}/-/ready")

        wait_for(probe, timeout, f"{name} /-/ready")
        yield url, proc
    finally:
        _stop(proc)
        log.close()


@contextlib.contextmanager
def run_prometheus(
    workdir: Path,
    config: dict[str, Any],
    *,
    timeout: float = 30.0,
    extra_args: tuple[str, ...] = (),
) -> Iterator[Prometheus]:
    """Start prometheus with ``config`` (written to ``workdir``); yield it once ready; kill it."""
    binary = require("prometheus")
    workdir.mkdir(parents=True, exist_ok=True)
    cfg_path = workdir / "prometheus.yml"
    cfg_path.write_text(yaml.safe_dump(config, sort_keys=False))
    port = free_port()
    cmd = [
        binary,
        f"--config.file={cfg_path}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--web.enable-lifecycle",
        *extra_args,
    ]
    with _launch("prometheus", cmd, workdir, port, timeout) as (url, proc):
        yield Prometheus(url, proc, workdir)


@dataclass
class Alertmanager:
    """A running Alertmanager on loopback."""

    url: str
    process: subprocess.Popen[bytes]


@contextlib.contextmanager
def run_alertmanager(
    workdir: Path, config_text: str, *, timeout: float = 30.0
) -> Iterator[Alertmanager]:
    """Start Alertmanager with ``config_text``; yield it once ready; kill it at exit."""
    binary = shutil.which("prometheus-alertmanager") or require("alertmanager")
    workdir.mkdir(parents=True, exist_ok=True)
    cfg_path = workdir / "alertmanager.yml"
    cfg_path.write_text(config_text)
    port, cluster_port = free_port(), free_port()
    cmd = [
        binary,
        f"--config.file={cfg_path}",
        f"--storage.path={workdir / 'am-data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        f"--cluster.listen-address=127.0.0.1:{cluster_port}",
    ]
    with _launch("alertmanager", cmd, workdir, port, timeout) as (url, proc):
        yield Alertmanager(url, proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Terminate ``proc`` (the one this module started), killing it if it lingers."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
