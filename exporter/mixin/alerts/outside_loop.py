"""Build the alerts of what happens outside the training loop: init, versions, sections, deadline.

Before the loop: ranks stuck in initialisation (DDPInitStuck) and ranks of one run on different
versions (DDPVersionSkew). Beside it: a declared section (``exporter.deadline``) running past
its own deadline (DDPSectionOverdue). Around it: a job that will not finish before its
wall-clock limit at its current pace (DDPJobWillMissDeadline).
"""

from __future__ import annotations

from ... import catalog
from ..alert import Alert, selector
from ..cluster import clauses
from ..config import DEFAULT, MixinConfig
from ..recording import recorded
from .shared import WHERE, with_role

__all__ = [
    "init_stuck",
    "job_will_miss_deadline",
    "outside_loop_alerts",
    "section_overdue",
    "version_skew",
]


def outside_loop_alerts(cfg: MixinConfig = DEFAULT) -> list[Alert]:
    """Return DDPInitStuck, DDPVersionSkew, DDPSectionOverdue and DDPJobWillMissDeadline."""
    return [init_stuck(cfg), version_skew(cfg), section_overdue(cfg), job_will_miss_deadline(cfg)]


def _init_stuck_expr(cfg: MixinConfig) -> str:
    """Return the ranks that never checked in (role=missing), else the runs still waiting."""
    c = clauses(cfg)
    rank = c.by("run, rank")
    started = f"max {rank} ({selector(cfg, catalog.INIT_STARTED.name)})"
    waited = f"(time() - {started} > {cfg.init_stuck_seconds:g})"
    arrived = selector(cfg, catalog.INIT_PEER_ARRIVED.name)
    not_arrived = f"max {c.by('run, rank, peer_rank')} ({arrived} == 0)"
    in_init = selector(cfg, catalog.INIT_PHASE.name, 'phase!="done"')
    in_init = f"max {rank} ({in_init})"
    missing = (
        f"max {rank} (\n  label_replace(\n"
        f"    {not_arrived} * 0\n    + {c.on('run, rank')} group_left ()\n    {waited},\n"
        '    "rank", "$1", "peer_rank", "(.*)"\n  )\n)'
    )
    waiting = (
        f"max {c.by('run')} (\n  {waited}\n  and {c.on('run, rank')}\n  {in_init}\n)\n"
        f"unless {c.on('run')}\n{missing}"
    )
    return f"{with_role(missing, 'missing')}\nor\n{with_role(waiting, 'waiting')}"


def init_stuck(cfg: MixinConfig = DEFAULT) -> Alert:
    """Return DDPInitStuck: name the ranks that never checked in, else the ranks still in init.

    The monitoring rank publishes ``ddp_init_peer_arrived`` 0 for peers that have not checked in
    through torchrun's store (role=missing names them: the others only wait for them). Without
    such peers (or without the store: srun), a run with ranks still in a phase other than done
    after ``init_stuck_seconds`` is one alert (role=waiting, a condition of the run).
    """
    return Alert(
        "DDPInitStuck",
        "critical",
        _init_stuck_expr(cfg),
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


def version_skew(cfg: MixinConfig = DEFAULT) -> Alert:
    """Return DDPVersionSkew: name the ranks in the minority on a version field."""
    r, c = recorded(cfg), clauses(cfg)
    fields = ", ".join(catalog.VERSION_LABELS)
    field = c.on("run, field")
    shared = f"{r.version} * 0\n+ {c.on('run, field, version')} group_left\n{r.version_ranks}"
    top = f"max {c.by('run, field')} ({r.version_ranks})"
    return Alert(
        "DDPVersionSkew",
        "warning",
        (
            # The minority: ranks whose version fewer ranks share than the most common one;
            # on a tie (say 2 against 2) there is no majority and every rank is named.
            f"(\n{shared}\n)\n< {field} group_left\n{top}\n"
            f"or\n(\n{shared}\n)\nand {field}\n"
            f"(\n  count {c.by('run, field')} (\n    {r.version_ranks}\n"
            f"    == {field} group_left\n    {top}\n  ) > 1\n)"
        ),
        cfg.version_skew_for,
        "Ranks of one run run different torch, Python, CUDA or NCCL versions.",
        (
            f"{WHERE.capitalize()} has {{{{ $labels.field }}}} {{{{ $labels.version }}}}, "
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
    )


def section_overdue(cfg: MixinConfig = DEFAULT) -> Alert:
    """Return DDPSectionOverdue: a declared section still running past its own deadline."""
    c = clauses(cfg)
    section = c.by("run, rank, section")
    started = selector(cfg, catalog.SECTION_STARTED.name)
    deadline = selector(cfg, catalog.SECTION_DEADLINE.name)
    return Alert(
        "DDPSectionOverdue",
        # Critical: a long checkpoint also stops steps (DDPTrainingStalled, critical), which
        # would otherwise inhibit the alert that names the actual section.
        "critical",
        (
            f"max {section} (time() - {started})\n"
            f"> {c.on('run, rank, section')}\nmax {section} ({deadline})"
        ),
        cfg.section_overdue_for,
        "A named section (exporter.deadline) is still running past its deadline.",
        (
            "Section {{ $labels.section }} on "
            f"{WHERE} has been running for {{{{ $value | humanizeDuration }}}}, past "
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
    )


def job_will_miss_deadline(cfg: MixinConfig = DEFAULT) -> Alert:
    """Return DDPJobWillMissDeadline: the projected finish is past the wall-clock limit."""
    r, c = recorded(cfg), clauses(cfg)
    deadline = selector(cfg, catalog.JOB_DEADLINE.name)
    margin = cfg.job_deadline_margin_seconds
    return Alert(
        "DDPJobWillMissDeadline",
        "warning",
        (
            f"topk {c.by('run')} (1, {r.projected_finish_rank})\n- {c.on('run')} group_left\n"
            f"min {c.by('run')} ({deadline})\n> {-margin:g}"
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
        "DDP_EXPORTER_JOB_DEADLINE) minus the margin. Slow or throttled instances, a "
        "straggler, a slow network or "
        f"input pipeline make a job miss a limit it was sized for. Margin: {margin:g}s.",
        "Overview dashboard: Time to finish vs deadline (the projection above the "
        "deadline line). Stragglers dashboard: whether one rank slows the job.",
        "Look for a concurrent DDPRankStraggler, DDPInputBound or DDPThroughputDrop and fix "
        "that cause. Otherwise make sure a checkpoint is written before the deadline "
        "(the job will be killed), and resubmit with a longer limit or more nodes.",
        scope="run",
    )
