"""Build the Stragglers dashboard: where each rank's step time goes.

The straggler has the tallest compute or data bar; the ranks waiting for it have the tallest
comm_wait bar. A slow link shows as one rank's store round trips far above the run's median.
"""

from __future__ import annotations

from ... import catalog
from ..config import DEFAULT, MixinConfig
from ..recording import BLAME_PHASES, Recorded, recorded
from .panels import RUN, TOP_RANKS, DashboardSpec, PanelSpec, Queries, Target

__all__ = ["dashboard"]

_RANKS = "rank {{rank}}"


def dashboard(cfg: MixinConfig = DEFAULT) -> DashboardSpec:
    """Return the Stragglers dashboard of ``cfg``."""
    q, r = Queries(cfg), recorded(cfg)
    return DashboardSpec(
        "stragglers",
        "ddp-stragglers",
        "DDP / Stragglers",
        "Where each rank's step time goes. The straggler has the tallest compute or data bar; "
        "the ranks waiting for it have the tallest comm_wait bar.",
        (*_phases(q, r), *_waiting(q, r)),
    )


def _phases(q: Queries, r: Recorded) -> tuple[PanelSpec, ...]:
    """Return the phase panels: the most loaded ranks' split, compute and data vs median."""
    cfg = q.cfg
    phases = "|".join(catalog.PHASES)
    phase_sel = f'phase=~"{phases}"'
    median = "median {{run}}"
    return (
        PanelSpec(
            f"Phase time per step, {TOP_RANKS} most loaded ranks",
            (
                # Recorded phases of the ranks with the highest straggler score only: all
                # 4 x 4096 series were > 1 s to return and unreadable as a stack.
                Target(
                    f"{q.rec(r.phase_mean, phase_sel)}\n"
                    f"and {q.on('run, rank')}\ntopk {q.by('run')} ({TOP_RANKS}, "
                    f"{q.rec(r.straggler_score)})",
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
                Target(q.rec(r.phase_mean, 'phase="compute"'), _RANKS),
                Target(q.filtered(r.phase_median, RUN, 'phase="compute"'), median),
            ),
            description=(
                "Compute time per step of each rank against the run's median rank (in a run "
                "of two ranks, the faster one); the straggler is above the median line."
            ),
            unit="s",
        ),
        PanelSpec(
            "Data wait per step vs run median",
            (
                Target(q.rec(r.phase_mean, 'phase="data"'), _RANKS),
                Target(q.filtered(r.phase_median, RUN, 'phase="data"'), median),
            ),
            description=(
                "Time per step each rank waits for its dataloader against the run's "
                "median rank (in a run of two ranks, the faster one); an input-bound rank is "
                "above it."
            ),
            unit="s",
        ),
        PanelSpec(
            "Phase share of the step, by rank",
            (Target(q.rec(r.phase_share), "rank {{rank}} {{phase}}"),),
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
    )


def _waiting(q: Queries, r: Recorded) -> tuple[PanelSpec, ...]:
    """Return the blame ratio, the comm wait and the store round trips (a slow link)."""
    cfg = q.cfg
    blame = "|".join(BLAME_PHASES)
    return (
        PanelSpec(
            "Compute/data ratio to the run median",
            (Target(q.rec(r.phase_ratio, f'phase=~"{blame}"'), "rank {{rank}} {{phase}}"),),
            description=f"Alerts above {cfg.straggler_ratio:g} (DDPRankStraggler).",
        ),
        PanelSpec(
            "Comm wait per step (waiting for a straggler or the network)",
            (Target(q.mean(catalog.STEP_PHASE, "run, rank", 'phase="comm_wait"'), _RANKS),),
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
                    f"topk {q.by('run')} ({TOP_RANKS}, {q.rec(r.store_rtt_rank)})",
                    "rank {{rank}}",
                ),
                Target(q.filtered(r.store_rtt_run, RUN), "median {{run}}"),
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
    )
