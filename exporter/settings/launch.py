"""Read what the launcher says about this process: its identity, attempt and the job's store."""

from __future__ import annotations

import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from .names import (
    ATTEMPT,
    LOCAL_RANK,
    MASTER_ADDR,
    MASTER_PORT,
    NODE,
    NODE_NAME,
    RANK,
    RUN,
    SLURM_JOB_ID,
    SLURM_RESTART_COUNT,
    TORCHELASTIC_MAX_RESTARTS,
    TORCHELASTIC_RESTART_COUNT,
    TORCHELASTIC_RUN_ID,
    TORCHELASTIC_USE_AGENT_STORE,
    WORLD_SIZE,
)
from .validate import environ_of, resolve


def under_torchrun(environ: Mapping[str, str] | None = None) -> bool:
    """Say whether torchrun (an elastic agent) started this process."""
    return bool(environ_of(environ).get(TORCHELASTIC_RUN_ID))


def attempt(environ: Mapping[str, str] | None = None) -> str:
    """Return which attempt of its run this process is: torchrun's restart, Slurm's requeue.

    ``DDP_EXPORTER_ATTEMPT`` (the attempts before this job, for a script that resubmits a
    run as a new job) is added.
    """
    base = resolve(ATTEMPT, environ=environ)
    environ = environ_of(environ)
    for name in (TORCHELASTIC_RESTART_COUNT, SLURM_RESTART_COUNT):
        value = environ.get(name, "").strip()
        if value.isdigit():
            return str(base + int(value))
    return str(base)


def restarts_left(environ: Mapping[str, str] | None = None) -> int | None:
    """Return how many restarts torchrun may still make of this job, None outside torchrun.

    ``TORCHELASTIC_MAX_RESTARTS`` minus ``TORCHELASTIC_RESTART_COUNT``: the restarts left.
    """
    env = environ_of(environ)
    total = int_or_none(env, TORCHELASTIC_MAX_RESTARTS)
    if total is None or not under_torchrun(env):
        return None
    return max(0, total - (int_or_none(env, TORCHELASTIC_RESTART_COUNT) or 0))


def restart_count(environ: Mapping[str, str] | None = None) -> str:
    """Return torchrun's restart attempt (``0`` outside torchrun) as it names store keys."""
    return environ_of(environ).get(TORCHELASTIC_RESTART_COUNT, "0")


def agent_store_address(environ: Mapping[str, str] | None = None) -> tuple[str, int] | None:
    """Return torchrun's agent store address, or None when the workers have no such store."""
    environ = environ_of(environ)
    if environ.get(TORCHELASTIC_USE_AGENT_STORE) != "True":
        return None
    return master_address(environ)


def master_address(environ: Mapping[str, str] | None = None) -> tuple[str, int] | None:
    """Return ``(MASTER_ADDR, MASTER_PORT)`` when both are set and the port is a number."""
    environ = environ_of(environ)
    addr, port = environ.get(MASTER_ADDR), environ.get(MASTER_PORT)
    if not addr or not port:
        return None
    try:
        return addr, int(port)
    except ValueError:
        return None


# -- single settings ---------------------------------------------------------------------------
def default_run(environ: Mapping[str, str] | None = None) -> str:
    """Return the ``run`` label from the environment (see the module docstring for the order)."""
    run = resolve(RUN, environ=environ)  # stripped; blank: unset
    if run:
        return str(run)
    environ = environ_of(environ)
    run = environ.get(TORCHELASTIC_RUN_ID)
    if run and run != "none":
        return run
    run = environ.get(SLURM_JOB_ID)
    if run:
        return run
    addr, port = environ.get(MASTER_ADDR), environ.get(MASTER_PORT)
    if addr and port:
        return f"{addr}:{port}"
    return "local"


# -- resolvers ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Identity:
    """Who this process is in its job: the labels and sizes every part of the exporter uses."""

    rank: int
    world_size: int
    local_rank: int
    run: str
    #: Which attempt of the run this process is (``0`` unless restarted or requeued).
    attempt: str = "0"
    #: The machine this rank runs on (:func:`node_name`): the ``node`` label.
    node: str = ""


def node_name(environ: Mapping[str, str] | None = None) -> str:
    """Return this rank's ``node`` label: ``DDP_EXPORTER_NODE``, else the hostname.

    The name becomes a label that fleet rules group by, so free text would make unbounded,
    unmatchable series: an invalid variable is reported and the hostname used, and a hostname
    that is not a node name has its other characters replaced by ``-``.
    """
    name: str | None = resolve(NODE, environ=environ)
    if name is not None:
        return name
    host = socket.gethostname()
    if NODE_NAME.match(host):
        return host
    return re.sub(r"[^A-Za-z0-9._-]", "-", host).lstrip("._-")[:253] or "unknown"


def identity(
    *,
    run: str | None = None,
    group: tuple[int, int] | None = None,
    environ: Mapping[str, str] | None = None,
    caller: str = "instrument",
) -> Identity:
    """Return this rank's identity.

    ``group`` is ``(rank, world_size)`` of the default process group when it exists (it wins
    over ``RANK``/``WORLD_SIZE``); ``run`` a keyword of ``caller`` that wins over
    :func:`default_run`. Raises ValueError naming that keyword where ``run`` is not a name.
    """
    if group is not None:
        rank, world = group
    else:
        rank, world = env_int(RANK, 0, environ), env_int(WORLD_SIZE, 1, environ)
    return Identity(
        rank=rank,
        world_size=world,
        local_rank=env_int(LOCAL_RANK, 0, environ),
        run=resolve(RUN, run, caller=caller) if run is not None else default_run(environ),
        attempt=attempt(environ),
        node=node_name(environ),
    )


# -- parsers -----------------------------------------------------------------------------------
def env_int(name: str, default: int, environ: Mapping[str, str] | None = None) -> int:
    """Return the integer in variable ``name``, or ``default`` when unset or empty.

    Raises ValueError naming the variable when it holds something else.
    """
    raw = environ_of(environ).get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


def int_or_none(environ: Mapping[str, str], name: str) -> int | None:
    """Return the integer in ``name``, or None when unset or not an integer (checkers report it)."""
    try:
        return int(environ[name])
    except (KeyError, ValueError):
        return None
