"""Start Grafana on loopback with the mixin's dashboards over a local Prometheus.

For ``ddp-exporter run`` (through :class:`~exporter.tools.localstack.LocalStack`): where Grafana
is installed, the job's dashboards are one click away. Grafana is found by
``DDP_EXPORTER_GRAFANA_BINARY``, on ``PATH`` (``grafana``, ``grafana-server``), or where its
packages and releases put it (``/usr/sbin``, ``/usr/share/grafana``, ``/opt``, the home folder).
It runs from a configuration file of its own in the stack's working folder: loopback only,
anonymous viewers, no update checks, the datasources and dashboards provisioned; nothing is
written where Grafana is installed.
"""

from __future__ import annotations

import glob
import os
import shutil
from pathlib import Path

from .. import settings
from ..deploy.stack import grafana_dashboard_provider, grafana_datasources
from ..mixin.config import MixinConfig
from ..mixin.render import dump_yaml

__all__ = ["find_grafana", "grafana_command", "write_grafana_files"]

_NAMES = ("grafana", "grafana-server")
#: Where Grafana's packages and releases put it, searched after PATH (``~`` expanded).
_PLACES = (
    "/usr/sbin/grafana-server",
    "/usr/share/grafana/bin/grafana",
    "/opt/grafana*/bin/grafana",
    "~/grafana-*/bin/grafana",
)


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def find_grafana() -> str | None:
    """Return the Grafana binary to run, None where there is none."""
    given = settings.stack_binary("grafana")
    if given is not None:
        return given if _executable(given) else None
    for name in _NAMES:
        path = shutil.which(name)
        if path is not None:
            return path
    for place in _PLACES:
        for path in sorted(glob.glob(os.path.expanduser(place)), reverse=True):
            if _executable(path):
                return path
    return None


def _homepath(binary: str) -> str:
    """Return Grafana's home (its ``conf/defaults.ini`` and public files) for ``binary``."""
    for home in (Path(binary).resolve().parent.parent, Path("/usr/share/grafana")):
        if (home / "conf" / "defaults.ini").is_file():
            return str(home)
    return str(Path(binary).resolve().parent.parent)


def write_grafana_files(
    workdir: Path, port: int, prometheus_url: str, alertmanager_url: str, cfg: MixinConfig
) -> Path:
    """Write the configuration file, provisioning and dashboards into ``workdir``; return the file."""
    from ..mixin.dashboards import render_dashboards

    dashboards = workdir / "dashboards"
    provisioning = workdir / "provisioning"
    for folder in (dashboards, provisioning / "datasources", provisioning / "dashboards"):
        folder.mkdir(parents=True, exist_ok=True)
    for name, text in render_dashboards(cfg).items():
        (dashboards / name).write_text(text)
    sources = grafana_datasources(cfg, prometheus_url, alertmanager_url)
    (provisioning / "datasources" / "ddp.yml").write_text(dump_yaml(sources))
    provider = grafana_dashboard_provider(str(dashboards))
    (provisioning / "dashboards" / "ddp.yml").write_text(dump_yaml(provider))
    ini = workdir / "grafana.ini"
    ini.write_text(
        "\n".join(
            [
                "[server]",
                "http_addr = 127.0.0.1",
                f"http_port = {port}",
                "[paths]",
                f"data = {workdir / 'data'}",
                f"logs = {workdir / 'logs'}",
                f"plugins = {workdir / 'plugins'}",
                f"provisioning = {provisioning}",
                "[analytics]",
                "reporting_enabled = false",
                "check_for_updates = false",
                "check_for_plugin_updates = false",
                "[auth.anonymous]",
                "enabled = true",
                "org_role = Viewer",
                "[dashboards]",
                f"default_home_dashboard_path = {dashboards / 'overview.json'}",
                "",
            ]
        )
    )
    return ini


def grafana_command(binary: str, ini: Path) -> list[str]:
    """Return the command that runs ``binary`` with the configuration file ``ini``."""
    # grafana-server (older packages) takes the flags alone; grafana, the "server" subcommand.
    server = [] if Path(binary).name == "grafana-server" else ["server"]
    return [binary, *server, "--homepath", _homepath(binary), "--config", str(ini)]
