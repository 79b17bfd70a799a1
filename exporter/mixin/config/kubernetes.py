"""Hold what the Kubernetes manifests need (deploy/kubernetes/, see docs/kubernetes.md)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...settings import DEFAULT_PORT
from .domain import Domain

__all__ = ["KubernetesConfig"]


@dataclass(frozen=True)
class KubernetesConfig(Domain):
    """Say which pods and ports the PodMonitor scrapes and where its objects live."""

    TITLE = "Kubernetes (deploy/kubernetes/, see docs/kubernetes.md)"

    #: Training processes per pod: the PodMonitor scrapes ``base_port + 0 .. ranks_per_pod - 1``.
    ranks_per_pod: int = 8
    #: The exporter's base port (``DDP_EXPORTER_PORT``; each rank serves base + LOCAL_RANK).
    base_port: int = DEFAULT_PORT
    #: Namespace of the PodMonitor, PrometheusRule and dashboard ConfigMaps.
    k8s_namespace: str = "monitoring"
    #: ``release`` label kube-prometheus-stack selects PodMonitors and rules by (its Helm release).
    k8s_release: str = "kube-prometheus-stack"
    #: ``key=value`` pod label that marks training pods to scrape (any namespace).
    k8s_pod_selector: str = "ddp-exporter/scrape=true"
    #: Pod labels tried in order for a target's ``run`` label (comma-separated).
    k8s_run_labels: str = (
        "ddp-exporter/run,training.kubeflow.org/job-name,jobset.sigs.k8s.io/jobset-name"
    )
    #: Pod labels tried in order for a target's ``node_rank`` label (comma-separated).
    k8s_node_rank_labels: str = "ddp-exporter/node-rank,batch.kubernetes.io/job-completion-index"

    def validate(self) -> None:
        """Refuse ports past 65535, 0 or over 64 ranks a pod, a pod selector not key=value."""
        if not 1 <= int(self.ranks_per_pod) <= 64 or not 0 < int(self.base_port) <= 65535:
            raise ValueError("need 1 <= ranks_per_pod <= 64 and a base_port in 1..65535")
        if int(self.base_port) + int(self.ranks_per_pod) - 1 > 65535:
            raise ValueError("base_port + ranks_per_pod - 1 exceeds 65535")
        if not re.fullmatch(r"[\w./-]+=[\w.-]*", self.k8s_pod_selector):
            raise ValueError(f"k8s_pod_selector must be key=value: {self.k8s_pod_selector!r}")
