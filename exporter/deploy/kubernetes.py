"""Build Kubernetes manifests for a cluster running kube-prometheus-stack (Prometheus Operator).

From the same catalog and :class:`~exporter.mixin.config.MixinConfig` as the committed rules and
dashboards, this writes ``deploy/kubernetes/``:

* a **PodMonitor** scraping one named container port per local rank (``ddp-rank-0`` ..
  ``ddp-rank-<ranks_per_pod - 1>``, i.e. ``base_port + LOCAL_RANK``) of every pod labelled
  ``k8s_pod_selector`` in any namespace, keeping the exposition's ``run``/``rank`` labels
  (``honorLabels``) and giving each target ``job``, ``run``, ``node_rank`` and ``local_rank``
  (and ``rank`` when one rank runs per pod) so ``up`` names the rank too;
* a **PrometheusRule** carrying exactly the groups of ``dashboards/prometheus/rules.yml``;
* one **ConfigMap per dashboard**, labelled ``grafana_dashboard: "1"`` for the Grafana sidecar,
  holding the JSON of ``dashboards/grafana/`` byte for byte;
* an **Alertmanager config** as a kube-prometheus-stack Helm values fragment
  (``alertmanager.config``): the same routes, inhibition and receivers as
  ``dashboards/alertmanager/alertmanager.yml``. A plain config rather than an AlertmanagerConfig
  resource, because the operator adds a ``namespace`` matcher to every AlertmanagerConfig
  route, and the alerts carry the training pods' namespace, not the monitoring one;
* a **kustomization.yaml** so ``kubectl apply -k deploy/kubernetes`` applies the resources; and
  an example training **Pod** showing the label, ports and environment the PodMonitor expects.
"""

from __future__ import annotations

import re
from typing import Any

from ..mixin.config import DEFAULT, MixinConfig
from ..mixin.dashboards import dashboard_specs, render_dashboards
from ..mixin.render import dump_yaml, header
from ..mixin.rules import rule_groups
from .alertmanager import alertmanager_config

__all__ = [
    "DEPLOY_DIR",
    "alertmanager_values",
    "dashboard_configmaps",
    "example_pod",
    "meta_label",
    "pod_monitor",
    "port_name",
    "prometheus_rule",
    "render_kubernetes",
]

#: Repository folder of the generated manifests.
DEPLOY_DIR = "deploy/kubernetes"

#: Labels every generated resource carries.
_PART_OF = {"app.kubernetes.io/name": "ddp-exporter", "app.kubernetes.io/part-of": "ddp-exporter"}


def port_name(local_rank: int) -> str:
    """Return the container port name of ``local_rank`` (an IANA service name, <= 15 chars)."""
    return f"ddp-rank-{local_rank}"


def meta_label(pod_label: str) -> str:
    """Return the Prometheus meta label Kubernetes pod discovery gives pod label ``pod_label``."""
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", pod_label)


def _labels(cfg: MixinConfig) -> dict[str, str]:
    """Return the metadata labels of operator-selected resources (``release`` = Helm release)."""
    return {**_PART_OF, "release": cfg.k8s_release}


def _first_of(pod_labels: str, target: str) -> dict[str, Any]:
    """Return a relabeling setting ``target`` to the first non-empty of comma-separated labels."""
    sources = [meta_label(label.strip()) for label in pod_labels.split(",") if label.strip()]
    return {
        "sourceLabels": sources,
        "separator": ";",
        # Joined values look like ";;value;other": skip empty leading ones, take the first.
        "regex": ";*([^;]+).*",
        "targetLabel": target,
        "replacement": "$1",
        "action": "replace",
    }


def _endpoint(cfg: MixinConfig, local_rank: int) -> dict[str, Any]:
    """Return the podMetricsEndpoint of one local rank."""
    relabelings = [
        # The rules and dashboards select up{job="<cfg.job>"}; the operator's default job
        # would be "<namespace>/<podmonitor>".
        {"targetLabel": "job", "replacement": cfg.job, "action": "replace"},
        _first_of(cfg.k8s_run_labels, "run"),
        _first_of(cfg.k8s_node_rank_labels, "node_rank"),
        {"targetLabel": "local_rank", "replacement": str(local_rank), "action": "replace"},
    ]
    if cfg.ranks_per_pod == 1:
        # One rank per pod: its global rank is the node rank, so up{rank} matches the series.
        # (With more, rank = node_rank * ranks_per_pod + local_rank: relabeling cannot add.)
        relabelings.append(_first_of(cfg.k8s_node_rank_labels, "rank"))
    return {
        "port": port_name(local_rank),
        "path": "/metrics",
        "scheme": cfg.scrape_scheme,
        "interval": cfg.scrape_interval,
        # The exposition's run/rank/node labels win over the target's.
        "honorLabels": True,
        "relabelings": relabelings,
        **_scrape_secret(cfg),
    }


def _scrape_secret(cfg: MixinConfig) -> dict[str, Any]:
    """Return the endpoint's tlsConfig and basicAuth, read from ``cfg.k8s_scrape_secret``."""

    def key(name: str) -> dict[str, str]:
        return {"name": cfg.k8s_scrape_secret, "key": name}

    out: dict[str, Any] = {}
    if cfg.scrape_scheme == "https":
        tls: dict[str, Any] = {"ca": {"secret": key("ca.crt")}} if cfg.scrape_ca_file else {}
        if cfg.scrape_cert_file:
            tls.update(cert={"secret": key("tls.crt")}, keySecret=key("tls.key"))
        if cfg.scrape_server_name:
            tls["serverName"] = cfg.scrape_server_name
        out["tlsConfig"] = tls
    if cfg.scrape_username:
        out["basicAuth"] = {"username": key("username"), "password": key("password")}
    return out


def pod_monitor(cfg: MixinConfig = DEFAULT) -> dict[str, Any]:
    """Return the PodMonitor scraping every local rank's port of the selected training pods."""
    key, _, value = cfg.k8s_pod_selector.partition("=")
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {
            "name": "ddp-exporter",
            "namespace": cfg.k8s_namespace,
            "labels": _labels(cfg),
        },
        "spec": {
            "selector": {"matchLabels": {key: value}},
            "namespaceSelector": {"any": True},
            "podMetricsEndpoints": [_endpoint(cfg, i) for i in range(cfg.ranks_per_pod)],
        },
    }


def prometheus_rule(cfg: MixinConfig = DEFAULT) -> dict[str, Any]:
    """Return the PrometheusRule holding exactly the generated rule groups."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "ddp-exporter",
            "namespace": cfg.k8s_namespace,
            "labels": _labels(cfg),
        },
        "spec": rule_groups(cfg),
    }


def dashboard_configmaps(cfg: MixinConfig = DEFAULT) -> list[dict[str, Any]]:
    """Return one ConfigMap per dashboard, labelled for the Grafana sidecar."""
    texts = render_dashboards(cfg)
    out = []
    for spec in dashboard_specs(cfg):
        name = f"{spec.stem}.json"
        out.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": f"ddp-dashboard-{spec.stem}",
                    "namespace": cfg.k8s_namespace,
                    "labels": {**_PART_OF, "grafana_dashboard": "1"},
                    # Honoured when the sidecar's folderAnnotation is grafana_folder.
                    "annotations": {"grafana_folder": "DDP"},
                },
                "data": {name: texts[name]},
            }
        )
    return out


def alertmanager_values(cfg: MixinConfig = DEFAULT) -> dict[str, Any]:
    """Return the kube-prometheus-stack Helm values that install the Alertmanager config."""
    return {"alertmanager": {"config": alertmanager_config(cfg)}}


def example_pod(cfg: MixinConfig = DEFAULT) -> dict[str, Any]:
    """Return an example training Pod with the label, ports and env the PodMonitor expects."""
    key, _, value = cfg.k8s_pod_selector.partition("=")
    run_label = cfg.k8s_run_labels.split(",")[0].strip()
    node_label = cfg.k8s_node_rank_labels.split(",")[0].strip()
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "ddp-train-node-0",
            "labels": {key: value, run_label: "my-run", node_label: "0"},
        },
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "trainer",
                    "image": "<your training image>",
                    "command": [
                        "torchrun",
                        f"--nproc-per-node={cfg.ranks_per_pod}",
                        "--nnodes=<nodes>",
                        "--node-rank=0",
                        "train.py",
                    ],
                    "env": [
                        # The same run id on the series (exposition) as on up (pod label).
                        {
                            "name": "DDP_EXPORTER_RUN",
                            "valueFrom": {
                                "fieldRef": {"fieldPath": f"metadata.labels['{run_label}']"}
                            },
                        },
                        # The node, not the pod's hostname: fleet rules blame nodes.
                        {
                            "name": "DDP_EXPORTER_NODE",
                            "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
                        },
                        {"name": "DDP_EXPORTER_PORT", "value": str(cfg.base_port)},
                        {"name": "DDP_EXPORTER_ADDR", "value": "0.0.0.0"},
                    ],
                    "ports": [
                        {
                            "name": port_name(i),
                            "containerPort": cfg.base_port + i,
                            "protocol": "TCP",
                        }
                        for i in range(cfg.ranks_per_pod)
                    ],
                }
            ],
        },
    }


def _kustomization() -> dict[str, Any]:
    """Return the kustomization applying the cluster resources (not the values or example)."""
    return {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": ["podmonitor.yaml", "prometheusrule.yaml", "grafana-dashboards.yaml"],
    }


def _documents(docs: list[dict[str, Any]]) -> str:
    """Return several manifests as one multi-document YAML file with the generated header."""
    return header() + "---\n".join(dump_yaml(d, with_header=False) for d in docs)


def render_kubernetes(cfg: MixinConfig = DEFAULT) -> dict[str, str]:
    """Return ``{repo-relative path: text}`` of the Kubernetes manifests."""
    values_note = (
        "# kube-prometheus-stack Helm values: helm upgrade <release> \\\n"
        "#   prometheus-community/kube-prometheus-stack --reuse-values -f alertmanager-values.yaml\n"
        "# This REPLACES the chart's Alertmanager config; merge by hand if you have one.\n"
    )
    return {
        f"{DEPLOY_DIR}/kustomization.yaml": dump_yaml(_kustomization()),
        f"{DEPLOY_DIR}/podmonitor.yaml": dump_yaml(pod_monitor(cfg)),
        f"{DEPLOY_DIR}/prometheusrule.yaml": dump_yaml(prometheus_rule(cfg)),
        f"{DEPLOY_DIR}/grafana-dashboards.yaml": _documents(dashboard_configmaps(cfg)),
        f"{DEPLOY_DIR}/alertmanager-values.yaml": dump_yaml(
            alertmanager_values(cfg), preamble=values_note
        ),
        f"{DEPLOY_DIR}/training-pod.example.yaml": dump_yaml(
            example_pod(cfg),
            preamble=(
                "# Example: what a training pod needs for the PodMonitor. Copy the label, env\n"
                "# and ports into your Pod / PyTorchJob / JobSet template.\n"
            ),
        ),
    }
