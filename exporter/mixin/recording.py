"""Build the per-run recording rules: the series the alerts and dashboards read.

Names follow ``level:metric:operations``: the level names the labels kept (``run_rank`` keeps
run and rank), the metric is a catalog name, the operations say what was done, newest first,
with the rate window in the name (``mean_rate1m``). :func:`recorded` names them for one
configuration; :func:`recording_groups` writes them, in groups small enough to evaluate well
within their interval at 4096 ranks (benchmarks/scale.py). The fleet's records, a group of
their own with their own interval, live with the fleet (:mod:`exporter.mixin.fleet`).

The goodput records (a run's time account, :mod:`exporter.sources.goodput`) have their own
group and interval (:func:`group_interval`): rolling windows of hours and days. They go through
one series per run and category, ``max`` over the monitoring rank's counters, which a restarted
attempt carries on: a new scrape target or a counter that starts again from zero (``increase``
counts a reset from zero) keeps the run's meaning.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import catalog
from .alert import selector
from .cluster import Clauses, clauses
from .config import DEFAULT, MixinConfig

__all__ = [
    "BLAME_PHASES",
    "RECORDING_GROUPS",
    "Recorded",
    "group_interval",
    "recorded",
    "recording_groups",
    "unplanned_seconds",
]

#: Goodput categories a healthy job spends by design (exporter.sources.goodput's PLANNED).
PLANNED: tuple[str, ...] = ("startup", "checkpoint", "evaluation", "section")

#: Step phases that a straggler is blamed by (never comm_wait, never collective latency).
BLAME_PHASES: tuple[str, ...] = ("compute", "data")

#: Recording groups. Prometheus runs groups concurrently, rules within one in order, so a rule
#: that reads a recorded series sits in the same group after it.
RECORDING_GROUPS = ("step", "collective", "health", "job", "goodput")

#: One recording rule: ``{"record": name, "expr": PromQL}``.
Rule = dict[str, str]


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
    #: A rank's compute and data time per step: when it reaches the step's collectives.
    work_mean: str
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
    #: The run, rank and node of each GPU, by its ``UUID`` as dcgm-exporter labels its series.
    gpu_rank: str
    errors_rate: str
    in_section: str
    version_sets: str
    version: str
    version_ranks: str
    projected_finish_rank: str
    projected_finish_run: str
    goodput: str
    goodput_short: str
    goodput_long: str
    ettr: str
    ettr_short: str
    ettr_long: str
    ettr_cluster_short: str
    ettr_cluster_long: str
    unplanned_ettr: str
    blame: str
    blame_short: str
    blame_long: str
    blame_node: str


def recorded(cfg: MixinConfig = DEFAULT) -> Recorded:
    """Return the recording-rule names for ``cfg``."""
    w, lat = cfg.rate_window, cfg.latency_window
    phase = catalog.STEP_PHASE.name
    coll = catalog.COLLECTIVE_DURATION.name
    inflight = catalog.INFLIGHT_AGE.name
    seq = catalog.LAST_ENQUEUED_SEQ.name
    eta = f"projected_finish_timestamp_rate{cfg.eta_window}"
    gp, gw, gl = _base(catalog.GOODPUT), cfg.goodput_window, cfg.goodput_long_window
    blame = _base(catalog.GOODPUT_BLAME)
    return Recorded(
        steps_rate=f"run_rank:{_base(catalog.STEPS)}:rate{w}",
        steps_rate_run=f"run:{_base(catalog.STEPS)}:max_rate{w}",
        step_mean=f"run_rank:{catalog.STEP_DURATION.name}:mean_rate{w}",
        step_p90=f"run_rank:{catalog.STEP_DURATION.name}:p90_rate{w}",
        phase_mean=f"run_rank:{phase}:mean_rate{w}",
        phase_median=f"run:{phase}:median_mean_rate{w}",
        phase_ratio=f"run_rank:{phase}:ratio_median_mean_rate{w}",
        phase_share=f"run_rank:{phase}:share_mean_rate{w}",
        work_mean=f"run_rank:{phase}:work_mean_rate{w}",
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
        gpu_rank=f"uuid:{catalog.GPU_INFO.name}:rank",
        errors_rate=f"run_rank:{_base(catalog.EXPORTER_ERRORS)}:rate{w}",
        in_section=f"run_rank:{catalog.SECTION_STARTED.name}:within_deadline",
        version_sets=f"run:{catalog.RANK_INFO.name}:version_sets",
        version=f"run_rank_field:{catalog.RANK_INFO.name}:version",
        version_ranks=f"run_field_version:{catalog.RANK_INFO.name}:count",
        projected_finish_rank=f"run_rank:{catalog.JOB_TOTAL_STEPS.name}:{eta}",
        projected_finish_run=f"run:{catalog.JOB_TOTAL_STEPS.name}:{eta}",
        goodput=f"run_category:{gp}:max",
        goodput_short=f"run_category:{gp}:increase{gw}",
        goodput_long=f"run_category:{gp}:increase{gl}",
        ettr=f"run:{gp}:ettr",
        ettr_short=f"run:{gp}:ettr_increase{gw}",
        ettr_long=f"run:{gp}:ettr_increase{gl}",
        ettr_cluster_short=f"cluster:{gp}:ettr_increase{gw}",
        ettr_cluster_long=f"cluster:{gp}:ettr_increase{gl}",
        unplanned_ettr=f"run:{gp}:unplanned_ettr_increase{gw}",
        blame=f"run_culprit_category:{blame}:max",
        blame_short=f"run_culprit_category:{blame}:increase{gw}",
        blame_long=f"run_culprit_category:{blame}:increase{gl}",
        blame_node=f"node_category:{blame}:increase{cfg.goodput_node_window}",
    )


def _sel(cfg: MixinConfig, metric: catalog.MetricDef) -> str:
    """Return the configured selector of ``metric``."""
    return selector(cfg, metric.name)


def _mean_rate(cfg: MixinConfig, metric: catalog.MetricDef, by: str, window: str) -> str:
    """Return the mean of a histogram or summary per event over ``window``, kept ``by`` labels.

    A window without events has no mean: no sample rather than NaN, so that a record that
    exists says its window held events (the straggler alerts' start guard counts on it).
    """
    c = clauses(cfg)
    s = selector(cfg, metric.name + "_sum")
    n = selector(cfg, metric.name + "_count")
    return f"sum {c.by(by)} (rate({s}[{window}]))\n/\n(sum {c.by(by)} (rate({n}[{window}])) > 0)"


def _p90(cfg: MixinConfig, metric: catalog.MetricDef, by: str, window: str) -> str:
    """Return the 0.9 quantile of a histogram over ``window``, kept ``by`` labels."""
    b = selector(cfg, metric.name + "_bucket")
    return f"histogram_quantile(0.9, sum {clauses(cfg).by(by + ', le')} (rate({b}[{window}])))"


def recording_groups(cfg: MixinConfig = DEFAULT) -> dict[str, list[Rule]]:
    """Return the recording rules by group name, dependencies before dependants in each."""
    r, c = recorded(cfg), clauses(cfg)
    return {
        "step": _step_records(cfg, r, c),
        "collective": _collective_records(cfg, r, c),
        "health": _health_records(cfg, r, c),
        # Version skew and the projected finish: their own group, so that it runs beside
        # health (the per-field version records alone are 4 series per rank).
        "job": _job_records(cfg, r, c),
        "goodput": _goodput_records(cfg, r, c),
    }


def group_interval(cfg: MixinConfig, name: str) -> str | None:
    """Return the evaluation interval of the recording group ``name`` (None: the global one)."""
    return cfg.goodput_interval if name == "goodput" else None


def _step_records(cfg: MixinConfig, r: Recorded, c: Clauses) -> list[Rule]:
    """Return the step rate, step time and phase records, and the straggler score."""
    w = cfg.rate_window
    blame = "|".join(BLAME_PHASES)
    work = f'sum {c.by("run, rank")} ({r.phase_mean}{{phase=~"{blame}"}})'
    steps = _sel(cfg, catalog.STEPS)
    return [
        {"record": r.steps_rate, "expr": f"sum {c.by('run, rank')} (rate({steps}[{w}]))"},
        # DDP ranks step in lockstep: the run's rate is any rank's; max keeps a rank that left.
        {"record": r.steps_rate_run, "expr": f"max {c.by('run')} ({r.steps_rate})"},
        {"record": r.step_mean, "expr": _mean_rate(cfg, catalog.STEP_DURATION, "run, rank", w)},
        {"record": r.step_p90, "expr": _p90(cfg, catalog.STEP_DURATION, "run, rank", w)},
        {
            "record": r.phase_mean,
            "expr": _mean_rate(cfg, catalog.STEP_PHASE, "run, rank, phase", w),
        },
        {"record": r.phase_median, "expr": _baseline(c, "run, phase", r.phase_mean)},
        {
            "record": r.phase_ratio,
            "expr": f"{r.phase_mean}\n/ {c.on('run, phase')} group_left\n{r.phase_median}",
        },
        {
            "record": r.phase_share,
            "expr": (
                f"{r.phase_mean}\n/ {c.on('run, rank')} group_left\n"
                f"sum {c.by('run, rank')} ({r.phase_mean})"
            ),
        },
        {"record": r.work_mean, "expr": work},
        {
            "record": r.straggler_score,
            "expr": (
                f"{r.work_mean}\n/ {c.on('run')} group_left ()\n"
                f"({_baseline(c, 'run', r.work_mean)})"
            ),
        },
        # NVRx's anchor: the run's median over the rank's compute+data, capped at 1: 1 = as
        # fast as the typical rank, 0.5 = half its speed. Comparable across runs of any speed
        # and size; bottomk of it ranks a 4096-rank run's slowest ranks at a glance.
        {
            "record": r.relative_speed,
            "expr": f"clamp_max(1 / ({r.straggler_score} > 0), 1)",
        },
    ]


def _baseline(c: Clauses, by: str, series: str) -> str:
    """Return what a rank's compute or data time is judged against: the run's median over its
    ranks, and in a run of two ranks the faster one's (their median is their mean, which a
    rank would have to exceed threefold to be 1.5 times it: a 2.9 times slower rank went
    unnamed)."""
    return (
        f"(quantile {c.by(by)} (0.5, {series})\n"
        f" and {c.on(by)} (count {c.by(by)} ({series}) > 2))\n"
        f"or min {c.by(by)} ({series})"
    )


def _collective_records(cfg: MixinConfig, r: Recorded, c: Clauses) -> list[Rule]:
    """Return the collective latency, bytes, sequence-lag and in-flight records."""
    w, lat = cfg.rate_window, cfg.latency_window
    last_seq = f"last_over_time({_sel(cfg, catalog.LAST_ENQUEUED_SEQ)}[{cfg.baseline_window}])"
    inflight = _sel(cfg, catalog.INFLIGHT_AGE)
    return [
        {
            "record": r.coll_mean_rank,
            "expr": _mean_rate(cfg, catalog.COLLECTIVE_DURATION, "run, rank, op, pg", lat),
        },
        {
            "record": r.coll_mean_run,
            "expr": _mean_rate(cfg, catalog.COLLECTIVE_DURATION, "run, pg", lat),
        },
        {
            "record": r.coll_p90_rank,
            "expr": _p90(cfg, catalog.COLLECTIVE_DURATION, "run, rank, op, pg", w),
        },
        {
            "record": r.coll_bytes_rate,
            "expr": (
                f"sum {c.by('run, rank, op, pg')} "
                f"(rate({_sel(cfg, catalog.COLLECTIVE_BYTES)}[{w}]))"
            ),
        },
        {
            # last_over_time: a frozen or dead rank's series go stale, yet its last sequence
            # number is exactly what names it as the rank that never entered the collective.
            "record": r.seq_behind,
            "expr": (
                f"max {c.by('run, pg')} ({last_seq})\n- {c.on('run, pg')} group_right\n"
                f"max {c.by('run, rank, pg')} ({last_seq})"
            ),
        },
        {"record": r.inflight_max_run, "expr": f"max {c.by('run, pg')} ({inflight})"},
        {
            "record": r.inflight_ratio_rank,
            "expr": (
                f"max {c.by('run, rank, pg')} ({inflight})\n/ {c.on('run, rank, pg')}\n"
                f"(max {c.by('run, rank, pg')} ({_sel(cfg, catalog.COLLECTIVE_TIMEOUT)}) > 0)"
            ),
        },
        {
            "record": r.inflight_ratio_run,
            "expr": f"max {c.by('run, pg')} ({r.inflight_ratio_rank})",
        },
    ]


def _health_records(cfg: MixinConfig, r: Recorded, c: Clauses) -> list[Rule]:
    """Return the heartbeat, store round trip, GPU memory, section and error records."""
    w = cfg.rate_window
    rank = c.by("run, rank")
    section = c.by("run, rank, section")
    return [
        {
            "record": r.heartbeat_age,
            "expr": f"time() - max {rank} ({_sel(cfg, catalog.HEARTBEAT)})",
        },
        {
            "record": r.peer_heartbeat_age,
            "expr": (
                f"max {rank} (\n  label_replace("
                f'{_sel(cfg, catalog.PEER_HEARTBEAT_AGE)}, "rank", "$1", "peer_rank", "(.*)")\n)'
            ),
        },
        {
            # The median over time drops the odd slow beat; a queue on a slow link is steady.
            "record": r.store_rtt_rank,
            "expr": (
                f"max {rank} (quantile_over_time(0.5, {_sel(cfg, catalog.STORE_ROUND_TRIP)}[{w}]))"
            ),
        },
        {"record": r.store_rtt_run, "expr": f"quantile {c.by('run')} (0.5, {r.store_rtt_rank})"},
        {
            "record": r.store_rtt_ratio,
            "expr": f"{r.store_rtt_rank}\n/ {c.on('run')} group_left ()\n({r.store_rtt_run} > 0)",
        },
        {
            "record": r.gpu_reserved_ratio,
            "expr": (
                f"max {rank} ({_sel(cfg, catalog.GPU_MEM_RESERVED)})\n/ {c.on('run, rank')}\n"
                f"(max {rank} ({_sel(cfg, catalog.GPU_MEM_TOTAL)}) > 0)"
            ),
        },
        {
            # dcgm-exporter's series carry the GPU's UUID and the host, never the rank: this
            # gives each UUID its run, rank and node, for `* on (UUID) group_left (run, rank,
            # node)` (docs/guides/gpu.md).
            "record": r.gpu_rank,
            "expr": (
                f"label_replace(\n  max {c.by('run, rank, gpu_uuid, gpu_index')} "
                f"({_sel(cfg, catalog.GPU_INFO)})\n"
                f"  * {c.on('run, rank')} group_left (node)\n"
                f"  max {c.by('run, rank, node')} ({_sel(cfg, catalog.RANK_INFO)}),\n"
                '  "UUID", "$1", "gpu_uuid", "(.+)"\n)'
            ),
        },
        {
            # 1 for each rank running a declared section within its deadline (its checkpoint
            # or evaluation excuses it, and the ranks it holds up, from the hang alerts).
            "record": r.in_section,
            "expr": (
                f"max {rank} (\n"
                f"  max {section} (time() - {_sel(cfg, catalog.SECTION_STARTED)})\n"
                f"  <= {c.on('run, rank, section')}\n"
                f"  max {section} ({_sel(cfg, catalog.SECTION_DEADLINE)})\n"
                ") * 0 + 1"
            ),
        },
        {
            # Only places with errors: zeros for every rank and place would be most series.
            "record": r.errors_rate,
            "expr": (
                f"sum {c.by('run, rank, where')} "
                f"(rate({_sel(cfg, catalog.EXPORTER_ERRORS)}[{w}])) > 0"
            ),
        },
    ]


def _job_records(cfg: MixinConfig, r: Recorded, c: Clauses) -> list[Rule]:
    """Return the records of version skew and of the job's projected finish (issue 12)."""
    info = _sel(cfg, catalog.RANK_INFO)
    fields = ", ".join(catalog.VERSION_LABELS)
    skewed = f"({info} and {c.on('run')} ({r.version_sets} > 1))"
    per_field = [
        f"max {c.by('run, rank, field, version')} (\n  label_replace(\n"
        f'    label_replace({skewed}, "version", "$1", "{f}", "(.*)"),\n'
        f'    "field", "{f}", "", ""\n  )\n)'
        for f in catalog.VERSION_LABELS
    ]
    steps = _sel(cfg, catalog.STEPS)
    total = _sel(cfg, catalog.JOB_TOTAL_STEPS)
    rank = c.by("run, rank")
    return [
        # Distinct version combinations per run: 1 on a healthy run.
        {
            "record": r.version_sets,
            "expr": f"count {c.by('run')} (count {c.by('run, ' + fields)} ({info}))",
        },
        # Only for runs with more than one combination (none on healthy runs, so no series per
        # rank): one series per rank and version field, the field's value in `version`, so one
        # rule compares every field and the alert names the field that differs.
        {"record": r.version, "expr": "\nor\n".join(per_field)},
        {
            "record": r.version_ranks,
            "expr": f"count {c.by('run, field, version')} ({r.version})",
        },
        {
            # Steps left over the recent step rate; a finished rank projects "now", a stopped
            # one (rate 0) projects nothing: DDPTrainingStalled covers it.
            "record": r.projected_finish_rank,
            "expr": (
                "time()\n+\nclamp_min(\n"
                f"  max {rank} ({total})\n  - {c.on('run, rank')}\n"
                f"  sum {rank} ({steps}),\n  0\n)\n/ {c.on('run, rank')}\n"
                f"(sum {rank} (rate({steps}[{cfg.eta_window}])) > 0)"
            ),
        },
        {
            "record": r.projected_finish_run,
            "expr": f"max {c.by('run')} ({r.projected_finish_rank})",
        },
    ]


def _ratio(c: Clauses, by: str, series: str) -> str:
    """Return productive over every category of ``series`` (one per category), kept ``by``."""
    return f'sum {c.by(by)} ({series}{{category="productive"}})\n/\n(sum {c.by(by)} ({series}) > 0)'


def unplanned_seconds(cfg: MixinConfig = DEFAULT) -> str:
    """Return a run's time over the goodput window less what it spent by design (PLANNED)."""
    planned = "|".join(PLANNED)
    return f'sum {clauses(cfg).by("run")} ({recorded(cfg).goodput_short}{{category!~"{planned}"}})'


def _goodput_records(cfg: MixinConfig, r: Recorded, c: Clauses) -> list[Rule]:
    """Return the goodput records: the run's account per category, ETTR per run and cluster."""
    run = "run, category"
    return [
        {
            "record": r.goodput,
            "expr": f"max {c.by(run)} ({_sel(cfg, catalog.GOODPUT)})",
        },
        {"record": r.goodput_short, "expr": f"increase({r.goodput}[{cfg.goodput_window}])"},
        {"record": r.goodput_long, "expr": f"increase({r.goodput}[{cfg.goodput_long_window}])"},
        {"record": r.ettr, "expr": _ratio(c, "run", r.goodput)},
        {"record": r.ettr_short, "expr": _ratio(c, "run", r.goodput_short)},
        {"record": r.ettr_long, "expr": _ratio(c, "run", r.goodput_long)},
        {"record": r.ettr_cluster_short, "expr": _ratio(c, "", r.goodput_short)},
        {"record": r.ettr_cluster_long, "expr": _ratio(c, "", r.goodput_long)},
        {
            # What DDPGoodputLow judges: productive over the time that was not planned.
            "record": r.unplanned_ettr,
            "expr": (
                f'sum {c.by("run")} ({r.goodput_short}{{category="productive"}})\n/\n'
                f"({unplanned_seconds(cfg)} > 0)"
            ),
        },
        {
            "record": r.blame,
            "expr": (
                f"max {c.by('run, culprit_rank, node, category')} "
                f"({_sel(cfg, catalog.GOODPUT_BLAME)})"
            ),
        },
        {"record": r.blame_short, "expr": f"increase({r.blame}[{cfg.goodput_window}])"},
        {"record": r.blame_long, "expr": f"increase({r.blame}[{cfg.goodput_long_window}])"},
        {
            # Which node cost the runs most time (a straggler or a hang on it), across runs.
            "record": r.blame_node,
            "expr": (
                f"sum {c.by('node, category')} (increase({r.blame}[{cfg.goodput_node_window}]))"
            ),
        },
    ]
