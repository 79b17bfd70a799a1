"""Build the Goodput dashboard: where a run's wall clock went, per run and per cluster.

It reads the goodput records (:mod:`exporter.mixin.recording`): ETTR over time, the badput
stacked by category, the whole run's account, and the ranks and nodes that cost the most time.
``ddp-exporter goodput`` prints the same account as a table.
"""

from __future__ import annotations

from ..config import DEFAULT, MixinConfig
from ..prose import spoken_duration
from ..recording import Recorded, recorded
from .panels import NODE, RUN, DashboardSpec, PanelSpec, Queries, Target

__all__ = ["TOP_COSTS", "dashboard"]

#: Ranks and nodes the cost panels list, costliest first.
TOP_COSTS = 10


def dashboard(cfg: MixinConfig = DEFAULT) -> DashboardSpec:
    """Return the Goodput dashboard of ``cfg``."""
    q, r = Queries(cfg), recorded(cfg)
    return DashboardSpec(
        "goodput",
        "ddp-goodput",
        "DDP / Goodput",
        "Where each run's wall clock went: productive training and each kind of badput, "
        "across restarts. ETTR is productive time over the wall clock.",
        (*_ettr(q, r), *_breakdown(q, r), *_costs(q, r)),
        time_from=f"now-{cfg.goodput_long_window}",
    )


def _ettr(q: Queries, r: Recorded) -> tuple[PanelSpec, ...]:
    """Return ETTR: of the whole run, over time per run, and per cluster."""
    cfg = q.cfg
    short, long = cfg.goodput_window, cfg.goodput_long_window
    floor = (("red", None), ("green", cfg.goodput_min_ettr))
    productive = q.filtered(r.goodput_short, RUN, 'category="productive"')
    every = q.filtered(r.goodput_short, RUN)
    return (
        PanelSpec(
            "ETTR, whole run",
            (Target(q.filtered(r.ettr, RUN), "{{run}}"),),
            kind="stat",
            unit="percentunit",
            width=6,
            min=0,
            max=1,
            thresholds=floor,
            description=(
                "Productive time over the wall clock since the run's first process started, "
                "across its restarts."
            ),
        ),
        PanelSpec(
            f"ETTR over {short} and {long}",
            (
                Target(q.filtered(r.ettr_short, RUN), f"{{{{run}}}} {short}"),
                Target(q.filtered(r.ettr_long, RUN), f"{{{{run}}}} {long}"),
            ),
            unit="percentunit",
            width=12,
            min=0,
            max=1,
            description=(
                f"Rolling ETTR over the last {spoken_duration(short)} and "
                f"{spoken_duration(long)}: productive over every category."
            ),
        ),
        PanelSpec(
            f"ETTR per cluster over {short}",
            (
                Target(
                    f"sum {q.by('')} ({productive})\n/\n(sum {q.by('')} ({every}) > 0)",
                    "{{cluster}}",
                ),
            ),
            unit="percentunit",
            width=6,
            min=0,
            max=1,
            description="ETTR of the selected runs together, per cluster.",
        ),
    )


def _breakdown(q: Queries, r: Recorded) -> tuple[PanelSpec, ...]:
    """Return the badput stacked over time and the whole run's account by category."""
    short = q.cfg.goodput_window
    badput = 'category!="productive"'
    return (
        PanelSpec(
            f"Badput over {short}, stacked by category",
            (Target(q.filtered(r.goodput_short, RUN, badput), "{{run}} {{category}}"),),
            kind="bars",
            unit="s",
            width=16,
            description=(
                f"Seconds of the last {spoken_duration(short)} lost to each kind of badput: "
                "startup, data, communication, straggler, checkpoint, evaluation, section, "
                "hang, restart, lost_work and other."
            ),
        ),
        PanelSpec(
            "Whole run by category",
            (Target(q.filtered(r.goodput, RUN), "{{run}} {{category}}"),),
            kind="bargauge",
            unit="s",
            width=8,
            description=(
                "Every second of the run since its first process started, by category; they "
                "add up to the wall clock (the same account `ddp-exporter goodput` prints)."
            ),
        ),
    )


def _costs(q: Queries, r: Recorded) -> tuple[PanelSpec, ...]:
    """Return the ranks and nodes that cost the most time (straggler, hang)."""
    cfg = q.cfg
    nodes, long = cfg.goodput_node_window, cfg.goodput_long_window
    per_node = f"{q.filtered(r.blame_node, NODE)} / 3600"
    per_rank = q.filtered(r.blame_long, RUN)
    return (
        PanelSpec(
            f"Nodes that cost the most hours over {nodes}",
            (Target(f"topk({TOP_COSTS}, {per_node})", "{{node}} {{category}}"),),
            kind="bargauge",
            unit="h",
            width=12,
            needs="blame",
            description=(
                f"Hours runs lost over the last {spoken_duration(nodes)} to a straggler or a "
                "hang on each node, whatever the run (the costliest first). Empty while no "
                "rank cost a run time."
            ),
        ),
        PanelSpec(
            f"Ranks that cost the most over {long}",
            (
                Target(
                    f"topk({TOP_COSTS}, {per_rank})",
                    "{{run}} rank {{culprit_rank}} ({{node}}) {{category}}",
                ),
            ),
            kind="bargauge",
            unit="s",
            width=12,
            needs="blame",
            description=(
                f"Seconds each rank cost its run over the last {spoken_duration(long)}: the "
                "time the other ranks waited for it (straggler) or the hang it was behind."
            ),
        ),
    )
