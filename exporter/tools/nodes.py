"""Rank the fleet's nodes by evidence: ``ddp-exporter nodes --prometheus URL``.

Reads the fleet rules' records (:mod:`exporter.mixin.fleet`) from Prometheus with four queries,
whatever the fleet's size: per node the runs seen and blamed over the fleet window, the blamed
runs among its last ``fleet_runs``, the causes, and each blamed run with when it was blamed.
Nodes DDPSuspectNode names come first, then by blamed runs among the last runs, then by all
blamed runs. Offline: imports no torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from ..mixin.cluster import clauses, cluster_matcher
from ..mixin.config import DEFAULT, MixinConfig, load_config
from ..mixin.fleet import fleet_recorded
from . import options
from .promapi import instant_query

__all__ = ["NodeRow", "add_parser", "fetch_nodes", "render_nodes", "run"]


@dataclass
class NodeRow:
    """What the fleet rules hold about one node."""

    node: str
    #: The node's cluster (the mixin's ``cluster_label``); empty where series carry none.
    cluster: str = ""
    runs_seen: int = 0
    runs_blamed: int = 0
    recent_blamed: int = 0
    suspect: bool = False
    causes: dict[str, int] = field(default_factory=dict)
    #: ``(unix time last blamed, run, cause)``, newest first.
    evidence: list[tuple[float, str, str]] = field(default_factory=list)

    def key(self) -> tuple:
        """Sort key: most evidence first."""
        return (not self.suspect, -self.recent_blamed, -self.runs_blamed, self.cluster, self.node)

    @property
    def name(self) -> str:
        """Return ``cluster/node``, or the node where series carry no cluster."""
        return f"{self.cluster}/{self.node}" if self.cluster else self.node


def fetch_nodes(
    url: str, cfg: MixinConfig = DEFAULT, timeout: float = 10.0, cluster: str = ""
) -> list[NodeRow]:
    """Return every node the fleet rules know (of ``cluster`` if given), most evidence first.

    A node name can repeat across clusters: rows are per cluster and node.
    """
    f = fleet_recorded(cfg)
    rows: dict[tuple[str, str], NodeRow] = {}
    only = cluster_matcher(cfg, cluster)
    label = cfg.cluster_label

    def sel(name: str, *matchers: str) -> str:
        parts = [m for m in (only, *matchers) if m]
        return f"{name}{{{', '.join(parts)}}}" if parts else name

    def row(labels: dict[str, str]) -> NodeRow:
        key = (labels.get(label, "") if label else "", labels.get("node", ""))
        return rows.setdefault(key, NodeRow(key[1], cluster=key[0]))

    counts = " or ".join(
        f'label_replace({name}, "what", "{what}", "", "")'
        for what, name in (
            ("seen", sel(f.runs_seen)),
            ("blamed", sel(f.runs_blamed)),
            ("recent", sel(f.recent_blamed)),
        )
    )
    for s in instant_query(url, counts, timeout):
        r, n = row(s["metric"]), int(float(s["value"][1]))
        what = s["metric"]["what"]
        if what == "seen":
            r.runs_seen = n
        elif what == "blamed":
            r.runs_blamed = n
        else:
            r.recent_blamed = n
    for s in instant_query(url, sel(f.cause_runs), timeout):
        row(s["metric"]).causes[s["metric"].get("cause", "?")] = int(float(s["value"][1]))
    evidence = f"{sel(f.blamed)}\nand {clauses(cfg).on('node, run')}\n{sel(f.blamed_alone)}"
    for s in instant_query(url, evidence, timeout):
        lab = s["metric"]
        row(lab).evidence.append((float(s["value"][1]), lab.get("run", "?"), lab.get("cause", "?")))
    suspects = sel("ALERTS", 'alertname="DDPSuspectNode"', 'alertstate="firing"')
    for s in instant_query(url, suspects, timeout):
        row(s["metric"]).suspect = True
    for r in rows.values():
        r.evidence.sort(reverse=True)
    return sorted((r for r in rows.values() if r.node), key=NodeRow.key)


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(ts))


def render_nodes(rows: list[NodeRow], cfg: MixinConfig = DEFAULT, worst: int = 20) -> str:
    """Return the ranking as text: one line per node, then its evidence."""
    n = int(cfg.fleet_runs)
    if not rows:
        return (
            f"no node seen in the last {cfg.fleet_window} (are the fleet rules loaded, and "
            "has their group evaluated yet?)"
        )
    head = f"{'NODE':<28} {'RUNS':>5} {'BLAMED':>6} {f'OF LAST {n}':>10}  CAUSES"
    lines = [
        f"nodes by evidence over {cfg.fleet_window}; suspect = blamed in "
        f"{cfg.fleet_blamed_runs} of its last {n} runs (DDPSuspectNode)",
        head,
    ]
    for r in rows[:worst]:
        causes = ", ".join(f"{c} {k}" for c, k in sorted(r.causes.items())) or "-"
        flag = "  SUSPECT" if r.suspect else ""
        lines.append(
            f"{r.name:<28} {r.runs_seen:>5} {r.runs_blamed:>6} {r.recent_blamed:>10}  "
            f"{causes}{flag}"
        )
        for ts, run, cause in r.evidence[:5]:
            lines.append(f"    {_when(ts)} UTC  run {run}: {cause}")
    if len(rows) > worst:
        lines.append(f"... {len(rows) - worst} more nodes (--worst)")
    return "\n".join(lines)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add ``nodes`` to the ``ddp-exporter`` subcommands."""
    n = sub.add_parser(
        "nodes",
        help="rank the fleet's nodes by how often runs blamed them",
        description="Rank the fleet's nodes by how often runs blamed them, from "
        "the fleet rules' series in Prometheus. Exit 1 when Prometheus cannot "
        "be read.",
    )
    n.add_argument(
        "--prometheus",
        required=True,
        type=options.prometheus_url,
        help="Prometheus URL with the fleet rules",
    )
    n.add_argument(
        "--config",
        default=None,
        help="the mixin config the rules were generated with (dashboards/mixin.json; "
        "default: the DEFAULT config)",
    )
    n.add_argument("--cluster", default="", help="only the nodes of this cluster")
    n.add_argument(
        "--worst", type=options.count, default=20, help="show the N nodes with most evidence"
    )
    n.add_argument("--json", action="store_true", help="print the rows as JSON")
    n.set_defaults(tool=run, parser=n)
    return n


def run(args: argparse.Namespace) -> int:
    """Run ``ddp-exporter nodes`` with parsed ``args``; return its exit status."""
    try:
        cfg = load_config(args.config) if args.config else DEFAULT
    except ValueError as exc:
        args.parser.error(f"--config: {exc}")
    try:
        rows = fetch_nodes(args.prometheus, cfg, cluster=args.cluster)
    except (OSError, RuntimeError, ValueError) as exc:
        print(f"ddp-exporter nodes: cannot read {args.prometheus}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in rows[: args.worst]], indent=1))
    else:
        print(render_nodes(rows, cfg, args.worst))
    return 0
