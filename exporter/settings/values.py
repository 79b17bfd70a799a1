"""Resolve the single settings of instrument() and watch_init(): endpoint, hang action, dumps, OTLP."""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from ..log import log
from .kinds import EXIT_CODE, Setting, integer
from .launch import env_int, int_or_none
from .names import (
    ABORT_AFTER_S,
    ABORT_EXIT_CODE,
    ABORT_LIMIT,
    ABORT_PROGRESS_STEPS,
    ADDR,
    ADVERTISE_ADDR,
    ALERTMANAGER_BINARY,
    ALL_INTERFACES,
    AUTORUN,
    COMM_TIMING,
    DEFAULT_ABORT_AFTER_S,
    DEFAULT_ABORT_EXIT_CODE,
    DEFAULT_ABORT_LIMIT,
    DEFAULT_ABORT_PROGRESS_STEPS,
    DEFAULT_GIVE_UP_EXIT_CODE,
    DEFAULT_PORT,
    DEVICE_WAIT_EVERY,
    DOCTOR_FAKE_VERSIONS,
    DUMP_DIR,
    FILE_SD,
    FINAL_SCRAPE_S,
    FLIGHT_RECORDER,
    GIVE_UP_EXIT_CODE,
    GPU_HEALTH,
    GRAFANA_BINARY,
    HANG_PROBE,
    HEARTBEAT_S,
    JOB_DEADLINE,
    LOCAL_RANK,
    LOCAL_WORLD_SIZE,
    MONITOR_RANK,
    ON_HANG,
    OTEL_ENDPOINT,
    OTEL_METRICS_ENDPOINT,
    OTEL_SDK_DISABLED,
    PEER_SERIES,
    PORT,
    PROMETHEUS_BINARY,
    SLURM_JOB_END_TIME,
    WEB_CONFIG,
    WORLD_SIZE,
)
from .table import SETTINGS
from .validate import environ_of, report_invalid, report_unusable, resolve, setting_message


def env_float(name: str, default: float, environ: Mapping[str, str] | None = None) -> float:
    """Return the number in variable ``name``, or ``default`` when unset or empty."""
    raw = environ_of(environ).get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None


def env_positive_ms(name: str, default: float, environ: Mapping[str, str] | None = None) -> float:
    """Return the positive milliseconds in ``name``; log once and use ``default`` otherwise.

    For OpenTelemetry's variables, which the SDK itself treats as advisory: a bad value must
    not stop the push path.
    """
    raw = environ_of(environ).get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not (value > 0 and math.isfinite(value)):
        report_invalid(Setting(name, "positive milliseconds", default), raw, environ=environ)
        return default
    return value


def positive_int(what: str, value: Any) -> int:
    """Return ``value`` if it is an int > 0; else raise ValueError naming keyword ``what``."""
    try:
        return integer(1)(value)
    except ValueError:
        raise ValueError(
            f"exporter.instrument({what}=...): expected an int > 0, got {value!r}"
        ) from None


def job_deadline_raw(environ: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """Return ``(variable, valid text)`` of the job's deadline, or None when none is set.

    ``DDP_EXPORTER_JOB_DEADLINE`` wins over ``SLURM_JOB_END_TIME``; Slurm's ``0`` (or empty)
    is what a job without a time limit gets: no deadline. A malformed value is reported
    (:func:`report_invalid`) and passed over.
    """
    for name in (JOB_DEADLINE, SLURM_JOB_END_TIME):
        text = resolve(name, environ=environ)
        if text:
            return name, text
    return None


def fake_versions(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return the test-only version overrides of ``DDP_EXPORTER_DOCTOR_FAKE_VERSIONS``."""
    return dict(resolve(DOCTOR_FAKE_VERSIONS, environ=environ))


def bind_addr(
    addr: str | None, environ: Mapping[str, str] | None = None, caller: str = "instrument"
) -> str:
    """Return the metrics bind address: keyword, ``DDP_EXPORTER_ADDR``, then all interfaces."""
    return cast(str, resolve(ADDR, addr, caller=caller, environ=environ))


def is_all_interfaces(addr: str) -> bool:
    """Say whether binding ``addr`` listens on every interface (0.0.0.0, ::, empty)."""
    return addr in ALL_INTERFACES


def monitoring_rank(
    rank: int | None, environ: Mapping[str, str] | None = None, caller: str = "instrument"
) -> int:
    """Return the monitoring rank: keyword, ``DDP_EXPORTER_MONITOR_RANK``, then 0."""
    return cast(int, resolve(MONITOR_RANK, rank, caller=caller, environ=environ))


def flight_recorder(on: bool | None, environ: Mapping[str, str] | None = None) -> bool:
    """Say whether to read the Flight Recorder: keyword, else the variable (default on)."""
    return cast(bool, resolve(FLIGHT_RECORDER, on, environ=environ))


def comm_timing(
    caller: str, value: str | None = None, environ: Mapping[str, str] | None = None
) -> str:
    """Return the communication timing mode: keyword, ``DDP_EXPORTER_COMM_TIMING``, ``auto``.

    Raises ValueError naming ``caller``'s keyword for a keyword it does not accept.
    """
    return cast(str, resolve(COMM_TIMING, value, caller=caller, environ=environ))


def dump_dir(path: Any, environ: Mapping[str, str] | None = None) -> str:
    """Return the hang dump folder: keyword (a path), ``DDP_EXPORTER_DUMP_DIR``, the default."""
    return cast(str, resolve(DUMP_DIR, path, environ=environ))


def usable_dump_dir(
    path: str, *, from_keyword: bool = False, environ: Mapping[str, str] | None = None
) -> str:
    """Return a folder hang dumps can be written to: ``path`` (created if missing), else another.

    Checked at start, so that the one artefact a user needs after a hang is not lost when it is
    written: a folder that cannot be created or written is reported in one line saying where
    dumps go instead (a private folder under the system's temporary directory), or that they
    would be lost. Never raises.
    """
    reason = _writable(path)
    if reason is None:
        return path
    fallback = os.path.join(tempfile.gettempdir(), f"ddp-exporter-dumps-{os.getuid()}")
    usable = _writable(fallback) is None
    instead = f"hang dumps go to {fallback} instead" if usable else "hang dumps would be lost"
    setting = SETTINGS[DUMP_DIR]
    accepted = f"a folder this process can write ({path}: {reason})"
    raw = environ_of(environ).get(DUMP_DIR, "")
    if not from_keyword and raw.strip():
        report_invalid(setting, raw, accepted=accepted, instead=instead, environ=environ)
    else:
        source = "exporter.instrument(dump_dir=...)" if from_keyword else "the default dump folder"
        log.warning(
            "ddp-exporter: %s; %s, training goes on",
            setting_message(source, path, setting, accepted),
            instead,
        )
    return fallback if usable else path


def _writable(path: str) -> str | None:
    """Create folder ``path`` (user-only) if missing; return why it cannot be written, or None."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    if not os.path.isdir(path) or not os.access(path, os.W_OK | os.X_OK):
        return "not writable"
    return None


def otlp_requested(otlp: bool | str | None, environ: Mapping[str, str] | None = None) -> bool | str:
    """Return the OTLP setting: the keyword, else whether an ``OTEL_*`` endpoint is set.

    Raises ValueError for a keyword that is neither a bool nor an http(s) URL.
    """
    if otlp is not None:
        if isinstance(otlp, bool) or (
            isinstance(otlp, str) and otlp.startswith(("http://", "https://"))
        ):
            return otlp
        raise ValueError(
            "exporter.instrument(otlp=...): expected True, False or an OTLP/HTTP endpoint URL "
            f"(http:// or https://), got {otlp!r} (default: on where OTEL_EXPORTER_OTLP_ENDPOINT "
            "is set)"
        )
    environ = environ_of(environ)
    return bool(environ.get(OTEL_ENDPOINT) or environ.get(OTEL_METRICS_ENDPOINT))


def otlp_disabled(environ: Mapping[str, str] | None = None) -> bool:
    """Say whether ``OTEL_SDK_DISABLED`` switches OpenTelemetry off."""
    return environ_of(environ).get(OTEL_SDK_DISABLED, "").strip().lower() == "true"


def advertise_override(environ: Mapping[str, str] | None = None) -> str | None:
    """Return ``DDP_EXPORTER_ADVERTISE_ADDR`` (a host), or None when unset or not a host."""
    return cast("str | None", resolve(ADVERTISE_ADDR, environ=environ))


def file_sd_dir(environ: Mapping[str, str] | None = None) -> str | None:
    """Return the folder every rank writes its file_sd target into (``DDP_EXPORTER_FILE_SD``).

    Created (user-only) if missing; one that cannot be is reported once and passed over (None).
    """
    folder = cast("str | None", resolve(FILE_SD, environ=environ)) or None
    reason = _writable(folder) if folder else None
    if folder is None or reason is None:
        return folder
    report_unusable(
        FILE_SD,
        accepted=f"a folder this process can write ({folder}: {reason})",
        instead="no file_sd target is written",
        environ=environ,
    )
    return None


def web_config_file(environ: Mapping[str, str] | None = None) -> str | None:
    """Return the web configuration file the ranks serve by (``DDP_EXPORTER_WEB_CONFIG``)."""
    return cast("str | None", resolve(WEB_CONFIG, environ=environ)) or None


def stack_binary(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """Return the path given for ``prometheus``, ``alertmanager`` or ``grafana`` (its variable)."""
    variable = {
        "prometheus": PROMETHEUS_BINARY,
        "alertmanager": ALERTMANAGER_BINARY,
        "grafana": GRAFANA_BINARY,
    }[name]
    return cast("str | None", resolve(variable, environ=environ)) or None


def hang_probe(environ: Mapping[str, str] | None = None) -> bool:
    """Return whether the hang watcher probes the links in a hang (``DDP_EXPORTER_HANG_PROBE``)."""
    return bool(resolve(HANG_PROBE, environ=environ))


def gpu_health(environ: Mapping[str, str] | None = None) -> bool:
    """Return whether a CUDA rank reads its GPU's health from NVML (``DDP_EXPORTER_GPU_HEALTH``)."""
    return bool(resolve(GPU_HEALTH, environ=environ))


def device_wait_every(environ: Mapping[str, str] | None = None) -> int:
    """Return every how many steps a CUDA rank times its waits on the device (0: never)."""
    return cast(int, resolve(DEVICE_WAIT_EVERY, environ=environ))


def autorun(environ: Mapping[str, str] | None = None) -> bool:
    """Return whether ``ddp-exporter run`` asks this process to instrument itself."""
    return bool(resolve(AUTORUN, environ=environ))


def final_scrape_s(environ: Mapping[str, str] | None = None) -> float:
    """Return how long a clean end may wait for its final scrape (``DDP_EXPORTER_FINAL_SCRAPE_S``)."""
    return cast(float, resolve(FINAL_SCRAPE_S, environ=environ))


@dataclass(frozen=True)
class OnHang:
    """What a hang does besides alerts and dumps (:mod:`exporter.hangs.action`)."""

    #: ``off`` or ``abort``.
    action: str = "off"
    #: Seconds a hang with complete evidence lasts before ``abort`` acts.
    after_s: float = DEFAULT_ABORT_AFTER_S
    #: Exit code of every rank the action ends.
    exit_code: int = DEFAULT_ABORT_EXIT_CODE
    #: Aborts in a row without progress after which the action stops (0: never).
    limit: int = DEFAULT_ABORT_LIMIT
    #: Steps past the earlier attempts' furthest step that count as progress.
    progress_steps: int = DEFAULT_ABORT_PROGRESS_STEPS
    #: Exit code of the abort that reaches the limit ("do not requeue").
    give_up_exit_code: int = DEFAULT_GIVE_UP_EXIT_CODE


def on_hang(
    caller: str,
    action: str | None = None,
    after_s: Any = None,
    limit: Any = None,
    environ: Mapping[str, str] | None = None,
) -> OnHang:
    """Resolve the hang action: keywords, then ``DDP_EXPORTER_ON_HANG`` and friends, then off.

    Raises ValueError naming ``caller``'s keyword for a keyword it does not accept.
    """
    action = resolve(ON_HANG, action, caller=caller, environ=environ)
    after_s = resolve(ABORT_AFTER_S, after_s, caller=caller, environ=environ)
    limit = resolve(ABORT_LIMIT, limit, caller=caller, environ=environ)
    steps = resolve(ABORT_PROGRESS_STEPS, environ=environ)
    code = resolve(ABORT_EXIT_CODE, environ=environ)
    give_up = resolve(GIVE_UP_EXIT_CODE, environ=environ)
    if give_up == code:
        # A requeue script could not tell "restart" from "do not requeue": blame the variable
        # that was set, and use both defaults.
        blamed = (
            GIVE_UP_EXIT_CODE if environ_of(environ).get(GIVE_UP_EXIT_CODE) else ABORT_EXIT_CODE
        )
        report_invalid(
            SETTINGS[blamed],
            environ_of(environ).get(blamed, ""),
            accepted=f"{EXIT_CODE} other than the "
            + ("abort exit code" if blamed == GIVE_UP_EXIT_CODE else "give-up exit code"),
            environ=environ,
        )
        code, give_up = DEFAULT_ABORT_EXIT_CODE, DEFAULT_GIVE_UP_EXIT_CODE
    return OnHang(action, float(after_s), code, limit, steps, give_up)


@dataclass(frozen=True)
class Endpoint:
    """What the metrics endpoint and its background threads need, resolved and validated."""

    #: The port this rank binds: ``port + LOCAL_RANK``, or 0 for a free port.
    port: int
    addr: str
    heartbeat_s: float
    monitor_rank: int
    peer_series: int
    #: The web configuration file (TLS, basic auth) the endpoint applies, None for plain HTTP.
    web_config: str | None = None


def endpoint(
    caller: str,
    *,
    port: Any = None,
    addr: str | None = None,
    heartbeat_s: Any = None,
    monitor_rank: int | None = None,
    peer_series: Any = None,
    web_config: Any = None,
    world_size: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> Endpoint:
    """Resolve the settings instrument() and watch_init() share: keyword, environment, default.

    ``world_size``: the job's ranks (default: ``WORLD_SIZE``), which the monitoring rank must
    be one of. Raises ValueError naming ``caller``'s keyword for a keyword it does not accept.
    """
    local_rank = env_int(LOCAL_RANK, 0, environ)
    return Endpoint(
        port=_rank_port(caller, port, local_rank, environ),
        addr=bind_addr(addr, environ, caller),
        heartbeat_s=resolve(HEARTBEAT_S, heartbeat_s, caller=caller, environ=environ),
        monitor_rank=_monitor_rank(caller, monitor_rank, world_size, environ),
        peer_series=resolve(PEER_SERIES, peer_series, caller=caller, environ=environ),
        web_config=resolve(WEB_CONFIG, web_config, caller=caller, environ=environ),
    )


def _rank_port(caller: str, port: Any, local_rank: int, environ: Mapping[str, str] | None) -> int:
    """Return the port this rank binds: the base port + ``LOCAL_RANK``, 0 for a free one.

    Every rank of a node judges the base port alike where it knows the node's ranks
    (``LOCAL_WORLD_SIZE``): a keyword too high for the node's last rank raises on each of them,
    never on some only (the others would then wait for them in their first collective). Where
    only its own rank is known, a rank whose port would pass 65535 says so in one line and
    takes the default base port.
    """
    base = resolve(PORT, port, caller=caller, environ=environ)
    if not base:
        return 0
    node_ranks = int_or_none(environ_of(environ), LOCAL_WORLD_SIZE)
    last = max(local_rank, node_ranks - 1 if node_ranks else 0)
    if base + last <= 65535:
        return int(base + local_rank)
    accepted = f"a base port with port + LOCAL_RANK ({last}) <= 65535"
    if port is not None and node_ranks:
        raise ValueError(f"exporter.{caller}(port=...): expected {accepted}, got {port!r}")
    fallback = DEFAULT_PORT if DEFAULT_PORT + last <= 65535 else 0
    instead = f"using base port {fallback}" if fallback else "using a free port"
    if port is None:
        report_unusable(PORT, accepted=accepted, instead=instead, environ=environ)
    else:
        log.warning(
            "ddp-exporter: %s; %s, training goes on",
            setting_message(f"exporter.{caller}(port=...)", port, SETTINGS[PORT], accepted),
            instead,
        )
    return fallback + local_rank if fallback else 0


def _monitor_rank(
    caller: str, rank: Any, world_size: int | None, environ: Mapping[str, str] | None
) -> int:
    """Return the monitoring rank, one of the job's ranks or -1 (none).

    A rank past the job's last is a keyword's error (raised) or a variable's (reported; rank 0
    monitors): nobody would read the heartbeats or watch for hangs.
    """
    chosen = monitoring_rank(rank, environ, caller)
    world = world_size if world_size is not None else int_or_none(environ_of(environ), WORLD_SIZE)
    if world is None or chosen < world:
        return chosen
    accepted = f"a rank in -1..{world - 1} (-1: none)"
    if rank is not None:
        raise ValueError(
            setting_message(
                f"exporter.{caller}(monitor_rank=...)", rank, SETTINGS[MONITOR_RANK], accepted
            )
        )
    report_unusable(MONITOR_RANK, accepted=accepted, instead="using the default", environ=environ)
    return 0
