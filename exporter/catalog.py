"""Name every metric the exporter publishes, once.

This module is the single source of metric names, types, units, labels and help texts. The
exporter's collector, the OTLP bridge, the generated recording/alert rules, the dashboards and
the runbook all import these definitions; no metric name is typed anywhere else.
"""

from __future__ import annotations

from dataclasses import dataclass

from .settings import DEFAULT_PEER_SERIES

__all__ = [
    "BASE_LABELS",
    "COLLECTIVE_BUCKETS",
    "MetricDef",
    "METRICS",
    "PHASES",
    "PARALLELISMS",
    "COLLECTIVE_OPS",
    "COMM_TIMING_MODES",
    "INFLIGHT_SOURCES",
    "LABEL_HELP",
    "STEP_BUCKETS",
    "ERROR_WHERE",
    "RANK_INFO",
    "STEPS",
    "STEP_DURATION",
    "STEP_PHASE",
    "COLLECTIVE_DURATION",
    "COLLECTIVE_BYTES",
    "COLLECTIVE_UNTIMED",
    "LAST_ENQUEUED_SEQ",
    "LAST_COMPLETED_SEQ",
    "INFLIGHT_AGE",
    "COLLECTIVE_TIMEOUT",
    "HEARTBEAT",
    "PEER_HEARTBEAT_AGE",
    "PEERS_ENDED",
    "STORE_ROUND_TRIP",
    "GPU_MEM_ALLOCATED",
    "GPU_MEM_RESERVED",
    "GPU_MEM_PEAK",
    "GPU_MEM_TOTAL",
    "HOST_MEM_RESIDENT",
    "GPU_CLOCK_EVENT_REASONS",
    "GPU_INFO",
    "GPU_SM_CLOCK",
    "GPU_SM_CLOCK_MAX",
    "GPU_CLOCK_EVENT",
    "GPU_TEMPERATURE",
    "GPU_POWER",
    "GPU_POWER_LIMIT",
    "GPU_UTILIZATION",
    "GPU_ECC_ERRORS",
    "GPU_REMAPPED_ROWS",
    "GPU_RETIRED_PAGES",
    "GPU_PCIE_REPLAYS",
    "GPU_NVLINK_ERRORS",
    "GPU_XID_ERRORS",
    "GPU_LAST_XID",
    "GPU_HEALTH_METRICS",
    "gpu_health_series",
    "EXPORTER_ERRORS",
    "INVALID_SETTING",
    "HANG_LOCATION",
    "HANG_DUMPS",
    "HANG_NETWORK",
    "HANG_NETWORK_FINDINGS",
    "HANG_ABORT",
    "HANG_ABORT_STREAK",
    "HANG_ABORT_LIMIT",
    "HANG_ABORTED_ATTEMPT",
    "series_per_rank",
    "INIT_PHASES",
    "INIT_STARTED",
    "INIT_PHASE",
    "INIT_PEER_ARRIVED",
    "INIT_METRICS",
    "init_series_per_rank",
    "VERSION_LABELS",
    "SECTION_DEADLINE",
    "SECTION_ENDED",
    "SECTION_STARTED",
    "SECTION_LAST_DURATION",
    "SECTION_RUNS",
    "JOB_DEADLINE",
    "JOB_TOTAL_STEPS",
    "FINISHED",
    "GOODPUT_CATEGORIES",
    "GOODPUT",
    "GOODPUT_BLAME",
    "GOODPUT_STARTED",
]

#: Labels on every series the exporter publishes: the run keeps concurrent jobs apart.
BASE_LABELS: tuple[str, ...] = ("run", "rank")

#: Step phases; they add up to the step duration.
PHASES: tuple[str, ...] = ("data", "compute", "comm_wait", "optimizer")

#: Kinds of parallelism a rank reports (``ddp_rank_info{parallelism}``): a DDP model, FSDP2
#: (``fully_shard``), classic FSDP, another module of a distributed job, or no model.
PARALLELISMS: tuple[str, ...] = ("ddp", "fsdp2", "fsdp", "module", "none")

#: Values of the ``op`` label of the collective series: DDP's gradient buckets are
#: ``allreduce``; without DDP every ``torch.distributed`` collective is timed under its kind.
COLLECTIVE_OPS: tuple[str, ...] = (
    "allreduce",
    "allgather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "alltoall",
    "barrier",
)

#: Places where an exporter error can happen (bounded label set of ddp_exporter_errors_total).
ERROR_WHERE: tuple[str, ...] = (
    "comm_hook",
    "comm_timing",
    "dataloader",
    "optimizer",
    "step",
    "flight_recorder",
    "heartbeat",
    "memory",
    "collect",
    "discovery",
    "forensics",
    "section",
    "goodput",
    "gpu",
)

#: Where a run's time went (the ``category`` label of the goodput series): productive first, then
#: each kind of badput. What each means is defined once, in exporter.sources.goodput.categories.
GOODPUT_CATEGORIES: tuple[str, ...] = (
    "productive",
    "startup",
    "data",
    "communication",
    "straggler",
    "checkpoint",
    "evaluation",
    "section",
    "hang",
    "restart",
    "lost_work",
    "other",
)

#: Values of ``ddp_rank_info{comm_timing}``: what times this rank's communication. DDP's own
#: reducer timers, marks of each DDP iteration (CUDA events on a GPU), the timing comm hook, the
#: ``torch.distributed`` wrappers (FSDP2, FSDP, no model), or nothing (a comm hook of the user's
#: registered before ``instrument()`` in hook mode).
COMM_TIMING_MODES: tuple[str, ...] = ("reducer", "events", "hook", "collectives", "none")

#: Values of ``ddp_rank_info{inflight_source}``: where in-flight collective state comes from.
INFLIGHT_SOURCES: tuple[str, ...] = ("flight_recorder", "comm_hook")

#: What each label of the exporter's series means (the metrics reference page lists them).
LABEL_HELP: dict[str, str] = {
    "run": "The job: ``DDP_EXPORTER_RUN``, else torchrun's run id, Slurm's job id or "
    "``MASTER_ADDR:MASTER_PORT``. A restarted job keeps it.",
    "rank": "The global rank.",
    "local_rank": "The rank on its node (the endpoint's port is the base port plus it).",
    "node": "The machine the rank runs on: ``DDP_EXPORTER_NODE``, else the hostname.",
    "world_size": "Ranks in the job.",
    "backend": "The backend running the rank's collectives on its device, as torch names its "
    "implementation: ``gloo``, ``nccl``, or ``nccl2`` (torch's newer NCCL backend, which "
    "``nccl`` may build).",
    "device": "``cuda`` or ``cpu``.",
    "torch_version": "torch's version on this rank (DDPVersionSkew compares it across ranks).",
    "python_version": "Python's version (compared across ranks).",
    "cuda_version": "CUDA's version, ``none`` on a CPU build (compared across ranks).",
    "nccl_version": "NCCL's version, ``none`` on a CPU build (compared across ranks).",
    "exporter_version": "This package's version.",
    "inflight_source": "Where in-flight state comes from: "
    + ", ".join(f"``{v}``" for v in INFLIGHT_SOURCES)
    + " (the comm hook's bookkeeping: DDP's buckets only).",
    "comm_timing": "What times communication: "
    + ", ".join(f"``{v}``" for v in COMM_TIMING_MODES)
    + ". ``reducer``, ``events`` and ``hook`` time DDP; ``collectives`` every torch.distributed "
    "collective of a job without DDP; ``none``: not measured.",
    "parallelism": "What the rank trains: "
    + ", ".join(f"``{v}``" for v in PARALLELISMS)
    + " (DDP, FSDP2's ``fully_shard``, classic FSDP, another module, no model).",
    "attempt": "Which attempt of the run: torchrun's restart count, else Slurm's requeue count, "
    "plus ``DDP_EXPORTER_ATTEMPT``.",
    "phase": "A step phase: "
    + ", ".join(f"``{v}``" for v in PHASES)
    + "; they add up to the step time. On the init series: "
    "``store``, ``process_group``, ``done``.",
    "op": "The kind of collective: "
    + ", ".join(f"``{v}``" for v in COLLECTIVE_OPS)
    + " (DDP's gradient buckets are ``allreduce``).",
    "pg": "The process group (torch's name for it; ``0`` is the default group).",
    "peer_rank": "The peer a monitoring rank's series is about.",
    "where": "Where an exporter error was caught: "
    + ", ".join(f"``{v}``" for v in ERROR_WHERE)
    + ".",
    "variable": "The ``DDP_EXPORTER_*`` variable holding a value the exporter cannot use.",
    "file": "The source file where a hung rank's training thread is stuck.",
    "line": "Its line.",
    "function": "Its function.",
    "section": "The name given to ``exporter.deadline``.",
    "culprit_rank": "The rank a hang action blamed (empty for a symmetric hang); on the goodput "
    "blame series, the rank whose straggling or hang cost the time.",
    "finding": "What the hang probe found between the nodes: "
    + ", ".join(f"``{v}``" for v in ("link", "node", "clear"))
    + " (a link that carries no traffic, a node unreachable on its backend address, every pair "
    "reachable).",
    "peer_node": "The other end of a broken link (empty for a node or ``clear``).",
    "category": "Where a run's time went: "
    + ", ".join(f"``{v}``" for v in GOODPUT_CATEGORIES)
    + " (defined in ``exporter.sources.goodput.categories``).",
}

#: Histogram bounds (seconds) for whole training steps.
STEP_BUCKETS: tuple[float, ...] = (
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)

#: Histogram bounds (seconds) for one collective (a DDP bucket's allreduce, or an iteration's).
COLLECTIVE_BUCKETS: tuple[float, ...] = (
    0.0001,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    5.0,
    30.0,
)


@dataclass(frozen=True)
class MetricDef:
    """Describe one metric family: its exposition name, type, extra labels, unit and help."""

    name: str
    type: str  # "gauge" | "counter" | "histogram" | "summary" | "info"
    help: str
    labels: tuple[str, ...] = ()
    unit: str = ""
    buckets: tuple[float, ...] = ()

    @property
    def all_labels(self) -> tuple[str, ...]:
        """Return the labels of a sample, base labels first."""
        return BASE_LABELS + self.labels

    @property
    def family(self) -> str:
        """Return the family name prometheus_client expects (counters without ``_total``)."""
        if self.type == "counter" and self.name.endswith("_total"):
            return self.name[: -len("_total")]
        if self.type == "info" and self.name.endswith("_info"):
            return self.name[: -len("_info")]
        return self.name


RANK_INFO = MetricDef(
    "ddp_rank_info",
    "info",
    "Static facts about this rank; value is always 1.",
    (
        "local_rank",
        "node",
        "world_size",
        "backend",
        "device",
        "torch_version",
        "exporter_version",
        "inflight_source",
        "comm_timing",
        "parallelism",
        "python_version",
        "cuda_version",
        "nccl_version",
        "attempt",
    ),
)

#: Labels of ddp_rank_info that must agree on every rank of a run (DDPVersionSkew).
VERSION_LABELS: tuple[str, ...] = (
    "torch_version",
    "python_version",
    "cuda_version",
    "nccl_version",
)
STEPS = MetricDef("ddp_steps_total", "counter", "Training steps completed by this rank.")
STEP_DURATION = MetricDef(
    "ddp_step_duration_seconds",
    "histogram",
    "Wall time of one training step on this rank.",
    unit="seconds",
    buckets=STEP_BUCKETS,
)
STEP_PHASE = MetricDef(
    "ddp_step_phase_seconds",
    "summary",
    "Time spent per step phase: data (DataLoader wait), compute (everything not otherwise "
    "attributed), comm_wait (communication the training thread waited for), optimizer.",
    ("phase",),
    unit="seconds",
)
COLLECTIVE_DURATION = MetricDef(
    "ddp_collective_duration_seconds",
    "histogram",
    "Latency of collectives on this rank. DDP: one gradient bucket's collective from launch "
    "to completion (comm_timing hook), or one iteration's, first bucket launched to last "
    "completed (comm_timing reducer and events); other parallelism (FSDP2, FSDP, no model): each "
    "torch.distributed collective from call to completion, per kind (comm_timing collectives; "
    "see ddp_rank_info); with any parallelism, each functional collective (DTensor's: tensor "
    "parallelism, clip_grad_norm_ on DTensor parameters) from launch to the return of its wait. "
    "On a GPU without DDP: NCCL's own device time of each collective, where "
    "TORCH_NCCL_ENABLE_TIMING=1 is set (a sample: what the Flight Recorder holds at each read). "
    "A straggler shows the SHORTEST latency: its peers wait for it inside the collective.",
    ("op", "pg"),
    unit="seconds",
    buckets=COLLECTIVE_BUCKETS,
)
COLLECTIVE_BYTES = MetricDef(
    "ddp_collective_bytes_total",
    "counter",
    "Payload bytes of collectives launched by this rank: DDP's gradient buckets, or the input "
    "tensors of torch.distributed collectives (other parallelism) and of functional "
    "collectives (DTensor's).",
    ("op", "pg"),
    unit="bytes",
)
COLLECTIVE_UNTIMED = MetricDef(
    "ddp_collective_untimed_total",
    "counter",
    "Collectives this rank called that ended without a latency the exporter could observe, by "
    "kind and group: every one on a CUDA device (NCCL completes on the device), an "
    "asynchronous one never waited for (or consumed through its future), a functional "
    "collective whose wait it did not see (a compiled graph's), one that raised. Counted "
    "beside ddp_collective_duration_seconds_count, which counts the timed ones: their sum is "
    "every collective seen. A collective whose wait is not seen is not in comm_wait either.",
    ("op", "pg"),
)
LAST_ENQUEUED_SEQ = MetricDef(
    "ddp_collective_last_enqueued_seq",
    "gauge",
    "Sequence number of the last collective this rank entered in the process group.",
    ("pg",),
)
LAST_COMPLETED_SEQ = MetricDef(
    "ddp_collective_last_completed_seq",
    "gauge",
    "Sequence number of the last collective completed by this rank in the process group.",
    ("pg",),
)
INFLIGHT_AGE = MetricDef(
    "ddp_collective_inflight_age_seconds",
    "gauge",
    "Age of the oldest incomplete collective of the process group on this rank (0 when none).",
    ("pg",),
    unit="seconds",
)
COLLECTIVE_TIMEOUT = MetricDef(
    "ddp_collective_timeout_seconds",
    "gauge",
    "Configured collective timeout of the process group (the watchdog's budget).",
    ("pg",),
    unit="seconds",
)
HEARTBEAT = MetricDef(
    "ddp_heartbeat_timestamp_seconds",
    "gauge",
    "Unix time of this rank's last training progress (a step, a bucket, a batch).",
    unit="seconds",
)
PEERS_ENDED = MetricDef(
    "ddp_peers_ended",
    "gauge",
    "Ranks of the run whose heartbeat carries the clean-end mark, as the monitoring rank last "
    "read them: a rank whose endpoint is gone and is among them ended, it did not die. "
    "Published by the monitoring rank only.",
)
STORE_ROUND_TRIP = MetricDef(
    "ddp_store_round_trip_seconds",
    "gauge",
    "Seconds this rank's last c10d-store heartbeat (one add) took: a round trip to the store's "
    "node. A degraded or saturated link queues it behind the gradients: the ranks on a node "
    "whose link is slow show it inflated, the others do not.",
    unit="seconds",
)
PEER_HEARTBEAT_AGE = MetricDef(
    "ddp_peer_heartbeat_age_seconds",
    "gauge",
    "Seconds since the monitoring rank last saw each peer's c10d-store heartbeat change. "
    "Published by the monitoring rank only; survives a peer whose own endpoint is unreachable. "
    f"Every peer in jobs of up to DDP_EXPORTER_PEER_SERIES ({DEFAULT_PEER_SERIES}) ranks, else "
    "only late peers.",
    ("peer_rank",),
    unit="seconds",
)
GPU_MEM_ALLOCATED = MetricDef(
    "ddp_gpu_memory_allocated_bytes",
    "gauge",
    "GPU memory held by tensors on this rank's device.",
    unit="bytes",
)
GPU_MEM_RESERVED = MetricDef(
    "ddp_gpu_memory_reserved_bytes",
    "gauge",
    "GPU memory reserved by the caching allocator on this rank's device.",
    unit="bytes",
)
GPU_MEM_PEAK = MetricDef(
    "ddp_gpu_memory_peak_bytes",
    "gauge",
    "Peak GPU memory held by tensors on this rank's device since start.",
    unit="bytes",
)
GPU_MEM_TOTAL = MetricDef(
    "ddp_gpu_memory_total_bytes",
    "gauge",
    "Total memory of this rank's GPU.",
    unit="bytes",
)
HOST_MEM_RESIDENT = MetricDef(
    "ddp_process_resident_memory_bytes",
    "gauge",
    "Resident set size of this rank's process (host memory).",
    unit="bytes",
)
# GPU health (exporter.sources.gpu): NVML's readings of the rank's own GPU, at scrape time.
#: NVML's clock-event (throttle) reasons, in the order of their bits: the ``reason`` label.
GPU_CLOCK_EVENT_REASONS: tuple[str, ...] = (
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "sync_boost",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "display_clock_setting",
)
GPU_INFO = MetricDef(
    "ddp_rank_gpu_info",
    "info",
    "The GPU this rank runs on, as nvidia-smi and dcgm-exporter name it (join DCGM's series on "
    "gpu_uuid = UUID); value is always 1. Only with the gpu extra on a CUDA rank.",
    ("gpu_uuid", "pci_bus_id", "gpu_index", "gpu_name"),
)
GPU_SM_CLOCK = MetricDef(
    "ddp_gpu_sm_clock_hertz",
    "gauge",
    "Current SM (graphics) clock of this rank's GPU.",
    unit="hertz",
)
GPU_SM_CLOCK_MAX = MetricDef(
    "ddp_gpu_sm_clock_max_hertz",
    "gauge",
    "Highest SM clock this rank's GPU can run at.",
    unit="hertz",
)
GPU_CLOCK_EVENT = MetricDef(
    "ddp_gpu_clock_event_active",
    "gauge",
    "1 while the clock-event (throttle) reason holds this rank's GPU's clocks down, else 0: "
    f"NVML's reasons ({', '.join(GPU_CLOCK_EVENT_REASONS)}).",
    ("reason",),
)
GPU_TEMPERATURE = MetricDef(
    "ddp_gpu_temperature_celsius",
    "gauge",
    "Core temperature of this rank's GPU.",
    unit="celsius",
)
GPU_POWER = MetricDef(
    "ddp_gpu_power_watts",
    "gauge",
    "Power drawn by this rank's GPU.",
    unit="watts",
)
GPU_POWER_LIMIT = MetricDef(
    "ddp_gpu_power_limit_watts",
    "gauge",
    "Power limit the driver enforces on this rank's GPU.",
    unit="watts",
)
GPU_UTILIZATION = MetricDef(
    "ddp_gpu_utilization_ratio",
    "gauge",
    "Share of NVML's last sample period in which a kernel ran on this rank's GPU (0 to 1).",
)
GPU_ECC_ERRORS = MetricDef(
    "ddp_gpu_ecc_errors_total",
    "counter",
    "Memory ECC errors of this rank's GPU by error_type (corrected, uncorrected) and counter "
    "(volatile: since the driver loaded; aggregate: over the GPU's life).",
    ("error_type", "counter"),
)
GPU_REMAPPED_ROWS = MetricDef(
    "ddp_gpu_remapped_rows",
    "gauge",
    "Row remapping of this rank's GPU's memory: rows remapped for correctable and "
    "uncorrectable errors, and the pending (a remap waits for a GPU reset) and failure (a "
    "remap failed) flags, 0 or 1.",
    ("kind",),
)
GPU_RETIRED_PAGES = MetricDef(
    "ddp_gpu_retired_pages",
    "gauge",
    "Memory pages retired on this rank's GPU by cause (GPUs before row remapping).",
    ("cause",),
)
GPU_PCIE_REPLAYS = MetricDef(
    "ddp_gpu_pcie_replays_total",
    "counter",
    "PCIe replays of this rank's GPU: transfers repeated after link errors.",
)
GPU_NVLINK_ERRORS = MetricDef(
    "ddp_gpu_nvlink_errors_total",
    "counter",
    "NVLink data-link errors of this rank's GPU by kind (replay, recovery, crc_flit, "
    "crc_data), summed over its active links.",
    ("kind",),
)
GPU_XID_ERRORS = MetricDef(
    "ddp_gpu_xid_errors_total",
    "counter",
    "Xid events (critical driver errors) on this rank's GPU since the rank started.",
)
GPU_LAST_XID = MetricDef(
    "ddp_gpu_last_xid_timestamp_seconds",
    "gauge",
    "Unix time of the last Xid event on this rank's GPU, labelled with its Xid number.",
    ("xid",),
    unit="seconds",
)

#: The GPU health families, in the order they are served.
GPU_HEALTH_METRICS: tuple[MetricDef, ...] = (
    GPU_INFO,
    GPU_SM_CLOCK,
    GPU_SM_CLOCK_MAX,
    GPU_CLOCK_EVENT,
    GPU_TEMPERATURE,
    GPU_POWER,
    GPU_POWER_LIMIT,
    GPU_UTILIZATION,
    GPU_ECC_ERRORS,
    GPU_REMAPPED_ROWS,
    GPU_RETIRED_PAGES,
    GPU_PCIE_REPLAYS,
    GPU_NVLINK_ERRORS,
    GPU_XID_ERRORS,
    GPU_LAST_XID,
)


def gpu_health_series(*, retirement: bool = False, nvlink: bool = False) -> int:
    """Return the most GPU health series one rank serves (every field supported).

    Formula: 1 info + 2 clocks + 9 clock-event reasons + temperature + power + its limit +
    utilization + 4 ECC counters + 4 row-remapping figures + 1 PCIe replays + 1 Xid count
    (+ 2 retired-page causes on GPUs before row remapping, + 4 NVLink error kinds with NVLink,
    + 1 last Xid once one happened). A field the GPU does not support is not served.
    """
    return 17 + len(GPU_CLOCK_EVENT_REASONS) + 2 * retirement + 4 * nvlink


EXPORTER_ERRORS = MetricDef(
    "ddp_exporter_errors_total",
    "counter",
    "Errors inside the exporter, caught so that training goes on, by place.",
    ("where",),
)
INVALID_SETTING = MetricDef(
    "ddp_exporter_invalid_setting_info",
    "info",
    "An environment variable of the exporter holds a value it cannot use (named by the "
    "variable label, one of exporter.settings.SETTINGS; the rank's log has the value): the "
    "default is used instead and training goes on. Present only while so; value is always 1.",
    ("variable",),
)
HANG_LOCATION = MetricDef(
    "ddp_hang_location_info",
    "info",
    "Where this rank is stuck (innermost frame of its training thread in user code), published "
    "by the culprit of a hang episode until it progresses again; value is always 1.",
    ("file", "line", "function"),
)
#: Values of ``ddp_hang_network_info{finding}``.
HANG_NETWORK_FINDINGS: tuple[str, ...] = ("link", "node", "clear")
HANG_NETWORK = MetricDef(
    "ddp_hang_network_info",
    "info",
    "What the hang watcher's probe found between the nodes while every rank waited inside a "
    "collective with nobody behind, published by the monitoring rank until the collective "
    "completes: finding=link (node and peer_node: a link that carries no traffic), node (node: "
    "unreachable from every peer on its backend address) or clear (every pair of nodes "
    "reachable and moving data: not the network); value is always 1.",
    ("finding", "node", "peer_node"),
)
HANG_DUMPS = MetricDef(
    "ddp_hang_dumps_total",
    "counter",
    "Hang dumps this rank wrote (one per hang episode; see ddp-exporter hangs DIR).",
)
HANG_ABORT = MetricDef(
    "ddp_hang_abort_timestamp_seconds",
    "gauge",
    'Unix time the hang action (instrument(on_hang="abort")) decided to end the run, published '
    "by every rank that then exits; culprit_rank names the (lowest) rank behind and node the "
    "machine it runs on (both empty for a symmetric hang). Present only in the rank's last "
    "scrapes, which it waits for briefly before exit.",
    ("culprit_rank", "node"),
    unit="seconds",
)
HANG_ABORT_STREAK = MetricDef(
    "ddp_hang_aborts_without_progress",
    "gauge",
    "Hang-action aborts of this run in a row whose attempts made no progress (the first "
    "included; 0 once the attempt passes the furthest step of the aborted ones), from the "
    "run's restart ledger. Monitoring rank, with on_hang=abort. At ddp_hang_abort_limit the "
    "action stops: the last abort exits with the give-up code, later hangs only alert and dump.",
)
HANG_ABORT_LIMIT = MetricDef(
    "ddp_hang_abort_limit",
    "gauge",
    "Aborts in a row without progress after which the hang action stops "
    "(DDP_EXPORTER_ABORT_LIMIT; 0: never). Monitoring rank, with on_hang=abort.",
)
HANG_ABORTED_ATTEMPT = MetricDef(
    "ddp_hang_aborted_attempt_step",
    "gauge",
    "Furthest step an earlier attempt of this run reached before the hang action aborted it "
    "(its resumed step plus the steps it completed), with its culprit rank and node; one series "
    "per aborted attempt, the latest 10. Monitoring rank, with on_hang=abort.",
    ("attempt", "culprit_rank", "node"),
)
SECTION_DEADLINE = MetricDef(
    "ddp_section_deadline_seconds",
    "gauge",
    "Deadline of a named section (exporter.deadline); of the run due first while one runs.",
    ("section",),
    unit="seconds",
)
SECTION_STARTED = MetricDef(
    "ddp_section_started_timestamp_seconds",
    "gauge",
    "Unix start time of the running section (the run due first); absent while none runs.",
    ("section",),
    unit="seconds",
)
SECTION_ENDED = MetricDef(
    "ddp_section_ended_timestamp_seconds",
    "gauge",
    "Unix end time of the section's last run that ended within its deadline: the ranks it held "
    "up in a collective wait from then, not from the collective's start. Absent before one has.",
    ("section",),
    unit="seconds",
)
SECTION_LAST_DURATION = MetricDef(
    "ddp_section_last_duration_seconds",
    "gauge",
    "Wall time of the section's last finished run.",
    ("section",),
    unit="seconds",
)
SECTION_RUNS = MetricDef(
    "ddp_section_runs_total",
    "counter",
    "Finished runs of the section.",
    ("section",),
)
JOB_DEADLINE = MetricDef(
    "ddp_job_deadline_timestamp_seconds",
    "gauge",
    "Unix time at which the job's wall-clock limit ends it (SLURM_JOB_END_TIME or "
    "DDP_EXPORTER_JOB_DEADLINE); absent when unknown.",
    unit="seconds",
)
FINISHED = MetricDef(
    "ddp_finished_timestamp_seconds",
    "gauge",
    "Unix time this rank ended cleanly (the exporter closed at the end of training, not on an "
    "error); present only in the rank's final scrapes, which it waits for briefly before exit. "
    "A rank that stops reporting without it was killed or crashed.",
    unit="seconds",
)
JOB_TOTAL_STEPS = MetricDef(
    "ddp_job_total_steps",
    "gauge",
    "Steps this process is to run in total (instrument(total_steps=...) or DataLoader length "
    "x epochs), in the unit of ddp_steps_total; absent when unknown.",
)

GOODPUT = MetricDef(
    "ddp_goodput_seconds_total",
    "counter",
    "The run's wall clock by where it went, from the first process start of its first attempt: "
    "productive training (each step once, at the healthy pace) and each kind of badput; the "
    "categories add up to the wall clock. Published by the monitoring rank, carried across the "
    "run's attempts (a restarted attempt goes on from the previous one's account).",
    ("category",),
    unit="seconds",
)
GOODPUT_BLAME = MetricDef(
    "ddp_goodput_blame_seconds_total",
    "counter",
    "The part of a goodput category that one rank cost the run: straggler (the time the other "
    "ranks waited for it) and hang (the hang it was behind), with the node it runs on. Published "
    "by the monitoring rank, only for ranks that cost time.",
    ("category", "culprit_rank", "node"),
    unit="seconds",
)
GOODPUT_STARTED = MetricDef(
    "ddp_goodput_started_timestamp_seconds",
    "gauge",
    "Unix time the run's account starts: the first process start of its first attempt. "
    "Published by the monitoring rank.",
    unit="seconds",
)

#: Every metric family, in exposition order.
METRICS: tuple[MetricDef, ...] = (
    RANK_INFO,
    STEPS,
    STEP_DURATION,
    STEP_PHASE,
    COLLECTIVE_DURATION,
    COLLECTIVE_BYTES,
    COLLECTIVE_UNTIMED,
    LAST_ENQUEUED_SEQ,
    LAST_COMPLETED_SEQ,
    INFLIGHT_AGE,
    COLLECTIVE_TIMEOUT,
    HEARTBEAT,
    STORE_ROUND_TRIP,
    PEER_HEARTBEAT_AGE,
    PEERS_ENDED,
    GPU_MEM_ALLOCATED,
    GPU_MEM_RESERVED,
    GPU_MEM_PEAK,
    GPU_MEM_TOTAL,
    HOST_MEM_RESIDENT,
    *GPU_HEALTH_METRICS,
    EXPORTER_ERRORS,
    INVALID_SETTING,
    HANG_LOCATION,
    HANG_NETWORK,
    HANG_DUMPS,
    HANG_ABORT,
    HANG_ABORT_STREAK,
    HANG_ABORT_LIMIT,
    HANG_ABORTED_ATTEMPT,
    SECTION_DEADLINE,
    SECTION_STARTED,
    SECTION_ENDED,
    SECTION_LAST_DURATION,
    SECTION_RUNS,
    JOB_DEADLINE,
    JOB_TOTAL_STEPS,
    FINISHED,
    GOODPUT,
    GOODPUT_BLAME,
    GOODPUT_STARTED,
)

#: Init phases of exporter.watch_init(), in order (bounded label set of ddp_init_phase_*).
INIT_PHASES: tuple[str, ...] = ("store", "process_group", "done")

INIT_STARTED = MetricDef(
    "ddp_init_started_timestamp_seconds",
    "gauge",
    "Unix time this rank called exporter.watch_init(), before init_process_group. Published "
    "until exporter.instrument() takes over the endpoint.",
    unit="seconds",
)
INIT_PHASE = MetricDef(
    "ddp_init_phase_timestamp_seconds",
    "gauge",
    "Unix time this rank entered its current init phase, one series labelled with the phase: "
    "store (checking in through the launcher's store), process_group (waiting for "
    "init_process_group), done (the process group exists). Published until "
    "exporter.instrument() takes over the endpoint.",
    ("phase",),
    unit="seconds",
)
INIT_PEER_ARRIVED = MetricDef(
    "ddp_init_peer_arrived",
    "gauge",
    "1 when the peer has checked in through torchrun's agent store during init, 0 while it has "
    "not. Monitoring rank only, until its process group exists. Every peer in jobs of up to "
    f"DDP_EXPORTER_PEER_SERIES ({DEFAULT_PEER_SERIES}) ranks, else only late peers.",
    ("peer_rank",),
)

#: The init watch's families (exporter.initwatch), published before instrument() only.
INIT_METRICS: tuple[MetricDef, ...] = (INIT_STARTED, INIT_PHASE, INIT_PEER_ARRIVED)

# Appended here rather than listed above: the init families are defined after METRICS.
METRICS = METRICS + INIT_METRICS


def init_series_per_rank(
    *, monitor: bool = False, world_size: int = 1, peer_series: int = DEFAULT_PEER_SERIES
) -> int:
    """Return how many series one rank exposes while exporter.watch_init() serves it.

    Formula: 1 started + 1 phase + len(ERROR_WHERE) errors + on the monitoring rank
    min(world_size, peer_series) peer arrivals (an upper bound beyond peer_series ranks). These
    series stop when instrument() takes over, so :func:`series_per_rank` does not change.
    """
    n = 2 + len(ERROR_WHERE)
    if monitor:
        n += min(world_size, peer_series)
    return n


def series_per_rank(
    *,
    process_groups: int = 1,
    gpu: bool = False,
    monitor: bool = False,
    world_size: int = 1,
    peer_series: int = DEFAULT_PEER_SERIES,
    sections: int = 0,
    job_deadline: bool = False,
    total_steps: bool = False,
    hang_action: bool = False,
    store_heartbeat: bool = True,
    timed_collectives: int = 1,
) -> int:
    """Return how many series one rank exposes by default.

    Formula: 1 info + 1 steps + (len(STEP_BUCKETS)+3) step histogram + 2*4 phases
    + per process group [(len(COLLECTIVE_BUCKETS)+3) collective histogram + 1 bytes + 1 untimed
    + 4 in-flight gauges] + 1 heartbeat (+ 1 store round trip with the store heartbeat)
    + len(ERROR_WHERE) errors + 1 hang dumps + 1 host RSS (+ 4 GPU memory gauges on CUDA)
    + on the monitoring rank min(world_size, peer_series) peer ages (an upper bound beyond
    peer_series ranks: only late peers are published there), 1 count of the ranks that ended,
    len(GOODPUT_CATEGORIES) goodput categories and the account's start. The in-flight gauges
    cover every process group the Flight Recorder reports; the collective histogram, bytes and
    untimed count cover each ``timed_collectives`` (op, pg) pair: DDP's process group (1), or,
    without DDP, every kind of collective per group the job calls (FSDP2: all-gather and
    reduce-scatter per group, 2; an HSDP mesh adds the replicate group's all-reduce, 3; tensor
    parallelism adds an all-reduce on its group, and clip_grad_norm_ one per mesh dimension).
    Opt-in: at most 5 per named section (deadline, runs, last duration once one finished, end
    time once one ended within its deadline, start time while one runs; at most 16 names), 1
    job deadline, 1 total steps; with ``on_hang="abort"`` the monitoring rank adds 2 (aborts
    without progress, their limit) and one per earlier aborted attempt of the run (at most 10). Not counted: the hang location (on a
    culprit during an episode), the finished timestamp (in the final scrapes) and the abort
    timestamp (in a leaving rank's last scrapes), an invalid setting (one series per variable
    holding a value the exporter cannot use), the hang probe's findings (on the monitoring rank
    during a hang with nobody behind: one per broken link, at most 8, or per node), the goodput
    blame (on the monitoring rank: one series per rank and category that cost the run time).
    """
    n = 1 + 1 + (len(STEP_BUCKETS) + 3) + 2 * len(PHASES) + 1 + len(ERROR_WHERE)
    # histogram + bytes + untimed per (op, pg)
    n += ((len(COLLECTIVE_BUCKETS) + 3) + 2) * timed_collectives
    n += 4 * process_groups
    n += 1  # host RSS, on every rank
    n += 1  # hang dumps; the hang location exists only on a culprit during an episode
    n += int(store_heartbeat)
    if gpu:
        n += 4
    if monitor:
        n += min(world_size, peer_series) + 1  # peer heartbeat ages; the ranks that ended
        n += len(GOODPUT_CATEGORIES) + 1  # the run's goodput account and its start
    n += 5 * sections + int(job_deadline) + int(total_steps)
    if hang_action and monitor:
        n += 2
    return n
