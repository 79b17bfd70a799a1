"""Build the demo/monitoring stack: Prometheus, Grafana provisioning and docker-compose.

Prometheus discovers the ranks through file_sd: a launcher (the demo, or your job's wrapper)
writes one JSON file per job listing ``host:port`` targets with the labels ``run`` and
``rank``, so ``up`` carries them too and persists for a dead rank while its file stays.
``honor_labels: true`` keeps the run/rank labels of the exposition.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..mixin.config import DEFAULT, MixinConfig
from ..mixin.render import dump_json, dump_yaml
from ..settings import WEB_CONFIG
from ..version import __version__
from .alertmanager import PRINTING_RECEIVER_URL

__all__ = [
    "IMAGES",
    "compose",
    "file_sd_example",
    "scrape_client",
    "grafana_dashboard_provider",
    "grafana_datasources",
    "prometheus_config",
    "render_stack",
]

#: Pinned images of the stack.
IMAGES: dict[str, str] = {
    "prometheus": "prom/prometheus:v2.53.2",
    "alertmanager": "prom/alertmanager:v0.27.0",
    "grafana": "grafana/grafana:11.2.2",
    "trainer": "python:3.11-slim",
    "receiver": "python:3.11-slim",
}

#: torch wheel the demo trainer installs (CPU build from the PyTorch CPU index).
TORCH_PIN = "torch==2.13.0"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"

# Paths inside the containers.
_PROM_DIR = "/etc/prometheus"
_FILE_SD_DIR = "/etc/prometheus/file_sd"
_DASHBOARD_DIR = "/var/lib/grafana/dashboards"


def prometheus_config(
    cfg: MixinConfig = DEFAULT,
    *,
    rule_files: Sequence[str] = (f"{_PROM_DIR}/rules.yml",),
    file_sd_files: Sequence[str] = (f"{_FILE_SD_DIR}/*.json", f"{_FILE_SD_DIR}/*.yml"),
    alertmanagers: Sequence[str] = ("alertmanager:9093",),
    scrape_interval: str | None = None,
    evaluation_interval: str | None = None,
) -> dict[str, Any]:
    """Return a Prometheus configuration scraping the ranks listed in file_sd files.

    The defaults are those of the compose stack; tests pass local paths and loopback ports.
    """
    out: dict[str, Any] = {
        "global": {
            "scrape_interval": scrape_interval or cfg.scrape_interval,
            "evaluation_interval": evaluation_interval or cfg.evaluation_interval,
        },
        "rule_files": list(rule_files),
    }
    if alertmanagers:
        out["alerting"] = {
            "alertmanagers": [{"static_configs": [{"targets": list(alertmanagers)}]}]
        }
    out["scrape_configs"] = [
        {
            "job_name": cfg.job,
            # The exposition carries run and rank; keep them (file_sd sets the same values).
            "honor_labels": True,
            "file_sd_configs": [{"files": list(file_sd_files), "refresh_interval": "5s"}],
            **scrape_client(cfg),
        }
    ]
    return out


def scrape_client(cfg: MixinConfig) -> dict[str, Any]:
    """Return the scrape job's ``scheme``, ``tls_config`` and ``basic_auth`` for ``cfg``.

    Empty for plain HTTP. An ``http_sd_configs`` entry reading a monitoring rank's ``/sd``
    takes the same ``tls_config`` and ``basic_auth`` (the Security page shows one).
    """
    out: dict[str, Any] = {}
    if cfg.scrape_scheme == "https":
        tls = {"ca_file": cfg.scrape_ca_file} if cfg.scrape_ca_file else {}
        if cfg.scrape_cert_file:
            tls.update(cert_file=cfg.scrape_cert_file, key_file=cfg.scrape_key_file)
        if cfg.scrape_server_name:
            tls["server_name"] = cfg.scrape_server_name
        out["scheme"] = "https"
        out["tls_config"] = tls
    if cfg.scrape_username:
        out["basic_auth"] = {
            "username": cfg.scrape_username,
            "password_file": cfg.scrape_password_file,
        }
    return out


def file_sd_example(
    targets: Sequence[tuple[str, str, int]] = (
        ("node-0:19400", "example-run", 0),
        ("node-0:19401", "example-run", 1),
        ("node-1:19400", "example-run", 2),
    ),
) -> list[dict[str, Any]]:
    """Return file_sd content for ``(host:port, run, rank)`` targets: one group per rank."""
    return [{"targets": [t], "labels": {"run": run, "rank": str(rank)}} for t, run, rank in targets]


def grafana_datasources(
    cfg: MixinConfig = DEFAULT,
    prometheus_url: str = "http://prometheus:9090",
    alertmanager_url: str = "http://alertmanager:9093",
) -> dict[str, Any]:
    """Return Grafana datasource provisioning: Prometheus with the fixed uid, and Alertmanager.

    The URLs default to the compose stack's services.
    """
    return {
        "apiVersion": 1,
        "datasources": [
            {
                "name": "Prometheus",
                "type": "prometheus",
                "uid": cfg.datasource_uid,
                "access": "proxy",
                "url": prometheus_url,
                "isDefault": True,
                "editable": False,
                "jsonData": {"timeInterval": cfg.scrape_interval},
            },
            {
                "name": "Alertmanager",
                "type": "alertmanager",
                "uid": "ddp-alertmanager",
                "access": "proxy",
                "url": alertmanager_url,
                "editable": False,
                "jsonData": {"implementation": "prometheus", "handleGrafanaManagedAlerts": False},
            },
        ],
    }


def grafana_dashboard_provider(path: str = _DASHBOARD_DIR) -> dict[str, Any]:
    """Return Grafana dashboard provisioning: load the JSON files in ``path`` into folder DDP."""
    return {
        "apiVersion": 1,
        "providers": [
            {
                "name": "ddp-exporter",
                "folder": "DDP",
                "type": "file",
                "disableDeletion": True,
                "allowUiUpdates": False,
                "updateIntervalSeconds": 30,
                "options": {"path": path, "foldersFromFilesStructure": False},
            }
        ],
    }


#: The printing receiver's port (the generated Alertmanager configuration posts there).
RECEIVER_PORT = int(PRINTING_RECEIVER_URL.rsplit(":", 1)[1].split("/")[0])


def _install(options: str = "", extra: str = "") -> str:
    """Return the shell step that installs ddp-exporter (with ``extra``) with pip ``options``.

    The stack's folder is mounted at /src: a checkout of the repository is installed from a
    copy (the mount is read-only), a folder the generator wrote gets the release it came from.
    """
    pip = f"pip install --no-cache-dir{' ' + options if options else ''}"
    local, release = "/tmp/ddp-exporter", f"ddp-exporter=={__version__}"
    if extra:
        local, release = f"'{local}[{extra}]'", f"'ddp-exporter[{extra}]=={__version__}'"
    return (
        "if [ -f /src/pyproject.toml ]; then "
        f"cp -r /src /tmp/ddp-exporter && {pip} {local}; "
        f"else {pip} {release}; fi; "
    )


def _trainer_command(extra: str = "") -> str:
    """Return the demo trainer's shell command (compose interpolates ``${...}`` from the host)."""
    return (
        "set -e; "
        # torch first, the CPU build, the way PyTorch documents it for CPU-only machines.
        f"pip install --no-cache-dir --index-url {TORCH_CPU_INDEX} {TORCH_PIN}; "
        + _install(extra=extra)
        # The compose stack is the demo's Prometheus and Alertmanager: it starts none of its own.
        + 'exec ddp-exporter demo --ranks 3 --fault "$$DDP_FAULT" '
        '--fault-rank "$$DDP_FAULT_RANK" --duration 0 --no-top --file-sd /file_sd --no-stack'
    )


def _receiver_command() -> str:
    """Return the printing receiver's shell command: the package alone, no torch."""
    return (
        "set -e; "
        + _install("--no-deps")
        + f"exec ddp-exporter receiver --listen 0.0.0.0:{RECEIVER_PORT}"
    )


def compose(cfg: MixinConfig = DEFAULT) -> dict[str, Any]:
    """Return the docker-compose model: prometheus, alertmanager, grafana and a demo trainer.

    With no receiver configured, also the printing receiver Alertmanager posts every alert to:
    ``docker compose logs -f receiver`` shows them.
    """
    out: dict[str, Any] = {
        "services": {
            "prometheus": {
                "image": IMAGES["prometheus"],
                "command": [
                    f"--config.file={_PROM_DIR}/prometheus.yml",
                    "--storage.tsdb.path=/prometheus",
                    "--web.enable-lifecycle",
                ],
                "ports": ["9090:9090"],
                "volumes": [
                    f"./dashboards/prometheus/prometheus.yml:{_PROM_DIR}/prometheus.yml:ro",
                    f"./dashboards/prometheus/rules.yml:{_PROM_DIR}/rules.yml:ro",
                    f"file_sd:{_FILE_SD_DIR}:ro",
                ],
                "depends_on": ["alertmanager"],
                "restart": "unless-stopped",
            },
            "alertmanager": {
                "image": IMAGES["alertmanager"],
                "command": ["--config.file=/etc/alertmanager/alertmanager.yml"],
                "ports": ["9093:9093"],
                "volumes": [
                    "./dashboards/alertmanager/alertmanager.yml:/etc/alertmanager/alertmanager.yml:ro"
                ],
                "restart": "unless-stopped",
            },
            "grafana": {
                "image": IMAGES["grafana"],
                "ports": ["3000:3000"],
                "environment": {
                    "GF_AUTH_ANONYMOUS_ENABLED": "true",
                    "GF_AUTH_ANONYMOUS_ORG_ROLE": "Viewer",
                    "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH": f"{_DASHBOARD_DIR}/overview.json",
                    "GF_USERS_DEFAULT_THEME": "dark",
                },
                "volumes": [
                    "./dashboards/grafana/provisioning:/etc/grafana/provisioning:ro",
                    f"./dashboards/grafana:{_DASHBOARD_DIR}:ro",
                ],
                "depends_on": ["prometheus"],
                "restart": "unless-stopped",
            },
            "trainer": {
                "image": IMAGES["trainer"],
                # Share Prometheus' network namespace: the demo's ranks bind 127.0.0.1 and
                # write 127.0.0.1:port targets, which Prometheus then reaches directly.
                "network_mode": "service:prometheus",
                "depends_on": ["prometheus"],
                "working_dir": "/tmp",
                "environment": {
                    "DDP_EXPORTER_RUN": "demo",
                    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
                    # Interpolated by compose from the host: DDP_FAULT=hang docker compose up.
                    "DDP_FAULT": "${DDP_FAULT:-straggler}",
                    "DDP_FAULT_RANK": "${DDP_FAULT_RANK:-1}",
                },
                "command": ["sh", "-c", _trainer_command()],
                "volumes": [".:/src:ro", "file_sd:/file_sd"],
            },
        },
        "volumes": {"file_sd": {}},
    }
    if cfg.scrape_scheme == "https" or cfg.scrape_username:
        _serve_tls(out["services"])
    if not cfg.receivers_set:
        out["services"]["alertmanager"]["depends_on"] = ["receiver"]
        out["services"]["receiver"] = {
            "image": IMAGES["receiver"],
            "working_dir": "/tmp",
            "environment": {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONUNBUFFERED": "1"},
            "command": ["sh", "-c", _receiver_command()],
            "volumes": [".:/src:ro"],
            "restart": "unless-stopped",
        }
    return out


#: The folder of your web configuration file, certificates and password file, next to
#: docker-compose.yml: the trainer reads it at /tls, Prometheus at /etc/prometheus/tls.
TLS_FOLDER = "tls"


def _serve_tls(services: dict[str, Any]) -> None:
    """Have the demo's ranks serve ``tls/web.yml`` and Prometheus read ``tls/`` (read-only).

    The scrape job's ``scrape_*`` paths name files in ``/etc/prometheus/tls``; the trainer
    installs the ``web`` extra.
    """
    trainer = services["trainer"]
    trainer["environment"].update({WEB_CONFIG: "/tls/web.yml"})
    trainer["volumes"].append(f"./{TLS_FOLDER}:/tls:ro")
    trainer["command"] = ["sh", "-c", _trainer_command(extra="web")]
    services["prometheus"]["volumes"].append(f"./{TLS_FOLDER}:{_PROM_DIR}/tls:ro")


def render_stack(cfg: MixinConfig = DEFAULT) -> dict[str, str]:
    """Return ``{repo-relative path: text}`` of the stack files."""
    return {
        "dashboards/prometheus/prometheus.yml": dump_yaml(prometheus_config(cfg)),
        "dashboards/prometheus/file_sd.example.json": dump_json(file_sd_example()),
        "dashboards/grafana/provisioning/datasources/ddp.yml": dump_yaml(grafana_datasources(cfg)),
        "dashboards/grafana/provisioning/dashboards/ddp.yml": dump_yaml(
            grafana_dashboard_provider()
        ),
        "docker-compose.yml": dump_yaml(
            compose(cfg),
            preamble=(
                "# Demo stack: docker compose up, then open http://localhost:3000 (Grafana),\n"
                "# :9090 (Prometheus), :9093 (Alertmanager). Pick the fault with\n"
                "# DDP_FAULT=straggler|slow-data|hang|kill|freeze DDP_FAULT_RANK=1 docker compose up.\n"
                + (
                    "# Alerts: docker compose logs -f receiver (or generate with --set\n"
                    "# slack_webhook_url=..., pagerduty_routing_key=..., email_to=..., webhook_url=...).\n"
                    if not cfg.receivers_set
                    else ""
                )
            ),
        ),
    }
