"""Build the Fleet dashboard: which node keeps being blamed across runs (DDPSuspectNode).

It reads the fleet group's records (:mod:`exporter.mixin.fleet`); the run and rank variables
do not apply, the node variable does.
"""

from __future__ import annotations

from ..config import DEFAULT, MixinConfig
from ..fleet import fleet_recorded
from .panels import NODE, DashboardSpec, PanelSpec, Queries, Target

__all__ = ["TOP_CAUSES", "TOP_NODES", "TOP_SEEN", "dashboard"]

#: Nodes the bar of recent blame shows, most blamed first ...
TOP_NODES = 20
#: ... (node, cause) pairs the bar of blame by cause shows ...
TOP_CAUSES = 40
#: ... and nodes the table of runs seen and blamed lists.
TOP_SEEN = 50


def dashboard(cfg: MixinConfig = DEFAULT) -> DashboardSpec:
    """Return the Fleet dashboard of ``cfg``."""
    q, f = Queries(cfg), fleet_recorded(cfg)
    n, k, w = int(cfg.fleet_runs), int(cfg.fleet_blamed_runs), cfg.fleet_window
    suspects = q.filtered("ALERTS", 'alertname="DDPSuspectNode"', 'alertstate="firing"', NODE)
    return DashboardSpec(
        "fleet",
        "ddp-fleet",
        "DDP / Fleet",
        f"Nodes ranked by how often runs blamed them over {w} (DDPSuspectNode: blamed in {k} "
        f"of the last {n} runs). The run and rank variables do not apply here.",
        (
            PanelSpec(
                "Suspect nodes",
                (Target(suspects, "{{node}}"),),
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
                (Target(f"topk({TOP_NODES}, {q.filtered(f.recent_blamed, NODE)})", "{{node}}"),),
                kind="bargauge",
                max=n,
                thresholds=(("green", None), ("orange", 1), ("red", k)),
                needs="blame",
                description=(
                    f"Per node, how many of its last {n} runs blamed it (top {TOP_NODES}); red "
                    f"from {k}, where DDPSuspectNode fires."
                ),
            ),
            PanelSpec(
                "Runs blamed by cause",
                (
                    Target(
                        f"topk({TOP_CAUSES}, {q.filtered(f.cause_runs, NODE)})",
                        "{{node}} {{cause}}",
                    ),
                ),
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
                    Target(f"topk({TOP_SEEN}, {q.filtered(f.runs_seen, NODE)})", "{{node}} seen"),
                    Target(
                        f"topk({TOP_SEEN}, {q.filtered(f.runs_blamed, NODE)})", "{{node}} blamed"
                    ),
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
                        f"sort_desc({q.filtered(f.blamed, NODE)}\n"
                        f"and {q.on('node, run')}\n{f.blamed_alone})",
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
