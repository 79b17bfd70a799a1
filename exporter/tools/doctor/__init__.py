"""Check, before a job starts, that its ranks can meet: ``ddp-exporter doctor``.

Run it under the job's own launcher, with the job's environment, so it sees what the job sees::

    torchrun --nnodes 2 --nproc-per-node 8 ... -m exporter.doctor       # or: ddp-exporter doctor
    srun python -m exporter.doctor                                      # one process per rank

Every rank checks what it can alone (required env, ``MASTER_ADDR`` resolves, ``MASTER_PORT``
accepts a TCP connection, ``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` name interfaces that
exist, a c10d-store round trip, whether torchrun's restarts can connect again: ``restart``,
a warning where a shared store makes a restart after a crash fail, a failure where
``DDP_EXPORTER_ON_HANG=abort`` could not clear it) and publishes the results and its Python/torch/CUDA/NCCL
versions through the c10d store at ``MASTER_ADDR:MASTER_PORT``. Facts travel through the store,
not through collectives, so a rank that never arrives is reported as *missing* instead of
hanging everyone. When every rank arrived, all run one tiny gloo ``all_reduce``. Rank 0 then
checks the ranks against each other (unique ranks, one world size, identical versions) and
prints one table, a row per rank, with the fix for each failure. Other ranks print only their
own failures (a rank that cannot reach the store can tell nobody else).

Every step has its own deadline (``--step-timeout``) inside the overall one (``--timeout``), so
doctor always ends: exit status 0 when everything passed on every rank, 1 otherwise, 2 for bad
usage. Only waiting for rank 0 to listen on ``MASTER_PORT`` lasts longer than a step: as long as
rank 0 waits for the others, since a rank may start late. Under torchrun the agent already
hosts the store on ``MASTER_PORT`` and every rank is a client; with one process per rank (srun,
mpirun) rank 0 hosts it, like ``init_process_group``.

The package: :mod:`.checks` (what a rank checks alone; Check, Checks, Report), :mod:`.connect`
(reaching the store), :mod:`.board` (the doctor's keys on it), :mod:`.gloo` (the all_reduce and
the links), :mod:`.compare` (rank 0 compares the reports), :mod:`.report` (the table),
:mod:`.exchange` (one rank's run, step by step), :mod:`.command` (the CLI).
"""

from __future__ import annotations

from .checks import (
    CHECKS,
    FAIL,
    MISSING,
    NA,
    OK,
    SKIP,
    VERDICT_GRACE_S,
    VERSION_KEYS,
    WARN,
    Check,
    Checks,
    Report,
    check_env,
    check_ifnames,
    check_restart,
    local_versions,
)
from .command import add_parser, build_parser, main, run
from .compare import compare, judge_reach, reach_targets
from .report import render

__all__ = [
    "CHECKS",
    "FAIL",
    "MISSING",
    "NA",
    "OK",
    "SKIP",
    "VERDICT_GRACE_S",
    "VERSION_KEYS",
    "WARN",
    "Check",
    "Checks",
    "Report",
    "add_parser",
    "build_parser",
    "check_env",
    "check_ifnames",
    "check_restart",
    "compare",
    "judge_reach",
    "local_versions",
    "main",
    "reach_targets",
    "render",
    "run",
]
