"""Build the Grafana dashboards from a thin list of panel specs, rendered with grafanalib.

Each dashboard is a list of :class:`PanelSpec` (title, kind, PromQL targets, unit); one
function turns specs into grafanalib objects and lays them out on the 24-column grid. Every
query filters on the template variables ``run`` and ``rank`` (``rank`` is limited by ``node``
through ``ddp_rank_info``); every datasource reference is ``{"type": "prometheus", "uid":
"${datasource}"}`` and the datasource variable defaults to the provisioned fixed uid.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from grafanalib import core as g

from .. import catalog, settings
from .cluster import scoped
from .config import DEFAULT, MixinConfig
from .fleet import fleet_recorded
from .render import dump_json
from .rules import recorded, selector

__all__ = [
    "BUILTIN_ANNOTATION",
    "LEGACY_KEYS",
    "SCHEMA_VERSION",
    "DashboardSpec",
    "PanelSpec",
    "Target",
    "build",
    "dashboard_specs",
    "modernize",
    "render_dashboards",
]

#: Dashboard JSON schema version of Grafana 11.0, so every Grafana 11 loads it as is. Grafana 12's
#: later steps (40: string refresh, 41: drop timepicker.time_options, 42: hideFrom.tooltip in
#: overrides) change nothing in these dashboards; tests/test_mixin_dashboards.py checks that.
SCHEMA_VERSION = 39

#: Datasource reference used by every panel, target and query variable.
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

#: Filter on the dashboard variables, for exporter series and recorded series alike.
VARS = 'run=~"$run", rank=~"$rank"'
#: Ranks shown where one series per rank would be too many to read (and to send) at scale.
TOP_RANKS = 10


@dataclass(frozen=True)
class Target:
    """One PromQL query of a panel and its legend."""

    expr: str
    legend: str = ""


@dataclass(frozen=True)
class PanelSpec:
    """Describe one panel: what it shows, how, and when it is expected to have data.

    ``needs`` names a condition without which the panel is legitimately empty: ``""`` (always
    has data on a healthy run), ``"gpu"`` (CUDA ranks), ``"alerts"`` (an alert is firing),
    ``"errors"`` (the exporter counted an error), ``"hang"`` (a hang episode is open),
    ``"deadline"`` (the job knows its wall-clock deadline and total steps), ``"sections"`` (an
    ``exporter.deadline`` section is running), ``"abort"`` (the run has ``on_hang="abort"``), ``"fleet"`` (the fleet group has evaluated once,
    ``fleet_interval``), ``"blame"`` (some node was blamed in a run).
    """

    title: str
    targets: tuple[Target, ...]
    kind: str = "timeseries"  # timeseries | bars | bargauge | stat | table
    unit: str = "short"
    description: str = ""
    width: int = 12
    height: int = 8
    needs: str = ""
    min: float | None = None
    max: float | None = None
    thresholds: tuple[tuple[str, float | None], ...] = ()


@dataclass(frozen=True)
class DashboardSpec:
    """Describe one dashboard: file stem, uid, title and panels."""

    stem: str
    uid: str
    title: str
    description: str
    panels: tuple[PanelSpec, ...] = field(default_factory=tuple)
    #: Start of the default time range (the fleet looks back days, the rest minutes).
    time_from: str = "now-30m"


def _s(cfg: MixinConfig, metric: catalog.MetricDef, suffix: str = "", *extra: str) -> str:
    """Return a selector of an exporter series filtered on the dashboard variables."""
    return selector(cfg, metric.name + suffix, VARS, *extra)


def _mean(cfg: MixinConfig, metric: catalog.MetricDef, by: str, *extra: str) -> str:
    """Return the mean per event of a histogram/summary over ``$__rate_interval``."""
    s, c = _s(cfg, metric, "_sum", *extra), _s(cfg, metric, "_count", *extra)
    return (
        f"sum by ({by}) (rate({s}[$__rate_interval]))\n/\n"
        f"sum by ({by}) (rate({c}[$__rate_interval]))"
    )


def _rate(cfg: MixinConfig, metric: catalog.MetricDef, by: str) -> str:
    """Return a per-second rate of a counter over ``$__rate_interval``."""
    return f"sum by ({by}) (rate({_s(cfg, metric)}[$__rate_interval]))"


def _rec(name: str, *extra: str) -> str:
    """Return a recorded series filtered on the dashboard variables."""
    return f"{name}{{{', '.join((VARS, *extra))}}}"


def _up(cfg: MixinConfig) -> str:
    """Return the ``up`` selector of the exporter's scrape targets (labels from file_sd)."""
    return selector(cfg, "up", f'job="{cfg.job}"', VARS)


def dashboard_specs(cfg: MixinConfig = DEFAULT) -> tuple[DashboardSpec, ...]:
    """Return the six dashboards as specs."""
    r = recorded(cfg)
    ranks = "rank {{rank}}"
    phases = "|".join(catalog.PHASES)
    phase_sel = f'phase=~"{phases}"'
    overview = DashboardSpec(
        "overview",
        "ddp-overview",
        "DDP / Overview",
        "Job health, throughput, step time and the straggler score per rank.",
        (
            PanelSpec(
                "Targets up",
                (Target(f"sum by (run) ({_up(cfg)})", "{{run}}"),),
                kind="stat",
                width=4,
                height=5,
                description="Scrape targets (ranks) whose endpoint answers.",
            ),
            PanelSpec(
                "Targets down",
                (Target(f"sum by (run) (1 - {_up(cfg)})", "{{run}}"),),
                kind="stat",
                width=4,
                height=5,
                thresholds=(("green", None), ("red", 1)),
                description="Scrape targets whose endpoint does not answer (dead or unreachable).",
            ),
            PanelSpec(
                "Alerts firing",
                (Target('count(ALERTS{alertstate="firing", run=~"$run"}) or vector(0)', "firing"),),
                description=(
                    "Alerts of the selected runs firing now (all severities). The list at the "
                    "bottom names them."
                ),
                kind="stat",
                width=4,
                height=5,
                thresholds=(("green", None), ("red", 1)),
            ),
            PanelSpec(
                "Steps/s (slowest rank)",
                (Target(f"min by (run) ({_rate(cfg, catalog.STEPS, 'run, rank')})", "{{run}}"),),
                description=(
                    "Training steps per second of the slowest rank: DDP runs at the pace of "
                    "its slowest rank."
                ),
                kind="stat",
                unit="ops",
                width=4,
                height=5,
            ),
            PanelSpec(
                "Ranks reporting",
                (Target(f"count by (run) ({_s(cfg, catalog.RANK_INFO)})", "{{run}}"),),
                description=(
                    "Ranks whose exporter publishes ddp_rank_info. Fewer than the world size: "
                    "a rank is not scraped."
                ),
                kind="stat",
                width=4,
                height=5,
            ),
            PanelSpec(
                "Median step time",
                (
                    Target(
                        "quantile by (run) (0.5, "
                        f"{_mean(cfg, catalog.STEP_DURATION, 'run, rank')})",
                        "{{run}}",
                    ),
                ),
                description=("Median over ranks of each rank's mean step time."),
                kind="stat",
                unit="s",
                width=4,
                height=5,
            ),
            PanelSpec(
                "Steps/s per rank",
                (Target(_rate(cfg, catalog.STEPS, "run, rank"), ranks),),
                description=(
                    "Training steps per second of each rank. Ranks of one DDP job step "
                    "together; a gap is a rank that stopped."
                ),
                unit="ops",
            ),
            PanelSpec(
                "Step time per rank (mean)",
                (Target(_mean(cfg, catalog.STEP_DURATION, "run, rank"), ranks),),
                description=(
                    "Mean wall time of one training step per rank (forward, backward, "
                    "optimizer, data wait)."
                ),
                unit="s",
            ),
            PanelSpec(
                "Straggler score per rank",
                (Target(_rec(r.straggler_score), ranks),),
                kind="bargauge",
                min=0,
                max=max(3.0, cfg.straggler_ratio * 2),
                thresholds=(("green", None), ("yellow", 1.2), ("red", cfg.straggler_ratio)),
                description=(
                    "Compute+data time per step of the rank over the run's median rank "
                    f"({cfg.rate_window} window). 1 = typical; above {cfg.straggler_ratio:g} "
                    "the rank holds the job back. Never judged by collective latency: the "
                    "straggler's is the shortest."
                ),
            ),
            PanelSpec(
                f"Relative speed, {TOP_RANKS} slowest ranks",
                (Target(f"bottomk by (run) ({TOP_RANKS}, {_rec(r.relative_speed)})", ranks),),
                kind="bargauge",
                unit="percentunit",
                min=0,
                max=1,
                thresholds=(
                    ("red", None),
                    ("yellow", round(1 / cfg.straggler_ratio, 3)),
                    ("green", round(1 / 1.2, 3)),
                ),
                description=(
                    "The run's median compute+data time per step over the rank's, capped at "
                    "1 (NVRx's relative score): 100 % = as fast as the typical rank, 50 % = "
                    f"half its speed; below {1 / cfg.straggler_ratio:.0%} the rank is a "
                    "straggler. The same scale for runs of any speed and size: the slowest "
                    f"{TOP_RANKS} ranks of each run, slowest first."
                ),
            ),
            PanelSpec(
                "Step time p90 per rank",
                (
                    # Recorded: a range query of per-rank quantiles at 4096 ranks took > 1 s.
                    Target(_rec(r.step_p90), ranks),
                ),
                description=(
                    "90th percentile of the step time per rank, from the recorded histogram "
                    "quantile."
                ),
                unit="s",
            ),
            PanelSpec(
                "Alerts firing (list)",
                (
                    Target(
                        "max by (alertname, severity, run, rank, cause, role, pg) "
                        '(ALERTS{alertstate="firing", run=~"$run"})',
                        "{{alertname}} {{severity}} rank {{rank}}",
                    ),
                ),
                description=(
                    "Every firing alert with the labels that name the rank, cause, role and "
                    "process group."
                ),
                kind="table",
                width=24,
                needs="alerts",
            ),
            PanelSpec(
                "Time to finish vs deadline",
                (
                    Target(
                        f'{r.projected_finish_run}{{run=~"$run"}} - time()',
                        "projected time to finish {{run}}",
                    ),
                    Target(
                        f"min by (run) ({_s(cfg, catalog.JOB_DEADLINE)}) - time()",
                        "time left to deadline {{run}}",
                    ),
                ),
                unit="s",
                width=24,
                needs="deadline",
                description=(
                    "Projected time to finish (steps left over the step rate of the last "
                    f"{cfg.eta_window}) against the time left to the job's wall-clock deadline "
                    "(SLURM_JOB_END_TIME or DDP_EXPORTER_JOB_DEADLINE). The job fits while the "
                    "projection stays below the deadline line by the margin "
                    f"({cfg.job_deadline_margin_seconds:g}s); DDPJobWillMissDeadline fires "
                    "otherwise. Needs instrument(total_steps=...) or epochs=..."
                ),
            ),
        ),
    )
    stragglers = DashboardSpec(
        "stragglers",
        "ddp-stragglers",
        "DDP / Stragglers",
        "Where each rank's step time goes. The straggler has the tallest compute or data bar; "
        "the ranks waiting for it have the tallest comm_wait bar.",
        (
            PanelSpec(
                f"Phase time per step, {TOP_RANKS} most loaded ranks",
                (
                    # Recorded phases of the ranks with the highest straggler score only: all
                    # 4 x 4096 series were > 1 s to return and unreadable as a stack.
                    Target(
                        f"{_rec(r.phase_mean, phase_sel)}\n"
                        f"and on (run, rank)\ntopk by (run) ({TOP_RANKS}, "
                        f"{_rec(r.straggler_score)})",
                        "rank {{rank}} {{phase}}",
                    ),
                ),
                kind="bars",
                unit="s",
                width=24,
                description=(
                    "Where the step goes on the ranks with the most compute+data time per step "
                    "relative to the run's median (the straggler score)."
                ),
            ),
            PanelSpec(
                "Compute per step vs run median",
                (
                    Target(_rec(r.phase_mean, 'phase="compute"'), ranks),
                    Target(f'{r.phase_median}{{run=~"$run", phase="compute"}}', "median {{run}}"),
                ),
                description=(
                    "Compute time per step of each rank against the run's median rank; the "
                    "straggler is above the median line."
                ),
                unit="s",
            ),
            PanelSpec(
                "Data wait per step vs run median",
                (
                    Target(_rec(r.phase_mean, 'phase="data"'), ranks),
                    Target(f'{r.phase_median}{{run=~"$run", phase="data"}}', "median {{run}}"),
                ),
                description=(
                    "Time per step each rank waits for its dataloader against the run's "
                    "median rank; an input-bound rank is above it."
                ),
                unit="s",
            ),
            PanelSpec(
                "Phase share of the step, by rank",
                (Target(_rec(r.phase_share), "rank {{rank}} {{phase}}"),),
                description=(
                    "Share of each rank's step spent in each phase. A data share above the "
                    "input-bound threshold marks an input-bound rank."
                ),
                kind="bargauge",
                unit="percentunit",
                min=0,
                max=1,
                thresholds=(("green", None), ("yellow", cfg.input_bound_share)),
            ),
            PanelSpec(
                "Compute/data ratio to the run median",
                (Target(_rec(r.phase_ratio, 'phase=~"compute|data"'), "rank {{rank}} {{phase}}"),),
                description=f"Alerts above {cfg.straggler_ratio:g} (DDPRankStraggler).",
            ),
            PanelSpec(
                "Comm wait per step (waiting for a straggler or the network)",
                (
                    Target(
                        _mean(cfg, catalog.STEP_PHASE, "run, rank", 'phase="comm_wait"'),
                        ranks,
                    ),
                ),
                description=(
                    "Time per step a rank waits in gradient collectives. High on every rank "
                    "but one: that one is the straggler. High on every rank alike: the "
                    "network (a slow link: see the store round trips)."
                ),
                unit="s",
                width=24,
            ),
            PanelSpec(
                f"Store round trip, {TOP_RANKS} slowest ranks vs run median (a slow link)",
                (
                    Target(
                        f"topk by (run) ({TOP_RANKS}, {_rec(r.store_rtt_rank)})",
                        "rank {{rank}}",
                    ),
                    Target(f'{r.store_rtt_run}{{run=~"$run"}}', "median {{run}}"),
                ),
                description=(
                    "Median over the rate window of each rank's c10d-store heartbeat round trip "
                    "(one add per heartbeat). When the whole job waits on communication, the "
                    "ranks far above the run's median sit behind a slow network link: "
                    f"DDPRankStraggler cause=link above {cfg.link_rtt_ratio:g}x the median and "
                    f"{cfg.link_min_rtt_seconds * 1000:g} ms."
                ),
                unit="s",
                width=24,
            ),
        ),
    )
    coll_by = "run, rank, op, pg"
    collectives = DashboardSpec(
        "collectives",
        "ddp-collectives",
        "DDP / Collectives",
        "Collectives: latency, bytes, in-flight age against the timeout, and the "
        "sequence-number lag that names a hung rank. DDP: its gradient buckets (op allreduce); "
        "FSDP2, FSDP and loops without DDP: every torch.distributed collective by kind (op "
        "allgather, reduce_scatter, ...; ddp_rank_info{parallelism} says which).",
        (
            PanelSpec(
                "Collective latency (mean) per rank and pg",
                (
                    Target(
                        _mean(cfg, catalog.COLLECTIVE_DURATION, coll_by),
                        "rank {{rank}} {{op}} pg {{pg}}",
                    ),
                ),
                unit="s",
                description="A straggler shows the SHORTEST latency: its peers wait for it.",
            ),
            PanelSpec(
                "Collective latency p90 per rank and pg",
                (Target(_rec(r.coll_p90_rank), "rank {{rank}} {{op}} pg {{pg}}"),),
                description=(
                    "90th percentile of collective latency per rank, op and process group."
                ),
                unit="s",
            ),
            PanelSpec(
                "Collective bytes/s per rank and pg",
                (
                    Target(
                        _rate(cfg, catalog.COLLECTIVE_BYTES, coll_by),
                        "rank {{rank}} {{op}} pg {{pg}}",
                    ),
                ),
                description=(
                    "Bytes per second sent per rank, op and process group: DDP's gradient "
                    "buckets, or (other parallelism) the input tensors of its collectives."
                ),
                unit="Bps",
            ),
            PanelSpec(
                "In-flight age vs timeout budget",
                (
                    Target(
                        f"max by (run, rank, pg) ({_s(cfg, catalog.INFLIGHT_AGE)})",
                        "age rank {{rank}} pg {{pg}}",
                    ),
                    Target(
                        f"max by (run, pg) ({_s(cfg, catalog.COLLECTIVE_TIMEOUT)})",
                        "timeout pg {{pg}}",
                    ),
                ),
                description=(
                    "Age of the oldest in-flight collective per rank against the process "
                    "group's collective timeout."
                ),
                unit="s",
            ),
            PanelSpec(
                "In-flight age / timeout",
                (Target(_rec(r.inflight_ratio_rank), "rank {{rank}} pg {{pg}}"),),
                description=(
                    "In-flight age as a fraction of the collective timeout: warning and "
                    "critical alert levels as thresholds."
                ),
                unit="percentunit",
                min=0,
                max=1,
                thresholds=(
                    ("green", None),
                    ("orange", cfg.timeout_warning_ratio),
                    ("red", cfg.timeout_critical_ratio),
                ),
            ),
            PanelSpec(
                "Sequence-number lag behind the run's max",
                (Target(_rec(r.seq_behind), "rank {{rank}} pg {{pg}}"),),
                description="Collectives a rank has not entered yet. A hung rank's lag stays "
                "above 0 while the others' in-flight age grows.",
            ),
            PanelSpec(
                "Last enqueued / completed sequence number",
                (
                    Target(
                        f"max by (run, rank, pg) ({_s(cfg, catalog.LAST_ENQUEUED_SEQ)})",
                        "enqueued rank {{rank}} pg {{pg}}",
                    ),
                    Target(
                        f"max by (run, rank, pg) ({_s(cfg, catalog.LAST_COMPLETED_SEQ)})",
                        "completed rank {{rank}} pg {{pg}}",
                    ),
                ),
                description=(
                    "Collective sequence numbers per rank and process group; a rank whose "
                    "numbers stop is stuck."
                ),
                width=24,
            ),
            PanelSpec(
                "Restarts: attempt, hang aborts without progress, limit",
                (
                    Target(
                        f"max by (run) ({_s(cfg, catalog.HANG_ABORT_STREAK)})",
                        "aborts without progress {{run}}",
                    ),
                    Target(f"max by (run) ({_s(cfg, catalog.HANG_ABORT_LIMIT)})", "limit {{run}}"),
                    Target(
                        f"count by (run, attempt) ({_s(cfg, catalog.RANK_INFO)})",
                        "ranks in attempt {{attempt}} {{run}}",
                    ),
                ),
                needs="abort",
                description=(
                    'With on_hang="abort": the run\'s hang aborts in a row whose attempts made no '
                    "progress, against the limit at which the action stops (DDPRestartLoop), and "
                    "how many ranks report in each attempt (torchrun's restart or Slurm's "
                    "requeue count)."
                ),
            ),
            PanelSpec(
                "Aborted attempts: furthest step, culprit rank and node",
                (
                    Target(
                        "max by (run, attempt, culprit_rank, node) "
                        f"({_s(cfg, catalog.HANG_ABORTED_ATTEMPT)})",
                        "{{run}} attempt {{attempt}} rank {{culprit_rank}} on {{node}}",
                    ),
                ),
                kind="table",
                needs="abort",
                description=(
                    "Each earlier attempt of the run that the hang action aborted: the furthest "
                    "step it reached (the step it resumed at plus the steps it completed) and "
                    "its culprit. The same node every time: drain it; the same step every time: "
                    "a bug or bad data there."
                ),
            ),
        ),
    )
    mem = "run, rank"
    memory = DashboardSpec(
        "memory",
        "ddp-memory",
        "DDP / Memory",
        "GPU memory (allocated, reserved, peak against total) and host resident memory per rank.",
        (
            PanelSpec(
                "GPU memory per rank",
                tuple(
                    Target(f"max by ({mem}) ({_s(cfg, m)})", f"{label} rank {{{{rank}}}}")
                    for m, label in (
                        (catalog.GPU_MEM_ALLOCATED, "allocated"),
                        (catalog.GPU_MEM_RESERVED, "reserved"),
                        (catalog.GPU_MEM_PEAK, "peak"),
                        (catalog.GPU_MEM_TOTAL, "total"),
                    )
                ),
                description=(
                    "CUDA allocated, reserved, peak and total device memory per rank. Empty "
                    "on CPU-only runs."
                ),
                unit="bytes",
                needs="gpu",
            ),
            PanelSpec(
                "GPU reserved / total",
                (Target(_rec(r.gpu_reserved_ratio), ranks),),
                description=(
                    "Memory the CUDA caching allocator reserved as a fraction of the device's "
                    "total. Empty on CPU-only runs."
                ),
                kind="bargauge",
                unit="percentunit",
                min=0,
                max=1,
                thresholds=(("green", None), ("orange", 0.8), ("red", cfg.gpu_memory_ratio)),
                needs="gpu",
            ),
            PanelSpec(
                "Host resident memory per rank",
                (Target(f"max by ({mem}) ({_s(cfg, catalog.HOST_MEM_RESIDENT)})", ranks),),
                description=("Resident set size of each rank's process."),
                unit="bytes",
                width=24,
            ),
        ),
    )
    peer = selector(cfg, catalog.PEER_HEARTBEAT_AGE.name, 'run=~"$run", peer_rank=~"$rank"')
    liveness = DashboardSpec(
        "liveness",
        "ddp-liveness",
        "DDP / Liveness",
        "Is every rank alive and progressing? Heartbeat ages, the monitoring rank's view of "
        "its peers (which survives a dead endpoint), and scrape health.",
        (
            PanelSpec(
                "Heartbeat age per rank (time since last progress)",
                (Target(f"time() - max by (run, rank) ({_s(cfg, catalog.HEARTBEAT)})", ranks),),
                description=(
                    "Seconds since each rank last made progress (finished a step or "
                    "collective), from its own endpoint."
                ),
                unit="s",
            ),
            PanelSpec(
                "Peer heartbeat age (seen by the monitoring rank)",
                (
                    Target(
                        f"max by (run, peer_rank) ({peer})",
                        "rank {{peer_rank}}",
                    ),
                ),
                unit="s",
                thresholds=(("green", None), ("red", cfg.heartbeat_stale_seconds)),
                description=(
                    "Every peer in jobs of up to DDP_EXPORTER_PEER_SERIES "
                    f"({settings.DEFAULT_PEER_SERIES}) ranks; in larger jobs only late peers "
                    "(silent for over three heartbeat intervals), so an empty panel is healthy."
                ),
            ),
            PanelSpec(
                "Scrape up per rank",
                (Target(f"max by (run, rank) ({_up(cfg)})", ranks),),
                description=(
                    "1 when Prometheus scraped the rank's endpoint, 0 when the scrape failed "
                    "(dead or unreachable rank)."
                ),
                min=0,
                max=1,
            ),
            PanelSpec(
                "Exporter errors/s",
                (
                    # Recorded with only the places that have errors (32k zero series at 4096).
                    Target(_rec(r.errors_rate), "rank {{rank}} {{where}}"),
                ),
                description=(
                    "Errors the exporter caught and counted, by place; training continues. "
                    "Empty when there are none."
                ),
                unit="ops",
                needs="errors",
            ),
            PanelSpec(
                "Rank info",
                (Target(_s(cfg, catalog.RANK_INFO), ranks),),
                description=(
                    "Static facts of each rank: node, local rank, world size, backend, device "
                    "and versions."
                ),
                kind="table",
                width=24,
            ),
            PanelSpec(
                "Hang location (culprit of an open hang episode)",
                (Target(_s(cfg, catalog.HANG_LOCATION), ranks),),
                kind="table",
                width=24,
                needs="hang",
                description=(
                    "Where a rank that never entered a collective is stuck: the innermost frame "
                    "of its training thread in user code, from its automatic hang dump. Empty "
                    "while no hang is open. `ddp-exporter hangs DUMP_DIR` prints every rank's "
                    "stack."
                ),
            ),
            PanelSpec(
                "Named sections: running time vs deadline",
                (
                    Target(
                        f"time() - {_s(cfg, catalog.SECTION_STARTED)}",
                        "rank {{rank}} {{section}} running",
                    ),
                    Target(
                        f"{_s(cfg, catalog.SECTION_DEADLINE)}\nand on (run, rank, section)\n"
                        f"{_s(cfg, catalog.SECTION_STARTED)}",
                        "rank {{rank}} {{section}} deadline",
                    ),
                ),
                unit="s",
                width=24,
                needs="sections",
                description=(
                    "How long each running exporter.deadline() section has been running, "
                    "against its deadline; DDPSectionOverdue fires when a line crosses its "
                    "deadline. Empty while no section runs."
                ),
            ),
        ),
    )
    return (overview, stragglers, collectives, memory, liveness, _fleet(cfg))


def _fleet(cfg: MixinConfig) -> DashboardSpec:
    """Return the Fleet dashboard: which node keeps being blamed across runs."""
    f = fleet_recorded(cfg)
    node = 'node=~"$node"'
    n, k, w = int(cfg.fleet_runs), int(cfg.fleet_blamed_runs), cfg.fleet_window
    return DashboardSpec(
        "fleet",
        "ddp-fleet",
        "DDP / Fleet",
        f"Nodes ranked by how often runs blamed them over {w} (DDPSuspectNode: blamed in {k} "
        f"of the last {n} runs). The run and rank variables do not apply here.",
        (
            PanelSpec(
                "Suspect nodes",
                (
                    Target(
                        f'ALERTS{{alertname="DDPSuspectNode", alertstate="firing", {node}}}',
                        "{{node}}",
                    ),
                ),
                kind="table",
                width=24,
                height=6,
                needs="blame",
                description=(
                    "Nodes DDPSuspectNode names now: blamed in at least "
                    f"{k} of their last {n} runs while most of each run's other nodes were not. "
                    "Drain them (the alert's description has the commands). Empty while no "
                    "node is suspect."
                ),
            ),
            PanelSpec(
                f"Runs blamed of each node's last {n}",
                (Target(f"topk(20, {f.recent_blamed}{{{node}}})", "{{node}}"),),
                kind="bargauge",
                max=n,
                thresholds=(("green", None), ("orange", 1), ("red", k)),
                needs="blame",
                description=(
                    f"Per node, how many of its last {n} runs blamed it (top 20); red from {k}, "
                    "where DDPSuspectNode fires."
                ),
            ),
            PanelSpec(
                "Runs blamed by cause",
                (Target(f"topk(40, {f.cause_runs}{{{node}}})", "{{node}} {{cause}}"),),
                kind="bargauge",
                max=n,
                needs="blame",
                description=(
                    f"Runs that blamed each node over {w}, by cause: compute or data "
                    "(straggler), hang (the rank behind a stalled collective), abort (the "
                    "culprit of a hang the hang action aborted), down (a rank that died while "
                    "its run went on)."
                ),
            ),
            PanelSpec(
                "Runs seen and blamed per node",
                (
                    Target(f"topk(50, {f.runs_seen}{{{node}}})", "{{node}} seen"),
                    Target(f"topk(50, {f.runs_blamed}{{{node}}})", "{{node}} blamed"),
                ),
                kind="table",
                width=24,
                needs="fleet",
                description=(
                    f"Runs each node hosted over {w} and in how many it was blamed (a busy node "
                    "hosts many runs: that alone never makes it suspect)."
                ),
            ),
            PanelSpec(
                "Evidence: blamed runs (newest first)",
                (
                    Target(
                        f"sort_desc({f.blamed}{{{node}}}\nand on (node, run)\n{f.blamed_alone})",
                        "{{node}} {{run}} {{cause}}",
                    ),
                ),
                kind="table",
                unit="dateTimeAsIso",
                width=24,
                needs="blame",
                description=(
                    "Each run that blamed a node, the cause, and when it was last blamed "
                    "(counted only where at most half of the run's nodes were blamed). "
                    "`ddp-exporter nodes --prometheus URL` prints the same ranking."
                ),
            ),
        ),
        time_from=f"now-{w}",
    )


def _thresholds(spec: PanelSpec) -> dict[str, Any]:
    """Return a Grafana thresholds object (first step has value null)."""
    steps = spec.thresholds or (("green", None),)
    return {"mode": "absolute", "steps": [{"color": c, "value": v} for c, v in steps]}


def _panel(spec: PanelSpec, pos: g.GridPos, panel_id: int) -> g.Panel:
    """Return the grafanalib panel of ``spec`` at ``pos``."""
    if not spec.description or not spec.unit:
        # Grafana shows the description as the panel's (i) tooltip: the only help a reader gets.
        raise ValueError(f"panel {spec.title!r} needs a description and a unit")
    instant = spec.kind in ("bargauge", "table")
    targets = [
        g.Target(
            expr=t.expr,
            legendFormat=t.legend,
            refId=chr(ord("A") + i),
            datasource=DATASOURCE,
            instant=instant,
            format="table" if spec.kind == "table" else "time_series",
            intervalFactor=1,
        )
        for i, t in enumerate(spec.targets)
    ]
    defaults: dict[str, Any] = {
        "unit": spec.unit,
        "thresholds": _thresholds(spec),
        "color": {"mode": "thresholds" if spec.kind in ("stat", "bargauge") else "palette-classic"},
    }
    if spec.min is not None:
        defaults["min"] = spec.min
    if spec.max is not None:
        defaults["max"] = spec.max
    common: dict[str, Any] = {
        "title": spec.title,
        "description": spec.description or None,
        "dataSource": DATASOURCE,
        "targets": targets,
        "gridPos": pos,
        "id": panel_id,
        "maxDataPoints": None,
    }
    extra: dict[str, Any] = {"fieldConfig": {"defaults": defaults, "overrides": []}}
    if spec.kind in ("timeseries", "bars"):
        return g.TimeSeries(
            **common,
            unit=spec.unit,
            drawStyle="bars" if spec.kind == "bars" else "line",
            fillOpacity=80 if spec.kind == "bars" else 10,
            stacking={"mode": "normal", "group": "A"} if spec.kind == "bars" else {},
            legendDisplayMode="table",
            legendPlacement="right" if spec.width == 24 else "bottom",
            legendCalcs=["lastNotNull", "max"],
            tooltipMode="multi",
            tooltipSort="desc",
            extraJson=extra,
        )
    if spec.kind == "stat":
        return g.Stat(
            **common,
            format=spec.unit,
            reduceCalc="lastNotNull",
            graphMode="area",
            noValue="0",
            extraJson=extra,
        )
    if spec.kind == "bargauge":
        extra["options"] = {
            "displayMode": "gradient",
            "orientation": "horizontal",
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "showUnfilled": True,
            "minVizHeight": 10,
            "minVizWidth": 0,
            "valueMode": "color",
            "namePlacement": "auto",
            "sizing": "auto",
        }
        return g.BarGauge(
            **common,
            format=spec.unit,
            min=spec.min if spec.min is not None else 0,
            max=spec.max if spec.max is not None else 100,
            displayMode=g.GAUGE_DISPLAY_MODE_GRADIENT,
            thresholds=[],
            extraJson=extra,
        )
    if spec.kind == "table":
        extra["transformations"] = [
            {"id": "organize", "options": {"excludeByName": {"Time": True, "__name__": True}}}
        ]
        return g.Table(**common, unit=spec.unit, extraJson=extra)
    raise ValueError(f"unknown panel kind {spec.kind!r}")


def _layout(specs: tuple[PanelSpec, ...]) -> list[g.GridPos]:
    """Return grid positions filling rows of 24 columns left to right."""
    out, x, y, row_h = [], 0, 0, 0
    for spec in specs:
        if x + spec.width > 24:
            x, y, row_h = 0, y + row_h, 0
        out.append(g.GridPos(h=spec.height, w=spec.width, x=x, y=y))
        x += spec.width
        row_h = max(row_h, spec.height)
    return out


def _variables(cfg: MixinConfig) -> list[g.Template]:
    """Return the template variables: datasource, cluster (unless disabled), run, node, rank."""
    info = catalog.RANK_INFO.name
    extra = f"{cfg.selector}, " if cfg.selector else ""

    def query_var(name: str, label: str, query: str) -> g.Template:
        return g.Template(
            name=name,
            label=label,
            query=query,
            dataSource=DATASOURCE,
            includeAll=True,
            multi=True,
            allValue=".*",
            default="$__all",
            refresh=g.REFRESH_ON_TIME_RANGE_CHANGE,
        )

    datasource = g.Template(
        name="datasource",
        label="Data source",
        query="prometheus",
        type="datasource",
        default=cfg.datasource_uid,
    )
    label = cfg.cluster_label
    if label:  # every other variable lists the chosen clusters' values only
        extra += f'{label}=~"$cluster", '
    variables = [
        datasource,
        query_var("run", "Run", f"label_values({info}{{{extra.rstrip(', ')}}}, run)"),
        query_var("node", "Node", f'label_values({info}{{{extra}run=~"$run"}}, node)'),
        query_var(
            "rank", "Rank", f'label_values({info}{{{extra}run=~"$run", node=~"$node"}}, rank)'
        ),
    ]
    if label:
        # All matches an absent label too: one Prometheus per cluster has no cluster label.
        variables.insert(
            1, query_var("cluster", "Cluster", f"label_values({selector(cfg, info)}, {label})")
        )
    return variables


#: A selector's matchers that filter on a dashboard variable (``{run=~"$run", ...}``).
_FILTERED = re.compile(r"\{([^{}]*\$(?:run|rank|node)\b[^{}]*)\}")


def cluster_scoped(cfg: MixinConfig, expr: str) -> str:
    """Return ``expr`` filtered on the cluster variable and aggregated per cluster.

    Every selector that filters on a dashboard variable gets ``cluster=~"$cluster"`` too, and
    every ``by``/``on`` clause the cluster label (:func:`exporter.mixin.cluster.scoped`).
    """
    label = cfg.cluster_label
    if not label:
        return expr
    matcher = f'{label}=~"$cluster"'

    def add(match: re.Match[str]) -> str:
        inner = match.group(1)
        return match.group(0) if matcher in inner else f"{{{matcher}, {inner}}}"

    return scoped(cfg, _FILTERED.sub(add, expr))


def _cluster_panel(cfg: MixinConfig, spec: PanelSpec) -> PanelSpec:
    targets = tuple(dataclasses.replace(t, expr=cluster_scoped(cfg, t.expr)) for t in spec.targets)
    return dataclasses.replace(spec, targets=targets)


def build(spec: DashboardSpec, cfg: MixinConfig = DEFAULT) -> dict[str, Any]:
    """Return the Grafana JSON model of one dashboard spec."""
    spec = dataclasses.replace(spec, panels=tuple(_cluster_panel(cfg, p) for p in spec.panels))
    panels = [
        _panel(p, pos, i + 1) for i, (p, pos) in enumerate(zip(spec.panels, _layout(spec.panels)))
    ]
    dash = g.Dashboard(
        title=spec.title,
        uid=spec.uid,
        description=spec.description,
        tags=["ddp-exporter"],
        timezone="browser",
        refresh=cfg.dashboard_refresh,
        time=g.Time(spec.time_from, "now"),
        schemaVersion=SCHEMA_VERSION,
        sharedCrosshair=True,
        templating=g.Templating(list=_variables(cfg)),
        links=[
            g.DashboardLink(
                title="DDP dashboards",
                type="dashboards",
                tags=["ddp-exporter"],
                asDropdown=True,
                includeVars=True,
                keepTime=True,
            )
        ],
        panels=panels,
    ).auto_panel_ids()
    data = json_roundtrip(dash)
    data["id"] = None
    data["version"] = 1
    for var in data["templating"]["list"]:
        if var["includeAll"]:  # Grafana's shape of a multi-value "All" selection
            var["current"] = {"selected": True, "text": ["All"], "value": ["$__all"]}
    return modernize(data)


#: Keys grafanalib still writes for Grafana < 7 (Angular graph/table/singlestat era); Grafana
#: 11/12 ignore or migrate them, so the generated JSON leaves them out.
LEGACY_KEYS: dict[str, tuple[str, ...]] = {
    "dashboard": ("rows", "style", "hideControls", "sharedCrosshair", "__inputs", "gnetId"),
    "timepicker": ("time_options", "nowDelay"),
    "panel": ("span", "minSpan", "height", "error", "cacheTimeout", "editable"),
    # The old React table kept these at panel level; now they live in fieldConfig/options.
    "table": ("columns", "fontSize", "mappings", "color"),
    # Gauge options grafanalib puts on bar gauges; fieldOptions is the pre-7 bar gauge model.
    "bargauge": ("fieldOptions", "showThresholdLabels", "showThresholdMarkers"),
    "target": ("query", "target", "metric", "step"),
    "variable": ("useTags", "tagsQuery", "tagValuesQuery", "auto", "auto_min", "auto_count"),
}

#: The annotation every dashboard saved by Grafana carries (alerts and annotations overlay).
BUILTIN_ANNOTATION = {
    "builtIn": 1,
    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
    "enable": True,
    "hide": True,
    "iconColor": "rgba(0, 211, 255, 1)",
    "name": "Annotations & Alerts",
    "type": "dashboard",
}


def _drop_nulls(obj: Any) -> Any:
    """Return ``obj`` without ``null`` values, except a threshold step's base ``value: null``."""
    if isinstance(obj, dict):
        is_step = "color" in obj and "value" in obj
        return {
            k: _drop_nulls(v) for k, v in obj.items() if v is not None or (is_step and k == "value")
        }
    if isinstance(obj, list):
        return [_drop_nulls(v) for v in obj]
    return obj


def modernize(data: dict[str, Any]) -> dict[str, Any]:
    """Return grafanalib's dashboard JSON as Grafana 11/12 saves it: no legacy keys, no nulls."""
    for key in LEGACY_KEYS["dashboard"]:
        data.pop(key, None)
    for key in LEGACY_KEYS["timepicker"]:
        data.get("timepicker", {}).pop(key, None)
    # sharedCrosshair=True in the pre-schema model is graphTooltip 1 (shared crosshair) today.
    data["graphTooltip"] = 1
    data["annotations"] = {"list": [dict(BUILTIN_ANNOTATION)]}
    for panel in data["panels"]:
        for key in LEGACY_KEYS["panel"]:
            panel.pop(key, None)
        if panel["type"] == "table":
            for key in LEGACY_KEYS["table"]:
                panel.pop(key, None)
        if panel["type"] == "bargauge":
            for key in LEGACY_KEYS["bargauge"]:
                panel["options"].pop(key, None)
        if panel["type"] == "timeseries":
            panel["options"]["legend"]["showLegend"] = True
        for target in panel["targets"]:
            for key in LEGACY_KEYS["target"]:
                target.pop(key, None)
    for var in data["templating"]["list"]:
        for key in LEGACY_KEYS["variable"]:
            var.pop(key, None)
        var.get("current", {}).pop("tags", None)
    return _drop_nulls(data)


def json_roundtrip(obj: Any) -> dict[str, Any]:
    """Return grafanalib objects as plain JSON-compatible data."""
    import json

    from grafanalib._gen import DashboardEncoder

    return json.loads(json.dumps(obj, cls=DashboardEncoder))


def render_dashboards(cfg: MixinConfig = DEFAULT) -> dict[str, str]:
    """Return ``{file name: JSON text}`` of every dashboard."""
    return {f"{d.stem}.json": dump_json(build(d, cfg)) for d in dashboard_specs(cfg)}
