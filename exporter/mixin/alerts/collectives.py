"""Build the collective and hang alerts: a collective stalled, or near its timeout; a link down.

A hung rank is the one whose collective sequence number stops advancing, so these alerts name
the ranks whose ``last_enqueued_seq`` is behind the run's maximum (role=behind, one alert per
rank); with nobody behind, every rank waits inside the collective and the process group is one
alert (role=waiting). The stall bound is the one hang definition (:mod:`exporter.hangs
.definition`) that ``top`` and the hang watcher use too. With nobody behind, the hang watcher
probes the links between the nodes; a link or a node that carries no traffic is
DDPHangNetworkFault, one alert per link or node, which the fleet counts against the nodes.
"""

from __future__ import annotations

from ... import catalog
from ..alert import Alert, selector
from ..cluster import clauses
from ..config import DEFAULT, MixinConfig
from ..recording import Recorded, recorded
from .shared import finished_ranks, hang_location, hang_network, with_role

__all__ = ["collective_alerts", "collective_stalled", "network_fault", "timeout_imminent"]

#: The description's sentence on the role label: who the alert names.
_WHO = (
    '{{ if eq $labels.role "behind" }}Rank {{ $labels.rank }} is behind: its last enqueued '
    "sequence number is below the run's maximum, so it never entered the collective (the hung "
    "rank; a rank in a declared section within its deadline is never named).{{ else }}No rank "
    "is visibly behind: the ranks are stuck inside the collective (waiting), the condition of "
    "the whole process group.{{ end }}"
)


def collective_alerts(cfg: MixinConfig = DEFAULT) -> list[Alert]:
    """Return DDPCollectiveTimeoutImminent (warning, critical), DDPCollectiveStalled and
    DDPHangNetworkFault."""
    return [
        timeout_imminent(cfg, "warning", cfg.timeout_warning_ratio),
        timeout_imminent(cfg, "critical", cfg.timeout_critical_ratio),
        collective_stalled(cfg),
        network_fault(cfg),
    ]


def _every_rank_in_section(cfg: MixinConfig, r: Recorded) -> str:
    """Return a (run) vector of the runs whose every reporting rank is in a declared section."""
    c = clauses(cfg)
    info = selector(cfg, catalog.RANK_INFO.name)
    return (
        f"count {c.by('run')} ({r.in_section})\n>= {c.on('run')}\n"
        f"count {c.by('run')} (max {c.by('run, rank')} ({info}))"
    )


def _section_holds_up(cfg: MixinConfig, r: Recorded) -> str:
    """Return a (run) vector of the runs where a rank in a declared section holds others up.

    Its own groups excuse it; through them it holds up groups it is not in: in a 2-D mesh the
    rank waiting for it in its shard group never enters its replicate group's next collective,
    whose other ranks then wait with nobody behind. A real hang elsewhere in the run while the
    section lasts is named once it ends (its deadline bounds the wait: DDPSectionOverdue).
    """
    c = clauses(cfg)
    return (
        f"count {c.by('run')} ({r.in_section}\nand {c.on('run, rank')}\n"
        f"(max {c.by('run, rank')} ({r.seq_behind}) > 0))"
    )


def _name_ranks(cfg: MixinConfig, run_pg_condition: str, rank_condition: str) -> str:
    """Return an expr naming the ranks behind in a stuck (run, pg), else the stuck (run, pg).

    ``run_pg_condition`` is a (run, pg) vector whose value is carried over to each rank behind
    (role=behind: a condition of that rank). A rank inside a declared section within its
    deadline, or one that ended cleanly, is not behind: it is saving, evaluating or gone, and
    the ranks it holds up are not stuck either. With nobody behind, ``rank_condition`` (a
    (run, rank, pg) vector) says whether ranks are stuck inside the collective: one alert per
    (run, pg) (role=waiting: a condition of the run), unless every rank is in a section or a
    rank in a section holds others up.
    """
    r, c = recorded(cfg), clauses(cfg)
    rank = c.on("run, rank")
    # Behind: a lower sequence number, and not itself stuck inside a collective of any group
    # (one that is waits, as the hang definition says: its reading is older, or, in a 2-D
    # mesh, it is held up in another group: the replicate group waits for a rank that waits
    # in its shard group for the real culprit).
    late = f"({r.seq_behind} > 0)\n  unless {rank}\n  ({rank_condition})"
    excused = f"{r.in_section}\nor {rank}\n{finished_ranks(cfg)}"
    behind = (
        f"(\n  {late}\n  unless {rank}\n  ({excused})\n) * 0\n"
        f"+ {c.on('run, pg')} group_left ()\n({run_pg_condition})"
    )
    waiting = (
        f"max {c.by('run, pg')} ({rank_condition})\nunless {c.on('run, pg')}\n({late})\n"
        f"unless {c.on('run')}\n({_every_rank_in_section(cfg, r)})\n"
        f"unless {c.on('run')}\n({_section_holds_up(cfg, r)})"
    )
    return f"{with_role(behind, 'behind')}\nor\n{with_role(waiting, 'waiting')}"


def timeout_imminent(cfg: MixinConfig, severity: str, ratio: float) -> Alert:
    """Return DDPCollectiveTimeoutImminent at ``severity``: ``ratio`` of the timeout used."""
    r = recorded(cfg)
    return Alert(
        "DDPCollectiveTimeoutImminent",
        severity,
        _name_ranks(
            cfg,
            f"{r.inflight_ratio_run} > {ratio:g}",
            f"{r.inflight_ratio_rank} > {ratio:g}",
        ),
        cfg.timeout_for,
        f"A collective has used over {ratio:.0%} of its timeout; the job will be killed soon.",
        (
            "A collective of process group {{ $labels.pg }} in run {{ $labels.run }} "
            "has been in flight for {{ $value | humanizePercentage }} of its timeout. " + _WHO
        )
        + hang_location(cfg)
        + hang_network(cfg),
        "A collective (DDP's gradient allreduce) is not completing. The rank labelled "
        "role=behind stopped advancing its collective sequence number: it is the hung one; "
        "the others wait for it. When the watchdog's timeout expires, the job dies.",
        "Collectives dashboard: in-flight age against the timeout budget, and the "
        "sequence-number lag per rank; the hung rank's lag is above zero.",
        "Read the hang verdict: every rank's stack was dumped automatically; the "
        "monitoring rank logs the verdict and `ddp-exporter hangs DUMP_DIR` prints it "
        "(culprit file:line first). Check the named rank's data loader, its host and "
        "its GPU (`nvidia-smi`, Xid errors). Kill and restart "
        "from the last checkpoint if it does not recover; raise the timeout only if the "
        "work legitimately takes longer.",
    )


def _waited(cfg: MixinConfig, ages: str) -> str:
    """Return ``ages`` (in-flight ages of a run's collectives) counted from the run's last
    declared section's end where the collective started before it.

    While a rank is in a section, the ranks it holds up are excused; once it leaves, their
    collective has been in flight for the whole section, and a rank that works a few seconds
    more before it joins (a DataLoader starting its workers again) would be named at once. So
    a wait counts from the section's end, as the hang watcher and ``top`` count it: the
    smaller of the age and the time since the end, ``age - clamp_min(age - since_end, 0)``.
    """
    c = clauses(cfg)
    ended = selector(cfg, catalog.SECTION_ENDED.name)
    since_end = f"(time() - max {c.by('run')} ({ended}))"
    return (
        f"(\n  (\n    {ages}\n    - clamp_min({ages} - {c.on('run')} group_left () {since_end}, 0)"
        f"\n  )\n  or\n  {ages}\n)"
    )


def collective_stalled(cfg: MixinConfig = DEFAULT) -> Alert:
    """Return DDPCollectiveStalled: in flight far longer than the run's normal latency, counted
    from the end of a declared section that held it up."""
    r, c = recorded(cfg), clauses(cfg)
    run_pg = c.on("run, pg")
    per_rank = f"max {c.by('run, rank, pg')} ({selector(cfg, catalog.INFLIGHT_AGE.name)})"
    bound = (
        f"clamp_min(\n  {cfg.stall_latency_factor:g} * (max {c.by('run, pg')} "
        f"(max_over_time({r.coll_mean_run}[{cfg.baseline_window}])) > 0),\n"
        f"  {cfg.stall_min_seconds:g}\n)\nor {run_pg}\n"
        f"(0 * {r.inflight_max_run} + {cfg.stall_min_seconds:g})"
    )
    return Alert(
        "DDPCollectiveStalled",
        "warning",
        _name_ranks(
            cfg,
            f"{_waited(cfg, r.inflight_max_run)}\n> {run_pg}\n({bound})",
            f"{_waited(cfg, per_rank)}\n> {run_pg} group_left ()\n({bound})",
        ),
        cfg.stalled_for,
        "A collective has been in flight far longer than this run's normal collective latency.",
        (
            "A collective of process group {{ $labels.pg }} in run {{ $labels.run }} has been "
            "in flight for {{ $value | humanizeDuration }}, over "
            f"{cfg.stall_latency_factor:g}x the run's normal latency (and at least "
            f"{cfg.stall_min_seconds:g}s). " + _WHO
        )
        + hang_location(cfg)
        + hang_network(cfg),
        "Collective latency normally stays near its recent mean; an in-flight age many times "
        "that mean means a rank has not joined (role=behind names it) or the network stalled. "
        "A collective that a rank's declared section held up counts its age from the "
        "section's end, when that rank is free to join.",
        "Collectives dashboard: in-flight age against the mean latency and the timeout; "
        "sequence-number lag per rank.",
        "Treat as an early DDPCollectiveTimeoutImminent: read the hang verdict "
        "(`ddp-exporter hangs DUMP_DIR`; the description names the culprit's file:line) and "
        "inspect the rank labelled behind (data loader, host, GPU). With role=waiting on all "
        "ranks, check the network fabric (NCCL_DEBUG=INFO logs, link errors).",
    )


def network_fault(cfg: MixinConfig = DEFAULT) -> Alert:
    """Return DDPHangNetworkFault: every rank waits, and a link or a node carries no traffic."""
    c = clauses(cfg)
    found = selector(cfg, catalog.HANG_NETWORK.name, 'finding=~"link|node"')
    return Alert(
        "DDPHangNetworkFault",
        "warning",
        f"max {c.by('run, finding, node, peer_node')} ({found})",
        "0s",
        "Every rank waits inside a collective, and a link or a node between them carries no "
        "traffic.",
        (
            "Every rank of run {{ $labels.run }} waits inside a collective with nobody behind, "
            'and {{ if eq $labels.finding "link" }}the link between node {{ $labels.node }} and '
            "node {{ $labels.peer_node }} carries no traffic: the hang watcher's probe could not "
            "connect or move data across it, twice, while both nodes reach their other peers."
            "{{ else }}node {{ $labels.node }} is unreachable from every peer on its backend "
            "address: the hang watcher's probe could not connect to it or move data, twice, "
            "from any other node, while the store still hears from it.{{ end }} The hang's "
            "verdict (`ddp-exporter hangs DUMP_DIR`) says how each attempt failed."
        ),
        "A collective every rank entered and none completes has nobody behind: the job's code "
        "is not where it hangs. While the ranks sit in it past the stall threshold, one rank "
        "per node tries a side port of one rank on every other node, at the address the "
        "backend uses (`DDP_EXPORTER_HANG_PROBE`): connect, send a few KiB, read them back. "
        "A pair that fails twice while both its nodes reach the others is a broken link "
        "(finding=link); a node no peer reaches is cut off on its backend address "
        "(finding=node), its victims not blamed. The verdict comes on this evidence, long "
        "before a hang with nobody behind is called symmetric. The fleet counts it against "
        "the nodes (cause link, network).",
        "The hang's verdict (`ddp-exporter hangs DUMP_DIR`): its NETWORK section lists the "
        "pairs tried; `ddp-exporter top` shows STUCK with the probe's finding. From the named "
        "node: `ip -s link` (errors, drops), `ethtool -S` (link flaps, CRC errors), the "
        "switch port's counters; a firewall change (`nft list ruleset`, security groups).",
        "Fix or drain the node (both ends of a link when you cannot tell which is broken): "
        "Slurm `scontrol update NodeName=... State=DRAIN`, Kubernetes `kubectl cordon`. "
        'Restart the job without it; with `on_hang="abort"` the abort line and '
        "`<dump_dir>/<run>-abort.txt` name the nodes for a requeue script to exclude.",
        scope="run",
    )
