"""Run Prometheus and Alertmanager on loopback: one starter for the demo, the drills and tests.

:func:`start_prometheus` and :func:`start_alertmanager` start one server as a plain child
process on a free loopback port, wait for ``/-/ready`` against a deadline and return a
:class:`Service` whose :meth:`~Service.close` stops it. :class:`LocalStack` puts both together
for ``ddp-exporter demo --stack`` and the fault drills: Prometheus scrapes the ranks listed in a
file_sd directory every second, evaluates the generated rules (by default their FAST variant:
same expressions, short windows), and sends alerts to Alertmanager, whose generated routes deliver
to the printing receiver (:class:`~exporter.tools.receiver.AlertReceiver`).

PyYAML (extra ``mixin``) is imported when a server is started, not with this module, so the
command line starts on a base install.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import glob
import importlib.util
import os
import random
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import settings
from ..generate.command import MIXIN_EXTRA
from ..mixin.config import FAST, MixinConfig
from .promapi import instant_query
from .receiver import AlertReceiver

__all__ = [
    "LocalStack",
    "MissingBinaryError",
    "Service",
    "add_stack_flags",
    "find_binaries",
    "find_binary",
    "free_port",
    "start_alertmanager",
    "stack_choice",
    "stack_missing",
    "start_prometheus",
]

_INSTALL = "apt-get install prometheus prometheus-alertmanager"
#: Names each server's binary goes by, in the order they are looked up on PATH.
_BINARIES = {
    "prometheus": ("prometheus",),
    "alertmanager": ("prometheus-alertmanager", "alertmanager"),
}


class MissingBinaryError(RuntimeError):
    """Prometheus or Alertmanager is not installed."""


#: Where an official release is often unpacked, searched after PATH (``~`` expanded).
_PLACES = ("/usr/local/bin", "/opt/{name}", "/opt/{name}-*", "~/.local/bin", "~/{name}-*")


def _where(name: str) -> str | None:
    given = settings.stack_binary(name)
    if given is not None:
        return given if os.access(given, os.X_OK) and os.path.isfile(given) else None
    for candidate in _BINARIES[name]:
        path = shutil.which(candidate)
        if path is not None:
            return path
    for place in _PLACES:
        pattern = os.path.join(os.path.expanduser(place.format(name=name)), name)
        for path in sorted(glob.glob(pattern), reverse=True):  # the newest release first
            if os.access(path, os.X_OK) and os.path.isfile(path):
                return path
    return None


def _not_found(missing: list[str]) -> MissingBinaryError:
    given = [n for n in missing if settings.stack_binary(n) is not None]
    if given:
        variable = (
            settings.PROMETHEUS_BINARY if given[0] == "prometheus" else settings.ALERTMANAGER_BINARY
        )
        return MissingBinaryError(
            f"{variable}={settings.stack_binary(given[0])} is not an executable file"
        )
    it = "them" if len(missing) > 1 else "it"
    return MissingBinaryError(
        f"{' and '.join(missing)} not found on PATH or where releases are unpacked "
        f"(/opt, ~/.local/bin); install {it} with `{_INSTALL}` (Debian/Ubuntu), or point "
        f"{settings.PROMETHEUS_BINARY} / {settings.ALERTMANAGER_BINARY} at the official binaries"
    )


def find_binary(name: str) -> str:
    """Return the path of ``prometheus`` or ``alertmanager``; raise MissingBinaryError if absent.

    Its variable (``DDP_EXPORTER_PROMETHEUS_BINARY``, ``..._ALERTMANAGER_BINARY``) first, then
    PATH, then the places an official release is often unpacked (:data:`_PLACES`).
    """
    path = _where(name)
    if path is None:
        raise _not_found([name])
    return path


def find_binaries() -> tuple[str, str]:
    """Return the prometheus and alertmanager paths, or raise MissingBinaryError saying how to install."""
    found = {name: _where(name) for name in _BINARIES}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        raise _not_found(missing)
    return found["prometheus"], found["alertmanager"]  # type: ignore[return-value]


#: Where the kernel says its ephemeral ports (the local ports of outgoing connections) begin.
_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: How many ports below the ephemeral range free ports are drawn from.
_QUIET_SPAN = 8192
_TRIES = 64
#: Ports this process was handed lately: a caller may not have bound one yet when it asks again.
_HANDED: collections.deque[int] = collections.deque(maxlen=256)
_HANDING = threading.Lock()


def stack_missing() -> str | None:
    """Return what a local stack lacks (a binary, the ``mixin`` extra), None when it can run."""
    try:
        find_binaries()
    except MissingBinaryError as exc:
        return str(exc)
    try:
        found = importlib.util.find_spec("yaml") is not None
    except ImportError:
        found = False
    return None if found else f"the stack needs the mixin extra: {MIXIN_EXTRA}"


def add_stack_flags(parser: argparse.ArgumentParser, stack_help: str) -> None:
    """Add ``--stack`` (``stack_help``) and ``--no-stack`` to a tool that can start the stack."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--stack", dest="stack", action="store_true", default=None, help=stack_help)
    group.add_argument(
        "--no-stack",
        dest="stack",
        action="store_false",
        help="never start Prometheus and Alertmanager",
    )


def stack_choice(asked: bool | None, tool: str) -> tuple[bool, str | None, int | None]:
    """Return whether to start the stack, what it lacks, and an exit status for ``--stack``.

    ``asked``: True for ``--stack`` (lacking something is then a usage error, said in one line
    as ``ddp-exporter TOOL: --stack: ...``, exit 2), False for ``--no-stack``, None for "when it
    can run" (the caller says what it lacks its own way).
    """
    if asked is False:
        return False, None, None
    missing = stack_missing()
    if missing is None:
        return True, None, None
    if asked:
        print(f"ddp-exporter {tool}: --stack: {missing}", file=sys.stderr)
        return False, missing, 2
    return False, missing, None


def _quiet_ports() -> range | None:
    """Return the ports just below the ephemeral range, or None where it leaves no room."""
    try:
        low = int(_EPHEMERAL.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    start = max(1024, low - _QUIET_SPAN)
    return range(start, low) if low - start >= 1024 else None


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port(count: int = 1) -> int:
    """Return the first of ``count`` consecutive TCP ports free on 127.0.0.1 right now.

    Drawn below the kernel's ephemeral range where it leaves room: a port from ``bind(0)`` is
    one that any outgoing connection on the machine may take as its local port before the
    caller binds it; below that range only a deliberate bind can.
    """
    if count < 1:
        raise ValueError(f"count must be at least 1, not {count}")
    with _HANDING:
        quiet = _quiet_ports()
        if quiet is not None and count < len(quiet):
            draw = random.SystemRandom()
            for _ in range(_TRIES):
                base = draw.randrange(quiet.start, quiet.stop - count + 1)
                if _usable(base, count):
                    return _hand(base, count)
        for _ in range(_TRIES):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                base = int(s.getsockname()[1])
            if base + count <= 65536 and _usable(base, count):
                return _hand(base, count)
    raise OSError(f"no {count} consecutive free TCP ports on 127.0.0.1")


def _usable(base: int, count: int) -> bool:
    ports = range(base, base + count)
    return not any(p in _HANDED for p in ports) and all(_bindable(p) for p in ports)


def _hand(base: int, count: int) -> int:
    _HANDED.extend(range(base, base + count))
    return base


@dataclasses.dataclass
class Service:
    """A Prometheus or Alertmanager process this module started, serving on loopback."""

    name: str
    url: str
    process: subprocess.Popen[bytes]
    workdir: Path

    @property
    def log_path(self) -> Path:
        """Return the file holding the process's output."""
        return self.workdir / f"{self.name}.log"

    def close(self) -> None:
        """Stop the process (terminate, then kill if it lingers); idempotent."""
        proc = self.process
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return resp.status == 200
    except OSError:
        return False


def _launch(
    name: str, cmd: list[str], workdir: Path, port: int, timeout: float, ready: str = "/-/ready"
) -> Service:
    """Start ``cmd`` logging to ``workdir/<name>.log``; return it once ``ready`` answers 200."""
    with open(workdir / f"{name}.log", "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=workdir)
    service = Service(name, f"http://127.0.0.1:{port}", proc, workdir)
    deadline = time.monotonic() + timeout
    try:
        while not _ready(f"{service.url}{ready}"):
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{name} exited {proc.returncode}: {service.log_path.read_text()[-2000:]}"
                )
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"{service.url} not ready after {timeout}s; log in {service.log_path}"
                )
            time.sleep(0.2)
    except BaseException:
        service.close()
        raise
    return service


def start_prometheus(workdir: Path, config: dict[str, Any], *, timeout: float = 30.0) -> Service:
    """Start Prometheus with ``config`` (written to ``workdir``); return it once ready."""
    binary = find_binary("prometheus")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    import yaml

    cfg_path = workdir / "prometheus.yml"
    cfg_path.write_text(yaml.safe_dump(config, sort_keys=False))
    port = free_port()
    cmd = [
        binary,
        f"--config.file={cfg_path}",
        f"--storage.tsdb.path={workdir / 'prom-data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    return _launch("prometheus", cmd, workdir, port, timeout)


def start_alertmanager(
    workdir: Path, config: dict[str, Any] | str, *, timeout: float = 30.0
) -> Service:
    """Start Alertmanager with ``config`` (a dict or YAML text); return it once ready."""
    binary = find_binary("alertmanager")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    import yaml

    cfg_path = workdir / "alertmanager.yml"
    cfg_path.write_text(config if isinstance(config, str) else yaml.safe_dump(config))
    port = free_port()
    cmd = [
        binary,
        f"--config.file={cfg_path}",
        f"--storage.path={workdir / 'am-data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        f"--cluster.listen-address=127.0.0.1:{free_port()}",
    ]
    return _launch("alertmanager", cmd, workdir, port, timeout)


def _fast_routes(node: dict[str, Any]) -> None:
    # Local runs measure detection, not batching: deliver each alert group at once.
    node["group_wait"], node["group_interval"] = "1s", "1s"
    for child in node.get("routes", []):
        _fast_routes(child)


class LocalStack:
    """Prometheus + Alertmanager + webhook receiver on loopback, over a file_sd directory.

    ``grafana``: also Grafana with the dashboards, where it is installed (:mod:`.localgrafana`);
    ``scrape``: how to read the ranks (``tls_config``, ``basic_auth``: ranks served over TLS).
    """

    def __init__(
        self,
        workdir: Path,
        file_sd_dir: Path,
        on_alert: Callable[[dict[str, Any]], None] | None = None,
        ready_timeout: float = 30.0,
        config: MixinConfig = FAST,
        grafana: bool = False,
        scrape: dict[str, Any] | None = None,
    ) -> None:
        from ..deploy.alertmanager import alertmanager_config
        from ..mixin.rules import render_rules

        find_binaries()  # both, or neither: say what to install before starting anything
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._services: list[Service] = []
        #: Grafana's URL where it was asked for, found and started; why not, if it failed.
        self.grafana_url: str | None = None
        self.grafana_error: str | None = None
        # The demo shows what fires; a resolved alert is news only to a person on call.
        self._receiver = AlertReceiver(
            lambda alert: on_alert(alert) if on_alert and alert.get("status") == "firing" else None
        )
        try:
            am_cfg = alertmanager_config(
                dataclasses.replace(config, webhook_url=self._receiver.url)
            )
            _fast_routes(am_cfg["route"])
            am = start_alertmanager(self.workdir, am_cfg, timeout=ready_timeout)
            self._services.append(am)
            self.alertmanager_url = am.url
            (self.workdir / "rules.yml").write_text(render_rules(config))
            prom_cfg = {
                "global": {
                    "scrape_interval": "1s",
                    "evaluation_interval": "1s",
                    "scrape_timeout": "900ms",
                },
                "rule_files": [str(self.workdir / "rules.yml")],
                "alerting": {
                    "alertmanagers": [{"static_configs": [{"targets": [am.url.split("//", 1)[1]]}]}]
                },
                "scrape_configs": [
                    {
                        "job_name": config.job,
                        "honor_labels": True,
                        "file_sd_configs": [
                            {"files": [str(Path(file_sd_dir) / "*.json")], "refresh_interval": "1s"}
                        ],
                        **(scrape or {}),
                    }
                ],
            }
            prom = start_prometheus(self.workdir, prom_cfg, timeout=ready_timeout)
            self._services.append(prom)
            self.prometheus_url = prom.url
            if grafana:
                self._start_grafana(config)
        except BaseException:
            self.close()
            raise

    def _start_grafana(self, config: MixinConfig) -> None:
        from .localgrafana import find_grafana, grafana_command, write_grafana_files

        binary = find_grafana()
        if binary is None:
            return
        folder, port = self.workdir / "grafana", free_port()
        ini = write_grafana_files(folder, port, self.prometheus_url, self.alertmanager_url, config)
        try:
            # Its first start migrates a fresh database: slower than Prometheus.
            service = _launch(
                "grafana", grafana_command(binary, ini), folder, port, 90.0, "/api/health"
            )
        except (RuntimeError, OSError) as exc:
            self.grafana_error = str(exc).splitlines()[0]
            return
        self._services.append(service)
        self.grafana_url = service.url

    @property
    def alerts(self) -> list[tuple[float, dict[str, Any]]]:
        """Return every firing alert delivered so far, with its monotonic arrival time."""
        return list(self._receiver.alerts)

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Run an instant PromQL query against the local Prometheus."""
        return instant_query(self.prometheus_url, expr)

    def close(self) -> None:
        """Stop every process this stack started; idempotent."""
        for service in self._services:
            service.close()
        self._services = []
        self._receiver.close()

    def __enter__(self) -> LocalStack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
