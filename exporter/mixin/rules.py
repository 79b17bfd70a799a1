"""Build the Prometheus recording and alerting rules from the metric catalog.

Recording rules follow ``level:metric:operations``: the level names the labels kept (``run_rank``
keeps run and rank), the metric is a catalog name, the operations say what was done, newest
first, with the rate window in the name (``mean_rate1m``).

Two design truths shape the alerts. A straggler shows the SHORTEST collective latency because
its peers wait for it inside the allreduce, so stragglers are blamed by compute and data time per
step, never by collective latency. A hung rank is the one whose collective sequence number stops
advancing, so timeouts name the ranks whose ``last_enqueued_seq`` is behind the run's maximum.

A third: a job has edges. A rank inside a declared section within its deadline is not hung, nor
are the ranks it holds up; a rank that ended cleanly (``ddp_finished_timestamp_seconds``) is not
down, and a run whose ranks all vanish together is one fact (DDPJobKilled), not one page per rank.
Conditions of the whole run (stalled, killed, slower, a symmetric hang, stuck in init) are one
alert per run; conditions of one rank name the rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import catalog
from .alert import Alert, selector
from .cluster import scoped
from .config import DEFAULT, MixinConfig
from .fleet import fleet_group, shard_down_alert, suspect_node_alert
from .misconfigured import misconfigured_alert
from .render import dump_yaml

__all__ = [
    "ALERT_NAMES",
    "FLEET_ALERTS",
    "MONITORING_ALERTS",
    "RUN_ALERTS",
    "Alert",
    "Recorded",
    "alerts",
    "every_alert",
    "hang_location",
    "restart_history",
    "RECORDING_GROUPS",
    "recorded",
    "recording_groups",
    "render_rules",
    "rule_groups",
    "selector",
]

#: Every alert the mixin defines, in the order of the runbook.
ALERT_NAMES: tuple[str, ...] = (
    "DDPRankDown",
    "DDPJobKilled",
    "DDPTrainingStalled",
    "DDPCollectiveTimeoutImminent",
    "DDPCollectiveStalled",
    "DDPHangAborted",
    "DDPRestartLoop",
    "DDPRankStraggler",
    "DDPInputBound",
    "DDPThroughputDrop",
    "DDPGPUMemoryNearLimit",
    "DDPInitStuck",
    "DDPVersionSkew",
    "DDPSectionOverdue",
    "DDPJobWillMissDeadline",
    "DDPExporterMisconfigured",
    "DDPSuspectNode",
    "DDPShardDown",
)

#: Alerts about a node across runs (exporter.mixin.fleet): a ``node`` label, no run, no rank.
FLEET_ALERTS: tuple[str, ...] = ("DDPSuspectNode",)

#: Alerts about the monitoring itself (a Prometheus shard): an ``instance`` label, no run.
MONITORING_ALERTS: tuple[str, ...] = ("DDPShardDown",)

#: Alerts that are one per run (a condition of the whole run: no ``rank`` label). The collective
#: alerts are per rank for the ranks behind and per (run, pg) when every rank waits.
RUN_ALERTS: tuple[str, ...] = (
    "DDPJobKilled",
    "DDPHangAborted",
    "DDPRestartLoop",
    "DDPTrainingStalled",
    "DDPThroughputDrop",
    "DDPJobWillMissDeadline",
    "DDPExporterMisconfigured",
)

#: Step phases that a straggler is blamed by (never comm_wait, never collective latency).
BLAME_PHASES: tuple[str, ...] = ("compute", "data")


def _base(metric: catalog.MetricDef) -> str:
    """Return the metric part of a recording-rule name (counters lose ``_total``)."""
    return metric.family if metric.type == "counter" else metric.name


@dataclass(frozen=True)
class Recorded:
    """Name the recorded series of one configuration (windows are part of the names)."""

    steps_rate: str
    steps_rate_run: str
    step_mean: str
    step_p90: str
    phase_mean: str
    phase_median: str
    phase_ratio: str
    phase_share: str
    straggler_score: str
    relative_speed: str
    coll_mean_rank: str
    coll_mean_run: str
    coll_p90_rank: str
    coll_bytes_rate: str
    seq_behind: str
    inflight_max_run: str
    inflight_ratio_rank: str
    inflight_ratio_run: str
    heartbeat_age: str
    peer_heartbeat_age: str
    store_rtt_rank: str
    store_rtt_run: str
    store_rtt_ratio: str
    gpu_reserved_ratio: str
    errors_rate: str
    in_section: str
    version_sets: str
    version: str
    version_ranks: str
    projected_finish_rank: str
    projected_finish_run: str


def recorded(cfg: MixinConfig = DEFAULT) -> Recorded:
    """Return the recording-rule names for ``cfg``."""
    w, lat = cfg.rate_window, cfg.latency_window
    phase = catalog.STEP_PHASE.name
    coll = catalog.COLLECTIVE_DURATION.name
    inflight = catalog.INFLIGHT_AGE.name
    seq = catalog.LAST_ENQUEUED_SEQ.name
    return Recorded(
        steps_rate=f"run_rank:{_base(catalog.STEPS)}:rate{w}",
        steps_rate_run=f"run:{_base(catalog.STEPS)}:max_rate{w}",
        step_mean=f"run_rank:{catalog.STEP_DURATION.name}:mean_rate{w}",
        step_p90=f"run_rank:{catalog.STEP_DURATION.name}:p90_rate{w}",
        phase_mean=f"run_rank:{phase}:mean_rate{w}",
        phase_median=f"run:{phase}:median_mean_rate{w}",
        phase_ratio=f"run_rank:{phase}:ratio_median_mean_rate{w}",
        phase_share=f"run_rank:{phase}:share_mean_rate{w}",
        straggler_score=f"run_rank:{phase}:straggler_score_rate{w}",
        relative_speed=f"run_rank:{phase}:relative_speed_rate{w}",
        coll_mean_rank=f"run_rank_pg:{coll}:mean_rate{lat}",
        coll_mean_run=f"run_pg:{coll}:mean_rate{lat}",
        coll_p90_rank=f"run_rank_pg:{coll}:p90_rate{w}",
        coll_bytes_rate=f"run_rank_pg:{_base(catalog.COLLECTIVE_BYTES)}:rate{w}",
        seq_behind=f"run_rank_pg:{seq}:behind_max_last{cfg.baseline_window}",
        inflight_max_run=f"run_pg:{inflight}:max",
        inflight_ratio_rank=f"run_rank_pg:{inflight}:ratio_timeout",
        inflight_ratio_run=f"run_pg:{inflight}:ratio_timeout",
        heartbeat_age=f"run_rank:{catalog.HEARTBEAT.name}:age",
        peer_heartbeat_age=f"run_rank:{catalog.PEER_HEARTBEAT_AGE.name}:max",
        store_rtt_rank=f"run_rank:{catalog.STORE_ROUND_TRIP.name}:median_over_time{w}",
        store_rtt_run=f"run:{catalog.STORE_ROUND_TRIP.name}:median_median_over_time{w}",
        store_rtt_ratio=f"run_rank:{catalog.STORE_ROUND_TRIP.name}:ratio_median_over_time{w}",
        gpu_reserved_ratio=f"run_rank:{catalog.GPU_MEM_RESERVED.name}:ratio_total",
        errors_rate=f"run_rank:{_base(catalog.EXPORTER_ERRORS)}:rate{w}",
        in_section=f"run_rank:{catalog.SECTION_STARTED.name}:within_deadline",
        version_sets=f"run:{catalog.RANK_INFO.name}:version_sets",
        version=f"run_rank_field:{catalog.RANK_INFO.name}:version",
        version_ranks=f"run_field_version:{catalog.RANK_INFO.name}:count",
        projected_finish_rank=(
            f"run_rank:{catalog.JOB_TOTAL_STEPS.name}:projected_finish_timestamp_rate{cfg.eta_window}"
        ),
        projected_finish_run=(
            f"run:{catalog.JOB_TOTAL_STEPS.name}:projected_finish_timestamp_rate{cfg.eta_window}"
        ),
    )


def _mean_rate(cfg: MixinConfig, metric: catalog.MetricDef, by: str, window: str) -> str:
    """Return the mean of a histogram or summary per event over ``window``, kept ``by`` labels."""
    s = selector(cfg, metric.name + "_sum")
    c = selector(cfg, metric.name + "_count")
    return f"sum by ({by}) (rate({s}[{window}]))\n/\nsum by ({by}) (rate({c}[{window}]))"


def _p90(cfg: MixinConfig, metric: catalog.MetricDef, by: str, window: str) -> str:
    """Return the 0.9 quantile of a histogram over ``window``, kept ``by`` labels."""
    b = selector(cfg, metric.name + "_bucket")
    return f"histogram_quantile(0.9, sum by ({by}, le) (rate({b}[{window}])))"


#: Recording groups, each small enough to evaluate well within its interval at 4096 ranks
#: (benchmarks/scale.py). Prometheus runs groups concurrently, rules within one in order, so
#: a rule that reads a recorded series sits in the same group after it.
RECORDING_GROUPS = ("step", "collective", "health", "job")


def recording_groups(cfg: MixinConfig = DEFAULT) -> dict[str, list[dict[str, str]]]:
    """Return the recording rules by group name, dependencies before dependants in each."""
    r = recorded(cfg)
    w = cfg.rate_window
    blame = "|".join(BLAME_PHASES)

    def sel(metric: catalog.MetricDef) -> str:
        """Return the configured selector of ``metric``."""
        return selector(cfg, metric.name)

    work = f'sum by (run, rank) ({r.phase_mean}{{phase=~"{blame}"}})'
    last_seq = f"last_over_time({sel(catalog.LAST_ENQUEUED_SEQ)}[{cfg.baseline_window}])"
    step = [
        {"record": r.steps_rate, "expr": f"sum by (run, rank) (rate({sel(catalog.STEPS)}[{w}]))"},
        # DDP ranks step in lockstep: the run's rate is any rank's; max keeps a rank that left.
        {"record": r.steps_rate_run, "expr": f"max by (run) ({r.steps_rate})"},
        {"record": r.step_mean, "expr": _mean_rate(cfg, catalog.STEP_DURATION, "run, rank", w)},
        {"record": r.step_p90, "expr": _p90(cfg, catalog.STEP_DURATION, "run, rank", w)},
        {
            "record": r.phase_mean,
            "expr": _mean_rate(cfg, catalog.STEP_PHASE, "run, rank, phase", w),
        },
        {"record": r.phase_median, "expr": f"quantile by (run, phase) (0.5, {r.phase_mean})"},
        {
            "record": r.phase_ratio,
            "expr": f"{r.phase_mean}\n/ on (run, phase) group_left\n{r.phase_median}",
        },
        {
            "record": r.phase_share,
            "expr": (
                f"{r.phase_mean}\n/ on (run, rank) group_left\nsum by (run, rank) ({r.phase_mean})"
            ),
        },
        {
            "record": r.straggler_score,
            "expr": f"{work}\n/ on (run) group_left\nquantile by (run) (0.5, {work})",
        },
        # NVRx's anchor: the run's median over the rank's compute+data, capped at 1: 1 = as
        # fast as the typical rank, 0.5 = half its speed. Comparable across runs of any speed
        # and size; bottomk of it ranks a 4096-rank run's slowest ranks at a glance.
        {
            "record": r.relative_speed,
            "expr": f"clamp_max(1 / ({r.straggler_score} > 0), 1)",
        },
    ]
    collective = [
        {
            "record": r.coll_mean_rank,
            "expr": _mean_rate(
                cfg, catalog.COLLECTIVE_DURATION, "run, rank, op, pg", cfg.latency_window
            ),
        },
        {
            "record": r.coll_mean_run,
            "expr": _mean_rate(cfg, catalog.COLLECTIVE_DURATION, "run, pg", cfg.latency_window),
        },
        {
            "record": r.coll_p90_rank,
            "expr": _p90(cfg, catalog.COLLECTIVE_DURATION, "run, rank, op, pg", w),
        },
        {
            "record": r.coll_bytes_rate,
            "expr": f"sum by (run, rank, op, pg) (rate({sel(catalog.COLLECTIVE_BYTES)}[{w}]))",
        },
        {
            # last_over_time: a frozen or dead rank's series go stale, yet its last sequence
            # number is exactly what names it as the rank that never entered the collective.
            "record": r.seq_behind,
            "expr": (
                f"max by (run, pg) ({last_seq})\n- on (run, pg) group_right\n"
                f"max by (run, rank, pg) ({last_seq})"
            ),
        },
        {"record": r.inflight_max_run, "expr": f"max by (run, pg) ({sel(catalog.INFLIGHT_AGE)})"},
        {
            "record": r.inflight_ratio_rank,
            "expr": (
                f"max by (run, rank, pg) ({sel(catalog.INFLIGHT_AGE)})\n/ on (run, rank, pg)\n"
                f"(max by (run, rank, pg) ({sel(catalog.COLLECTIVE_TIMEOUT)}) > 0)"
            ),
        },
        {"record": r.inflight_ratio_run, "expr": f"max by (run, pg) ({r.inflight_ratio_rank})"},
    ]
    health = [
        {
            "record": r.heartbeat_age,
            "expr": f"time() - max by (run, rank) ({sel(catalog.HEARTBEAT)})",
        },
        {
            "record": r.peer_heartbeat_age,
            "expr": (
                "max by (run, rank) (\n  label_replace("
                f'{sel(catalog.PEER_HEARTBEAT_AGE)}, "rank", "$1", "peer_rank", "(.*)")\n)'
            ),
        },
        {
            # The median over time drops the odd slow beat; a queue on a slow link is steady.
            "record": r.store_rtt_rank,
            "expr": (
                f"max by (run, rank) (quantile_over_time(0.5, {sel(catalog.STORE_ROUND_TRIP)}[{w}]))"
            ),
        },
        {"record": r.store_rtt_run, "expr": f"quantile by (run) (0.5, {r.store_rtt_rank})"},
        {
            "record": r.store_rtt_ratio,
            "expr": f"{r.store_rtt_rank}\n/ on (run) group_left ()\n({r.store_rtt_run} > 0)",
        },
        {
            "record": r.gpu_reserved_ratio,
            "expr": (
                f"max by (run, rank) ({sel(catalog.GPU_MEM_RESERVED)})\n/ on (run, rank)\n"
                f"(max by (run, rank) ({sel(catalog.GPU_MEM_TOTAL)}) > 0)"
            ),
        },
        {
            # 1 for each rank running a declared section within its deadline (its checkpoint
            # or evaluation excuses it, and the ranks it holds up, from the hang alerts).
            "record": r.in_section,
            "expr": (
                "max by (run, rank) (\n"
                f"  max by (run, rank, section) (time() - {sel(catalog.SECTION_STARTED)})\n"
                "  <= on (run, rank, section)\n"
                f"  max by (run, rank, section) ({sel(catalog.SECTION_DEADLINE)})\n"
                ") * 0 + 1"
            ),
        },
        {
            # Only places with errors: zeros for every rank and place would be most series.
            "record": r.errors_rate,
            "expr": f"sum by (run, rank, where) (rate({sel(catalog.EXPORTER_ERRORS)}[{w}])) > 0",
        },
    ]
    # Version skew and the projected finish: their own group, so that it runs beside health
    # (the per-field version records alone are 4 series per rank).
    job = _outside_loop_records(cfg, r)
    return {"step": step, "collective": collective, "health": health, "job": job}


def _outside_loop_records(cfg: MixinConfig, r: Recorded) -> list[dict[str, str]]:
    """Return the records of version skew and of the job's projected finish (issue 12)."""
    info = selector(cfg, catalog.RANK_INFO.name)
    fields = ", ".join(catalog.VERSION_LABELS)
    skewed = f"({info} and on (run) ({r.version_sets} > 1))"
    per_field = [
        f"max by (run, rank, field, version) (\n  label_replace(\n    label_replace({skewed}, "
        f'"version", "$1", "{f}", "(.*)"),\n    "field", "{f}", "", ""\n  )\n)'
        for f in catalog.VERSION_LABELS
    ]
    steps = selector(cfg, catalog.STEPS.name)
    total = selector(cfg, catalog.JOB_TOTAL_STEPS.name)
    return [
        # Distinct version combinations per run: 1 on a healthy run.
        {
            "record": r.version_sets,
            "expr": f"count by (run) (count by (run, {fields}) ({info}))",
        },
        # Only for runs with more than one combination (none on healthy runs, so no series per
        # rank): one series per rank and version field, the field's value in `version`, so one
        # rule compares every field and the alert names the field that differs.
        {"record": r.version, "expr": "\nor\n".join(per_field)},
        {"record": r.version_ranks, "expr": f"count by (run, field, version) ({r.version})"},
        {
            # Steps left over the recent step rate; a finished rank projects "now", a stopped
            # one (rate 0) projects nothing: DDPTrainingStalled covers it.
            "record": r.projected_finish_rank,
            "expr": (
                "time()\n+\nclamp_min(\n"
                f"  max by (run, rank) ({total})\n  - on (run, rank)\n"
                f"  sum by (run, rank) ({steps}),\n  0\n)\n/ on (run, rank)\n"
                f"(sum by (run, rank) (rate({steps}[{cfg.eta_window}])) > 0)"
            ),
        },
        {"record": r.projected_finish_run, "expr": f"max by (run) ({r.projected_finish_rank})"},
    ]


def _role(expr: str, role: str) -> str:
    """Return ``expr`` with a constant ``role`` label (behind = never entered, waiting = stuck)."""
    return f'label_replace(\n{expr},\n"role", "{role}", "run", ".*")'


def _every_rank_in_section(cfg: MixinConfig, r: Recorded) -> str:
    """Return a (run) vector of the runs whose every reporting rank is in a declared section."""
    info = selector(cfg, catalog.RANK_INFO.name)
    return (
        f"count by (run) ({r.in_section})\n>= on (run)\n"
        f"count by (run) (max by (run, rank) ({info}))"
    )


def _finished_ranks(cfg: MixinConfig) -> str:
    """Return a (run, rank) vector of the ranks that ended cleanly within the baseline window."""
    return (
        f"max by (run, rank) (last_over_time({selector(cfg, catalog.FINISHED.name)}"
        f"[{cfg.baseline_window}]))"
    )


def _aborted_runs(cfg: MixinConfig) -> str:
    """Return a (run, culprit_rank, node) vector of the runs the hang action ended recently."""
    metric = selector(cfg, catalog.HANG_ABORT.name)
    return f"max by (run, culprit_rank, node) (last_over_time({metric}[{cfg.hang_abort_window}]))"


def _looping_runs(cfg: MixinConfig) -> str:
    """Return a (run) vector of the runs whose hang action stopped: aborts without progress."""
    streak = selector(cfg, catalog.HANG_ABORT_STREAK.name)
    limit = selector(cfg, catalog.HANG_ABORT_LIMIT.name)
    w = cfg.restart_loop_window
    return (
        f"max by (run) (last_over_time({streak}[{w}]))\n>= on (run)\n"
        f"(max by (run) (last_over_time({limit}[{w}])) > 0)"
    )


def restart_history(cfg: MixinConfig = DEFAULT) -> str:
    """Return a description suffix listing each aborted attempt's culprit rank and node.

    A template ``query`` reads ``ddp_hang_aborted_attempt_step`` of the alert's run (published
    by the monitoring rank from the run's ledger) over the restart-loop window, in attempt order
    (as text: attempt 10 sorts before 2).
    """
    matchers = [m for m in (cfg.selector.replace("%", "%%"), "run=%q") if m]
    metric = f"{catalog.HANG_ABORTED_ATTEMPT.name}{{{', '.join(matchers)}}}"
    query = (
        f"max by (attempt, culprit_rank, node) (last_over_time({metric}"
        f"[{cfg.restart_loop_window}]))"
    )
    return (
        f"{{{{ with printf `{query}` $labels.run | query | sortByLabel `attempt` }}}}"
        " Aborted attempts:"
        "{{ range . }} attempt {{ .Labels.attempt }}: "
        "{{ if .Labels.culprit_rank }}rank {{ .Labels.culprit_rank }} on node "
        "{{ .Labels.node }}{{ else }}every rank stuck{{ end }}, furthest step "
        "{{ .Value }};{{ end }}{{ end }}"
    )


def _name_collective_ranks(
    cfg: MixinConfig, r: Recorded, run_pg_condition: str, rank_condition: str
) -> str:
    """Return an expr naming the ranks behind in a stuck (run, pg), else the stuck (run, pg).

    ``run_pg_condition`` is a (run, pg) vector whose value is carried over to each rank behind
    (role=behind: a condition of that rank). A rank inside a declared section within its
    deadline, or one that ended cleanly, is not behind: it is saving, evaluating or gone, and
    the ranks it holds up are not stuck either. With nobody behind, ``rank_condition`` (a
    (run, rank, pg) vector) says whether ranks are stuck inside the collective: one alert per
    (run, pg) (role=waiting: a condition of the run), unless every rank is in a section.
    """
    # Behind: a lower sequence number, and not itself stuck inside a collective of any group
    # (one that is waits, as the hang definition says: its reading is older, or, in a 2-D
    # mesh, it is held up in another group: the replicate group waits for a rank that waits
    # in its shard group for the real culprit).
    late = f"({r.seq_behind} > 0)\n  unless on (run, rank)\n  ({rank_condition})"
    excused = f"{r.in_section}\nor on (run, rank)\n{_finished_ranks(cfg)}"
    behind = (
        f"(\n  {late}\n  unless on (run, rank)\n  ({excused})\n) * 0\n"
        f"+ on (run, pg) group_left ()\n({run_pg_condition})"
    )
    waiting = (
        f"max by (run, pg) ({rank_condition})\nunless on (run, pg)\n({late})\n"
        f"unless on (run)\n({_every_rank_in_section(cfg, r)})"
    )
    return f"{_role(behind, 'behind')}\nor\n{_role(waiting, 'waiting')}"


_WHO_COLLECTIVE = (
    '{{ if eq $labels.role "behind" }}Rank {{ $labels.rank }} is behind: its last enqueued '
    "sequence number is below the run's maximum, so it never entered the collective (the hung "
    "rank; a rank in a declared section within its deadline is never named).{{ else }}No rank "
    "is visibly behind: the ranks are stuck inside the collective (waiting), the condition of "
    "the whole process group.{{ end }}"
)


def hang_location(cfg: MixinConfig = DEFAULT, rank_label: str = "rank", window: str = "") -> str:
    """Return a description suffix saying where the alert's rank is stuck, when it is known.

    The culprit of a hang episode publishes ``ddp_hang_location_info`` (exporter.hangs.watcher);
    a template ``query`` looks it up for the alert's run and the rank in label ``rank_label``
    (over ``window`` when the rank is gone) and adds nothing otherwise.
    """
    # The selector goes through printf: a literal % in it must be doubled.
    matchers = [m for m in (cfg.selector.replace("%", "%%"), "run=%q", "rank=%q") if m]
    metric = f"{catalog.HANG_LOCATION.name}{{{', '.join(matchers)}}}"
    if window:
        metric = f"last_over_time({metric}[{window}])"
    return (
        f"{{{{ with printf `{metric}` $labels.run $labels.{rank_label} | query }}}}"
        "{{ with first . }} Its hang dump says it is at {{ .Labels.file }}:{{ .Labels.line }} "
        "in {{ .Labels.function }} (ddp-exporter hangs DUMP_DIR prints every rank's stack)."
        "{{ end }}{{ end }}"
    )


def alerts(cfg: MixinConfig = DEFAULT) -> list[Alert]:
    """Return every alert of ``cfg``, grouped by alert name in :data:`ALERT_NAMES` order."""
    r = recorded(cfg)
    up = selector(cfg, "up", f'job="{cfg.job}"', 'rank!=""')
    inflight = selector(cfg, catalog.INFLIGHT_AGE.name)
    runs_total = selector(cfg, catalog.SECTION_RUNS.name)
    blame = "|".join(BLAME_PHASES)
    stall_bound = (
        f"clamp_min(\n  {cfg.stall_latency_factor:g} * (max by (run, pg) "
        f"(max_over_time({r.coll_mean_run}[{cfg.baseline_window}])) > 0),\n"
        f"  {cfg.stall_min_seconds:g}\n)\nor on (run, pg)\n"
        f"(0 * {r.inflight_max_run} + {cfg.stall_min_seconds:g})"
    )
    where = "rank {{ $labels.rank }} of run {{ $labels.run }}"
    stale = f"{cfg.heartbeat_stale_seconds:g}"
    info = selector(cfg, catalog.RANK_INFO.name)
    out = [
        Alert(
            "DDPRankDown",
            "critical",
            (
                f"(\n  max by (run, rank) ({up} == 0)\n  or\n"
                f"  max by (run, rank) ({r.peer_heartbeat_age} > {stale})\n  or\n"
                f"  max by (run, rank) (last_over_time({info}[{cfg.baseline_window}]))\n"
                f"  unless on (run, rank) max by (run, rank) ({info})\n)\n"
                f"unless on (run, rank)\n{_finished_ranks(cfg)}\n"
                f"and on (run)\nmax by (run) ({info})"
            ),
            cfg.rank_down_for,
            "A training rank is down while the rest of its run goes on.",
            (
                f"{where.capitalize()} is down: its scrape target is down, the monitoring rank "
                "has not "
                f"seen its heartbeat for over {cfg.heartbeat_stale_seconds:g}s, or its series "
                "disappeared, while the rest of the run still reports and the rank did not end "
                "cleanly."
            ),
            "The rank's process died, its host is gone, or it stopped heartbeating (hard hang). "
            "DDP cannot make progress without it; the other ranks will block in their next "
            "collective until the collective timeout kills the job. A rank that ended cleanly "
            "(`ddp_finished_timestamp_seconds` in its final scrapes) is never down, and when "
            "every rank of the run is gone at once the run is killed (DDPJobKilled), not one "
            "page per rank.",
            "Liveness dashboard: `up` per rank, heartbeat age, and peer heartbeat ages published "
            "by rank 0 (they keep counting for a rank whose endpoint is gone).",
            "Check the rank's process and host (OOM killer, node failure, `dmesg`, the launcher "
            "log). If the process is alive but stuck, take a stack dump (`py-spy dump`). Restart "
            "the job from the last checkpoint once the node is healthy.",
        ),
        Alert(
            "DDPJobKilled",
            "critical",
            (
                f"count by (run) (\n"
                f"  max by (run, rank) (last_over_time({info}[{cfg.baseline_window}]))\n"
                f"  unless on (run, rank) max by (run, rank) ({info})\n)\n"
                f"unless on (run)\nmax by (run) ({info})\n"
                f"unless on (run)\nmax by (run) ({_finished_ranks(cfg)})\n"
                f"unless on (run)\n{_aborted_runs(cfg)}\n"
                f"unless on (run)\n{_looping_runs(cfg)}"
            ),
            cfg.rank_down_for,
            "Every rank of a run stopped reporting without a clean end: the job was killed.",
            (
                "Run {{ $labels.run }} is gone: its {{ $value }} rank(s) stopped reporting "
                "within the last "
                f"{cfg.baseline_window} and none ended cleanly (a finished job publishes "
                "ddp_finished_timestamp_seconds before it exits)."
            ),
            "The whole job disappeared at once without finishing: the scheduler killed it (time "
            "limit, preemption, a cancelled job), a node's failure took the launcher with it, "
            "the job crashed on every rank, or Prometheus lost the network to all of its "
            "nodes. A run that the hang action ended (DDPHangAborted) is given "
            f"{cfg.hang_abort_window} to come back (the launcher's restart) before it counts as "
            "killed, and a run whose hang action stopped after aborts without progress "
            "(DDPRestartLoop, which pages for it) is not killed but given up. One alert for the "
            "run, not one per rank; it resolves by itself "
            f"{cfg.baseline_window} after the last scrape, or when the run reports again (a "
            "restarted attempt).",
            "Liveness dashboard: every rank of the run went down together; the scheduler's "
            "record of the job (`sacct -j`, `kubectl describe`) says why.",
            "Read the scheduler's reason and the launcher's log. If the job hit its time limit, "
            "see DDPJobWillMissDeadline; resubmit from the last checkpoint.",
        ),
        Alert(
            "DDPTrainingStalled",
            "critical",
            (
                f"count by (run) ({r.steps_rate} == 0)\nunless on (run)\n"
                f"max by (run) ({r.in_section})"
            ),
            cfg.training_stalled_for,
            "Training made no step progress although the run's ranks are still reporting.",
            (
                "{{ $value }} rank(s) of run {{ $labels.run }} completed no training step in the "
                f"last {cfg.rate_window} for {cfg.training_stalled_for}, while their exporters "
                "are still scraped and no rank runs a declared section within its deadline."
            ),
            "No rank advances: a hung collective, a dead peer, a stuck data loader, a "
            "checkpoint or evaluation that was not declared (`exporter.deadline`). One alert for "
            "the run; the cause is usually named by DDPCollectiveTimeoutImminent, "
            "DDPCollectiveStalled or DDPRankDown for the same run. While any rank of the run is "
            "inside a declared section within its deadline the run is excused; past the "
            "deadline DDPSectionOverdue names the section.",
            "Overview dashboard: steps/s per rank is flat at zero. Collectives dashboard: "
            "in-flight age and sequence-number lag show whether a collective is stuck and which "
            "rank is behind.",
            "Look for a concurrent DDPCollectiveTimeoutImminent / DDPRankDown naming a rank and "
            "follow that runbook. Otherwise take stack dumps of all ranks (`py-spy dump`). Wrap "
            "checkpoints and evaluation in `exporter.deadline(...)` so that they are not taken "
            "for a stall.",
        ),
    ]
    for severity, ratio in (
        ("warning", cfg.timeout_warning_ratio),
        ("critical", cfg.timeout_critical_ratio),
    ):
        out.append(
            Alert(
                "DDPCollectiveTimeoutImminent",
                severity,
                _name_collective_ranks(
                    cfg,
                    r,
                    f"{r.inflight_ratio_run} > {ratio:g}",
                    f"{r.inflight_ratio_rank} > {ratio:g}",
                ),
                cfg.timeout_for,
                f"A collective has used over {ratio:.0%} of its timeout; the job will be killed "
                "soon.",
                (
                    "A collective of process group {{ $labels.pg }} in run {{ $labels.run }} "
                    "has been in flight for {{ $value | humanizePercentage }} of its timeout. "
                    + _WHO_COLLECTIVE
                )
                + hang_location(cfg),
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
        )
    out += [
        Alert(
            "DDPCollectiveStalled",
            "warning",
            _name_collective_ranks(
                cfg,
                r,
                f"{r.inflight_max_run}\n> on (run, pg)\n({stall_bound})",
                f"max by (run, rank, pg) ({inflight})\n> on (run, pg) group_left ()\n"
                f"({stall_bound})",
            ),
            cfg.stalled_for,
            "A collective has been in flight far longer than this run's normal collective latency.",
            (
                "A collective of process group {{ $labels.pg }} in run {{ $labels.run }} has been "
                "in flight for {{ $value | humanizeDuration }}, over "
                f"{cfg.stall_latency_factor:g}x the run's normal latency (and at least "
                f"{cfg.stall_min_seconds:g}s). " + _WHO_COLLECTIVE
            )
            + hang_location(cfg),
            "Collective latency normally stays near its recent mean; an in-flight age many times "
            "that mean means a rank has not joined (role=behind names it) or the network stalled.",
            "Collectives dashboard: in-flight age against the mean latency and the timeout; "
            "sequence-number lag per rank.",
            "Treat as an early DDPCollectiveTimeoutImminent: read the hang verdict "
            "(`ddp-exporter hangs DUMP_DIR`; the description names the culprit's file:line) and "
            "inspect the rank labelled behind (data loader, host, GPU). With role=waiting on all ranks, check the "
            "network fabric (NCCL_DEBUG=INFO logs, link errors).",
        ),
        Alert(
            "DDPHangAborted",
            "warning",
            _aborted_runs(cfg),
            "0s",
            "The hang action ended every rank of a hung run for its launcher to restart it.",
            (
                "Run {{ $labels.run }} was aborted on a hang: "
                "{{ if $labels.culprit_rank }}rank {{ $labels.culprit_rank }}"
                "{{ if $labels.node }} on node {{ $labels.node }}{{ end }} never entered the "
                "collective the others waited in."
                "{{ else }}every rank was stuck inside the same collective (no rank behind)."
                "{{ end }}"
                + hang_location(cfg, "culprit_rank", cfg.hang_abort_window)
                + " Every rank exited (ddp-exporter's exit code, 75 by default) for the launcher "
                "to restart the job from its last checkpoint."
            ),
            'With `instrument(on_hang="abort")` (`DDP_EXPORTER_ON_HANG=abort`), once a hang\'s '
            "dumps are on disk and the hang has lasted `DDP_EXPORTER_ABORT_AFTER_S` (20 s with "
            "complete evidence, 30 s otherwise; at least twice the threshold that declared it, at "
            "most half the process group's timeout), every rank of the run publishes "
            "`ddp_hang_abort_timestamp_seconds{culprit_rank, node}` and "
            "exits, instead of idling until the collective timeout (10 to 30 minutes). The "
            "launcher (torchrun `--max-restarts`, Slurm requeue, Kubernetes) restarts the job "
            "from its last checkpoint; the alert fires for "
            f"{cfg.hang_abort_window} after the abort. A job that does not come back within "
            "that time raises DDPJobKilled.",
            "Collectives dashboard: the in-flight age that grew until the abort; Overview: the "
            "restarted attempt's steps (`ddp_rank_info{attempt}` one higher). The episode folder "
            "(`ddp-exporter hangs DUMP_DIR`) holds every rank's stack and the verdict, which "
            "records the action.",
            "Read the verdict: the culprit's file:line says where it was stuck (data loader, "
            "file system, a rank-dependent branch, a collective the others never call). If the "
            "same rank or node is the culprit again after the restart, drain that node "
            "(`<dump_dir>/<run>-abort.txt` names it for a requeue script). If the job hangs "
            "again at the same place, it is a bug in the training code: the restart cannot fix "
            "it, and after `DDP_EXPORTER_ABORT_LIMIT` aborts without progress DDPRestartLoop "
            "says so.",
        ),
        Alert(
            "DDPRestartLoop",
            "critical",
            _looping_runs(cfg),
            "0s",
            "Restarting a hung run did not help: the hang action stopped.",
            (
                "Run {{ $labels.run }} was aborted on a hang {{ $value }} times in a row without "
                "getting past the furthest step of its earlier attempts. The last abort exited "
                "with the give-up code (69 by default, do not requeue) and the hang action no "
                "longer ends the run: a next hang only alerts and dumps." + restart_history(cfg)
            ),
            'Each abort of `instrument(on_hang="abort")` restarts the job from its last '
            "checkpoint. When the culprit stays broken (the same node's file system or network, a "
            "data shard that never arrives, a bug at one step), every attempt hangs again at the "
            "same place. After `DDP_EXPORTER_ABORT_LIMIT` (3) aborts in a row whose attempts did "
            "not get `DDP_EXPORTER_ABORT_PROGRESS_STEPS` (50) steps past the furthest earlier "
            "one, the last abort exits with `DDP_EXPORTER_GIVE_UP_EXIT_CODE` and the action "
            "stops, so that a requeue script and the launcher stop too, instead of paying the "
            "detection and the restart forever. Fires while the run's monitoring rank reports "
            f"the streak, and for {cfg.restart_loop_window} after its last report.",
            "Collectives dashboard: the Restarts and Aborted attempts panels (each aborted attempt's furthest step, culprit rank "
            "and node); `<dump_dir>/<run>-restarts.json` and `-abort.txt` next to the dumps; "
            "`ddp-exporter hangs DUMP_DIR` for each attempt's verdict.",
            "If the same node is the culprit in every attempt, drain it (Slurm `scontrol update "
            "NodeName=... State=DRAIN`, or requeue with `--exclude`; Kubernetes `kubectl cordon`) "
            "and resubmit. If the culprits differ but the file:line is the same, it is a bug or "
            "bad data at that step: fix it before resubmitting; a restart cannot.",
        ),
        Alert(
            "DDPRankStraggler",
            "warning",
            (
                "max by (run, rank, cause) (\n  label_replace(\n"
                f'    ({r.phase_ratio}{{phase=~"{blame}"}} > {cfg.straggler_ratio:g})\n'
                "    and on (run, rank, phase)\n"
                f"    ({r.phase_mean} - on (run, phase) group_left {r.phase_median}"
                f" > {cfg.straggler_min_excess_seconds:g}),\n"
                '    "cause", "$1", "phase", "(.*)"\n  )\n)\n'
                # A slow link slows every rank alike: no rank's compute stands out, but the
                # store round trips of the ranks behind that link do (exporter.sources.heartbeat).
                "or\nmax by (run, rank, cause) (\n  label_replace(\n"
                f"    ({r.store_rtt_ratio} > {cfg.link_rtt_ratio:g})\n"
                f"    and on (run, rank) ({r.store_rtt_rank} > {cfg.link_min_rtt_seconds:g})\n"
                f'    and on (run, rank) ({r.phase_share}{{phase="comm_wait"}}'
                f" > {cfg.link_comm_share:g}),\n"
                '    "cause", "link", "", ""\n  )\n)'
            ),
            cfg.straggler_for,
            "One rank is slower than its peers and holds the whole job back.",
            (
                '{{ if eq $labels.cause "link" }}'
                f"{where.capitalize()}'s round trips to the c10d store take "
                '{{ $value | printf "%.0f" }}x the run\'s median while every rank waits on '
                "communication: the network link of its node is slow (a degraded NIC or cable, "
                "or a saturated link), and the whole job runs at its pace."
                "{{ else }}"
                f'{where.capitalize()} spends {{{{ $value | printf "%.2f" }}}}x the run\'s median '
                "{{ $labels.cause }} time per step. Its peers wait for it inside the gradient "
                "allreduce, so they, not it, show long collective latency.{{ end }}"
            ),
            "In DDP every step ends in an allreduce, so the slowest rank sets the pace. The slow "
            "rank is the one with more compute (cause=compute) or data-loading (cause=data) time "
            "per step than the median rank. Its collective latency is the SHORTEST: the healthy "
            "ranks wait for it inside the allreduce, so never blame by collective latency. A "
            "slow network link slows every rank alike, so no rank's compute stands out: "
            "cause=link names the ranks whose c10d-store round trips (one per heartbeat) take "
            f"over {cfg.link_rtt_ratio:g}x the run's median and over "
            f"{cfg.link_min_rtt_seconds * 1000:g} ms while over "
            f"{cfg.link_comm_share:.0%} of their step is exposed communication: their "
            "packets queue behind the gradients on that link. It cannot name a slow link on "
            "the node that hosts the store (every other node's round trips are then inflated) "
            "or on half of the nodes or more; `ddp-exporter doctor --links` can.",
            "Stragglers dashboard: phase split per rank (the straggler's compute or data bar is "
            "taller; the others' comm_wait is taller). Overview: straggler score per rank.",
            "cause=compute: check that GPU for thermal or power throttling, ECC errors, a "
            "co-located process, a slower device model, or uneven work (batch sizes). cause=data: "
            "check that host's CPU load, disk and network, and the DataLoader's num_workers. "
            "cause=link: run `ddp-exporter doctor --links` (between jobs, or on the suspect "
            "node and a healthy one), check the NIC's negotiated speed, errors and cable "
            "(`ethtool`, `ip -s link`), and other traffic on that node; drain it if it stays "
            "slow.",
        ),
        Alert(
            "DDPInputBound",
            "info",
            f'{r.phase_share}{{phase="data"}} > {cfg.input_bound_share:g}',
            cfg.input_bound_for,
            "A rank spends a large share of each step waiting for input data.",
            (
                f"{where.capitalize()} spends {{{{ $value | humanizePercentage }}}} of each step "
                "waiting for the DataLoader."
            ),
            "The accelerator idles while the input pipeline catches up. If every rank shows it, "
            "the job is input-bound; if one does, that rank's host is (see DDPRankStraggler "
            "cause=data).",
            "Stragglers dashboard: the data share of the step per rank.",
            "Raise DataLoader num_workers and prefetch_factor, enable pin_memory, move decoding "
            "off the critical path, or cache/pre-shard the data set closer to the node.",
        ),
        Alert(
            "DDPThroughputDrop",
            "warning",
            (
                f"({r.steps_rate_run} > 0)\n< {cfg.throughput_drop_ratio:g} * "
                f"avg_over_time({r.steps_rate_run}[{cfg.baseline_window}])\n"
                f"unless on (run)\nmax by (run) ({r.in_section})\n"
                # A section that just ended still weighs on the rate window.
                f"unless on (run)\nmax by (run) (changes({runs_total}[{cfg.rate_window}]) > 0)"
            ),
            cfg.throughput_for,
            "Training throughput fell well below its own recent past.",
            (
                'Steps/s of run {{ $labels.run }} is {{ $value | printf "%.3g" }}, below '
                f"{cfg.throughput_drop_ratio:.0%} of its average over the last "
                f"{cfg.baseline_window}."
            ),
            "The job still progresses but much slower than it did recently: a new straggler, "
            "input pipeline trouble, network degradation, or a change in the workload. DDP's "
            "ranks step together, so this is one alert for the run; a declared section "
            "(checkpoint, evaluation) that is running or just ended is not a drop.",
            "Overview dashboard: steps/s and step time per rank; Stragglers: which phase grew.",
            "Look for a concurrent DDPRankStraggler or DDPInputBound on the same run and follow "
            "it; otherwise compare the phase split before and after the drop.",
        ),
        Alert(
            "DDPGPUMemoryNearLimit",
            "warning",
            f"{r.gpu_reserved_ratio} > {cfg.gpu_memory_ratio:g}",
            cfg.gpu_memory_for,
            "A rank's GPU memory is nearly exhausted.",
            (
                f"The caching allocator of {where} holds {{{{ $value | humanizePercentage }}}} "
                "of the GPU's memory."
            ),
            "The next larger batch, a longer sequence or fragmentation can raise "
            "torch.OutOfMemoryError and kill the rank (and with it the job).",
            "Memory dashboard: allocated, reserved and peak against total per rank.",
            "Reduce the micro-batch size, enable activation checkpointing, set "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation, or look "
            "for tensors kept alive across steps (a growing allocated line).",
        ),
    ]
    out.append(_init_stuck(cfg))
    out += _outside_loop_alerts(cfg, r, where)
    out.append(misconfigured_alert(cfg))
    return out


def _outside_loop_alerts(cfg: MixinConfig, r: Recorded, where: str) -> list[Alert]:
    """Return the alerts on version skew, overdue sections and the job's deadline (issue 12)."""
    fields = ", ".join(catalog.VERSION_LABELS)
    shared = f"{r.version} * 0\n+ on (run, field, version) group_left\n{r.version_ranks}"
    top = f"max by (run, field) ({r.version_ranks})"
    started = selector(cfg, catalog.SECTION_STARTED.name)
    section_deadline = selector(cfg, catalog.SECTION_DEADLINE.name)
    job_deadline = selector(cfg, catalog.JOB_DEADLINE.name)
    margin = cfg.job_deadline_margin_seconds
    return [
        Alert(
            "DDPVersionSkew",
            "warning",
            (
                # The minority: ranks whose version fewer ranks share than the most common one;
                # on a tie (say 2 against 2) there is no majority and every rank is named.
                f"(\n{shared}\n)\n< on (run, field) group_left\n{top}\n"
                f"or\n(\n{shared}\n)\nand on (run, field)\n"
                f"(\n  count by (run, field) (\n    {r.version_ranks}\n"
                f"    == on (run, field) group_left\n    {top}\n  ) > 1\n)"
            ),
            cfg.version_skew_for,
            "Ranks of one run run different torch, Python, CUDA or NCCL versions.",
            (
                f"{where.capitalize()} has {{{{ $labels.field }}}} {{{{ $labels.version }}}}, "
                "which only {{ $value }} rank(s) of the run share: the ranks disagree on "
                "{{ $labels.field }} and this one is in the minority (or there is no majority)."
            ),
            f"Every rank publishes its versions ({fields}) on ddp_rank_info; the ranks of one "
            "run disagree on one of them. Mixed versions cause init timeouts, NCCL errors, "
            "silent numerical differences and hangs in collectives whose wire format changed. "
            "The alert names the odd ranks (the minority) and the field.",
            "Overview dashboard: Ranks reporting; or query `count by (run, "
            "torch_version, python_version, cuda_version, nccl_version) (ddp_rank_info)`. "
            "`ddp-exporter doctor` under the same launcher compares versions before the job.",
            "Fix the image or environment of the named ranks' nodes (container tag, conda env, "
            "driver/CUDA module, NCCL library on LD_LIBRARY_PATH) so that every node runs the "
            "same versions, then restart the job.",
        ),
        Alert(
            "DDPSectionOverdue",
            # Critical: a long checkpoint also stops steps (DDPTrainingStalled, critical), which
            # would otherwise inhibit the alert that names the actual section.
            "critical",
            (
                f"max by (run, rank, section) (time() - {started})\n"
                f"> on (run, rank, section)\nmax by (run, rank, section) ({section_deadline})"
            ),
            cfg.section_overdue_for,
            "A named section (exporter.deadline) is still running past its deadline.",
            (
                "Section {{ $labels.section }} on "
                f"{where} has been running for {{{{ $value | humanizeDuration }}}}, past "
                "the deadline its code set with exporter.deadline()."
            ),
            "Code wrapped in `with exporter.deadline(name, seconds=...)` (a checkpoint save, an "
            "evaluation, data preparation) has not finished within its deadline and is still "
            "running. The alert fires while it runs, so there is time to act before a "
            "collective timeout or the job's time limit ends the job.",
            "Liveness dashboard: Named sections, running time against deadline (or query "
            "`time() - ddp_section_started_timestamp_seconds` against "
            "`ddp_section_deadline_seconds`); "
            "`ddp_section_last_duration_seconds` shows how long earlier runs took.",
            "Take a stack dump of the rank (`py-spy dump --pid`). For checkpoints check the "
            "storage (full disk, slow or hung network file system); for evaluation check for "
            "a larger shard on this rank or a collective waiting for a peer. If the work "
            "legitimately grew, raise the deadline in the code.",
        ),
        Alert(
            "DDPJobWillMissDeadline",
            "warning",
            (
                f"topk by (run) (1, {r.projected_finish_rank})\n- on (run) group_left\n"
                f"min by (run) ({job_deadline})\n> {-margin:g}"
            ),
            cfg.job_deadline_for,
            "At its current step rate the job will not finish before its wall-clock limit.",
            (
                "Run {{ $labels.run }} is projected to finish {{ $value | humanizeDuration }} "
                "after its wall-clock deadline at the step rate of the last "
                f"{cfg.eta_window} (a negative figure: that long before it, inside the "
                f"{margin:g}s safety margin); rank {{{{ $labels.rank }}}} has the most steps "
                "left. The scheduler will kill the job at the deadline."
            ),
            "The finish time projected from the steps left (`ddp_job_total_steps` - "
            "`ddp_steps_total`) and the recent step rate is later than the job's deadline "
            "(`ddp_job_deadline_timestamp_seconds`, from SLURM_JOB_END_TIME or "
            "DDP_EXPORTER_JOB_DEADLINE) minus the margin. Slow or throttled instances, a straggler, a slow network or "
            f"input pipeline make a job miss a limit it was sized for. Margin: {margin:g}s.",
            "Overview dashboard: Time to finish vs deadline (the projection above the "
            "deadline line). Stragglers dashboard: whether one rank slows the job.",
            "Look for a concurrent DDPRankStraggler, DDPInputBound or DDPThroughputDrop and fix "
            "that cause. Otherwise make sure a checkpoint is written before the deadline "
            "(the job will be killed), and resubmit with a longer limit or more nodes.",
        ),
    ]


def _init_stuck(cfg: MixinConfig) -> Alert:
    """Return DDPInitStuck: name the ranks that never checked in, else the ranks still in init.

    The monitoring rank publishes ``ddp_init_peer_arrived`` 0 for peers that have not checked in
    through torchrun's store (role=missing names them: the others only wait for them). Without
    such peers (or without the store: srun), a run with ranks still in a phase other than done
    after ``init_stuck_seconds`` is one alert (role=waiting, a condition of the run).
    """
    started = f"max by (run, rank) ({selector(cfg, catalog.INIT_STARTED.name)})"
    waited = f"(time() - {started} > {cfg.init_stuck_seconds:g})"
    arrived = selector(cfg, catalog.INIT_PEER_ARRIVED.name)
    not_arrived = f"max by (run, rank, peer_rank) ({arrived} == 0)"
    in_init = selector(cfg, catalog.INIT_PHASE.name, 'phase!="done"')
    in_init = f"max by (run, rank) ({in_init})"
    missing = (
        "max by (run, rank) (\n  label_replace(\n"
        f"    {not_arrived} * 0\n    + on (run, rank) group_left ()\n    {waited},\n"
        '    "rank", "$1", "peer_rank", "(.*)"\n  )\n)'
    )
    waiting = (
        f"max by (run) (\n  {waited}\n  and on (run, rank)\n  {in_init}\n)\n"
        f"unless on (run)\n{missing}"
    )
    return Alert(
        "DDPInitStuck",
        "critical",
        f"{_role(missing, 'missing')}\nor\n{_role(waiting, 'waiting')}",
        cfg.init_stuck_for,
        "The job is stuck in initialisation: a rank never arrived or the process group never "
        "formed.",
        (
            '{{ if eq $labels.role "missing" }}Rank {{ $labels.rank }} of run {{ $labels.run }} '
            "never checked in through the launcher's store: the monitoring rank has waited "
            "{{ $value | humanizeDuration }} for it.{{ else }}The ranks of run "
            "{{ $labels.run }} are waiting: the first started the init watch "
            "{{ $value | humanizeDuration }} ago and their process group does not exist "
            "yet.{{ end }}"
        ),
        (
            "The ranks called exporter.watch_init() but init_process_group has not completed "
            f"after {cfg.init_stuck_seconds:g}s. init_process_group waits for every rank, so one "
            "rank that never arrives holds all of them: role=missing names it. With no rank "
            "missing (or without torchrun's agent store to check in with), the run is one "
            "alert with role=waiting (see each rank's init phase for who waits). Seed "
            "causes:\n\n"
            "- **Port blocked**: a firewall blocks MASTER_PORT; the rank stays in phase `store` "
            "(it cannot reach the launcher's store) and the log says so once.\n"
            "- **Rank not started**: scheduler, container pull, a crash on import; the rank has "
            "no endpoint at all and the monitoring rank names it missing.\n"
            "- **Environment mismatch**: MASTER_ADDR, MASTER_PORT, WORLD_SIZE or the run id "
            "differ between nodes; ranks wait in phase `process_group` for peers that "
            "rendezvous elsewhere.\n"
            "- **Version skew**: another torch, NCCL or CUDA on one node; init fails or hangs."
        ),
        "Each rank's endpoint shows `ddp_init_phase_timestamp_seconds{phase}` (store, "
        "process_group, done) and `ddp_init_started_timestamp_seconds`; the monitoring rank's "
        "shows `ddp_init_peer_arrived{peer_rank}` (0 = not arrived). `up` tells whether the "
        "missing rank's endpoint exists at all. The launcher log of the named rank's node "
        "usually has the error.",
        "role=missing: check that the rank's process started on its node (launcher and "
        "scheduler logs, `ps`), that it can reach MASTER_ADDR:MASTER_PORT (`nc -z`), and that "
        "its environment matches the other nodes. Phase store on any rank: open MASTER_PORT "
        "between the nodes. role=waiting on every rank: compare MASTER_ADDR, MASTER_PORT, "
        "WORLD_SIZE and the torch/NCCL/CUDA versions across nodes (`ddp-exporter doctor` checks "
        "all of them), fix and restart the job.",
    )


def every_alert(cfg: MixinConfig = DEFAULT) -> list[Alert]:
    """Return the per-run alerts, then the fleet group's (the runbook's order, :data:`ALERT_NAMES`)."""
    return [*alerts(cfg), suspect_node_alert(cfg), shard_down_alert(cfg)]


def rule_groups(cfg: MixinConfig = DEFAULT) -> dict[str, Any]:
    """Return the rule file content: the recording groups, the alerts, then the fleet group.

    The fleet group (its own, longer interval) reads the alerts' ``ALERTS`` series. Every
    expression keeps the cluster label (:func:`exporter.mixin.cluster.scoped`).
    """
    recording = recording_groups(cfg)
    groups = [
        *({"name": f"ddp-exporter.{name}", "rules": recording[name]} for name in RECORDING_GROUPS),
        {"name": "ddp-exporter.alerts", "rules": [a.rule(cfg) for a in alerts(cfg)]},
        fleet_group(cfg),
    ]
    for group in groups:
        for rule in group["rules"]:
            rule["expr"] = scoped(cfg, rule["expr"])
    return {"groups": groups}


def render_rules(cfg: MixinConfig = DEFAULT) -> str:
    """Return the rules file as YAML text with the generated-file header."""
    return dump_yaml(rule_groups(cfg))
