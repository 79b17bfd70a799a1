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
``DDP_EXPORTER_JOB_DEADLINE``   The job's wall-clock limit: a Unix time, or a          unset
                                duration (``72h``, ``90m``, ``3600s``, ``1d12h``)
                                from the job's start (torchrun's start under
                                torchrun, else the rank's process start; see
                                :mod:`exporter.walltime`). Wins over
                                ``SLURM_JOB_END_TIME``.
==============================  =====================================================  =========

The ``run`` label falls back to ``TORCHELASTIC_RUN_ID`` (set by torchrun), then to
``MASTER_ADDR:MASTER_PORT`` (identical on all ranks of one job, distinct between concurrent
jobs), then to ``local``.
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
    "OTEL_ENDPOINT",
    "OTEL_METRICS_ENDPOINT",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "TORCHELASTIC_RUN_ID",
    "MASTER_ADDR",
    "MASTER_PORT",
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

JOB_DEADLINE = "DDP_EXPORTER_JOB_DEADLINE"

# Set by Slurm 23.02+ in the job's environment (Unix time the job's time limit ends it); read only.
SLURM_JOB_END_TIME = "SLURM_JOB_END_TIME"
