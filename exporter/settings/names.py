"""Name every variable the exporter reads (its own, OpenTelemetry's, the launchers') and the defaults."""

from __future__ import annotations

import re

# -- the exporter's own variables ------------------------------------------------------------
PORT = "DDP_EXPORTER_PORT"
ADDR = "DDP_EXPORTER_ADDR"
RUN = "DDP_EXPORTER_RUN"
HEARTBEAT_S = "DDP_EXPORTER_HEARTBEAT_S"
MONITOR_RANK = "DDP_EXPORTER_MONITOR_RANK"
PEER_SERIES = "DDP_EXPORTER_PEER_SERIES"
FLIGHT_RECORDER = "DDP_EXPORTER_FLIGHT_RECORDER"
COMM_TIMING = "DDP_EXPORTER_COMM_TIMING"
DUMP_DIR = "DDP_EXPORTER_DUMP_DIR"
ADVERTISE_ADDR = "DDP_EXPORTER_ADVERTISE_ADDR"
FILE_SD = "DDP_EXPORTER_FILE_SD"
JOB_DEADLINE = "DDP_EXPORTER_JOB_DEADLINE"
FINAL_SCRAPE_S = "DDP_EXPORTER_FINAL_SCRAPE_S"
ON_HANG = "DDP_EXPORTER_ON_HANG"
ABORT_AFTER_S = "DDP_EXPORTER_ABORT_AFTER_S"
ABORT_EXIT_CODE = "DDP_EXPORTER_ABORT_EXIT_CODE"
ABORT_LIMIT = "DDP_EXPORTER_ABORT_LIMIT"
ABORT_PROGRESS_STEPS = "DDP_EXPORTER_ABORT_PROGRESS_STEPS"
GIVE_UP_EXIT_CODE = "DDP_EXPORTER_GIVE_UP_EXIT_CODE"
ATTEMPT = "DDP_EXPORTER_ATTEMPT"
NODE = "DDP_EXPORTER_NODE"
HANG_PROBE = "DDP_EXPORTER_HANG_PROBE"
GPU_HEALTH = "DDP_EXPORTER_GPU_HEALTH"
DEVICE_WAIT_EVERY = "DDP_EXPORTER_DEVICE_WAIT_EVERY"
WEB_CONFIG = "DDP_EXPORTER_WEB_CONFIG"
# Set by ``ddp-exporter run`` for the command it runs (exporter.autorun).
AUTORUN = "DDP_EXPORTER_AUTORUN"
# Where ``ddp-exporter run`` finds Prometheus, Alertmanager and Grafana, when not on PATH.
PROMETHEUS_BINARY = "DDP_EXPORTER_PROMETHEUS_BINARY"
ALERTMANAGER_BINARY = "DDP_EXPORTER_ALERTMANAGER_BINARY"
GRAFANA_BINARY = "DDP_EXPORTER_GRAFANA_BINARY"
# Test-only: versions ``ddp-exporter doctor`` reports instead of the real ones (see above).
DOCTOR_FAKE_VERSIONS = "DDP_EXPORTER_DOCTOR_FAKE_VERSIONS"

# -- OpenTelemetry's standard variables (exporter.export.otlp); the SDK reads the rest ------
OTEL_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
OTEL_METRICS_ENDPOINT = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"
OTEL_METRIC_EXPORT_INTERVAL = "OTEL_METRIC_EXPORT_INTERVAL"
OTEL_METRIC_EXPORT_TIMEOUT = "OTEL_METRIC_EXPORT_TIMEOUT"
OTEL_SDK_DISABLED = "OTEL_SDK_DISABLED"

# -- set by launchers (torchrun, Slurm); read, never written ---------------------------------
RANK = "RANK"
LOCAL_RANK = "LOCAL_RANK"
WORLD_SIZE = "WORLD_SIZE"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
TORCHELASTIC_RUN_ID = "TORCHELASTIC_RUN_ID"
# "True" when torchrun's agent hosts the store at MASTER_ADDR:MASTER_PORT before the workers
# start (exporter.watch_init and the doctor check in there); the restart count keeps attempts
# apart.
TORCHELASTIC_USE_AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"
TORCHELASTIC_RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
# How many restarts torchrun may make (``--max-restarts``): 0 means an abort ends the job.
TORCHELASTIC_MAX_RESTARTS = "TORCHELASTIC_MAX_RESTARTS"
# Read by torchrun's c10d rendezvous: "1" gives every attempt a store of its own, hosted by rank
# 0, instead of the agent's store shared by all attempts (exporter.sources.launcher).
TORCH_DISABLE_SHARE_RDZV_TCP_STORE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
SLURM_JOB_ID = "SLURM_JOB_ID"
# How often Slurm requeued the job (the attempt of a requeued run).
SLURM_RESTART_COUNT = "SLURM_RESTART_COUNT"
# Set by Slurm 23.02+ in the job's environment (Unix time the job's time limit ends it).
SLURM_JOB_END_TIME = "SLURM_JOB_END_TIME"
# Read by gloo and NCCL; the doctor checks that they name interfaces that exist.
GLOO_SOCKET_IFNAME = "GLOO_SOCKET_IFNAME"
NCCL_SOCKET_IFNAME = "NCCL_SOCKET_IFNAME"

# -- defaults ----------------------------------------------------------------------------------
#: Base port; rank ``LOCAL_RANK`` serves on ``DEFAULT_PORT + LOCAL_RANK``. Outside the
#: 9100-9999 range that Prometheus exporters have allocated among themselves.
DEFAULT_PORT = 19400
DEFAULT_ADDR = "0.0.0.0"
DEFAULT_HEARTBEAT_S = 5.0
#: Longest heartbeat accepted: a slower one watches nothing, and a wait that long overflows.
MAX_HEARTBEAT_S = 3600.0
#: Most peer-heartbeat series the monitoring rank publishes by default (``peer_series``).
DEFAULT_PEER_SERIES = 64
#: Steps between two whose collective waits are timed on the device (CUDA without DDP).
DEFAULT_DEVICE_WAIT_EVERY = 8
#: Where dumps go unless ``dump_dir=`` / ``DDP_EXPORTER_DUMP_DIR`` say otherwise (relative to
#: the working directory of each rank).
DEFAULT_DUMP_DIR = "ddp-exporter-dumps"
#: Most seconds a rank that ends cleanly waits for its scrapers to read its final state.
DEFAULT_FINAL_SCRAPE_S = 10.0
#: How DDP's communication is timed (``instrument(comm_timing=...)``).
COMM_TIMING_CHOICES: tuple[str, ...] = ("auto", "reducer", "events", "hook")
#: What a hang may do besides alerting and dumping (``instrument(on_hang=...)``).
ON_HANG_CHOICES: tuple[str, ...] = ("off", "abort")
#: Seconds a hang whose evidence is complete lasts before the ``abort`` action ends the run:
#: twice the stall floor (10 s), past the time its dumps take (about 14 s) and a straggler late
#: by 15 s, far below any process-group timeout (incomplete evidence waits 1.5x as long).
DEFAULT_ABORT_AFTER_S = 20.0
#: EX_TEMPFAIL (sysexits.h): a temporary failure, the caller is invited to retry.
DEFAULT_ABORT_EXIT_CODE = 75
#: Aborts in a row without progress before the action stops (NVIDIA's fault-tolerance launcher
#: gives up after 3 cycles without checkpoint progress).
DEFAULT_ABORT_LIMIT = 3
#: Steps past the furthest of the earlier attempts that make an attempt's progress.
DEFAULT_ABORT_PROGRESS_STEPS = 50
#: EX_UNAVAILABLE (sysexits.h): the last abort of a restart loop, "do not requeue".
DEFAULT_GIVE_UP_EXIT_CODE = 69
#: Bind addresses that mean "every interface": no single address to show or advertise.
ALL_INTERFACES: tuple[str, ...] = ("", "0.0.0.0", "::")
#: The versions compared across ranks (and the keys the test-only override accepts).
VERSION_KEYS: tuple[str, ...] = ("python", "torch", "cuda", "nccl")


#: A node name: a hostname or a Kubernetes node name (a bounded label value, no free text).
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")
