"""Build the fleet rules: which node keeps being the culprit across runs (DDPSuspectNode).

Every accusation the per-run alerts make names a rank: a straggler by compute or data
(DDPRankStraggler, ``cause``), the rank behind in a stalled collective or the culprit of an
aborted hang (``hang``), a rank down while its run goes on (``down``). Each is turned into a
series per ``(node, run, cause)`` by joining the firing alert with the rank's ``node``
(``ddp_rank_info``). These series, and one per ``(node, run)`` seen at all, outlive the run:
each evaluation of the fleet group keeps the last value for ``fleet_window`` by reading its
own previous output (``last_over_time(record[fleet_carry])``), so an evaluation reads a few
samples per remembered pair whatever the fleet's size and the window's length.

**The definition** (also in docs/runbook.md, DDPSuspectNode). A node is blamed in a run when
one of the accusations above fired for a rank on it, and at most half of the run's nodes were
blamed in that run (a run blaming most of its nodes blames none: a job-wide problem, or a run
on one node, says nothing about one node). It is suspect when blamed in at least
``fleet_blamed_runs`` of its last ``fleet_runs`` distinct runs within ``fleet_window``. So:

- one slow job is one run: never enough;
- a job-wide slowdown or a data stall common to every rank (a shared file system) blames no rank,
  since stragglers are judged against the run's own median;
- a busy node is judged on its last ``fleet_runs`` runs, not on how many it hosted.

Labels stay bounded: ``node``, ``run``, ``cause`` (compute, data, hang, down).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import catalog
from .alert import Alert, selector
from .config import MixinConfig, duration_seconds

__all__ = ["CAUSES", "FleetRecorded", "fleet_group", "fleet_recorded", "suspect_node_alert"]

#: What a node can be blamed for.
CAUSES: tuple[str, ...] = ("compute", "data", "hang", "down")


@dataclass(frozen=True)
class FleetRecorded:
    """Name the fleet's recorded series of one configuration (the window is in the names)."""

    seen: str
    blamed: str
    blamed_alone: str
    recent: str
    runs_seen: str
    runs_blamed: str
    recent_blamed: str
    cause_runs: str


def fleet_recorded(cfg: MixinConfig) -> FleetRecorded:
    """Return the fleet's recording-rule names for ``cfg``."""
    info, w = catalog.RANK_INFO.name, cfg.fleet_window
    return FleetRecorded(
        seen=f"node_run:{info}:seen_timestamp_last{w}",
        blamed=f"node_run_cause:{info}:blamed_timestamp_last{w}",
        blamed_alone=f"node_run:{info}:blamed_alone_timestamp_last{w}",
        recent=f"node_run:{info}:seen_timestamp_topk_last{w}",
        runs_seen=f"node:{info}:runs_seen_last{w}",
        runs_blamed=f"node:{info}:runs_blamed_last{w}",
        recent_blamed=f"node:{info}:recent_runs_blamed_last{w}",
        cause_runs=f"node_cause:{info}:runs_blamed_last{w}",
    )


def _carried(now: str, record: str, cfg: MixinConfig) -> str:
    """Return ``now`` (stamped with the time), else ``record``'s last value within the window."""
    window = duration_seconds(cfg.fleet_window)
    return f"{now}\nor\n(last_over_time({record}[{cfg.fleet_carry}]) > time() - {window})"


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
    return (
        "max by (run, rank, cause) (\n"
        f"  {straggler}\n  or\n"
        f'  label_replace({behind}, "cause", "hang", "", "")\n  or\n'
        f'  label_replace({aborted}, "cause", "hang", "", "")\n  or\n'
        f'  label_replace({down}, "cause", "down", "", "")\n)'
    )


def _node_of_rank(cfg: MixinConfig) -> str:
    """Return a (run, rank, node) vector: each rank's node, also for a rank gone lately."""
    info = selector(cfg, catalog.RANK_INFO.name)
    # One node per rank even when a restarted attempt moved it (topk keeps one).
    return (
        "topk by (run, rank) (1,\n"
        f"  max by (run, rank, node) (last_over_time({info}[{cfg.baseline_window}]))\n)"
    )


def fleet_group(cfg: MixinConfig) -> dict[str, Any]:
    """Return the fleet's rule group (its own evaluation interval), records then the alert."""
    f = fleet_recorded(cfg)
    info = selector(cfg, catalog.RANK_INFO.name)
    seen_now = f"max by (node, run) ({info}) * 0 + time()"
    blamed_now = (
        f"max by (node, run, cause) (\n{_accusations(cfg)} * 0\n"
        f"+ on (run, rank) group_left (node)\n({_node_of_rank(cfg)} * 0)\n) + time()"
    )
    nodes_blamed = f"count by (run) (max by (node, run) ({f.blamed}))"
    rules = [
        {"record": f.seen, "expr": _carried(seen_now, f.seen, cfg)},
        {"record": f.blamed, "expr": _carried(blamed_now, f.blamed, cfg)},
        {
            # Counted only where at most half of the run's nodes were blamed.
            "record": f.blamed_alone,
            "expr": (
                f"max by (node, run) ({f.blamed})\nand on (run)\n"
                f"({nodes_blamed} * 2\n<= on (run)\ncount by (run) ({f.seen}))"
            ),
        },
        {"record": f.recent, "expr": f"topk by (node) ({int(cfg.fleet_runs)}, {f.seen})"},
        {"record": f.runs_seen, "expr": f"count by (node) ({f.seen})"},
        {"record": f.runs_blamed, "expr": f"count by (node) ({f.blamed_alone})"},
        {
            "record": f.recent_blamed,
            "expr": f"count by (node) (\n  {f.recent}\n  and on (node, run)\n  {f.blamed_alone}\n)",
        },
        {
            "record": f.cause_runs,
            "expr": (
                f"count by (node, cause) (\n  {f.blamed}\n  and on (node, run)\n"
                f"  {f.blamed_alone}\n)"
            ),
        },
        suspect_node_alert(cfg).rule(cfg),
    ]
    return {"name": "ddp-exporter.fleet", "interval": cfg.fleet_interval, "rules": rules}


def suspect_node_alert(cfg: MixinConfig) -> Alert:
    """Return DDPSuspectNode: a node blamed again and again, with its evidence and drain commands."""
    f = fleet_recorded(cfg)
    n, k = int(cfg.fleet_runs), int(cfg.fleet_blamed_runs)
    evidence = f"sort_desc({f.blamed}{{node=%q}} and on (node, run) {f.blamed_alone})"
    return Alert(
        "DDPSuspectNode",
        "warning",
        f"{f.recent_blamed} >= {k}",
        cfg.suspect_node_for,
        "A node was blamed in several of its recent runs: drain it before the next job lands "
        "on it.",
        (
            "Node {{ $labels.node }} was blamed in {{ $value }} of its last "
            f"{n} runs (within {cfg.fleet_window}) while most of the other nodes of each run "
            "were not. Evidence (run, cause, last blamed): "
            f"{{{{ range printf `{evidence}` $labels.node | query }}}}"
            "{{ .Labels.run }} ({{ .Labels.cause }}, {{ .Value | humanizeTimestamp }}); "
            "{{ end }}Drain it: Slurm `scontrol update NodeName={{ $labels.node }} State=DRAIN "
            'Reason="ddp-exporter DDPSuspectNode"`; Kubernetes `kubectl cordon '
            "{{ $labels.node }} && kubectl drain {{ $labels.node }} --ignore-daemonsets "
            "--delete-emptydir-data`."
        ),
        "Jobs that land on this node keep naming one of its ranks: a straggler by compute "
        "(a GPU that throttles, ECC errors, a slower part) or by data (a slow local disk, a "
        "flaky NIC, a noisy neighbour), the hung rank of a stalled collective, or a rank that "
        "died. A node is blamed in a run when an alert accused a rank on it and at most half "
        "of the run's nodes were accused; it is suspect when blamed in at least "
        f"{k} of its last {n} distinct runs within {cfg.fleet_window}. One slow job, a "
        "slowdown of every rank (judged against the run's own median, nobody is a "
        "straggler), a data stall common to all ranks and a node that merely hosts many jobs "
        "are never enough.",
        "Fleet dashboard: the node's runs and blame by cause; `ddp-exporter nodes --prometheus "
        "URL` ranks nodes by evidence and lists the runs. Check the node's hardware: "
        "`nvidia-smi -q -d PERFORMANCE,ECC,TEMPERATURE` (throttle reasons, retired pages), "
        "`dmesg` for Xid and NIC errors, `ethtool -S` link errors, disk latency.",
        "Drain the node (commands in the description) so that the scheduler places no new job "
        "on it, and hand it to the hardware team with the evidence. Once repaired, resume it "
        "(`scontrol update NodeName=... State=RESUME`, `kubectl uncordon`); the alert resolves "
        f"as new runs on it go unblamed or its blamed runs age out of {cfg.fleet_window}.",
    )
