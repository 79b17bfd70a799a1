"""Say where the mixin's data comes from: the exporter's job, extra matchers, the cluster label."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..promql import check_matchers
from .domain import Domain

__all__ = ["SourceConfig"]

#: Labels the rules aggregate or match by themselves: a cluster label of one of these names
#: would be dropped or doubled by them.
RULE_LABELS = ("run", "rank", "node", "pg", "job", "instance", "le")


@dataclass(frozen=True)
class SourceConfig(Domain):
    """Name the scrape job, the extra selector and the label that tells clusters apart."""

    TITLE = "where the data comes from"

    #: Prometheus job name of the exporter's scrape targets (also used in ``up`` selectors).
    job: str = "ddp"
    #: Extra label matchers added to every exporter selector, e.g. ``'cluster="a"'``; empty = none.
    selector: str = ""
    #: The label that tells clusters apart (kubernetes-mixin's ``clusterLabel``): kept in every
    #: aggregation and vector match of the rules and dashboards, a variable on every dashboard,
    #: and in Alertmanager's grouping. Usually an external label of each cluster's Prometheus,
    #: so it is absent where one Prometheus sees one cluster. Empty: no cluster label at all.
    cluster_label: str = "cluster"

    def validate(self) -> None:
        """Refuse a selector that is no list of label matchers, and a cluster label that is no
        label name or one the rules use themselves (the job may be any string: it is quoted)."""
        try:
            check_matchers(self.selector)
        except ValueError as exc:
            raise ValueError(f"selector: {exc}") from None
        if self.cluster_label and not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", self.cluster_label):
            raise ValueError(f"cluster_label is not a label name: {self.cluster_label!r}")
        if self.cluster_label in RULE_LABELS:
            raise ValueError(f"cluster_label {self.cluster_label!r} is a label the rules use")
