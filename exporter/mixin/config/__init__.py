"""Hold every tunable of the monitoring mixin in one frozen dataclass, assembled from domains.

Thresholds, ``for`` durations, rate windows, label selectors and URLs live here; the rule,
dashboard, alerting and stack generators read them and nothing else. :data:`DEFAULT` is what the
committed files are rendered from. :data:`FAST` renders the SAME expressions with shorter
windows and ``for`` durations so that unit tests and fault drills finish in seconds.
Users with other collective timeouts or step times regenerate with their own instance, e.g.
``dataclasses.replace(DEFAULT, stalled_for="5m")``, ``--set`` or ``--config FILE``.

The generator also writes the configuration it used (:data:`CONFIG_FILE`, JSON), so that
``ddp-exporter top --config`` judges with exactly the thresholds of the rules: one set of
thresholds, read by both.

Each domain (its windows, thresholds, receivers, Kubernetes, fleet, goodput, shards, ...) is a
module of this package that declares its fields' defaults and checks their values, as
kubernetes-mixin's per-file config does; :class:`MixinConfig` joins them into one flat set of
fields.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...settings import duration_seconds
from .domain import Domain
from .durations import ForConfig
from .evaluation import EvaluationConfig
from .fleet import FleetConfig
from .goodput import GoodputConfig
from .kubernetes import KubernetesConfig
from .outside_loop import OutsideLoopConfig
from .receivers import ReceiverConfig
from .scrape import ScrapeConfig
from .shards import ShardConfig
from .sources import SourceConfig
from .thresholds import ThresholdConfig
from .windows import WindowConfig

__all__ = [
    "CONFIG_FILE",
    "DEFAULT",
    "DOMAINS",
    "FAST",
    "MixinConfig",
    "config_json",
    "duration_seconds",
    "load_config",
]

#: Where the generator writes the configuration it rendered from (relative to its output).
CONFIG_FILE = "dashboards/mixin.json"

#: The domains :class:`MixinConfig` is assembled from, in the order of its fields: the order of
#: dashboards/mixin.json and of the reference page's sections.
DOMAINS: tuple[type[Domain], ...] = (
    SourceConfig,
    WindowConfig,
    ThresholdConfig,
    ForConfig,
    EvaluationConfig,
    ScrapeConfig,
    ReceiverConfig,
    KubernetesConfig,
    OutsideLoopConfig,
    FleetConfig,
    GoodputConfig,
    ShardConfig,
)


# A dataclass collects its fields from the last base to the first (reverse MRO), so the bases
# are DOMAINS backwards: the fields then keep DOMAINS' order (tests/test_mixin_config.py).
@dataclass(frozen=True)
class MixinConfig(
    ShardConfig,
    GoodputConfig,
    FleetConfig,
    OutsideLoopConfig,
    KubernetesConfig,
    ReceiverConfig,
    ScrapeConfig,
    EvaluationConfig,
    ForConfig,
    ThresholdConfig,
    WindowConfig,
    SourceConfig,
):
    """Describe thresholds, durations and deployment settings of the generated monitoring.

    Every domain's fields, flat: ``MixinConfig(goodput_window="2h")``, ``cfg.stalled_for``.
    """

    #: The whole config stands under no one heading of the reference page.
    TITLE = ""

    def validate(self) -> None:
        """Run every domain's own checks, in the order of the fields."""
        # Each domain checks only its own fields; a check that spans two domains goes here,
        # after both of theirs.
        for domain in DOMAINS:
            domain.validate(self)


#: What the committed files are generated from.
DEFAULT = MixinConfig()

#: Same expressions, shorter windows and ``for`` durations: for promtool tests and drills. The
#: time threshold that must fit inside those windows (heartbeat staleness) shrinks with them;
#: every ratio and the hang definition stay the same.
FAST = MixinConfig(
    rate_window="20s",
    latency_window="1m",
    baseline_window="5m",
    hang_abort_window="1m",
    restart_loop_window="5m",
    gpu_error_window="1m",
    heartbeat_stale_seconds=15.0,
    straggler_for="30s",
    input_bound_for="30s",
    stalled_for="10s",
    timeout_for="0s",
    rank_down_for="10s",
    training_stalled_for="30s",
    training_startup_for="1m",
    gpu_memory_for="30s",
    throughput_for="30s",
    init_stuck_seconds=20.0,  # an init wait, shrunk like heartbeat staleness
    init_stuck_for="10s",
    scrape_interval="1s",
    evaluation_interval="1s",
    version_skew_for="5s",
    section_overdue_for="0s",
    eta_window="20s",
    job_deadline_margin_seconds=10.0,
    job_deadline_for="5s",
    misconfigured_for="5s",
    fleet_window="1h",
    fleet_runs=5,
    fleet_blamed_runs=2,
    fleet_interval="1s",
    fleet_carry="10s",
    suspect_node_for="0s",
    shard_down_for="5s",
    goodput_window="1m",
    goodput_long_window="5m",
    goodput_node_window="10m",
    goodput_interval="1s",
    goodput_for="30s",
)


def config_json(cfg: MixinConfig) -> str:
    """Return ``cfg`` as the JSON the generator writes next to the rules (every field)."""
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(MixinConfig)}
    return json.dumps({"ddp_exporter_mixin": fields}, indent=2) + "\n"


def config_from(data: Any, origin: str = "config") -> MixinConfig:
    """Return the config that ``data`` (a mapping of fields, as :func:`config_json` writes it,
    or bare) describes on top of :data:`DEFAULT`; raise ValueError naming a bad field."""
    if isinstance(data, dict) and "ddp_exporter_mixin" in data:
        data = data["ddp_exporter_mixin"]
    if not isinstance(data, dict):
        raise ValueError(f"{origin}: expected a mapping of MixinConfig fields")
    types = {f.name: f.type for f in dataclasses.fields(MixinConfig)}
    changes: dict[str, Any] = {}
    for name, value in data.items():
        if name not in types:
            raise ValueError(
                f"{origin}: unknown field {name!r} (fields: {', '.join(sorted(types))})"
            )
        want = types[name]
        if (
            want in (float, "float")
            and isinstance(value, (int, float))
            and not isinstance(value, bool)
        ):
            value = float(value)
        elif want in (int, "int") and isinstance(value, int) and not isinstance(value, bool):
            pass
        elif want in (str, "str") and isinstance(value, str):
            pass
        else:
            raise ValueError(f"{origin}: field {name!r} expects {want}, got {value!r}")
        changes[name] = value
    return dataclasses.replace(DEFAULT, **changes)


def load_config(path: str | Path) -> MixinConfig:
    """Read a configuration file written by the generator (or by hand, same JSON)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read the mixin config {path}: {exc}") from None
    return config_from(data, str(path))
