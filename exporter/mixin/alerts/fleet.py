"""The fleet's alerts: a node blamed run after run, and a shard the global server cannot read.

They belong to the fleet's own rule group (:func:`exporter.mixin.rules.fleet_group`), after the
records they read (:mod:`exporter.mixin.fleet`): DDPSuspectNode carries a ``node`` label and no
run, DDPShardDown an ``instance`` label (the monitoring itself).
"""

from __future__ import annotations

from ..alert import Alert
from ..config import MixinConfig
from ..fleet import fleet_recorded
from ..promql import string

__all__ = [
    "fleet_alerts",
    "shard_down_alert",
    "suspect_node_alert",
]


def fleet_alerts(cfg: MixinConfig) -> list[Alert]:
    """Return the fleet group's alerts, in the runbook's order."""
    return [suspect_node_alert(cfg), shard_down_alert(cfg)]


def shard_down_alert(cfg: MixinConfig) -> Alert:
    """Return DDPShardDown: the global server cannot read a shard's accusations."""
    return Alert(
        "DDPShardDown",
        "warning",
        f"up{{job={string(cfg.federate_job)}}} == 0",
        cfg.shard_down_for,
        "The global server cannot read a Prometheus shard: the fleet is blind to its runs.",
        (
            "Federation from shard {{ $labels.instance }} has failed for "
            f"{cfg.shard_down_for}: its runs' accusations and rank-to-node facts do not reach "
            "the fleet rules, so no node is blamed for them (and none falsely) until it is back."
        ),
        "In a sharded setup (deploy/sharded/, `exporter.deploy.sharding`) each shard evaluates the "
        "per-run rules of the runs it scrapes and pages for them itself; the global server "
        "federates only the firing accusations and `ddp_rank_info` to judge nodes across runs. "
        "A shard it cannot read drops out of that judgement: nodes blamed only there are not "
        "counted, and a node is never blamed for the gap. Inert where no federation job "
        "exists (one Prometheus).",
        "The global server's Targets page (job `" + cfg.federate_job + "`): the scrape error; "
        "`curl -s 'http://SHARD:9090/federate?match[]=ddp_rank_info' | head` from the global "
        "server's host; the shard's own `up` and its logs.",
        "Bring the shard back (restart it, fix the network or its storage). The fleet's memory "
        f"survives a gap of up to {cfg.fleet_carry}; a longer outage makes the fleet rules "
        "count that shard's nodes from scratch. The shard's own per-run alerts keep paging "
        "while it runs; if it is down, its runs are unwatched: check them with "
        "`ddp-exporter top --targets`.",
        scope="monitoring",
    )


def suspect_node_alert(cfg: MixinConfig) -> Alert:
    """Return DDPSuspectNode: a node blamed again and again, with its evidence and drain commands."""
    f = fleet_recorded(cfg)
    n, k = int(cfg.fleet_runs), int(cfg.fleet_blamed_runs)
    # Both selectors narrowed to the node: the template runs once per active alert.
    evidence = f"sort_desc({f.blamed}{{node=%q}} and on (node, run) {f.blamed_alone}{{node=%q}})"
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
            f"{{{{ range printf `{evidence}` $labels.node $labels.node | query }}}}"
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
        scope="node",
    )
