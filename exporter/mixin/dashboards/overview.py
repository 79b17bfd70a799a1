"""Build the Overview dashboard: job health, throughput, step time, straggler score per rank."""

from __future__ import annotations

from ... import catalog
from ..config import DEFAULT, MixinConfig
from ..recording import Recorded, recorded
from .panels import RUN, TOP_RANKS, DashboardSpec, PanelSpec, Queries, Target

__all__ = ["NEAR_TYPICAL", "dashboard"]

#: A straggler score up to this is the run's normal spread (yellow above it, red from the
#: straggler ratio).
NEAR_TYPICAL = 1.2

_RANKS = "rank {{rank}}"


def dashboard(cfg: MixinConfig = DEFAULT) -> DashboardSpec:
    """Return the Overview dashboard of ``cfg``."""
    q, r = Queries(cfg), recorded(cfg)
    return DashboardSpec(
        "overview",
        "ddp-overview",
        "DDP / Overview",
        "Job health, throughput, step time and the straggler score per rank.",
        (*_headline(q), *_per_rank(q, r), *_alerts_and_deadline(q, r)),
    )


def _headline(q: Queries) -> tuple[PanelSpec, ...]:
    """Return the row of figures: targets up and down, alerts, pace, ranks, step time."""
    firing = q.filtered("ALERTS", 'alertstate="firing"', RUN)
    return (
        PanelSpec(
            "Targets up",
            (Target(f"sum {q.by('run')} ({q.up()})", "{{run}}"),),
            kind="stat",
            width=4,
            height=5,
            description="Scrape targets (ranks) whose endpoint answers.",
        ),
        PanelSpec(
            "Targets down",
            (Target(f"sum {q.by('run')} (1 - {q.up()})", "{{run}}"),),
            kind="stat",
            width=4,
            height=5,
            thresholds=(("green", None), ("red", 1)),
            description="Scrape targets whose endpoint does not answer (dead or unreachable).",
        ),
        PanelSpec(
            "Alerts firing",
            (Target(f"count({firing}) or vector(0)", "firing"),),
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
            (Target(f"min {q.by('run')} ({q.rate(catalog.STEPS, 'run, rank')})", "{{run}}"),),
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
            (Target(f"count {q.by('run')} ({q.series(catalog.RANK_INFO)})", "{{run}}"),),
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
                    f"quantile {q.by('run')} (0.5, {q.mean(catalog.STEP_DURATION, 'run, rank')})",
                    "{{run}}",
                ),
            ),
            description=("Median over ranks of each rank's mean step time."),
            kind="stat",
            unit="s",
            width=4,
            height=5,
        ),
    )


def _per_rank(q: Queries, r: Recorded) -> tuple[PanelSpec, ...]:
    """Return the per-rank panels: pace, step time, straggler score, relative speed, p90."""
    cfg = q.cfg
    return (
        PanelSpec(
            "Steps/s per rank",
            (Target(q.rate(catalog.STEPS, "run, rank"), _RANKS),),
            description=(
                "Training steps per second of each rank. Ranks of one DDP job step "
                "together; a gap is a rank that stopped."
            ),
            unit="ops",
        ),
        PanelSpec(
            "Step time per rank (mean)",
            (Target(q.mean(catalog.STEP_DURATION, "run, rank"), _RANKS),),
            description=(
                "Mean wall time of one training step per rank (forward, backward, "
                "optimizer, data wait)."
            ),
            unit="s",
        ),
        PanelSpec(
            "Straggler score per rank",
            (Target(q.rec(r.straggler_score), _RANKS),),
            kind="bargauge",
            min=0,
            max=max(3.0, cfg.straggler_ratio * 2),
            thresholds=(("green", None), ("yellow", NEAR_TYPICAL), ("red", cfg.straggler_ratio)),
            description=(
                "Compute+data time per step of the rank over the run's median rank "
                f"({cfg.rate_window} window). 1 = typical; above {cfg.straggler_ratio:g} "
                "the rank holds the job back. Never judged by collective latency: the "
                "straggler's is the shortest."
            ),
        ),
        PanelSpec(
            f"Relative speed, {TOP_RANKS} slowest ranks",
            (Target(f"bottomk {q.by('run')} ({TOP_RANKS}, {q.rec(r.relative_speed)})", _RANKS),),
            kind="bargauge",
            unit="percentunit",
            min=0,
            max=1,
            thresholds=(
                ("red", None),
                ("yellow", round(1 / cfg.straggler_ratio, 3)),
                ("green", round(1 / NEAR_TYPICAL, 3)),
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
                Target(q.rec(r.step_p90), _RANKS),
            ),
            description=(
                "90th percentile of the step time per rank, from the recorded histogram quantile."
            ),
            unit="s",
        ),
    )


def _alerts_and_deadline(q: Queries, r: Recorded) -> tuple[PanelSpec, ...]:
    """Return the list of firing alerts and the projected finish against the deadline."""
    cfg = q.cfg
    firing = q.filtered("ALERTS", 'alertstate="firing"', RUN)
    return (
        PanelSpec(
            "Alerts firing (list)",
            (
                Target(
                    f"max {q.by('alertname, severity, run, rank, cause, role, pg')} ({firing})",
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
                    f"{q.filtered(r.projected_finish_run, RUN)} - time()",
                    "projected time to finish {{run}}",
                ),
                Target(
                    f"min {q.by('run')} ({q.series(catalog.JOB_DEADLINE)}) - time()",
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
    )
