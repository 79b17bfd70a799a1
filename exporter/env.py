"""Name the environment variables the exporter reads, in one place.

Every setting of :func:`exporter.instrument` that is not passed as a keyword can come from the
environment, so a launcher can configure jobs it does not own. A keyword always wins over the
environment; the environment wins over the default.

==============================  =====================================================  =========
Variable                        Meaning                                                Default
==============================  =====================================================  =========
``DDP_EXPORTER_PORT``           Base port; each rank serves ``port + LOCAL_RANK``.     19400
                                ``0`` picks a free port.
``DDP_EXPORTER_ADDR``           Bind address of the metrics endpoint.                  0.0.0.0
``DDP_EXPORTER_RUN``            ``run`` label value; else ``TORCHELASTIC_RUN_ID``.     see below
``DDP_EXPORTER_HEARTBEAT_S``    Seconds between c10d-store heartbeats.                 5
``DDP_EXPORTER_MONITOR_RANK``   Rank that publishes peer heartbeat ages; ``-1`` none.  0
``DDP_EXPORTER_PEER_SERIES``    Most peer-heartbeat series the monitoring rank         64
                                publishes: all peers up to this world size, beyond it
                                only late peers, oldest first. ``0`` none.
``DDP_EXPORTER_FLIGHT_RECORDER``  ``0`` ignores the Flight Recorder (comm-hook         1
                                bookkeeping only).
``DDP_EXPORTER_ADVERTISE_ADDR``  Host or IP registered for discovery (``/sd``,          see below
                                file_sd): where Prometheus scrapes this rank.
``DDP_EXPORTER_FILE_SD``        Directory where each rank writes its file_sd target    unset
                                file (removed at a clean exit).
``DDP_EXPORTER_DUMP_DIR``       Folder for hang dumps (one subfolder per episode,      ./ddp-
                                user-only permissions; see exporter.forensics).        exporter-
                                                                                       dumps
``DDP_EXPORTER_JOB_DEADLINE``   The job's wall-clock limit: a Unix time, or a          unset
                                duration (``72h``, ``90m``, ``3600s``, ``1d12h``)
                                from the job's start (torchrun's start under
                                torchrun, else the rank's process start; see
                                :mod:`exporter.walltime`). Wins over
                                ``SLURM_JOB_END_TIME``.
==============================  =====================================================  =========

The ``run`` label falls back to ``TORCHELASTIC_RUN_ID`` (set by torchrun; ignored when it is
torchrun's placeholder ``none``), then to ``SLURM_JOB_ID`` (set by Slurm on every task of a
job), then to ``MASTER_ADDR:MASTER_PORT`` (identical on all ranks of one job, distinct between
concurrent jobs), then to ``local``. An explicit rendezvous id (``torchrun --rdzv-id``) thus
wins over the Slurm job id; pass ``--rdzv-id $SLURM_JOB_ID`` to get the same value either way.

The advertised address defaults to the bind address when it names one interface; when bound
to all interfaces (0.0.0.0), to the IP of the interface that routes to ``MASTER_ADDR``, else
the hostname's address, else the default route's interface IP (never a loopback address),
else the hostname (see :func:`exporter.discovery.advertise_host`).

Test-only (never set in production; ``ddp-exporter doctor`` would report a skew that is not there):

``DDP_EXPORTER_DOCTOR_FAKE_VERSIONS``: comma-separated ``KEY=VERSION`` (KEY one of ``python``,
``torch``, ``cuda``, ``nccl``) that this rank's doctor reports instead of its real versions, so a
test can inject version skew between ranks, e.g. ``torch=9.9.9``.

:func:`exporter.watch_init` reads the same settings. Under torchrun it checks in through the
agent's store when ``TORCHELASTIC_USE_AGENT_STORE`` is ``True`` (torchrun sets it), at
``MASTER_ADDR:MASTER_PORT``, keyed by ``TORCHELASTIC_RESTART_COUNT``.
"""

from __future__ import annotations

__all__ = [
    "PORT",
    "ADDR",
    "RUN",
    "HEARTBEAT_S",
    "MONITOR_RANK",
    "PEER_SERIES",
    "FLIGHT_RECORDER",
    "DUMP_DIR",
    "OTEL_ENDPOINT",
    "OTEL_METRICS_ENDPOINT",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "TORCHELASTIC_RUN_ID",
    "MASTER_ADDR",
    "MASTER_PORT",
    "ADVERTISE_ADDR",
    "FILE_SD",
    "SLURM_JOB_ID",
    "DOCTOR_FAKE_VERSIONS",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_RESTART_COUNT",
    "JOB_DEADLINE",
    "SLURM_JOB_END_TIME",
]

PORT = "DDP_EXPORTER_PORT"
ADDR = "DDP_EXPORTER_ADDR"
RUN = "DDP_EXPORTER_RUN"
HEARTBEAT_S = "DDP_EXPORTER_HEARTBEAT_S"
MONITOR_RANK = "DDP_EXPORTER_MONITOR_RANK"
PEER_SERIES = "DDP_EXPORTER_PEER_SERIES"
FLIGHT_RECORDER = "DDP_EXPORTER_FLIGHT_RECORDER"
DUMP_DIR = "DDP_EXPORTER_DUMP_DIR"

# OpenTelemetry's standard variables that switch the OTLP push path on (see exporter.otlp).
OTEL_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
OTEL_METRICS_ENDPOINT = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"

# Set by torchrun (torch.distributed.run); read, never written.
RANK = "RANK"
LOCAL_RANK = "LOCAL_RANK"
WORLD_SIZE = "WORLD_SIZE"
TORCHELASTIC_RUN_ID = "TORCHELASTIC_RUN_ID"
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"

# Discovery (exporter.discovery).
ADVERTISE_ADDR = "DDP_EXPORTER_ADVERTISE_ADDR"
FILE_SD = "DDP_EXPORTER_FILE_SD"

# Set by Slurm (srun/sbatch); read for the default run label, never written.
SLURM_JOB_ID = "SLURM_JOB_ID"
# Test-only: versions ``ddp-exporter doctor`` reports instead of the real ones (see above).
DOCTOR_FAKE_VERSIONS = "DDP_EXPORTER_DOCTOR_FAKE_VERSIONS"
# "True" when torchrun's agent hosts the store at MASTER_ADDR:MASTER_PORT before the workers
# start (exporter.watch_init checks in there); the restart count keeps attempts apart.
TORCHELASTIC_USE_AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"
TORCHELASTIC_RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
JOB_DEADLINE = "DDP_EXPORTER_JOB_DEADLINE"

# Set by Slurm 23.02+ in the job's environment (Unix time the job's time limit ends it); read only.
SLURM_JOB_END_TIME = "SLURM_JOB_END_TIME"
