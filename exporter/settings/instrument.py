"""Resolve every setting of ``exporter.instrument()`` in one call, into one typed object.

Keywords win over the environment, the environment over the defaults; a bad keyword raises
ValueError (TypeError) naming it, a bad variable is logged once and its default used. The rules
that tie settings together live here too, so that no other module re-checks them: DDP's timing
mode only for a DDP model, the hang action only with a heartbeat and a monitoring rank, a resumed
step that is a step. What needs the running job (the launcher's store, for the hang action's
restarts) is checked where that is built.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from .kinds import integer
from .launch import Identity, identity
from .names import ON_HANG
from .validate import report_unusable
from .values import (
    Endpoint,
    OnHang,
    comm_timing,
    device_wait_every,
    dump_dir,
    endpoint,
    file_sd_dir,
    final_scrape_s,
    flight_recorder,
    gpu_health,
    hang_probe,
    on_hang,
    otlp_requested,
    usable_dump_dir,
)

__all__ = ["InstrumentSettings", "for_instrument", "off_hang"]


@dataclass(frozen=True)
class InstrumentSettings:
    """Everything ``instrument()`` was asked for, resolved and checked: what the observer builds."""

    identity: Identity
    endpoint: Endpoint
    #: How DDP's communication is timed: ``auto``, ``reducer``, ``events`` or ``hook``.
    comm_timing: str
    on_hang: OnHang
    #: A folder hang dumps can be written to (checked at start).
    dump_dir: str
    flight_recorder: bool
    #: False, True (the OTEL_* endpoint) or an OTLP/HTTP endpoint URL.
    otlp: bool | str
    final_scrape_s: float
    #: The folder each rank writes its file_sd target into, None for none.
    file_sd_dir: str | None
    #: Whether the hang watcher probes the links in a hang.
    hang_probe: bool
    #: Whether a CUDA rank reads its GPU's health from NVML.
    gpu_health: bool
    #: Every how many steps a CUDA rank without DDP times its waits on the device (0: never).
    device_wait_every: int
    #: The step this attempt resumed at, None where unknown.
    start_step: int | None
    #: The settings given as keywords (``comm_timing``, ``on_hang``): one that cannot be honoured
    #: raises, where the same value from the environment is logged and replaced.
    keywords: frozenset[str] = frozenset()


def for_instrument(
    *,
    parallelism: str,
    group: tuple[int, int],
    run: str | None = None,
    port: Any = None,
    addr: str | None = None,
    heartbeat_s: Any = None,
    monitor_rank: int | None = None,
    peer_series: Any = None,
    web_config: Any = None,
    flight_recorder_on: bool | None = None,
    otlp: bool | str | None = None,
    dump_folder: str | os.PathLike[str] | None = None,
    hang_action: str | None = None,
    abort_after: Any = None,
    abort_limit: Any = None,
    start_step: Any = None,
    timing: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> InstrumentSettings:
    """Resolve ``instrument()``'s keywords with the environment; apply every rule between them.

    ``parallelism`` is the model's kind (``ddp``, ``fsdp2``, ...), ``group`` the default process
    group's ``(rank, world_size)``, ``run`` a run name that wins over the environment's.
    """
    if parallelism != "ddp" and timing not in (None, "auto"):
        raise ValueError(
            f"exporter.instrument(comm_timing={timing!r}) chooses how DDP's gradient "
            f"communication is timed; this model's parallelism is {parallelism!r}, whose "
            "collectives are timed where they are called: leave comm_timing out"
        )
    if start_step is not None:
        try:
            integer(0)(start_step)
        except ValueError:
            raise ValueError(
                f"exporter.instrument(start_step=...): expected an int >= 0, got {start_step!r}"
            ) from None
    where = endpoint(
        "instrument",
        port=port,
        addr=addr,
        heartbeat_s=heartbeat_s,
        monitor_rank=monitor_rank,
        peer_series=peer_series,
        web_config=web_config,
        world_size=group[1],
        environ=environ,
    )
    hang = on_hang("instrument", hang_action, abort_after, abort_limit, environ=environ)
    if hang.action != "off" and not (where.heartbeat_s > 0 and where.monitor_rank >= 0):
        needs = (
            f"the hang watcher: a heartbeat (heartbeat_s > 0, got {where.heartbeat_s:g}) and a "
            f"monitoring rank (monitor_rank >= 0, got {where.monitor_rank})"
        )
        if hang_action is not None:
            raise ValueError(f"exporter.instrument(on_hang={hang.action!r}) needs {needs}")
        hang = off_hang(hang, f"'off' without {needs}", environ)
    folder = usable_dump_dir(
        dump_dir(dump_folder, environ), from_keyword=dump_folder is not None, environ=environ
    )
    return InstrumentSettings(
        identity=identity(run=run, group=group, environ=environ),
        endpoint=where,
        comm_timing=comm_timing("instrument", timing, environ),
        on_hang=hang,
        dump_dir=folder,
        flight_recorder=flight_recorder(flight_recorder_on, environ),
        otlp=otlp_requested(otlp, environ),
        final_scrape_s=final_scrape_s(environ),
        file_sd_dir=file_sd_dir(environ),
        hang_probe=hang_probe(environ),
        gpu_health=gpu_health(environ),
        device_wait_every=device_wait_every(environ),
        start_step=start_step,
        keywords=frozenset(
            name
            for name, given in (("comm_timing", timing), ("on_hang", hang_action))
            if given is not None
        ),
    )


def off_hang(hang: OnHang, accepted: str, environ: Mapping[str, str] | None = None) -> OnHang:
    """Return ``hang`` turned off, after logging that ``DDP_EXPORTER_ON_HANG`` cannot be honoured.

    ``accepted`` says what the variable could hold here. For a value read from the environment
    only: a keyword that cannot be honoured raises instead.
    """
    report_unusable(
        ON_HANG,
        accepted=accepted,
        instead="the hang action is off (alerts and dumps only)",
        environ=environ,
    )
    return replace(hang, action="off")
