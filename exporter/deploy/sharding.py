"""Split the monitoring over Prometheus shards under one global server.

At fleet scale one Prometheus cannot hold every rank (docs/performance.md: the capacity plan). The
per-run rules need every rank of a run on one server, the fleet rules need every run's
accusations on one server. So:

- **shards** scrape the ranks, each keeping the runs whose ``run`` label hashes to it
  (``hashmod`` over ``run`` after discovery: a run's ranks, wherever they are discovered, land
  on one shard) and evaluate the per-run groups, paging for their runs themselves;
- **the global server** federates from every shard exactly what the fleet group reads (the
  firing accusations :data:`~exporter.mixin.fleet.FLEET_INPUT_ALERTS` and ``ddp_rank_info``,
  one series per rank) and evaluates the fleet group: DDPSuspectNode once for the fleet.

Federation rather than remote write: the global server pulls, so a shard it cannot read is an
``up == 0`` of its own (DDPShardDown) rather than a silence; the selection lives in one
generated file; shards need no receiver flag and no queue tuning. It carries a few series per
rank at the fleet interval, far inside what federation serves. Each shard's
``external_labels`` (``shard``, and the cluster label if set) reach the global server on the
federated series; the fleet rules aggregate them away (``by (cluster, node, run)``).
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Sequence
from typing import Any

from .. import catalog
from ..mixin.config import DEFAULT, MixinConfig
from ..mixin.fleet import FLEET_INPUT_ALERTS
from ..mixin.render import dump_yaml
from ..mixin.rules import fleet_group, rule_groups
from .stack import prometheus_config

__all__ = [
    "SHARD_LABEL",
    "federate_matchers",
    "global_config",
    "global_rule_groups",
    "render_sharded",
    "shard_config",
    "shard_of",
    "shard_relabel",
    "shard_rule_groups",
]

#: External label naming a shard on everything it federates.
SHARD_LABEL = "shard"
#: A temporary target label (dropped after relabelling: ``__tmp`` prefix).
_HASH_LABEL = "__tmp_ddp_shard"


def shard_of(run: str, shards: int) -> int:
    """Return the shard Prometheus's ``hashmod`` puts ``run`` on (md5, low 8 bytes, mod)."""
    digest = hashlib.md5(run.encode(), usedforsecurity=False).digest()
    return int.from_bytes(digest[8:], "big") % shards


def shard_relabel(index: int, shards: int) -> list[dict[str, Any]]:
    """Return the relabelling that keeps the targets of the runs that hash to ``index``."""
    if not 0 <= index < shards:
        raise ValueError(f"shard {index} is not in 0..{shards - 1}")
    return [
        {
            "source_labels": ["run"],
            "modulus": shards,
            "target_label": _HASH_LABEL,
            "action": "hashmod",
        },
        {"source_labels": [_HASH_LABEL], "regex": str(index), "action": "keep"},
    ]


def shard_rule_groups(cfg: MixinConfig = DEFAULT) -> dict[str, Any]:
    """Return the rule groups a shard evaluates: every group but the fleet's."""
    fleet = fleet_group(cfg)["name"]
    return {"groups": [g for g in rule_groups(cfg)["groups"] if g["name"] != fleet]}


def global_rule_groups(cfg: MixinConfig = DEFAULT) -> dict[str, Any]:
    """Return the rule groups the global server evaluates: the fleet group only."""
    fleet = fleet_group(cfg)["name"]
    return {"groups": [g for g in rule_groups(cfg)["groups"] if g["name"] == fleet]}


def federate_matchers(cfg: MixinConfig = DEFAULT) -> list[str]:
    """Return the ``match[]`` selectors the global server federates (the fleet's inputs)."""
    names = "|".join(FLEET_INPUT_ALERTS)
    info = f"{catalog.RANK_INFO.name}{{{cfg.selector}}}" if cfg.selector else catalog.RANK_INFO.name
    return [f'ALERTS{{alertname=~"{names}", alertstate="firing"}}', info]


def shard_config(
    cfg: MixinConfig,
    index: int,
    shards: int,
    base: dict[str, Any],
    *,
    external_labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Return ``base`` (a Prometheus config scraping the ranks) made shard ``index`` of ``shards``.

    The exporter's job keeps only its runs' targets; ``external_labels`` gains ``shard`` (and
    whatever is given, e.g. the cluster label's value).
    """
    out = copy.deepcopy(base)
    jobs = [job for job in out["scrape_configs"] if job["job_name"] == cfg.job]
    if not jobs:
        raise ValueError(f"no scrape job {cfg.job!r} in the base config to shard")
    for job in jobs:
        job["relabel_configs"] = [*job.get("relabel_configs", []), *shard_relabel(index, shards)]
    labels = dict(out["global"].get("external_labels", {}))
    labels.update(external_labels or {})
    labels[SHARD_LABEL] = str(index)
    out["global"]["external_labels"] = labels
    return out


def global_config(
    cfg: MixinConfig,
    shard_targets: Sequence[str],
    *,
    rule_files: Sequence[str],
    alertmanagers: Sequence[str] = (),
    interval: str | None = None,
) -> dict[str, Any]:
    """Return the global server's config: federate the fleet's inputs from every shard."""
    if not shard_targets:
        raise ValueError("the global server needs at least one shard to federate")
    out = prometheus_config(
        cfg,
        rule_files=rule_files,
        alertmanagers=alertmanagers,
        scrape_interval=interval or cfg.fleet_interval,
        evaluation_interval=interval or cfg.fleet_interval,
    )
    out["scrape_configs"] = [
        {
            "job_name": cfg.federate_job,
            # Keep the shards' labels (run, rank, node, alertname, shard, cluster) as they are.
            "honor_labels": True,
            "metrics_path": "/federate",
            "params": {"match[]": federate_matchers(cfg)},
            "static_configs": [{"targets": list(shard_targets)}],
        }
    ]
    return out


def render_sharded(cfg: MixinConfig = DEFAULT) -> dict[str, str]:
    """Return the sharded deployment's files (``deploy/sharded/``): ``cfg.shards`` shards."""
    shards = int(cfg.shards)
    base = prometheus_config(
        cfg,
        rule_files=("/etc/prometheus/rules-shard.yml",),
        alertmanagers=("alertmanager:9093",),
    )
    root = "deploy/sharded"
    out = {
        f"{root}/rules-shard.yml": dump_yaml(shard_rule_groups(cfg)),
        f"{root}/rules-global.yml": dump_yaml(global_rule_groups(cfg)),
        f"{root}/prometheus-global.yml": dump_yaml(
            global_config(
                cfg,
                [f"prometheus-shard-{i}:9090" for i in range(shards)],
                rule_files=("/etc/prometheus/rules-global.yml",),
                alertmanagers=("alertmanager:9093",),
            )
        ),
    }
    for i in range(shards):
        out[f"{root}/prometheus-shard-{i}.yml"] = dump_yaml(shard_config(cfg, i, shards, base))
    return out
