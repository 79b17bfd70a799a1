"""Put the Prometheus rules in order and write the rule file: records, alerts, the fleet.

The recording rules are built by :mod:`exporter.mixin.recording`, the alerts by one module per
domain (:mod:`exporter.mixin.alerts`, the fleet's too), the fleet's records by
:mod:`exporter.mixin.fleet`; each reads one :class:`~exporter.mixin.config.MixinConfig`. This
module takes every alert's name from the domains, says which are one per run, and assembles
the groups.

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

from typing import Any

from .alert import Alert, selector
from .alerts.collectives import collective_alerts
from .alerts.fleet import fleet_alerts
from .alerts.goodput import goodput_alerts
from .alerts.gpu import gpu_alerts
from .alerts.hang_action import hang_action_alerts, restart_history
from .alerts.liveness import liveness_alerts
from .alerts.misconfigured import misconfigured_alert
from .alerts.outside_loop import outside_loop_alerts
from .alerts.performance import performance_alerts
from .alerts.shared import hang_location
from .config import DEFAULT, MixinConfig
from .fleet import fleet_records
from .recording import (
    BLAME_PHASES,
    RECORDING_GROUPS,
    Recorded,
    group_interval,
    recorded,
    recording_groups,
)
from .render import dump_yaml

__all__ = [
    "ALERT_NAMES",
    "BLAME_PHASES",
    "FLEET_ALERTS",
    "fleet_group",
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


def alerts(cfg: MixinConfig = DEFAULT) -> list[Alert]:
    """Return every per-run alert of ``cfg``, grouped by alert name in :data:`ALERT_NAMES` order."""
    return [
        *liveness_alerts(cfg),
        *collective_alerts(cfg),
        *hang_action_alerts(cfg),
        *performance_alerts(cfg),
        *gpu_alerts(cfg),
        *outside_loop_alerts(cfg),
        misconfigured_alert(cfg),
        *goodput_alerts(cfg),
    ]


def every_alert(cfg: MixinConfig = DEFAULT) -> list[Alert]:
    """Return the per-run alerts, then the fleet group's (the runbook's order, :data:`ALERT_NAMES`)."""
    return [*alerts(cfg), *fleet_alerts(cfg)]


#: Every alert the mixin defines, in the order of the runbook: as each domain registers them.
ALERT_NAMES: tuple[str, ...] = tuple(dict.fromkeys(a.name for a in every_alert()))


def _scoped(scope: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(a.name for a in every_alert() if a.scope == scope))


#: Alerts that are one per run (a condition of the whole run: no ``rank`` label), as their
#: domains declare them. The collective alerts are per rank for the ranks behind and per (run,
#: pg) when every rank waits.
RUN_ALERTS: tuple[str, ...] = _scoped("run")
#: Alerts about a node across runs: a ``node`` label, no run, no rank.
FLEET_ALERTS: tuple[str, ...] = _scoped("node")
#: Alerts about the monitoring itself (a Prometheus shard): an ``instance`` label, no run.
MONITORING_ALERTS: tuple[str, ...] = _scoped("monitoring")


def fleet_group(cfg: MixinConfig = DEFAULT) -> dict[str, Any]:
    """Return the fleet's rule group (its own evaluation interval): its records, then its alerts."""
    rules: list[dict[str, Any]] = [*fleet_records(cfg), *(a.rule(cfg) for a in fleet_alerts(cfg))]
    return {"name": "ddp-exporter.fleet", "interval": cfg.fleet_interval, "rules": rules}


def rule_groups(cfg: MixinConfig = DEFAULT) -> dict[str, Any]:
    """Return the rule file content: the recording groups, the alerts, then the fleet group.

    The fleet group (its own, longer interval) reads the alerts' ``ALERTS`` series. Every
    expression was written with the cluster label in its clauses
    (:class:`exporter.mixin.cluster.Clauses`).
    """
    recording = recording_groups(cfg)
    gpu = {a.name for a in gpu_alerts(cfg)}
    return {
        "groups": [
            *(_group(cfg, name, recording[name]) for name in RECORDING_GROUPS),
            {
                "name": "ddp-exporter.alerts",
                "rules": [a.rule(cfg) for a in alerts(cfg) if a.name not in gpu],
            },
            # A group of their own: a group stays small (at most 20 rules) to evaluate in time.
            {"name": "ddp-exporter.gpu", "rules": [a.rule(cfg) for a in gpu_alerts(cfg)]},
            fleet_group(cfg),
        ]
    }


def _group(cfg: MixinConfig, name: str, rules: list[dict[str, str]]) -> dict[str, Any]:
    """Return one recording group, with its own interval where it has one."""
    interval = group_interval(cfg, name)
    group: dict[str, Any] = {"name": f"ddp-exporter.{name}"}
    if interval is not None:
        group["interval"] = interval
    group["rules"] = rules
    return group


def render_rules(cfg: MixinConfig = DEFAULT) -> str:
    """Return the rules file as YAML text with the generated-file header."""
    return dump_yaml(rule_groups(cfg))
