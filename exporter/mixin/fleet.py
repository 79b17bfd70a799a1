"""Build the fleet rules: which node keeps being the culprit across runs (DDPSuspectNode).

Every accusation the per-run alerts make names a rank: a straggler by compute or data
(DDPRankStraggler, ``cause``), the rank behind in a stalled collective (``hang``), the culprit
of a hang the hang action aborted (``abort``: the fleet counts aborts by node), a rank down while
its run goes on (``down``). Each is turned into a
series per ``(node, run, cause)`` by joining the firing alert with the rank's ``node``
(``ddp_rank_info``). A hang with nobody behind whose probe found a node unreachable
(``network``) or a link that carries no traffic (``link``, both its nodes) names the nodes
itself (DDPHangNetworkFault).

What is remembered, and what it costs. A fleet hosts hundreds of thousands of (node, run) pairs
a month; rewriting a series for each at every evaluation would cost seconds per evaluation
and gigabytes a month. So the group keeps one counter per node instead, ``runs_total``: the
runs that started on it (a pair never seen within ``fleet_carry`` is a new run). Only blamed
pairs (few) get series of their own, which outlive their run for ``fleet_window``: the time
they were last blamed, whether they count (the run did not blame most of its nodes), and the
node's run count when they were first blamed, which places them among its last runs. Each
record reads its own previous value (``last_over_time(record[fleet_carry])``) and carries it
forward, so an evaluation reads a sample or two per series whatever the window.

**The definition** (also in docs/runbook.md, DDPSuspectNode). A node is blamed in a run when
one of the accusations above fired for a rank on it, and at most half of the run's nodes were
blamed in that run (a run blaming most of its nodes blames none: a job-wide problem, or a run
on one node, says nothing about one node). It is suspect when blamed in at least
``fleet_blamed_runs`` of its last ``fleet_runs`` distinct runs within ``fleet_window``. So:

- one slow job is one run: never enough;
- a job-wide slowdown or a data stall common to every rank (a shared file system) blames no rank,
  since stragglers are judged against the run's own median;
- a busy node is judged on its last ``fleet_runs`` runs, not on how many it hosted.

Labels stay bounded: ``node``, ``run``, ``cause`` (compute, data, link, network, hang, abort,
down).
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import catalog
from .alert import selector
from .cluster import clauses
from .config import MixinConfig, duration_seconds

__all__ = [
    "CAUSES",
    "FLEET_INPUT_ALERTS",
    "FleetRecorded",
    "fleet_records",
    "fleet_recorded",
]

#: What a node can be blamed for.
CAUSES: tuple[str, ...] = ("compute", "data", "link", "network", "hang", "abort", "down", "gpu")


@dataclass(frozen=True)
class FleetRecorded:
    """Name the fleet's recorded series of one configuration (the window is in the names)."""

    live: str
    runs_total: str
    blamed: str
    blamed_index: str
    blamed_alone: str
    runs_seen: str
    runs_blamed: str
    recent_blamed: str
    cause_runs: str


def fleet_recorded(cfg: MixinConfig) -> FleetRecorded:
    """Return the fleet's recording-rule names for ``cfg``."""
    info, w = catalog.RANK_INFO.name, cfg.fleet_window
    return FleetRecorded(
        live=f"node_run:{info}:live",
        runs_total=f"node:{info}:runs_total",
        blamed=f"node_run_cause:{info}:blamed_timestamp_last{w}",
        blamed_index=f"node_run:{info}:blamed_runs_total_last{w}",
        blamed_alone=f"node_run:{info}:blamed_alone_timestamp_last{w}",
        runs_seen=f"node:{info}:runs_last{w}",
        runs_blamed=f"node:{info}:runs_blamed_last{w}",
        recent_blamed=f"node:{info}:recent_runs_blamed_last{w}",
        cause_runs=f"node_cause:{info}:runs_blamed_last{w}",
    )


def _accusations(cfg: MixinConfig) -> str:
    """Return a (run, rank, cause) vector of the ranks an alert accuses right now."""
    firing = 'alertstate="firing"'
    straggler = f'ALERTS{{alertname="DDPRankStraggler", {firing}}}'
    behind = (
        f'ALERTS{{alertname=~"DDPCollectiveStalled|DDPCollectiveTimeoutImminent", {firing}, '
        'role="behind"}'
    )
    aborted = (
        f'label_replace(ALERTS{{alertname="DDPHangAborted", {firing}, culprit_rank!=""}}, '
        '"rank", "$1", "culprit_rank", "(.+)")'
    )
    down = f'ALERTS{{alertname="DDPRankDown", {firing}}}'
    gpu = f'ALERTS{{alertname="DDPGPUError", {firing}}}'
    return (
        f"max {clauses(cfg).by('run, rank, cause')} (\n"
        f"  {straggler}\n  or\n"
        f'  label_replace({behind}, "cause", "hang", "", "")\n  or\n'
        f'  label_replace({aborted}, "cause", "abort", "", "")\n  or\n'
        f'  label_replace({down}, "cause", "down", "", "")\n  or\n'
        f'  label_replace({gpu}, "cause", "gpu", "", "")\n)'
    )


def _network_accusations(cfg: MixinConfig) -> str:
    """Return a (node, run, cause) vector of the nodes the hang probe names right now: an
    unreachable node (cause network), both ends of a link that carries no traffic (link)."""
    alert = 'ALERTS{alertname="DDPHangNetworkFault", alertstate="firing", finding="%s"}'
    node, link = alert % "node", alert % "link"
    return (
        f"max {clauses(cfg).by('node, run, cause')} (\n"
        f'  label_replace({node}, "cause", "network", "", "")\n  or\n'
        f'  label_replace({link}, "cause", "link", "", "")\n  or\n'
        f'  label_replace(label_replace({link}, "node", "$1", "peer_node", "(.+)"), "cause", '
        '"link", "", "")\n)'
    )


def _node_of_rank(cfg: MixinConfig) -> str:
    """Return a (run, rank, node) vector: each rank's node, also for a rank gone lately."""
    c = clauses(cfg)
    info = selector(cfg, catalog.RANK_INFO.name)
    # One node per rank even when a restarted attempt moved it (topk keeps one).
    return (
        f"topk {c.by('run, rank')} (1,\n"
        f"  max {c.by('run, rank, node')} (last_over_time({info}[{cfg.baseline_window}]))\n)"
    )


def _last(record: str, cfg: MixinConfig) -> str:
    """Return ``record``'s previous value (this group's own output, within ``fleet_carry``)."""
    return f"last_over_time({record}[{cfg.fleet_carry}])"


def fleet_records(cfg: MixinConfig) -> list[dict[str, str]]:
    """Return the fleet's recording rules, in the order its rule group evaluates them.

    Rules run in order within a group: each reads the records above it as of this evaluation
    and its own (and the live pairs') as of the previous one. The group
    (:func:`exporter.mixin.rules.fleet_group`) ends with the fleet's alerts
    (:mod:`exporter.mixin.alerts.fleet`).
    """
    f, c = fleet_recorded(cfg), clauses(cfg)
    info = selector(cfg, catalog.RANK_INFO.name)
    nl = "\n"
    node, node_run, run = c.on("node"), c.on("node, run"), c.on("run")
    pairs = f"max {c.by('node, run')} ({info})"
    new_runs = (
        f"count {c.by('node')} ({nl}  {pairs}{nl}  unless {node_run}{nl}  {_last(f.live, cfg)}{nl})"
    )
    prev_total = _last(f.runs_total, cfg)
    blamed_now = (
        f"max {c.by('node, run, cause')} ({nl}{_accusations(cfg)} * 0{nl}"
        f"+ {c.on('run, rank')} group_left (node){nl}({_node_of_rank(cfg)} * 0){nl}"
        f"or{nl}{_network_accusations(cfg)} * 0{nl}) + time()"
    )
    blamed_pairs = f"max {c.by('node, run')} ({f.blamed})"
    # A run's nodes, also ranks gone lately (a rank down still counts among its run's nodes).
    run_nodes = (
        f"count {c.by('run')} ({nl}  max {c.by('node, run')} "
        f"(last_over_time({info}[{cfg.baseline_window}])){nl})"
    )
    alone_now = (
        f"{blamed_pairs}{nl}and {run}{nl}"
        f"(count {c.by('run')} ({blamed_pairs}) * 2{nl}<= {run}{nl}{run_nodes})"
    )
    window = duration_seconds(cfg.fleet_window)
    total, n = f.runs_total, int(cfg.fleet_runs)
    rules = [
        {
            # Runs started on each node, ever: carried, plus the pairs new since the last
            # evaluation (read before this evaluation's live pairs are written below).
            "record": total,
            "expr": (
                f"{prev_total}{nl}+ {node}{nl}({new_runs}{nl}or{nl}{prev_total} * 0){nl}"
                f"or{nl}{new_runs}"
            ),
        },
        {"record": f.live, "expr": pairs},
        {
            # When each pair was last blamed, and for what; kept for the window.
            "record": f.blamed,
            "expr": f"{blamed_now}{nl}or{nl}({_last(f.blamed, cfg)} > time() - {window})",
        },
        {
            # The node's run count when the pair was first blamed: its place among the node's
            # runs (its last N runs are those above runs_total - N).
            "record": f.blamed_index,
            "expr": (
                f"({_last(f.blamed_index, cfg)} and {node_run} {blamed_pairs}){nl}or{nl}"
                f"({blamed_pairs} * 0{nl}+ {node} group_left (){nl}{total})"
            ),
        },
        {
            # Counted only where at most half of the run's nodes were blamed; decided while the
            # run's ranks are known, then kept.
            "record": f.blamed_alone,
            "expr": (
                f"{alone_now}{nl}or{nl}({nl}  {_last(f.blamed_alone, cfg)}{nl}"
                f"  and {node_run}{nl}  {blamed_pairs}{nl}  unless {run}{nl}"
                f"  {run_nodes}{nl})"
            ),
        },
        {
            # Runs in the window: the counter's growth (all of it for a younger node, or after
            # the counter restarted).
            "record": f.runs_seen,
            "expr": f"({total} - {total} offset {cfg.fleet_window}) >= 0{nl}or{nl}{total}",
        },
        {"record": f.runs_blamed, "expr": f"count {c.by('node')} ({f.blamed_alone})"},
        {
            "record": f.recent_blamed,
            "expr": (
                f"count {c.by('node')} ({nl}  ({f.blamed_index} and {node_run} "
                f"{f.blamed_alone}){nl}  > {node} group_left (){nl}  ({total} - {n}){nl})"
            ),
        },
        {
            "record": f.cause_runs,
            "expr": (
                f"count {c.by('node, cause')} ({nl}  {f.blamed}{nl}  and {node_run}{nl}"
                f"  {f.blamed_alone}{nl})"
            ),
        },
    ]
    return rules


#: What the fleet group reads of each run, and nothing else: the global server of a sharded
#: setup federates exactly these from its shards (exporter.deploy.sharding).
FLEET_INPUT_ALERTS: tuple[str, ...] = (
    "DDPRankStraggler",
    "DDPCollectiveStalled",
    "DDPCollectiveTimeoutImminent",
    "DDPHangAborted",
    "DDPHangNetworkFault",
    "DDPRankDown",
    "DDPGPUError",
)
