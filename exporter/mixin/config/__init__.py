"""Hold every tunable of the monitoring mixin in one frozen dataclass.

Thresholds, ``for`` durations, rate windows, label selectors and URLs live here; the rule,
dashboard, alerting and stack generators read them and nothing else. :data:`DEFAULT` is what the
committed files are rendered from. :data:`FAST` renders the SAME expressions with shorter
windows and ``for`` durations so that unit tests and fault drills finish in seconds.
Users with other collective timeouts or step times regenerate with their own instance, e.g.
``dataclasses.replace(DEFAULT, stalled_for="5m")``, ``--set`` or ``--config FILE``.

The generator also writes the configuration it used (:data:`CONFIG_FILE`, JSON), so that
``ddp-exporter top --config`` judges with exactly the thresholds of the rules: one set of
thresholds, read by both.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...hangs.definition import DEFAULT_POLICY, HangPolicy
from ...settings import DEFAULT_PORT, duration_seconds
from ...version import RUNBOOK_URL

__all__ = [
    "CONFIG_FILE",
    "DEFAULT",
    "FAST",
    "MixinConfig",
    "config_json",
    "duration_seconds",
    "load_config",
]

#: Where the generator writes the configuration it rendered from (relative to its output).
CONFIG_FILE = "dashboards/mixin.json"


@dataclass(frozen=True)
class MixinConfig:
    """Describe thresholds, durations and deployment settings of the generated monitoring."""

    # --- where the data comes from -------------------------------------------------------------
    #: Prometheus job name of the exporter's scrape targets (also used in ``up`` selectors).
    job: str = "ddp"
    #: Extra label matchers added to every exporter selector, e.g. ``'cluster="a"'``; empty = none.
    selector: str = ""
    #: The label that tells clusters apart (kubernetes-mixin's ``clusterLabel``): kept in every
    #: aggregation and vector match of the rules and dashboards, a variable on every dashboard,
    #: and in Alertmanager's grouping. Usually an external label of each cluster's Prometheus,
    #: so it is absent where one Prometheus sees one cluster. Empty: no cluster label at all.
    cluster_label: str = "cluster"

    # --- rate windows (also part of recording-rule names) ---------------------------------------
    #: Window of per-step means and step rates.
    rate_window: str = "1m"
    #: Window of the "normal" collective latency a stall is compared with.
    latency_window: str = "5m"
    #: How far back "recent past" reaches (throughput baseline, normal latency, vanished ranks).
    baseline_window: str = "30m"
    #: How long DDPHangAborted fires after the hang action ended a run, and how long DDPJobKilled
    #: gives such a run to come back (the launcher's restart) before it says the run is gone.
    hang_abort_window: str = "10m"
    #: How long DDPRestartLoop keeps firing after the last report of a run whose hang action
    #: stopped (the run is usually gone: nobody requeues it); at least ``baseline_window``, so
    #: that DDPJobKilled never calls such a run killed.
    restart_loop_window: str = "1h"

    # --- thresholds ----------------------------------------------------------------------------
    #: A rank is a straggler when its compute (or data) time per step exceeds this multiple of
    #: the run's median over ranks ...
    straggler_ratio: float = 1.5
    #: ... and exceeds the median by at least this many seconds per step (ignores tiny phases).
    straggler_min_excess_seconds: float = 0.02
    #: A rank's link is slow (DDPRankStraggler cause=link) when its median c10d-store round
    #: trip exceeds this multiple of the run's median ...
    link_rtt_ratio: float = 5.0
    #: ... and this many seconds (a loopback or LAN round trip is well under a millisecond) ...
    link_min_rtt_seconds: float = 0.01
    #: ... while more than this share of its step is exposed communication (the job waits).
    link_comm_share: float = 0.3
    #: Share of a rank's step spent waiting for data that makes it input-bound.
    input_bound_share: float = 0.4
    #: In-flight age above this multiple of the run's normal collective latency is a stall ...
    #: (the one hang definition, :mod:`exporter.hangs.definition`, shared with ``top`` and the
    #: hang watcher)
    stall_latency_factor: float = DEFAULT_POLICY.stall_latency_factor
    #: ... provided it also exceeds this many seconds (and this is the bound when no latency
    #: baseline exists yet).
    stall_min_seconds: float = DEFAULT_POLICY.stall_min_seconds
    #: In-flight age as a fraction of the collective timeout: warning and critical levels.
    timeout_warning_ratio: float = 0.5
    #: ... (DDPCollectiveTimeoutImminent warns at the first, is critical at the second).
    timeout_critical_ratio: float = 0.8
    #: Peer heartbeat age (seen by the monitoring rank) after which a rank counts as down.
    heartbeat_stale_seconds: float = 60.0
    #: GPU reserved memory as a fraction of total that raises DDPGPUMemoryNearLimit.
    gpu_memory_ratio: float = 0.92
    #: A straggler's GPU is throttled (DDPGPUThrottledStraggler reason=low_clock) when its SM
    #: clock runs below this fraction of the run's median.
    gpu_clock_ratio: float = 0.85
    #: How long DDPGPUError fires after a GPU's Xid event, uncorrectable ECC error or failed
    #: row remap (the window its counters are read over).
    gpu_error_window: str = "15m"
    #: Steps/s below this fraction of the rank's average over ``baseline_window`` is a drop.
    throughput_drop_ratio: float = 0.5
    #: Seconds a rank may spend between exporter.watch_init() and its process group existing
    #: before DDPInitStuck names it (or, when peers never checked in, names those peers).
    init_stuck_seconds: float = 300.0

    # --- for durations: how long a condition must hold before its alert fires ----------------
    #: DDPRankStraggler.
    straggler_for: str = "5m"
    #: DDPInputBound.
    input_bound_for: str = "10m"
    #: DDPCollectiveStalled.
    stalled_for: str = "1m"
    #: DDPCollectiveTimeoutImminent.
    timeout_for: str = "15s"
    #: DDPRankDown.
    rank_down_for: str = "1m"
    #: DDPTrainingStalled.
    training_stalled_for: str = "5m"
    #: DDPGPUMemoryNearLimit.
    gpu_memory_for: str = "5m"
    #: DDPThroughputDrop.
    throughput_for: str = "10m"
    #: DDPInitStuck.
    init_stuck_for: str = "1m"

    # --- evaluation and deployment -------------------------------------------------------------
    #: Scrape interval of the generated Prometheus config ...
    scrape_interval: str = "5s"
    #: ... and its rule evaluation interval.
    evaluation_interval: str = "5s"
    #: Base URL of the generated runbook; each alert links to ``<base>#<anchor>``. The default
    #: is the runbook in the project's repository; point it at your own copy (the generator
    #: writes one, docs/runbook.md) where people on call read it.
    runbook_base_url: str = RUNBOOK_URL

    # --- ranks served over TLS or with a password (DDP_EXPORTER_WEB_CONFIG, docs/security.md) --
    #: ``https``: the ranks serve TLS; the generated scrape jobs verify them against
    #: ``scrape_ca_file`` (their /sd and file_sd targets say https themselves).
    scrape_scheme: str = "http"
    #: The CA that signed the ranks' certificates: a path on the Prometheus server.
    scrape_ca_file: str = ""
    #: Prometheus's client certificate and its key, for ranks that require one: paths on the
    #: Prometheus server.
    scrape_cert_file: str = ""
    scrape_key_file: str = ""
    #: The name the ranks' certificates carry, where it is not the address scraped (a
    #: PodMonitor scrapes pod IPs): every rank's certificate names it.
    scrape_server_name: str = ""
    #: Basic authentication: the user, and a file on the Prometheus server holding its password
    #: (a password never goes into the generated files).
    scrape_username: str = ""
    scrape_password_file: str = ""
    #: Kubernetes: the Secret (in ``k8s_namespace``) the PodMonitor reads the same from, keys
    #: ``ca.crt`` (where ``scrape_ca_file`` is set), ``tls.crt`` and ``tls.key`` (where
    #: ``scrape_cert_file`` is), ``username`` and ``password``.
    k8s_scrape_secret: str = "ddp-exporter-scrape"

    # --- who gets the alerts (exporter.deploy.alertmanager); none set: the stack's printer ----
    #: A webhook of your own that gets every alert (Alertmanager's webhook JSON).
    webhook_url: str = ""
    #: A Slack incoming-webhook URL: every alert, to the channel the webhook posts to.
    slack_webhook_url: str = ""
    #: A PagerDuty Events v2 integration (routing) key: critical alerts page.
    pagerduty_routing_key: str = ""
    #: E-mail address(es, comma-separated) for critical and warning alerts; needs
    #: ``email_smarthost``.
    email_to: str = ""
    #: SMTP server ``host:port`` that sends the e-mail (STARTTLS required, as Alertmanager's
    #: default is).
    email_smarthost: str = ""
    #: Sender address of the e-mail (default: alertmanager@ the recipient's domain).
    email_from: str = ""
    #: Fixed uid of the Prometheus datasource, so provisioned dashboards resolve it.
    datasource_uid: str = "ddp-prometheus"
    #: Grafana dashboard refresh interval.
    dashboard_refresh: str = "10s"

    # --- Kubernetes (deploy/kubernetes/, see docs/kubernetes.md) ---------------------------------
    #: Training processes per pod: the PodMonitor scrapes ``base_port + 0 .. ranks_per_pod - 1``.
    ranks_per_pod: int = 8
    #: The exporter's base port (``DDP_EXPORTER_PORT``; each rank serves base + LOCAL_RANK).
    base_port: int = DEFAULT_PORT
    #: Namespace of the PodMonitor, PrometheusRule and dashboard ConfigMaps.
    k8s_namespace: str = "monitoring"
    #: ``release`` label kube-prometheus-stack selects PodMonitors and rules by (its Helm release).
    k8s_release: str = "kube-prometheus-stack"
    #: ``key=value`` pod label that marks training pods to scrape (any namespace).
    k8s_pod_selector: str = "ddp-exporter/scrape=true"
    #: Pod labels tried in order for a target's ``run`` label (comma-separated).
    k8s_run_labels: str = (
        "ddp-exporter/run,training.kubeflow.org/job-name,jobset.sigs.k8s.io/jobset-name"
    )
    #: Pod labels tried in order for a target's ``node_rank`` label (comma-separated).
    k8s_node_rank_labels: str = "ddp-exporter/node-rank,batch.kubernetes.io/job-completion-index"

    # --- outside the training loop: versions, sections, the job's deadline --------------------
    #: How long ranks of one run must disagree on a version before DDPVersionSkew fires (ranks
    #: of a restarting job briefly mix old and new processes).
    version_skew_for: str = "2m"
    #: DDPSectionOverdue fires this long after a running section passed its own deadline.
    section_overdue_for: str = "0s"
    #: Window of the step rate that projects the job's finish time (long: an ETA, not a blip).
    eta_window: str = "15m"
    #: DDPJobWillMissDeadline fires when the projected finish is later than the job's deadline
    #: minus this many seconds (time to checkpoint and resubmit before the kill).
    job_deadline_margin_seconds: float = 1800.0
    #: How long the projection must miss before DDPJobWillMissDeadline fires.
    job_deadline_for: str = "10m"
    #: How long a rank must report a variable it cannot use before DDPExporterMisconfigured.
    misconfigured_for: str = "1m"

    # --- the fleet: which node keeps being the culprit across runs (exporter.mixin.fleet) -----
    #: How long the fleet rules remember a run on a node and what it was blamed for.
    fleet_window: str = "7d"
    #: DDPSuspectNode: a node blamed in at least ``fleet_blamed_runs`` of its last
    #: ``fleet_runs`` distinct runs (within ``fleet_window``), each time with most of the run's
    #: other nodes not blamed.
    fleet_runs: int = 10
    #: (see ``fleet_runs``)
    fleet_blamed_runs: int = 3
    #: Evaluation interval of the fleet group. Its records carry their state from one
    #: evaluation to the next (cheap at any fleet size) ...
    fleet_interval: str = "1m"
    #: ... over at most this gap: a Prometheus outage longer than this forgets the fleet's
    #: history (the rules count again from then on).
    fleet_carry: str = "30m"
    #: How long a node must meet the definition before DDPSuspectNode fires.
    suspect_node_for: str = "15m"

    # --- goodput: where a run's wall clock went (exporter.sources.goodput) --------------------
    #: Rolling window of ETTR per run and per cluster, which DDPGoodputLow judges ...
    goodput_window: str = "1h"
    #: ... and the longer rolling window of ETTR (the published anchors use an hour and a day).
    goodput_long_window: str = "1d"
    #: How far back the Goodput dashboard ranks the nodes that cost runs the most time.
    goodput_node_window: str = "7d"
    #: Evaluation interval of the goodput records (rolling windows of hours need no more).
    goodput_interval: str = "1m"
    #: DDPGoodputLow: productive time below this share of the run's unplanned time (its wall
    #: clock less startup and declared sections, which their own alerts judge) ...
    goodput_min_ettr: float = 0.85
    #: ... over ``goodput_window``, for this long; judged only once the window holds at least
    #: this share of its length in unplanned time (a run's first minutes, or a window spent in
    #: declared sections, are not judged on a few seconds of jitter).
    goodput_for: str = "15m"
    goodput_min_evidence: float = 0.5

    # --- past one Prometheus: shards under a global server (exporter.deploy.sharding) ---------
    #: Prometheus shards the generated sharded deployment (deploy/sharded/) splits runs over.
    shards: int = 2
    #: Job name of the global server's federation scrape of the shards.
    federate_job: str = "ddp-federate"
    #: DDPShardDown: how long the global server may fail to read a shard.
    shard_down_for: str = "2m"

    def __post_init__(self) -> None:
        """Reject malformed durations and inverted timeout levels early."""
        if self.cluster_label and not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", self.cluster_label):
            raise ValueError(f"cluster_label is not a label name: {self.cluster_label!r}")
        if self.cluster_label in ("run", "rank", "node", "pg", "job", "instance", "le"):
            raise ValueError(f"cluster_label {self.cluster_label!r} is a label the rules use")
        for name in (
            "rate_window",
            "latency_window",
            "baseline_window",
            "hang_abort_window",
            "restart_loop_window",
            "gpu_error_window",
            "scrape_interval",
            "evaluation_interval",
        ):
            if duration_seconds(getattr(self, name)) <= 0:
                raise ValueError(f"{name} must be positive")
        for name in (
            "straggler_for",
            "input_bound_for",
            "stalled_for",
            "timeout_for",
            "rank_down_for",
            "training_stalled_for",
            "gpu_memory_for",
            "throughput_for",
            "init_stuck_for",
        ):
            duration_seconds(getattr(self, name))
        for name in (
            "version_skew_for",
            "section_overdue_for",
            "job_deadline_for",
            "misconfigured_for",
        ):
            duration_seconds(getattr(self, name))
        for name in ("fleet_window", "fleet_interval", "fleet_carry"):
            if duration_seconds(getattr(self, name)) <= 0:
                raise ValueError(f"{name} must be positive")
        duration_seconds(self.suspect_node_for)
        duration_seconds(self.shard_down_for)
        self._check_goodput()
        if not 1 <= int(self.shards) <= 1024:
            raise ValueError(f"shards must be in 1..1024: {self.shards}")
        if duration_seconds(self.restart_loop_window) < duration_seconds(self.baseline_window):
            # A run given up must not be called killed once DDPRestartLoop resolves.
            raise ValueError("restart_loop_window must be at least baseline_window")
        if duration_seconds(self.fleet_carry) < 2 * duration_seconds(self.fleet_interval):
            raise ValueError("fleet_carry must be at least twice fleet_interval")
        if duration_seconds(self.fleet_window) < duration_seconds(self.fleet_carry):
            raise ValueError("fleet_window must be at least fleet_carry")
        if not 1 <= int(self.fleet_blamed_runs) <= int(self.fleet_runs):
            raise ValueError("need 1 <= fleet_blamed_runs <= fleet_runs")
        if duration_seconds(self.eta_window) <= 0:
            raise ValueError("eta_window must be positive")
        if self.job_deadline_margin_seconds < 0:
            raise ValueError("job_deadline_margin_seconds must be >= 0")
        if not 0 < self.timeout_warning_ratio < self.timeout_critical_ratio <= 1:
            raise ValueError("need 0 < timeout_warning_ratio < timeout_critical_ratio <= 1")
        self.hang_policy  # noqa: B018 - validates the stall thresholds
        if not 1 <= int(self.ranks_per_pod) <= 64 or not 0 < int(self.base_port) <= 65535:
            raise ValueError("need 1 <= ranks_per_pod <= 64 and a base_port in 1..65535")
        if int(self.base_port) + int(self.ranks_per_pod) - 1 > 65535:
            raise ValueError("base_port + ranks_per_pod - 1 exceeds 65535")
        self._check_receivers()
        self._check_scrape()
        if not re.fullmatch(r"[\w./-]+=[\w.-]*", self.k8s_pod_selector):
            raise ValueError(f"k8s_pod_selector must be key=value: {self.k8s_pod_selector!r}")

    def _check_goodput(self) -> None:
        windows = (
            "goodput_window",
            "goodput_long_window",
            "goodput_node_window",
            "goodput_interval",
        )
        for name in windows:
            if duration_seconds(getattr(self, name)) <= 0:
                raise ValueError(f"{name} must be positive")
        duration_seconds(self.goodput_for)
        if duration_seconds(self.goodput_long_window) <= duration_seconds(self.goodput_window):
            raise ValueError("goodput_long_window must be longer than goodput_window")
        if not 0 < self.goodput_min_ettr < 1:
            raise ValueError(f"goodput_min_ettr must be in (0, 1): {self.goodput_min_ettr}")
        if not 0 < self.goodput_min_evidence <= 1:
            raise ValueError(f"goodput_min_evidence must be in (0, 1]: {self.goodput_min_evidence}")

    def _check_scrape(self) -> None:
        if self.scrape_scheme not in ("http", "https"):
            raise ValueError(f"scrape_scheme must be http or https: {self.scrape_scheme!r}")
        if bool(self.scrape_cert_file) != bool(self.scrape_key_file):
            raise ValueError("scrape_cert_file and scrape_key_file go together")
        if bool(self.scrape_username) != bool(self.scrape_password_file):
            raise ValueError("scrape_username and scrape_password_file go together")
        tls_only = self.scrape_ca_file or self.scrape_cert_file or self.scrape_server_name
        if self.scrape_scheme == "http" and tls_only:
            raise ValueError(
                "scrape_ca_file, scrape_cert_file and scrape_server_name need scrape_scheme https"
            )

    def _check_receivers(self) -> None:
        for name in ("webhook_url", "slack_webhook_url"):
            url = getattr(self, name)
            if url and not re.fullmatch(r"https?://\S+", url):
                raise ValueError(f"{name} must be an http(s):// URL: {url!r}")
        if self.email_to and not self.email_smarthost:
            raise ValueError("email_to needs email_smarthost (the SMTP server, host:port)")
        if self.email_smarthost and not re.fullmatch(r"\S+:\d+", self.email_smarthost):
            raise ValueError(f"email_smarthost must be host:port: {self.email_smarthost!r}")
        for name in ("email_to", "email_from"):
            for address in filter(None, getattr(self, name).split(",")):
                if not re.fullmatch(r"[^@\s,]+@[^@\s,]+", address.strip()):
                    raise ValueError(f"{name} is not an e-mail address: {address!r}")

    @property
    def receivers_set(self) -> bool:
        """Say whether any receiver of one's own is configured (else the stack's printer)."""
        return bool(
            self.webhook_url
            or self.slack_webhook_url
            or self.pagerduty_routing_key
            or self.email_to
        )

    @property
    def hang_policy(self) -> HangPolicy:
        """Return the hang definition these rules encode (``top`` and the hang watcher use it too)."""
        return HangPolicy(
            stall_latency_factor=self.stall_latency_factor,
            stall_min_seconds=self.stall_min_seconds,
        )


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
