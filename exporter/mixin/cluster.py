"""Keep the cluster label in every aggregation, so runs of two clusters never merge.

A Slurm job id or a run name can repeat across clusters. The monitoring-mixin convention
(kubernetes-mixin's ``clusterLabel``) is to carry a cluster label through every aggregation and
vector match: every ``by (...)`` and ``on (...)`` clause the generator writes comes from
:class:`Clauses`, which puts :attr:`MixinConfig.cluster_label` first. The rules are written
once, per run; where the cluster label is absent (one Prometheus per cluster, the label only an
external label added on federation or remote write) an empty label groups exactly as before,
and where a global server holds several clusters' series the same run name stays two runs.

:func:`scoped` adds the label to a finished query; the tests use it to check that no
generated clause lacks it (scoping a generated query changes nothing).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .config import MixinConfig
from .promql import string

__all__ = ["Clauses", "aggregations", "clauses", "cluster_matcher", "scoped"]

# ``by (a, b)`` or ``on (a, b)``; ``\b`` keeps ``..._on (`` of a metric name out (``_`` is a
# word character). ``without`` and ``ignoring`` keep every other label, the cluster's too.
_CLAUSE = re.compile(r"\b(by|on) *\(([^()]*)\)")
#: Aggregation operators of PromQL (what :func:`aggregations` finds).
_AGGREGATION = re.compile(
    r"\b(sum|min|max|avg|group|stddev|stdvar|count|count_values|bottomk|topk|quantile|limitk|"
    r"limit_ratio)\b *(by|without)? *(\(([^()]*)\))? *\("
)


@dataclass(frozen=True)
class Clauses:
    """Write the ``by`` and ``on`` clauses of one configuration, the cluster label first."""

    #: The cluster label (:attr:`MixinConfig.cluster_label`); empty: none.
    label: str

    def labels(self, labels: str) -> str:
        """Return ``labels`` (comma-separated, may be empty) with the cluster label first."""
        if not self.label:
            return labels
        return ", ".join([self.label, labels]) if labels else self.label

    def by(self, labels: str) -> str:
        """Return ``by (cluster, labels)``."""
        return f"by ({self.labels(labels)})"

    def on(self, labels: str = "") -> str:
        """Return ``on (cluster, labels)``: a match never pairs series of two clusters."""
        return f"on ({self.labels(labels)})"


def clauses(cfg: MixinConfig) -> Clauses:
    """Return the clause writer of ``cfg``."""
    return Clauses(cfg.cluster_label)


def _labels(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def scoped(cfg: MixinConfig, expr: str) -> str:
    """Return ``expr`` with the cluster label added to every ``by (...)`` and ``on (...)``."""
    label = cfg.cluster_label
    if not label:
        return expr

    def add(match: re.Match[str]) -> str:
        labels = _labels(match.group(2))
        if label in labels:
            return match.group(0)
        return f"{match.group(1)} ({', '.join([label, *labels])})"

    return _CLAUSE.sub(add, expr)


def aggregations(expr: str) -> list[tuple[str, str, list[str]]]:
    """Return ``(operator, by|without|"", labels)`` of every aggregation in ``expr``.

    The generated expressions write the clause before the operand (``max by (run) (...)``);
    the lint in the tests uses this to check that every aggregation keeps the cluster label.
    """
    return [
        (m.group(1), m.group(2) or "", _labels(m.group(4) or ""))
        for m in _AGGREGATION.finditer(expr)
    ]


def cluster_matcher(cfg: MixinConfig, value: str) -> str:
    """Return the label matcher ``cluster="value"`` (empty when no value or no cluster label)."""
    if not value or not cfg.cluster_label:
        return ""
    return f"{cfg.cluster_label}={string(value)}"
