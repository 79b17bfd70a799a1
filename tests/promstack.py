"""Start real Prometheus and Alertmanager processes for tests, and find their tools.

The processes are started by the product's own starter (:mod:`exporter.tools.localstack`: loopback
only, a free port, readiness against a deadline, stopped at teardown); this module adds what tests
need around it: a missing binary skips the test with the reason (CI installs the Debian packages
``prometheus`` (promtool, prometheus) and ``prometheus-alertmanager`` (amtool,
prometheus-alertmanager)), and a small client for Prometheus's HTTP API.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from exporter.tools import localstack, promapi
from exporter.tools.localstack import free_port

__all__ = [
    "Alertmanager",
    "Prometheus",
    "fast_config",
    "file_sd_scrape",
    "firing",
    "free_port",
    "local_stack",
    "require",
    "run_alertmanager",
    "run_prometheus",
    "sd_scrape",
    "static_scrape",
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
        return promapi.api(self.url, f"/api/v1/{path}", params)

    def query(self, expr: str, **params: str) -> list[dict[str, Any]]:
        """Run an instant query and return its result vector; raise on a query error."""
        try:
            return list(self.api("query", query=expr, **params)["result"])
        except RuntimeError as exc:
            raise RuntimeError(f"query failed: {expr!r}: {exc}") from None

    def targets_up(self) -> list[dict[str, Any]]:
        """Return the active targets whose last scrape succeeded."""
        active = self.api("targets", state="active")["activeTargets"]
        return [t for t in active if t.get("health") == "up"]


@contextlib.contextmanager
def run_prometheus(
    workdir: Path, config: dict[str, Any], *, timeout: float = 30.0
) -> Iterator[Prometheus]:
    """Start prometheus with ``config`` (written to ``workdir``); yield it once ready; stop it."""
    require("prometheus")
    service = localstack.start_prometheus(workdir, config, timeout=timeout)
    try:
        yield Prometheus(service.url, service.process, Path(workdir))
    finally:
        service.close()


def fast_config(workdir: Path, scrape: dict, timeout: str = "900ms") -> dict:
    """Return a 1 s scrape config with the FAST rules (written to ``workdir``).

    Prometheus servers on one host differ by ``timeout``: the exporter tells scrapers apart by
    address, user agent and scrape timeout.
    """
    from exporter.mixin.config import FAST
    from exporter.mixin.rules import render_rules

    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "rules.yml").write_text(render_rules(FAST))
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": timeout},
        "rule_files": [str(workdir / "rules.yml")],
        "scrape_configs": [{"job_name": FAST.job, "honor_labels": True, **scrape}],
    }


def sd_scrape(url: str) -> dict:
    """Return the scrape part that discovers the ranks through the monitoring rank's ``/sd``."""
    return {"http_sd_configs": [{"url": url.replace("/metrics", "/sd"), "refresh_interval": "1s"}]}


def file_sd_scrape(directory: Path) -> dict:
    """Return the scrape part that discovers the ranks through their file_sd files."""
    return {"file_sd_configs": [{"files": [str(directory / "*.json")], "refresh_interval": "1s"}]}


def static_scrape(urls: dict[int, str]) -> dict:
    """Return the scrape part that lists the ranks' endpoints as static targets."""
    return {
        "static_configs": [{"targets": [u.split("//")[1].split("/")[0] for u in urls.values()]}]
    }


def firing(prom: Prometheus, run: str, state: str = "firing") -> list[dict]:
    """Return the labels of every alert of ``run`` in ``state``."""
    return [s["metric"] for s in prom.query(f'ALERTS{{run="{run}", alertstate="{state}"}}')]


@dataclass
class Alertmanager:
    """A running Alertmanager on loopback."""

    url: str
    process: subprocess.Popen[bytes]


@contextlib.contextmanager
def run_alertmanager(
    workdir: Path, config_text: str, *, timeout: float = 30.0
) -> Iterator[Alertmanager]:
    """Start Alertmanager with ``config_text``; yield it once ready; stop it at exit."""
    if shutil.which("prometheus-alertmanager") is None:
        require("alertmanager")
    service = localstack.start_alertmanager(workdir, config_text, timeout=timeout)
    try:
        yield Alertmanager(service.url, service.process)
    finally:
        service.close()


@contextlib.contextmanager
def local_stack(workdir: Path) -> Iterator[tuple[localstack.LocalStack, Path]]:
    """Run the product's LocalStack (FAST rules) over a new file_sd folder; skip without it."""
    try:
        localstack.find_binaries()
    except localstack.MissingBinaryError as exc:
        pytest.skip(str(exc))
    sd = workdir / "sd"
    sd.mkdir(parents=True)
    with localstack.LocalStack(workdir / "stack", sd) as st:
        yield st, sd
