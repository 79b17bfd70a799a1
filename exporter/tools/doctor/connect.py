"""Reach the c10d store at MASTER_ADDR:MASTER_PORT (or host it, as rank 0 of an srun job).

Each step names what failed and where it was seen: MASTER_ADDR does not resolve, is not rank
0's own address, the port cannot be listened on, takes no connection (refused, dropped,
unreachable: :func:`exporter.network.netcheck.explain_master`), or takes one but answers no
store; then a round trip through the store and whether torchrun's restarts could connect again.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Mapping
from typing import Any

from ... import settings
from .checks import (
    FAIL,
    FIX_LAUNCHER,
    OK,
    Check,
    Checks,
    Deadline,
    bounded,
    check_master_is_here,
    check_restart,
    made_and_failed,
    probe_port,
    resolve_master,
    round_trip,
)

__all__ = ["connect_store"]


def connect_store(
    env: Mapping[str, str],
    rank: int | None,
    agent_store: bool,
    dl: Deadline,
    checks: Checks,
    prefix: str,
    arrive_by: float,
) -> Any:
    """Return a client of the job's store (rank 0 without a launcher's store hosts it), None
    when it cannot be reached; set ``checks``' addr, port, store and restart as it goes.

    A client waits for ``MASTER_PORT`` to take a connection until ``arrive_by`` (monotonic),
    however short a step is: rank 0 may start late (a slow node, a busy one importing torch),
    and it gathers the reports until then on its own clock.
    """
    from torch.distributed import TCPStore

    addr, port = env[settings.MASTER_ADDR], int(env[settings.MASTER_PORT])
    checks.addr, ip = resolve_master(addr, dl.step(5.0))
    if ip is None:
        return None
    timeout = datetime.timedelta(seconds=dl.step())
    if rank == 0 and not agent_store:
        checks.addr = check_master_is_here(addr, ip)
        if made_and_failed(checks.addr):
            return None  # the store's own client would dial MASTER_ADDR: another host
        try:
            store = TCPStore(addr, port, None, True, timeout, wait_for_workers=False)
        except Exception as exc:  # noqa: BLE001 - reported with its fix
            in_use = "in use" in str(exc).lower()
            checks.port = Check(
                FAIL,
                f"cannot listen on MASTER_PORT {port}: {str(exc).splitlines()[0]}",
                "another process holds the port (a leftover job, or a second rank 0): "
                "choose a free MASTER_PORT"
                if in_use
                else FIX_LAUNCHER,
            )
            return None
        checks.port = Check(OK, f"listening on {port}")
    else:
        checks.port = probe_port(addr, port, max(dl.step(), arrive_by - time.monotonic()))
        if made_and_failed(checks.port):
            return None
        finished, store = bounded(lambda: TCPStore(addr, port, None, False, timeout), dl.step() + 1)
        if not finished:
            checks.store = Check(
                FAIL,
                f"cannot connect to the c10d store at {addr}:{port}: {store}, though "
                f"{checks.port.detail}",
                "MASTER_PORT answers but is not a c10d store: another program uses it",
            )
            return None
    finished, value = bounded(
        lambda: round_trip(store, prefix + f"rtt/{rank}/{os.getpid()}"), dl.step()
    )
    checks.store = (
        value
        if finished
        else Check(FAIL, f"set+get failed: {value}", "the store host is overloaded or gone")
    )
    if made_and_failed(checks.store):
        return None
    import torch

    checks.restart = check_restart(env, store, torch.__version__)
    return store
