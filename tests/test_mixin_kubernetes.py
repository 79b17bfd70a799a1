"""Test the generated Kubernetes manifests: CRD fields, identity with the committed files, and
the PodMonitor's relabeling evaluated by a real Prometheus."""

from __future__ import annotations

import dataclasses
import re
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from harness import wait_for
from promstack import require, run_prometheus, write_file_sd

from exporter.deploy import kubernetes as k8s
from exporter.generate.files import generated_files
from exporter.mixin.__main__ import apply_overrides
from exporter.mixin.config import DEFAULT, MixinConfig
from exporter.mixin.dashboards import dashboard_specs
from exporter.mixin.render import GENERATED_BY
from exporter.settings import DEFAULT_PORT

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / k8s.DEPLOY_DIR

#: Patterns and enums of the Prometheus Operator CRDs (monitoring.coreos.com/v1) and Kubernetes
#: object validation that the generated manifests must satisfy.
LABEL_NAME = r"^[a-zA-Z_][a-zA-Z0-9_]*$"
DURATION = (
    r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
)
DNS_1123 = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
IANA_SVC_NAME = r"^(?=.{1,15}$)(?=.*[a-z])[a-z0-9]([a-z0-9-]*[a-z0-9])?$"
RELABEL_ACTIONS = [
    "replace",
    "keep",
    "drop",
    "hashmod",
    "labelmap",
    "labeldrop",
    "labelkeep",
    "lowercase",
    "uppercase",
    "keepequal",
    "dropequal",
]

METADATA = {
    "type": "object",
    "required": ["name", "namespace"],
    "properties": {
        "name": {"type": "string", "pattern": DNS_1123, "maxLength": 253},
        "namespace": {"type": "string", "pattern": DNS_1123, "maxLength": 63},
        "labels": {"type": "object", "additionalProperties": {"type": "string", "maxLength": 63}},
    },
}
RELABEL = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "sourceLabels": {"type": "array", "items": {"type": "string", "pattern": LABEL_NAME}},
        "separator": {"type": "string"},
        "regex": {"type": "string"},
        "targetLabel": {"type": "string", "pattern": LABEL_NAME},
        "replacement": {"type": "string"},
        "action": {"enum": RELABEL_ACTIONS},
    },
}
# prometheus-operator's SecretKeySelector and SafeTLSConfig (a Secret's key, no file paths).
SECRET_KEY = {
    "type": "object",
    "required": ["name", "key"],
    "additionalProperties": False,
    "properties": {"name": {"type": "string", "minLength": 1}, "key": {"type": "string"}},
}
SAFE_TLS_CONFIG = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "ca": {"type": "object", "properties": {"secret": SECRET_KEY}},
        "cert": {"type": "object", "properties": {"secret": SECRET_KEY}},
        "keySecret": SECRET_KEY,
        "serverName": {"type": "string"},
        "insecureSkipVerify": {"type": "boolean"},
    },
}
POD_MONITOR = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PodMonitor"},
        "metadata": METADATA,
        "spec": {
            "type": "object",
            "required": ["selector"],
            "additionalProperties": False,
            "properties": {
                "selector": {
                    "type": "object",
                    "required": ["matchLabels"],
                    "properties": {
                        "matchLabels": {"type": "object", "minProperties": 1},
                    },
                },
                "namespaceSelector": {
                    "type": "object",
                    "properties": {"any": {"type": "boolean"}},
                },
                "podMetricsEndpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["port"],
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string", "pattern": IANA_SVC_NAME},
                            "path": {"type": "string", "pattern": "^/"},
                            "scheme": {"enum": ["http", "https"]},
                            "interval": {"type": "string", "pattern": DURATION},
                            "honorLabels": {"type": "boolean"},
                            "relabelings": {"type": "array", "items": RELABEL},
                            "tlsConfig": SAFE_TLS_CONFIG,
                            "basicAuth": {
                                "type": "object",
                                "additionalProperties": False,
                                "properties": {"username": SECRET_KEY, "password": SECRET_KEY},
                            },
                        },
                    },
                },
            },
        },
    },
}
PROMETHEUS_RULE = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": METADATA,
        "spec": {
            "type": "object",
            "required": ["groups"],
            "properties": {
                "groups": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name", "rules"],
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "rules": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "required": ["expr"],
                                    "oneOf": [
                                        {"required": ["record"]},
                                        {"required": ["alert"]},
                                    ],
                                    "properties": {
                                        "expr": {"type": "string", "minLength": 1},
                                        "for": {"type": "string", "pattern": DURATION},
                                        "labels": {"type": "object"},
                                        "annotations": {"type": "object"},
                                    },
                                },
                            },
                        },
                    },
                }
            },
        },
    },
}
CONFIG_MAP = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "data"],
    "properties": {
        "apiVersion": {"const": "v1"},
        "kind": {"const": "ConfigMap"},
        "metadata": METADATA,
        "data": {
            "type": "object",
            "propertyNames": {"pattern": r"^[-._a-zA-Z0-9]+$"},
            "additionalProperties": {"type": "string"},
        },
    },
}


def committed(name: str) -> str:
    """Return the text of a committed file under deploy/kubernetes/."""
    return (DEPLOY / name).read_text(encoding="utf-8")


def load_all(name: str) -> list[dict[str, Any]]:
    """Return the YAML documents of a committed manifest."""
    return [d for d in yaml.safe_load_all(committed(name)) if d is not None]


@pytest.mark.unit
def test_every_manifest_is_generated_and_committed() -> None:
    files = {p: t for p, t in generated_files(DEFAULT).items() if p.startswith(k8s.DEPLOY_DIR)}
    assert {Path(p).name for p in files} == {
        "kustomization.yaml",
        "podmonitor.yaml",
        "prometheusrule.yaml",
        "grafana-dashboards.yaml",
        "alertmanager-values.yaml",
        "training-pod.example.yaml",
    }
    for path, text in files.items():
        assert text.startswith(f"# {GENERATED_BY}")
        assert (ROOT / path).read_text(encoding="utf-8") == text, path
    (kustomization,) = load_all("kustomization.yaml")
    for resource in kustomization["resources"]:
        assert (DEPLOY / resource).is_file()


@pytest.mark.unit
def test_pod_monitor_has_the_fields_the_crd_requires() -> None:
    (pm,) = load_all("podmonitor.yaml")
    jsonschema.validate(pm, POD_MONITOR)
    assert pm["metadata"]["labels"]["release"] == DEFAULT.k8s_release
    assert pm["spec"]["selector"]["matchLabels"] == {"ddp-exporter/scrape": "true"}
    endpoints = pm["spec"]["podMetricsEndpoints"]
    assert [e["port"] for e in endpoints] == [f"ddp-rank-{i}" for i in range(DEFAULT.ranks_per_pod)]
    for i, endpoint in enumerate(endpoints):
        assert endpoint["honorLabels"] is True and endpoint["path"] == "/metrics"
        targets = {r["targetLabel"]: r for r in endpoint["relabelings"]}
        assert targets["job"]["replacement"] == DEFAULT.job
        assert targets["local_rank"]["replacement"] == str(i)
        assert {"run", "node_rank"} <= set(targets)
        assert "rank" not in targets  # 8 ranks per pod: rank is not derivable by relabeling
        for relabel in endpoint["relabelings"]:
            re.compile(relabel.get("regex", "(.*)"))


@pytest.mark.unit
def test_ranks_served_over_tls_with_a_password_are_scraped_with_the_secret() -> None:
    cfg = dataclasses.replace(
        DEFAULT,
        scrape_scheme="https",
        scrape_ca_file="/etc/prometheus/ddp-ca.crt",
        scrape_cert_file="/etc/prometheus/client.crt",
        scrape_key_file="/etc/prometheus/client.key",
        scrape_username="prometheus",
        scrape_password_file="/etc/prometheus/ddp-password",
        scrape_server_name="trainer.ddp.svc",
    )
    pm = k8s.pod_monitor(cfg)
    jsonschema.validate(pm, POD_MONITOR)
    for endpoint in pm["spec"]["podMetricsEndpoints"]:
        assert endpoint["scheme"] == "https"
        tls, auth = endpoint["tlsConfig"], endpoint["basicAuth"]
        assert tls["ca"]["secret"] == {"name": cfg.k8s_scrape_secret, "key": "ca.crt"}
        assert tls["keySecret"] == {"name": cfg.k8s_scrape_secret, "key": "tls.key"}
        assert tls["serverName"] == "trainer.ddp.svc"  # pod IPs are scraped, not names
        assert auth["password"] == {"name": cfg.k8s_scrape_secret, "key": "password"}
    (plain,) = load_all("podmonitor.yaml")
    assert all("tlsConfig" not in e for e in plain["spec"]["podMetricsEndpoints"])
    for bad in (
        {"scrape_scheme": "ftp"},
        {"scrape_username": "prometheus"},  # no password file
        {"scrape_scheme": "https", "scrape_cert_file": "/c"},  # no key
        {"scrape_ca_file": "/ca"},  # a CA for plain HTTP
        {"scrape_server_name": "trainer"},  # a name to verify over plain HTTP
    ):
        with pytest.raises(ValueError):
            dataclasses.replace(DEFAULT, **bad)


@pytest.mark.unit
def test_one_rank_per_pod_labels_the_rank_and_the_count_is_configurable() -> None:
    cfg = apply_overrides(DEFAULT, ["ranks_per_pod=1", "base_port=29500"])
    assert cfg.ranks_per_pod == 1 and isinstance(cfg.base_port, int)
    pm = k8s.pod_monitor(cfg)
    jsonschema.validate(pm, POD_MONITOR)
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    assert "rank" in {r["targetLabel"] for r in endpoint["relabelings"]}
    pod = k8s.example_pod(cfg)
    assert [p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]] == [29500]
    for bad in ({"ranks_per_pod": 0}, {"base_port": 65535}, {"k8s_pod_selector": "no-value"}):
        with pytest.raises(ValueError):
            dataclasses.replace(DEFAULT, **bad)


@pytest.mark.unit
def test_example_pod_matches_the_pod_monitor() -> None:
    (pod,) = load_all("training-pod.example.yaml")
    (pm,) = load_all("podmonitor.yaml")
    assert DEFAULT.base_port == DEFAULT_PORT  # the exporter's own default
    for key, value in pm["spec"]["selector"]["matchLabels"].items():
        assert pod["metadata"]["labels"][key] == value
    (container,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {
        e["port"]: DEFAULT.base_port + i for i, e in enumerate(pm["spec"]["podMetricsEndpoints"])
    }
    env = {e["name"]: e for e in container["env"]}
    assert env["DDP_EXPORTER_PORT"]["value"] == str(DEFAULT.base_port)
    run_label = env["DDP_EXPORTER_RUN"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert run_label == "metadata.labels['ddp-exporter/run']"
    assert "ddp-exporter/run" in pod["metadata"]["labels"]


def _scrape_config(cfg: MixinConfig, sd_file: Path) -> dict[str, Any]:
    """Return a Prometheus scrape config doing what the operator makes of the PodMonitor.

    The operator turns each podMetricsEndpoint into a scrape job whose relabel_configs end with
    the endpoint's relabelings (camelCase keys in snake_case); the pod metadata Kubernetes
    discovery would attach comes here from a file_sd file instead.
    """
    keys = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    jobs = []
    for endpoint in k8s.pod_monitor(cfg)["spec"]["podMetricsEndpoints"]:
        jobs.append(
            {
                "job_name": f"podmonitor/{endpoint['port']}",
                "honor_labels": endpoint["honorLabels"],
                "metrics_path": endpoint["path"],
                "scrape_interval": endpoint["interval"],
                "file_sd_configs": [{"files": [str(sd_file)]}],
                "relabel_configs": [
                    # the operator keeps only targets of this endpoint's named port
                    {
                        "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                        "regex": endpoint["port"],
                        "action": "keep",
                    },
                    *({keys.get(k, k): v for k, v in r.items()} for r in endpoint["relabelings"]),
                ],
            }
        )
    return {"global": {"scrape_interval": cfg.scrape_interval}, "scrape_configs": jobs}


@pytest.mark.stack
def test_pod_monitor_relabeling_in_a_real_prometheus(tmp_path: Path) -> None:
    """Prometheus itself applies the relabelings to pods of a plain Pod, a PyTorchJob and a JobSet."""
    require("prometheus")
    cfg = dataclasses.replace(DEFAULT, ranks_per_pod=2)
    pods = {
        # pod ip: its labels as Kubernetes discovery names them
        "127.0.0.2": {"ddp_exporter_run": "plain", "ddp_exporter_node_rank": "3"},
        "127.0.0.3": {"training_kubeflow_org_job_name": "pytorchjob-a"},
        "127.0.0.4": {
            "jobset_sigs_k8s_io_jobset_name": "js",
            "batch_kubernetes_io_job_completion_index": "1",
        },
    }
    targets = [
        (
            f"{ip}:{cfg.base_port + i}",
            {
                "__meta_kubernetes_pod_container_port_name": k8s.port_name(i),
                **{f"__meta_kubernetes_pod_label_{k}": v for k, v in labels.items()},
            },
        )
        for ip, labels in pods.items()
        for i in range(cfg.ranks_per_pod)
    ]
    sd_file = tmp_path / "pods.json"
    write_file_sd(sd_file, targets)
    with run_prometheus(tmp_path / "prom", _scrape_config(cfg, sd_file)) as prom:
        active: list[dict[str, Any]] = []

        def all_discovered() -> bool:
            active[:] = prom.api("targets", state="active")["activeTargets"]
            return len(active) == len(targets)

        wait_for(all_discovered, 30, "every pod port discovered")
    got = sorted(
        (
            t["labels"]["job"],
            t["labels"].get("run"),
            t["labels"].get("node_rank"),
            t["labels"]["local_rank"],
            t["scrapePool"],
        )
        for t in active
    )
    want = sorted(
        (cfg.job, run, node, str(i), f"podmonitor/ddp-rank-{i}")
        for run, node in (("plain", "3"), ("pytorchjob-a", None), ("js", "1"))
        for i in range(cfg.ranks_per_pod)
    )
    assert got == want


@pytest.mark.tool
def test_prometheus_rule_carries_exactly_the_rules(tmp_path: Path) -> None:
    (rule,) = load_all("prometheusrule.yaml")
    jsonschema.validate(rule, PROMETHEUS_RULE)
    assert rule["metadata"]["labels"]["release"] == DEFAULT.k8s_release
    rules_yml = yaml.safe_load((ROOT / "dashboards/prometheus/rules.yml").read_text())
    assert rule["spec"] == rules_yml
    extracted = tmp_path / "groups.yml"
    extracted.write_text(yaml.safe_dump(rule["spec"], sort_keys=False))
    proc = subprocess.run(
        [require("promtool"), "check", "rules", str(extracted)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    total = sum(len(g["rules"]) for g in rules_yml["groups"])
    assert f"SUCCESS: {total} rules found" in proc.stdout


@pytest.mark.unit
def test_dashboard_configmaps_hold_the_committed_json() -> None:
    maps = load_all("grafana-dashboards.yaml")
    files = sorted((ROOT / "dashboards/grafana").glob("*.json"))
    assert len(maps) == len(files) == len(dashboard_specs())
    seen = {}
    for cm in maps:
        jsonschema.validate(cm, CONFIG_MAP)
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"  # sidecar's default label
        (name,) = cm["data"]
        seen[name] = cm["data"][name]
        # kubectl apply stores the object in an annotation limited to 256 KiB
        assert len(yaml.safe_dump(cm).encode()) < 262144, name
    assert seen == {f.name: f.read_text(encoding="utf-8") for f in files}


@pytest.mark.tool
def test_alertmanager_values_are_the_alertmanager_config(tmp_path: Path) -> None:
    (values,) = load_all("alertmanager-values.yaml")
    committed_am = yaml.safe_load((ROOT / "dashboards/alertmanager/alertmanager.yml").read_text())
    assert values == {"alertmanager": {"config": committed_am}}
    extracted = tmp_path / "alertmanager.yml"
    extracted.write_text(yaml.safe_dump(values["alertmanager"]["config"]))
    proc = subprocess.run(
        [require("amtool"), "check-config", str(extracted)], capture_output=True, text=True
    )
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout, proc.stdout + proc.stderr
