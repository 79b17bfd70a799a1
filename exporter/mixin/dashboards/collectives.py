"""Build the Collectives dashboard: latency, bytes, in-flight age, the lag of a hung rank.

Also the hang action's record of a run: its aborts without progress against the limit, and
each aborted attempt's culprit.
"""

from __future__ import annotations

from ... import catalog
from ..config import DEFAULT, MixinConfig
from ..recording import Recorded, recorded
from .panels import DashboardSpec, PanelSpec, Queries, Target

__all__ = ["dashboard"]

_PER_OP = "rank {{rank}} {{op}} pg {{pg}}"
_PER_PG = "rank {{rank}} pg {{pg}}"


def dashboard(cfg: MixinConfig = DEFAULT) -> DashboardSpec:
    """Return the Collectives dashboard of ``cfg``."""
    q, r = Queries(cfg), recorded(cfg)
    return DashboardSpec(
        "collectives",
        "ddp-collectives",
        "DDP / Collectives",
        "Collectives: latency, bytes, in-flight age against the timeout, and the "
        "sequence-number lag that names a hung rank. DDP: its gradient buckets (op allreduce); "
        "FSDP2, FSDP and loops without DDP: every torch.distributed collective by kind (op "
        "allgather, reduce_scatter, ...; ddp_rank_info{parallelism} says which).",
        (*_latency(q, r), *_stuck(q, r), *_restarts(q)),
    )


def _latency(q: Queries, r: Recorded) -> tuple[PanelSpec, ...]:
    """Return the latency and bytes panels per rank, op and process group."""
    by = "run, rank, op, pg"
    return (
        PanelSpec(
            "Collective latency (mean) per rank and pg",
            (Target(q.mean(catalog.COLLECTIVE_DURATION, by), _PER_OP),),
            unit="s",
            description="A straggler shows the SHORTEST latency: its peers wait for it.",
        ),
        PanelSpec(
            "Collective latency p90 per rank and pg",
            (Target(q.rec(r.coll_p90_rank), _PER_OP),),
            description=("90th percentile of collective latency per rank, op and process group."),
            unit="s",
        ),
        PanelSpec(
            "Collective bytes/s per rank and pg",
            (Target(q.rate(catalog.COLLECTIVE_BYTES, by), _PER_OP),),
            description=(
                "Bytes per second sent per rank, op and process group: DDP's gradient "
                "buckets, or (other parallelism) the input tensors of its collectives."
            ),
            unit="Bps",
        ),
    )


def _stuck(q: Queries, r: Recorded) -> tuple[PanelSpec, ...]:
    """Return the in-flight age against the timeout and the sequence numbers of each rank."""
    cfg = q.cfg
    rank_pg = q.by("run, rank, pg")
    return (
        PanelSpec(
            "In-flight age vs timeout budget",
            (
                Target(
                    f"max {rank_pg} ({q.series(catalog.INFLIGHT_AGE)})",
                    "age rank {{rank}} pg {{pg}}",
                ),
                Target(
                    f"max {q.by('run, pg')} ({q.series(catalog.COLLECTIVE_TIMEOUT)})",
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
            (Target(q.rec(r.inflight_ratio_rank), _PER_PG),),
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
            (Target(q.rec(r.seq_behind), _PER_PG),),
            description="Collectives a rank has not entered yet. A hung rank's lag stays "
            "above 0 while the others' in-flight age grows.",
        ),
        PanelSpec(
            "Last enqueued / completed sequence number",
            (
                Target(
                    f"max {rank_pg} ({q.series(catalog.LAST_ENQUEUED_SEQ)})",
                    "enqueued rank {{rank}} pg {{pg}}",
                ),
                Target(
                    f"max {rank_pg} ({q.series(catalog.LAST_COMPLETED_SEQ)})",
                    "completed rank {{rank}} pg {{pg}}",
                ),
            ),
            description=(
                "Collective sequence numbers per rank and process group; a rank whose "
                "numbers stop is stuck."
            ),
            width=24,
        ),
    )


def _restarts(q: Queries) -> tuple[PanelSpec, ...]:
    """Return the hang action's panels: aborts without progress, each aborted attempt."""
    run = q.by("run")
    return (
        PanelSpec(
            "Restarts: attempt, hang aborts without progress, limit",
            (
                Target(
                    f"max {run} ({q.series(catalog.HANG_ABORT_STREAK)})",
                    "aborts without progress {{run}}",
                ),
                Target(f"max {run} ({q.series(catalog.HANG_ABORT_LIMIT)})", "limit {{run}}"),
                Target(
                    f"count {q.by('run, attempt')} ({q.series(catalog.RANK_INFO)})",
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
                    f"max {q.by('run, attempt, culprit_rank, node')} "
                    f"({q.series(catalog.HANG_ABORTED_ATTEMPT)})",
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
    )
