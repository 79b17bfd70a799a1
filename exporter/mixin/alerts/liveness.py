"""Build the liveness alerts: a rank down, a whole run killed, training stalled.

A rank is down when its endpoint, its heartbeat or its series are gone while the rest of its
run goes on; when every rank goes at once the run was killed, one fact for the run; a run
whose ranks report but make no step is stalled. A rank that ended cleanly is never down, a run
the hang action ended is given time to come back, a declared section excuses a stall.
"""

from __future__ import annotations

from ... import catalog, settings
from ..alert import Alert, selector
from ..cluster import clauses
from ..config import DEFAULT, MixinConfig, duration_seconds
from ..promql import string
from ..recording import recorded
from .shared import WHERE, aborted_runs, finished_ranks, looping_runs

__all__ = [
    "SILENCE_MIN_S",
    "job_killed",
    "liveness_alerts",
    "rank_down",
    "silence_seconds",
    "training_stalled",
]

#: The fewest seconds a rank's endpoint must answer no scrape before DDPRankDown calls it down,
#: however short the scrape interval: on a busy host a live rank's threads can wait seconds for
#: a CPU and the interpreter lock, and its scrapes time out meanwhile.
SILENCE_MIN_S = 5.0


def liveness_alerts(cfg: MixinConfig = DEFAULT) -> list[Alert]:
    """Return DDPRankDown, DDPJobKilled and DDPTrainingStalled for ``cfg``."""
    return [rank_down(cfg), job_killed(cfg), training_stalled(cfg)]


def silence_seconds(cfg: MixinConfig) -> float:
    """Return how long an endpoint answers no scrape before its rank counts as gone."""
    return max(1.5 * settings.duration_seconds(cfg.scrape_interval), SILENCE_MIN_S)


def _up(cfg: MixinConfig) -> str:
    """Return the selector of the ranks' scrape health (``up`` of the job, with a rank)."""
    return selector(cfg, "up", f"job={string(cfg.job)}", 'rank!=""')


def _answered(cfg: MixinConfig) -> str:
    """Return the ranks whose endpoint answered a scrape within :func:`silence_seconds`.

    Where no sample is that recent (a Prometheus that scrapes less often than the config says)
    the last scrape decides.
    """
    recent = f"{round(1000 * silence_seconds(cfg))}ms"
    return f"max {clauses(cfg).by('run, rank')} (max_over_time({_up(cfg)}[{recent}]) == 1)"


def rank_down(cfg: MixinConfig = DEFAULT) -> Alert:
    """Return DDPRankDown: one rank gone while the rest of its run still reports."""
    r, c = recorded(cfg), clauses(cfg)
    up = _up(cfg)
    info = selector(cfg, catalog.RANK_INFO.name)
    stale = f"{cfg.heartbeat_stale_seconds:g}"
    rank = c.by("run, rank")
    # Down once its last scrape failed and none answered within one and a half intervals, and
    # within SILENCE_MIN_S: scrapes that timed out on a busy host are not a rank gone. Its
    # series gone count only where no scrape answered that recently either: a failed scrape
    # marks every series of the target stale at once.
    silence = silence_seconds(cfg)
    answered = _answered(cfg)
    down = f"(\n    max {rank} ({up} == 0)\n    unless {c.on('run, rank')}\n    {answered}\n  )"
    monitor = settings.SETTINGS[settings.MONITOR_RANK].default
    return Alert(
        "DDPRankDown",
        "critical",
        (
            f"(\n  {down}\n  or\n"
            f"  max {rank} ({r.peer_heartbeat_age} > {stale})\n  or\n"
            f"  max {rank} (last_over_time({info}[{cfg.baseline_window}]))\n"
            f"  unless {c.on('run, rank')} max {rank} ({info})\n"
            f"  unless {c.on('run, rank')} {answered}\n)\n"
            f"unless {c.on('run, rank')}\n{finished_ranks(cfg)}\n"
            f"and {c.on('run')}\nmax {c.by('run')} ({info})"
        ),
        cfg.rank_down_for,
        "A training rank is down while the rest of its run goes on.",
        (
            f"{WHERE.capitalize()} is down: its endpoint answered no scrape for {silence:g}s, the "
            f"monitoring rank has not seen its heartbeat for over {stale}s, or its series "
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
        f"by rank {monitor} (they keep counting for a rank whose endpoint is gone).",
        "Check the rank's process and host (OOM killer, node failure, `dmesg`, the launcher "
        "log). If the process is alive but stuck, take a stack dump (`py-spy dump`). Restart "
        "the job from the last checkpoint once the node is healthy.",
    )


def job_killed(cfg: MixinConfig = DEFAULT) -> Alert:
    """Return DDPJobKilled: every rank of a run gone at once, without a clean end.

    A rank's series gone count only where its endpoint answered no scrape lately either, as
    for DDPRankDown: a Prometheus whose scrapes of every rank failed once is no job killed.
    """
    c = clauses(cfg)
    info = selector(cfg, catalog.RANK_INFO.name)
    rank, run = c.by("run, rank"), c.on("run")
    answered = _answered(cfg)
    return Alert(
        "DDPJobKilled",
        "critical",
        (
            f"count {c.by('run')} (\n"
            f"  max {rank} (last_over_time({info}[{cfg.baseline_window}]))\n"
            f"  unless {c.on('run, rank')} max {rank} ({info})\n"
            f"  unless {c.on('run, rank')} {answered}\n)\n"
            f"unless {run}\nmax {c.by('run')} ({info})\n"
            f"unless {run}\nmax {c.by('run')} ({finished_ranks(cfg)})\n"
            f"unless {run}\n{aborted_runs(cfg)}\n"
            f"unless {run}\n{looping_runs(cfg)}"
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
        scope="run",
    )


def training_stalled(cfg: MixinConfig = DEFAULT) -> Alert:
    """Return DDPTrainingStalled: the run's ranks report, but none completes a step.

    A rank that has not completed a step in its attempt yet (a checkpoint load, a first step's
    torch.compile) counts once it has run ``training_startup_for`` without one. A run the hang
    action ended counts from the abort: the time its hung attempt made no step is
    DDPHangAborted's, and the restarted attempt gets the whole stall time to step again.
    """
    r, c = recorded(cfg), clauses(cfg)
    abort = selector(cfg, catalog.HANG_ABORT.name)
    window = duration_seconds(cfg.rate_window)
    rank = c.by("run, rank")
    steps = selector(cfg, catalog.STEPS.name)
    start = cfg.training_startup_for
    # Stepped in this attempt and stopped; or up for the whole startup allowance, no step yet.
    stopped = f"{r.steps_rate} == 0\nand {c.on('run, rank')} max {rank} ({steps}) > 0"
    never = (
        f"max {rank} (max_over_time({steps}[{start}])) == 0\n"
        f"and {c.on('run, rank')} max {rank} ({steps} offset {start}) == 0"
    )
    return Alert(
        "DDPTrainingStalled",
        "critical",
        (
            f"count {c.by('run')} (\n({stopped})\nor\n({never})\n)\nunless {c.on('run')}\n"
            f"max {c.by('run')} ({r.in_section})\nunless {c.on('run')}\n"
            f"max {c.by('run')} (last_over_time({abort}[{cfg.hang_abort_window}]))"
            f" > time() - {window:g}"
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
        "deadline DDPSectionOverdue names the section. A rank that has not completed a step "
        f"in its attempt yet counts only once it has run {cfg.training_startup_for} without "
        "one: loading a checkpoint or compiling the first step (torch.compile) takes minutes. "
        "A run the hang action ended "
        "(DDPHangAborted) counts from the abort: its restarted attempt has the whole "
        f"{cfg.rate_window} and {cfg.training_stalled_for} to step again.",
        "Overview dashboard: steps/s per rank is flat at zero. Collectives dashboard: "
        "in-flight age and sequence-number lag show whether a collective is stuck and which "
        "rank is behind.",
        "Look for a concurrent DDPCollectiveTimeoutImminent / DDPRankDown naming a rank and "
        "follow that runbook. Otherwise take stack dumps of all ranks (`py-spy dump`). Wrap "
        "checkpoints and evaluation in `exporter.deadline(...)` so that they are not taken "
        "for a stall.",
        scope="run",
    )
