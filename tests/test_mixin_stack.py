"""Test the generated stack: Prometheus config, file_sd, Grafana provisioning, compose file.

The compose file is validated against the compose specification JSON schema shipped by the
PyPI package ``docker-compose`` 1.29.2 (``compose/config/compose_spec.json``); install it with
``pip install --no-deps docker-compose==1.29.2`` (its dependencies are not needed and would
pin an old PyYAML).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml
from promstack import require

from exporter.deploy import stack
from exporter.generate.files import generated_files, write_files
from exporter.mixin.config import DEFAULT
from exporter.mixin.render import GENERATED_BY

ROOT = Path(__file__).resolve().parents[1]


def _compose_schema() -> dict:
    spec = importlib.util.find_spec("compose")
    paths = list(spec.submodule_search_locations or []) if spec else []
    for base in paths:
        path = Path(base) / "config" / "compose_spec.json"
        if path.exists():
            return json.loads(path.read_text())
    pytest.skip("compose spec schema missing: pip install --no-deps docker-compose==1.29.2")


@pytest.mark.tool
def test_prometheus_config_passes_promtool(tmp_path: Path) -> None:
    """Check the committed stack config with its container paths mapped into a temp dir."""
    promtool = require("promtool")
    write_files(tmp_path, generated_files(DEFAULT))
    text = (tmp_path / "dashboards/prometheus/prometheus.yml").read_text()
    assert text.startswith(f"# {GENERATED_BY}")
    cfg = yaml.safe_load(text)
    (job,) = cfg["scrape_configs"]
    assert job["honor_labels"] is True and job["job_name"] == DEFAULT.job
    assert cfg["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == [
        "alertmanager:9093"
    ]
    assert cfg["rule_files"] == ["/etc/prometheus/rules.yml"]
    # Same config, local paths (promtool opens the rule files and file_sd globs).
    local = stack.prometheus_config(
        DEFAULT,
        rule_files=[str(tmp_path / "dashboards/prometheus/rules.yml")],
        file_sd_files=[str(tmp_path / "file_sd" / "*.json")],
    )
    assert local["global"] == cfg["global"] and local["alerting"] == cfg["alerting"]
    (tmp_path / "file_sd").mkdir()
    (tmp_path / "file_sd" / "example.json").write_text(
        (tmp_path / "dashboards/prometheus/file_sd.example.json").read_text()
    )
    path = tmp_path / "prometheus-local.yml"
    path.write_text(yaml.safe_dump(local, sort_keys=False))
    proc = subprocess.run(
        [promtool, "check", "config", str(path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


@pytest.mark.unit
def test_file_sd_example_labels_every_target_with_run_and_rank() -> None:
    groups = json.loads((ROOT / "dashboards/prometheus/file_sd.example.json").read_text())
    assert groups
    for group in groups:
        assert len(group["targets"]) == 1 and ":" in group["targets"][0]
        assert set(group["labels"]) == {"run", "rank"}


@pytest.mark.unit
def test_grafana_provisioning() -> None:
    files = generated_files(DEFAULT)
    ds = yaml.safe_load(files["dashboards/grafana/provisioning/datasources/ddp.yml"])
    (prom,) = [d for d in ds["datasources"] if d["type"] == "prometheus"]
    assert prom["uid"] == DEFAULT.datasource_uid and prom["isDefault"] is True
    prov = yaml.safe_load(files["dashboards/grafana/provisioning/dashboards/ddp.yml"])
    (provider,) = prov["providers"]
    assert provider["type"] == "file"
    env = stack.compose(DEFAULT)["services"]["grafana"]["environment"]
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    home = env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{provider['options']['path']}/overview.json"
    assert "dashboards/grafana/overview.json" in files


@pytest.mark.unit
def test_compose_validates_against_the_compose_spec() -> None:
    schema = _compose_schema()
    text = (ROOT / "docker-compose.yml").read_text()
    assert text.startswith(f"# {GENERATED_BY}")
    doc = yaml.safe_load(text)
    # The file names draft 2019-09 by a URL jsonschema does not know; use that draft directly.
    validator = jsonschema.Draft201909Validator(schema)
    errors = sorted(validator.iter_errors(doc), key=str)
    assert not errors, "\n".join(e.message for e in errors)
    broken = yaml.safe_load(text)
    broken["services"]["trainer"]["imagee"] = "typo"
    assert list(validator.iter_errors(broken)), "the schema must reject unknown service keys"


@pytest.mark.unit
def test_compose_services_and_pins() -> None:
    services = stack.compose(DEFAULT)["services"]
    assert set(services) == {"prometheus", "alertmanager", "grafana", "trainer", "receiver"}
    for svc in services.values():
        image = svc["image"]
        assert ":" in image and not image.endswith(":latest"), image
    trainer = services["trainer"]
    assert trainer["image"] == "python:3.11-slim"
    command = trainer["command"][-1]
    assert "torch==2.13.0" in command and "/whl/cpu" in command
    assert "ddp-exporter demo --ranks 3" in command and command.endswith(" --no-stack")
    assert "ddp-exporter receiver --listen 0.0.0.0:5001" in services["receiver"]["command"][-1]
    assert trainer["environment"]["DDP_FAULT"] == "${DDP_FAULT:-straggler}"
    assert trainer["environment"]["DDP_FAULT_RANK"] == "${DDP_FAULT_RANK:-1}"
    # Every ./path the stack mounts is a committed file or folder.
    for svc in services.values():
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), source


@pytest.mark.unit
def test_compose_with_tls_on_serves_and_scrapes_the_tls_folder() -> None:
    cfg = dataclasses.replace(
        DEFAULT,
        scrape_scheme="https",
        scrape_ca_file="/etc/prometheus/tls/ca.crt",
        scrape_username="prometheus",
        scrape_password_file="/etc/prometheus/tls/password",
    )
    doc = stack.compose(cfg)
    validator = jsonschema.Draft201909Validator(_compose_schema())
    errors = sorted(validator.iter_errors(doc), key=str)
    assert not errors, "\n".join(e.message for e in errors)
    trainer, prometheus = doc["services"]["trainer"], doc["services"]["prometheus"]
    assert trainer["environment"]["DDP_EXPORTER_WEB_CONFIG"] == "/tls/web.yml"
    assert "./tls:/tls:ro" in trainer["volumes"]
    assert "'/tmp/ddp-exporter[web]'" in trainer["command"][-1]
    assert "./tls:/etc/prometheus/tls:ro" in prometheus["volumes"]
    (job,) = stack.prometheus_config(cfg)["scrape_configs"]
    assert job["scheme"] == "https" and job["tls_config"] == {"ca_file": cfg.scrape_ca_file}
    assert job["basic_auth"] == {
        "username": "prometheus",
        "password_file": cfg.scrape_password_file,
    }
    plain = stack.compose(DEFAULT)["services"]
    assert "DDP_EXPORTER_WEB_CONFIG" not in plain["trainer"]["environment"]
