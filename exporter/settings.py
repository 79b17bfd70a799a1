"""Name every environment variable the exporter reads, with its parser and default, in one place.

Every setting of :func:`exporter.instrument` and :func:`exporter.watch_init` that is not passed
as a keyword can come from the environment, so a launcher can configure jobs it does not own. A
keyword always wins over the environment; the environment wins over the default. The resolvers
at the end (:func:`identity`, :func:`endpoint`) are the only place these rules are applied.

Every variable of the exporter, what it accepts, its default and what it means are in one
table, :data:`SETTINGS` (rendered as the settings reference page, docs/reference/settings.md);
the variables it reads but does not own (OpenTelemetry's, the launchers') in :data:`OTHER_VARIABLES`.

:func:`exporter.watch_init` reads the same settings. Under torchrun it checks in through the
agent's store when ``TORCHELASTIC_USE_AGENT_STORE`` is ``True`` (torchrun sets it), at
``MASTER_ADDR:MASTER_PORT``, keyed by ``TORCHELASTIC_RESTART_COUNT``.

A value a variable holds that the exporter cannot use never stops training: one shared
validator (:func:`resolve`, the table :data:`SETTINGS`) logs it once per process in one line
naming the variable, the value, what is accepted and the default used instead, and the rank
publishes ``ddp_exporter_invalid_setting_info{variable}`` (alert DDPExporterMisconfigured).
The same value passed as a keyword raises ValueError with the same message: code is the
programmer's to fix.

This module imports no torch and nothing of the exporter but its logger: offline tools use it.
"""

from __future__ import annotations

import math
import os
import re
import socket
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .log import log

__all__ = [
    "ABORT_AFTER_S",
    "ABORT_EXIT_CODE",
    "ABORT_LIMIT",
    "ABORT_PROGRESS_STEPS",
    "ADDR",
    "ADVERTISE_ADDR",
    "ALL_INTERFACES",
    "ATTEMPT",
    "COMM_TIMING",
    "COMM_TIMING_CHOICES",
    "DEFAULT_ABORT_AFTER_S",
    "DEFAULT_ABORT_EXIT_CODE",
    "DEFAULT_ABORT_LIMIT",
    "DEFAULT_ABORT_PROGRESS_STEPS",
    "DEFAULT_ADDR",
    "DEFAULT_DUMP_DIR",
    "DEFAULT_FINAL_SCRAPE_S",
    "DEFAULT_GIVE_UP_EXIT_CODE",
    "DEFAULT_HEARTBEAT_S",
    "DEFAULT_PEER_SERIES",
    "DEFAULT_PORT",
    "DOCTOR_FAKE_VERSIONS",
    "DUMP_DIR",
    "Endpoint",
    "FILE_SD",
    "FINAL_SCRAPE_S",
    "FLIGHT_RECORDER",
    "GIVE_UP_EXIT_CODE",
    "GLOO_SOCKET_IFNAME",
    "HEARTBEAT_S",
    "Identity",
    "JOB_DEADLINE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "MONITOR_RANK",
    "NCCL_SOCKET_IFNAME",
    "NODE",
    "ON_HANG",
    "ON_HANG_CHOICES",
    "OTEL_ENDPOINT",
    "OTEL_METRICS_ENDPOINT",
    "OTEL_METRIC_EXPORT_INTERVAL",
    "OTEL_METRIC_EXPORT_TIMEOUT",
    "OTEL_SDK_DISABLED",
    "OTHER_VARIABLES",
    "OnHang",
    "PEER_SERIES",
    "SETTINGS",
    "Setting",
    "PORT",
    "RANK",
    "RUN",
    "SLURM_JOB_END_TIME",
    "SLURM_JOB_ID",
    "SLURM_RESTART_COUNT",
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
    "VERSION_KEYS",
    "WORLD_SIZE",
    "advertise_override",
    "agent_store_address",
    "attempt",
    "final_scrape_s",
    "bind_addr",
    "comm_timing",
    "default_run",
    "dump_dir",
    "endpoint",
    "env_float",
    "env_int",
    "env_positive_ms",
    "fake_versions",
    "flight_recorder",
    "identity",
    "int_or_none",
    "invalid_settings",
    "is_all_interfaces",
    "job_deadline_raw",
    "monitoring_rank",
    "node_name",
    "on_hang",
    "otlp_requested",
    "otlp_disabled",
    "parse_deadline",
    "positive_int",
    "report_invalid",
    "resolve",
    "restart_count",
    "restarts_left",
    "setting_message",
    "under_torchrun",
    "usable_dump_dir",
]

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
#: Most peer-heartbeat series the monitoring rank publishes by default (``peer_series``).
DEFAULT_PEER_SERIES = 64
#: Where dumps go unless ``dump_dir=`` / ``DDP_EXPORTER_DUMP_DIR`` say otherwise (relative to
#: the working directory of each rank).
DEFAULT_DUMP_DIR = "ddp-exporter-dumps"
#: Most seconds a rank that ends cleanly waits for its scrapers to read its final state.
DEFAULT_FINAL_SCRAPE_S = 10.0
#: How DDP's communication is timed (``instrument(comm_timing=...)``).
COMM_TIMING_CHOICES: tuple[str, ...] = ("auto", "reducer", "hook")
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
_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


def _environ(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


# -- the one validator ---------------------------------------------------------------------------
# A monitoring setting must never cost a run (the OpenTelemetry SDK's convention for environment
# configuration): a variable holding a value the exporter cannot use is logged once per process,
# in one line naming the variable, the value, what is accepted and the default used instead, and
# published (ddp_exporter_invalid_setting_info, alert DDPExporterMisconfigured). A keyword passed
# in code is the programmer's: it still raises, with the same message.


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Setting:
    """One variable the exporter reads: what it accepts, its default and its keyword if any.

    ``parse`` turns the variable's text into a value; ``check`` returns a value (a keyword's or a
    parsed one) as used, or raises ValueError (TypeError where a wrong type is the caller's bug).
    """

    name: str
    accepted: str
    default: Any
    parse: Callable[[str], Any] = str.strip
    check: Callable[[Any], Any] = _same
    keyword: str = ""
    #: How the default reads in messages when it is not a plain value (e.g. "the hostname").
    shown_default: str = ""
    #: What the setting does, for people (the settings reference page is rendered from it).
    meaning: str = ""

    @property
    def default_text(self) -> str:
        """Return the default as the messages show it."""
        return self.shown_default or str(self.default)


def setting_message(source: str, value: Any, setting: Setting, accepted: str = "") -> str:
    """Return the one message of a value ``setting`` does not accept, read from ``source``.

    The same text for a variable (logged) and a keyword (raised): what was given, what is
    accepted, and the default.
    """
    return (
        f"{source}: expected {accepted or setting.accepted}, got {value!r} "
        f"(default: {setting.default_text})"
    )


_lock = threading.Lock()
#: Variables found invalid in this process's environment, with the value found.
_invalid: dict[str, str] = {}
#: ``(variable, value)`` pairs already logged: once per process.
_logged: set[tuple[str, str]] = set()


def report_invalid(
    setting: Setting,
    raw: str,
    *,
    accepted: str = "",
    instead: str = "using the default",
    environ: Mapping[str, str] | None = None,
) -> None:
    """Log once that variable ``setting.name`` holds ``raw``, which is not accepted; never raises.

    ``instead`` says what is done instead. Recorded for :func:`invalid_settings` when read from
    the process's environment (``environ`` None or ``os.environ``); another mapping (a test, a
    tool) is only logged.
    """
    with _lock:
        first = (setting.name, raw) not in _logged
        _logged.add((setting.name, raw))
        if environ is None or environ is os.environ:
            _invalid[setting.name] = raw
    if first:
        log.warning(
            "ddp-exporter: %s; %s, training goes on",
            setting_message(setting.name, raw, setting, accepted),
            instead,
        )


def invalid_settings() -> list[str]:
    """Return the variables whose value in this process's environment was found invalid."""
    with _lock:
        found = list(_invalid.items())
    # Still holding the value found: a variable fixed (or changed) since is not reported.
    return sorted(name for name, raw in found if os.environ.get(name) == raw)


def resolve(
    name: str,
    keyword: Any = None,
    *,
    caller: str = "instrument",
    environ: Mapping[str, str] | None = None,
) -> Any:
    """Return setting ``name``: the keyword, else the variable, else the default.

    Raises ValueError (TypeError) naming ``caller``'s keyword for a keyword value it does not
    accept; an invalid variable is reported (:func:`report_invalid`) and the default returned.
    """
    setting = SETTINGS[name]
    if keyword is not None:
        try:
            return setting.check(keyword)
        except (TypeError, ValueError) as exc:
            source = f"exporter.{caller}({setting.keyword or name}=...)"
            raise type(exc)(setting_message(source, keyword, setting)) from None
    raw = _environ(environ).get(name)
    if raw is None or not raw.strip():
        return setting.default
    try:
        return setting.check(setting.parse(raw))
    except (TypeError, ValueError):
        report_invalid(setting, raw, environ=environ)
        return setting.default


def _integer(low: int, high: int | None = None) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError("not an int")
        if value < low or (high is not None and value > high):
            raise ValueError("out of range")
        return value

    return check


def _parse_int(raw: str) -> int:
    return int(raw.strip())


def _seconds(minimum: float, *, inclusive: bool) -> Callable[[Any], float]:
    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError("not a number")
        if not math.isfinite(value) or value < minimum or (value == minimum and not inclusive):
            raise ValueError("out of range")
        return float(value)

    return check


def _parse_float(raw: str) -> float:
    return float(raw.strip())


def _one_of(choices: tuple[str, ...]) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if not isinstance(value, str) or value not in choices:
            raise ValueError("not a choice")
        return value

    return check


def _lower(raw: str) -> str:
    return raw.strip().lower()


_SWITCH = {"1": True, "true": True, "yes": True, "on": True,
           "0": False, "false": False, "no": False, "off": False}  # fmt: skip


def _parse_switch(raw: str) -> bool:
    return _SWITCH[raw.strip().lower()] if raw.strip().lower() in _SWITCH else _no(raw)


def _no(raw: str) -> Any:
    raise ValueError(f"not accepted: {raw!r}")


def _path(value: Any) -> str:
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"expected a path, got {type(value).__name__}")
    text = os.fspath(value)
    if not text:
        raise ValueError("empty path")
    return text


def _host(value: Any) -> str:
    """Accept a host name or IP address: no port, scheme, path or blank."""
    if not isinstance(value, str):
        raise ValueError("not a host")
    if ":" in value and not _is_ipv6(value) or "/" in value or any(c.isspace() for c in value):
        raise ValueError("not a host")
    return value


def _bind(value: Any) -> str:
    return value if value in ALL_INTERFACES else _host(value)


def _node(value: Any) -> str:
    if not isinstance(value, str) or not _NODE_NAME.match(value):
        raise ValueError("not a node name")
    return value


def _deadline(name: str) -> Callable[[str], str | None]:
    def parse(raw: str) -> str | None:
        text = raw.strip()
        if name == SLURM_JOB_END_TIME and text == "0":
            return None  # Slurm's "no time limit"
        parse_deadline(name, text, float(_MIN_UNIX))  # raises ValueError when malformed
        return text

    return parse


def _parse_attempt(raw: str) -> int:
    if not raw.strip().isdigit():
        raise ValueError("not a count")
    return int(raw.strip())


def _parse_fake_versions(raw: str) -> dict[str, str]:
    out = {}
    for item in filter(None, (x.strip() for x in raw.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key not in VERSION_KEYS or not value:
            raise ValueError(f"bad item {item!r}")
        out[key] = value
    return out


_EXIT_CODE = "an exit code in 1..255"

#: Every variable of the exporter (and the deadline Slurm sets), by name: one validator reads
#: them all. Launcher variables (RANK, MASTER_PORT, ...) are torch's: a bad one stops torch first.
SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in (
        Setting(PORT, "an int in 0..65535 (0: a free port)", DEFAULT_PORT, _parse_int,
                _integer(0, 65535), "port",
                meaning="Base port of the metrics endpoint: each rank serves ``/metrics`` on "
                "``port + LOCAL_RANK`` (the default lies outside the 9100-9999 range that "
                "Prometheus exporters share). ``0`` picks a free port; ``Observer.port`` says which."),
        Setting(ADDR, "a bind address (an IP address or host name)", DEFAULT_ADDR, str.strip,
                _bind, "addr",
                meaning="Bind address of the metrics endpoint; ``127.0.0.1`` keeps it on the "
                "node."),
        Setting(RUN, "a run name", None, str.strip, _same, "run",
                "torchrun's run id, Slurm's job id or MASTER_ADDR:MASTER_PORT",
                meaning="The ``run`` label, which keeps concurrent jobs apart. Unset: torchrun's "
                "``TORCHELASTIC_RUN_ID`` (ignored when it is torchrun's placeholder ``none``), "
                "then Slurm's ``SLURM_JOB_ID``, then ``MASTER_ADDR:MASTER_PORT`` (the same on "
                "every rank of a job, distinct between concurrent jobs), then ``local``. An "
                "explicit rendezvous id (``torchrun --rdzv-id``) thus wins over the Slurm job "
                "id: pass ``--rdzv-id $SLURM_JOB_ID`` to get the same value either way. A "
                "restarted or requeued job keeps its run; ``ddp_rank_info{attempt}`` tells the "
                "attempts apart."),
        Setting(HEARTBEAT_S, "seconds >= 0 (0: off)", DEFAULT_HEARTBEAT_S, _parse_float,
                _seconds(0, inclusive=True), "heartbeat_s",
                meaning="Seconds between a rank's c10d-store heartbeats: liveness (peer "
                "heartbeat ages), the store round trip that names a slow link, the hang "
                "watcher's reports and the init watch's check-in. ``0`` turns them off."),
        Setting(MONITOR_RANK, "a rank >= -1 (-1: none)", 0, _parse_int, _integer(-1),
                "monitor_rank",
                meaning="The rank that reads every peer's heartbeat and publishes its age, "
                "serves ``/sd`` (the job's targets for Prometheus) and watches for hangs. "
                "``-1``: none."),
        Setting(PEER_SERIES, "an int >= 0", DEFAULT_PEER_SERIES, _parse_int, _integer(0),
                "peer_series",
                meaning="Most peer-heartbeat (and init check-in) series the monitoring rank "
                "publishes: every peer in jobs of up to this many ranks, beyond that only late "
                "peers, oldest first. ``0``: none."),
        Setting(FLIGHT_RECORDER, "1 or 0 (true/false, yes/no, on/off)", True, _parse_switch,
                bool, "flight_recorder", "1",
                meaning="Read in-flight collective state from torch's Flight Recorder (every "
                "collective of every process group). ``0``: the comm hook's own bookkeeping only "
                "(DDP's gradient buckets)."),
        Setting(COMM_TIMING, "one of 'auto', 'reducer', 'hook'", "auto", _lower,
                _one_of(("auto", "reducer", "hook")), "comm_timing",
                meaning="How a DDP model's communication is timed. ``reducer``: DDP's own "
                "reducer timers, its built-in allreduce untouched (CPU only). ``hook``: a timing "
                "comm hook, per-bucket detail (the choice on CUDA). ``auto``: ``reducer`` where "
                "it gives the same blame, else ``hook``. Without DDP every ``torch.distributed`` "
                "collective is timed where it is called, whatever this says."),
        Setting(DUMP_DIR, "a folder path", DEFAULT_DUMP_DIR, str.strip, _path, "dump_dir",
                meaning="Folder for hang dumps, relative to each rank's working directory: one "
                "subfolder per hang episode, one JSON and one text file per rank, folders 0700 "
                "and files 0600. Checked at start: created, or one log line says where dumps "
                "go instead."),
        Setting(ADVERTISE_ADDR, "a host name or IP address without port or scheme (the port "
                "is the metrics port)", None, str.strip, _host, "",
                "the address of the interface that reaches MASTER_ADDR",
                meaning="Host or IP registered for discovery (``/sd``, file_sd): where "
                "Prometheus scrapes this rank. Unset: the bind address when it names one "
                "interface; when bound to every interface, the IP of the interface that routes "
                "to ``MASTER_ADDR``, else the hostname's address, else the default route's "
                "interface IP (never a loopback address), else the hostname."),
        Setting(FILE_SD, "a folder path", None, str.strip, _path, "", "unset: no file_sd",
                meaning="Folder where each rank writes its own file_sd target file "
                "(atomically), for Prometheus' ``file_sd_configs``; removed at a clean exit, "
                "kept when the rank dies."),
        Setting(JOB_DEADLINE, "a Unix time or a duration like 72h, 90m, 3600s or 1d12h", None,
                _deadline(JOB_DEADLINE), _same, "", "none (SLURM_JOB_END_TIME, else no deadline)",
                meaning="The job's wall-clock limit: a Unix time, or a duration from the job's "
                "start (torchrun's start under torchrun, so restarted workers keep it; else the "
                "rank's process start). With the steps to run (``instrument(total_steps=...)`` "
                "or ``epochs``) the rules project whether the job finishes in time "
                "(DDPJobWillMissDeadline). Wins over ``SLURM_JOB_END_TIME``."),
        Setting(SLURM_JOB_END_TIME, "a Unix time (seconds since 1970)", None,
                _deadline(SLURM_JOB_END_TIME), _same, "", "none (no deadline)",
                meaning="Set by Slurm 23.02 and later: the Unix time the job's ``--time`` limit "
                "ends it. ``0`` or empty: no deadline."),
        Setting(FINAL_SCRAPE_S, "seconds >= 0 (0: no wait)", DEFAULT_FINAL_SCRAPE_S, _parse_float,
                _seconds(0, inclusive=True),
                meaning="Most seconds a rank that ends cleanly (or leaves on a hang action) "
                "waits for its scrapers to read its final state, so that a finished job is not "
                "taken for a dead one. ``0``: no wait."),
        Setting(ON_HANG, "'off' or 'abort'", "off", _lower, _one_of(("off", "abort")),
                "on_hang",
                meaning="What a hang does besides alerts and dumps. ``abort``: every rank of "
                "the run exits with the abort exit code once the hang has lasted "
                "``DDP_EXPORTER_ABORT_AFTER_S``, for the launcher to restart the job from its "
                "last checkpoint."),
        Setting(ABORT_AFTER_S, "seconds > 0", DEFAULT_ABORT_AFTER_S, _parse_float,
                _seconds(0, inclusive=False), "abort_after",
                meaning="Seconds a hang whose evidence is complete lasts before ``abort`` acts; "
                "1.5x as long when it is not, at least twice the threshold that declared the "
                "hang, at most half the process group's timeout."),
        Setting(ABORT_EXIT_CODE, _EXIT_CODE, DEFAULT_ABORT_EXIT_CODE, _parse_int,
                _integer(1, 255),
                meaning="Exit code of every rank the hang action ends (EX_TEMPFAIL: try "
                "again)."),
        Setting(ABORT_LIMIT, "an int >= 0 (0: never stop)", DEFAULT_ABORT_LIMIT, _parse_int,
                _integer(0), "abort_limit",
                meaning="Aborts in a row without progress after which the hang action stops: "
                "the last one exits with the give-up code, later hangs only alert and dump. "
                "``0``: never stop."),
        Setting(ABORT_PROGRESS_STEPS, "steps >= 1", DEFAULT_ABORT_PROGRESS_STEPS, _parse_int,
                _integer(1),
                meaning="Steps an attempt must get past the furthest step of the run's earlier "
                "attempts to count as progress."),
        Setting(GIVE_UP_EXIT_CODE, _EXIT_CODE, DEFAULT_GIVE_UP_EXIT_CODE, _parse_int,
                _integer(1, 255),
                meaning="Exit code of the abort that reaches the limit: \"do not requeue\" "
                "(EX_UNAVAILABLE). Must differ from the abort exit code."),
        Setting(ATTEMPT, "a count of earlier attempts (0, 1, ...)", 0, _parse_attempt,
                meaning="Attempts of the run before this job, for a script that resubmits a run "
                "as a new job; added to torchrun's restart count (``TORCHELASTIC_RESTART_COUNT``) "
                "or Slurm's requeue count (``SLURM_RESTART_COUNT``) to make "
                "``ddp_rank_info{attempt}``."),
        Setting(NODE, "a node name (letters, digits, '.', '_', '-'; up to 253)", None, str.strip,
                _node, "", "the hostname",
                meaning="The ``node`` label: the machine this rank runs on, what the fleet "
                "rules blame and a drain acts on. On Kubernetes, the node name (downward API "
                "``spec.nodeName``; the generated manifests set it), not the pod's hostname."),
        Setting(DOCTOR_FAKE_VERSIONS, "comma-separated KEY=VERSION with KEY in "
                + ", ".join(VERSION_KEYS), {}, _parse_fake_versions, _same, "", "none",
                meaning="For tests only, never in production: versions this rank's ``ddp-exporter "
                "doctor`` reports instead of its real ones, to inject version skew "
                "(e.g. ``torch=9.9.9``)."),
    )
}  # fmt: skip

#: Variables the exporter reads but does not own, and what it reads them for.
OTHER_VARIABLES: dict[str, str] = {
    OTEL_ENDPOINT: "OpenTelemetry's endpoint: when set (or its metrics-only form), each rank "
    "also pushes its series over OTLP/HTTP (extra ``otlp``).",
    OTEL_METRICS_ENDPOINT: "OpenTelemetry's metrics-only endpoint; as above.",
    OTEL_METRIC_EXPORT_INTERVAL: "Milliseconds between OTLP pushes (the SDK's own variable).",
    OTEL_METRIC_EXPORT_TIMEOUT: "Milliseconds an OTLP push may take (the SDK's own variable).",
    OTEL_SDK_DISABLED: "``true`` switches the OTLP push off.",
    RANK: "Set by the launcher; the rank until the process group exists.",
    LOCAL_RANK: "Set by the launcher; the endpoint's port is the base port plus it.",
    WORLD_SIZE: "Set by the launcher; the world size until the process group exists.",
    MASTER_ADDR: "Set by the launcher; the init watch and the doctor probe it, the advertised "
    "address is the interface that routes to it.",
    MASTER_PORT: "Set by the launcher; probed by the init watch and the doctor.",
    TORCHELASTIC_RUN_ID: "Set by torchrun: the default ``run`` label.",
    TORCHELASTIC_RESTART_COUNT: "Set by torchrun: the attempt of a restarted job.",
    TORCHELASTIC_MAX_RESTARTS: "Set by torchrun: whether a hang action's abort can be "
    "restarted.",
    TORCHELASTIC_USE_AGENT_STORE: "Set by torchrun: the init watch checks in through its "
    "agent's store.",
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE: "Read by torchrun's c10d rendezvous: ``1`` gives each "
    "attempt a store of its own (the doctor's ``restart`` check reads it).",
    SLURM_JOB_ID: "Set by Slurm: the ``run`` label when torchrun gives none.",
    SLURM_RESTART_COUNT: "Set by Slurm: the attempt of a requeued job.",
    GLOO_SOCKET_IFNAME: "Read by gloo: the doctor checks the interface exists and is reachable.",
    NCCL_SOCKET_IFNAME: "Read by NCCL: the doctor checks the interface exists.",
}


# -- parsers -----------------------------------------------------------------------------------
def env_int(name: str, default: int, environ: Mapping[str, str] | None = None) -> int:
    """Return the integer in variable ``name``, or ``default`` when unset or empty.

    Raises ValueError naming the variable when it holds something else.
    """
    raw = _environ(environ).get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


def env_float(name: str, default: float, environ: Mapping[str, str] | None = None) -> float:
    """Return the number in variable ``name``, or ``default`` when unset or empty."""
    raw = _environ(environ).get(name)
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
    raw = _environ(environ).get(name, "").strip()
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


def int_or_none(environ: Mapping[str, str], name: str) -> int | None:
    """Return the integer in ``name``, or None when unset or not an integer (checkers report it)."""
    try:
        return int(environ[name])
    except (KeyError, ValueError):
        return None


def positive_int(what: str, value: Any) -> int:
    """Return ``value`` if it is an int > 0; else raise ValueError naming keyword ``what``."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"exporter.instrument({what}=...): expected an int > 0, got {value!r}")
    return value


_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
#: A bare number below this is surely a duration without unit, not a Unix time (2001-09-09).
_MIN_UNIX = 1_000_000_000


def parse_deadline(name: str, raw: str, start_unix: float) -> float:
    """Return the Unix deadline that ``raw`` (read from variable ``name``) stands for.

    Accepts a Unix time (integer or decimal) or, for ``DDP_EXPORTER_JOB_DEADLINE``, a duration
    with d/h/m/s units counted from ``start_unix``. Raises ValueError naming the variable.
    """
    text = raw.strip()
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is not None:
        if not math.isfinite(value) or value < _MIN_UNIX:
            hint = f"; for a duration write a unit, e.g. {text}s" if name == JOB_DEADLINE else ""
            raise ValueError(f"{name}={raw!r} is not a Unix time (seconds since 1970){hint}")
        return value
    match = _DURATION.match(text)
    if name == JOB_DEADLINE and text and match is not None:
        days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
        total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
        if total <= 0:
            raise ValueError(f"{name}={raw!r}: the duration must be positive")
        return start_unix + total
    if name == JOB_DEADLINE:
        raise ValueError(
            f"{name}={raw!r} is neither a Unix time nor a duration like 72h, 90m, 3600s or 1d12h"
        )
    raise ValueError(f"{name}={raw!r} is not a Unix time (seconds since 1970)")


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


# -- single settings ---------------------------------------------------------------------------
def default_run(environ: Mapping[str, str] | None = None) -> str:
    """Return the ``run`` label from the environment (see the module docstring for the order)."""
    environ = _environ(environ)
    run = environ.get(RUN)
    if run:
        return run
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


def bind_addr(
    addr: str | None, environ: Mapping[str, str] | None = None, caller: str = "instrument"
) -> str:
    """Return the metrics bind address: keyword, ``DDP_EXPORTER_ADDR``, then all interfaces."""
    return resolve(ADDR, addr, caller=caller, environ=environ)


def is_all_interfaces(addr: str) -> bool:
    """Say whether binding ``addr`` listens on every interface (0.0.0.0, ::, empty)."""
    return addr in ALL_INTERFACES


def monitoring_rank(
    rank: int | None, environ: Mapping[str, str] | None = None, caller: str = "instrument"
) -> int:
    """Return the monitoring rank: keyword, ``DDP_EXPORTER_MONITOR_RANK``, then 0."""
    return resolve(MONITOR_RANK, rank, caller=caller, environ=environ)


def flight_recorder(on: bool | None, environ: Mapping[str, str] | None = None) -> bool:
    """Say whether to read the Flight Recorder: keyword, else the variable (default on)."""
    return resolve(FLIGHT_RECORDER, on, environ=environ)


def comm_timing(
    caller: str, value: str | None = None, environ: Mapping[str, str] | None = None
) -> str:
    """Return the communication timing mode: keyword, ``DDP_EXPORTER_COMM_TIMING``, ``auto``.

    Raises ValueError naming ``caller``'s keyword for a keyword it does not accept.
    """
    return resolve(COMM_TIMING, value, caller=caller, environ=environ)


def dump_dir(path: Any, environ: Mapping[str, str] | None = None) -> str:
    """Return the hang dump folder: keyword (a path), ``DDP_EXPORTER_DUMP_DIR``, the default."""
    return resolve(DUMP_DIR, path, environ=environ)


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
    raw = _environ(environ).get(DUMP_DIR, "")
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
    """Return the OTLP setting: the keyword, else whether an ``OTEL_*`` endpoint is set."""
    if otlp is not None:
        return otlp
    environ = _environ(environ)
    return bool(environ.get(OTEL_ENDPOINT) or environ.get(OTEL_METRICS_ENDPOINT))


def otlp_disabled(environ: Mapping[str, str] | None = None) -> bool:
    """Say whether ``OTEL_SDK_DISABLED`` switches OpenTelemetry off."""
    return _environ(environ).get(OTEL_SDK_DISABLED, "").strip().lower() == "true"


def advertise_override(environ: Mapping[str, str] | None = None) -> str | None:
    """Return ``DDP_EXPORTER_ADVERTISE_ADDR`` (a host), or None when unset or not a host."""
    return resolve(ADVERTISE_ADDR, environ=environ)


def _is_ipv6(host: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(host).version == 6
    except ValueError:
        return False


def under_torchrun(environ: Mapping[str, str] | None = None) -> bool:
    """Say whether torchrun (an elastic agent) started this process."""
    return bool(_environ(environ).get(TORCHELASTIC_RUN_ID))


def attempt(environ: Mapping[str, str] | None = None) -> str:
    """Return which attempt of its run this process is: torchrun's restart, Slurm's requeue.

    ``DDP_EXPORTER_ATTEMPT`` (the attempts before this job, for a script that resubmits a
    run as a new job) is added.
    """
    base = resolve(ATTEMPT, environ=environ)
    environ = _environ(environ)
    for name in (TORCHELASTIC_RESTART_COUNT, SLURM_RESTART_COUNT):
        value = environ.get(name, "").strip()
        if value.isdigit():
            return str(base + int(value))
    return str(base)


def final_scrape_s(environ: Mapping[str, str] | None = None) -> float:
    """Return how long a clean end may wait for its final scrape (``DDP_EXPORTER_FINAL_SCRAPE_S``)."""
    return resolve(FINAL_SCRAPE_S, environ=environ)


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
        blamed = GIVE_UP_EXIT_CODE if _environ(environ).get(GIVE_UP_EXIT_CODE) else ABORT_EXIT_CODE
        report_invalid(
            SETTINGS[blamed],
            _environ(environ).get(blamed, ""),
            accepted=f"{_EXIT_CODE} other than the "
            + ("abort exit code" if blamed == GIVE_UP_EXIT_CODE else "give-up exit code"),
            environ=environ,
        )
        code, give_up = DEFAULT_ABORT_EXIT_CODE, DEFAULT_GIVE_UP_EXIT_CODE
    return OnHang(action, float(after_s), code, limit, steps, give_up)


def restarts_left(environ: Mapping[str, str] | None = None) -> int | None:
    """Return how many restarts torchrun may still make of this job, None outside torchrun.

    ``TORCHELASTIC_MAX_RESTARTS`` minus ``TORCHELASTIC_RESTART_COUNT``: the restarts left.
    """
    env = _environ(environ)
    total = int_or_none(env, TORCHELASTIC_MAX_RESTARTS)
    if total is None or not under_torchrun(env):
        return None
    return max(0, total - (int_or_none(env, TORCHELASTIC_RESTART_COUNT) or 0))


def restart_count(environ: Mapping[str, str] | None = None) -> str:
    """Return torchrun's restart attempt (``0`` outside torchrun) as it names store keys."""
    return _environ(environ).get(TORCHELASTIC_RESTART_COUNT, "0")


def agent_store_address(environ: Mapping[str, str] | None = None) -> tuple[str, int] | None:
    """Return torchrun's agent store address, or None when the workers have no such store."""
    environ = _environ(environ)
    if environ.get(TORCHELASTIC_USE_AGENT_STORE) != "True":
        return None
    return master_address(environ)


def master_address(environ: Mapping[str, str] | None = None) -> tuple[str, int] | None:
    """Return ``(MASTER_ADDR, MASTER_PORT)`` when both are set and the port is a number."""
    environ = _environ(environ)
    addr, port = environ.get(MASTER_ADDR), environ.get(MASTER_PORT)
    if not addr or not port:
        return None
    try:
        return addr, int(port)
    except ValueError:
        return None


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
    name = resolve(NODE, environ=environ)
    if name is not None:
        return name
    host = socket.gethostname()
    if _NODE_NAME.match(host):
        return host
    return re.sub(r"[^A-Za-z0-9._-]", "-", host).lstrip("._-")[:253] or "unknown"


def identity(
    *,
    run: str | None = None,
    group: tuple[int, int] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Identity:
    """Return this rank's identity.

    ``group`` is ``(rank, world_size)`` of the default process group when it exists (it wins
    over ``RANK``/``WORLD_SIZE``); ``run`` a keyword that wins over :func:`default_run`.
    """
    if group is not None:
        rank, world = group
    else:
        rank, world = env_int(RANK, 0, environ), env_int(WORLD_SIZE, 1, environ)
    return Identity(
        rank=rank,
        world_size=world,
        local_rank=env_int(LOCAL_RANK, 0, environ),
        run=run if run is not None else default_run(environ),
        attempt=attempt(environ),
        node=node_name(environ),
    )


@dataclass(frozen=True)
class Endpoint:
    """What the metrics endpoint and its background threads need, resolved and validated."""

    #: The port this rank binds: ``port + LOCAL_RANK``, or 0 for a free port.
    port: int
    addr: str
    heartbeat_s: float
    monitor_rank: int
    peer_series: int


def endpoint(
    caller: str,
    *,
    port: Any = None,
    addr: str | None = None,
    heartbeat_s: Any = None,
    monitor_rank: int | None = None,
    peer_series: Any = None,
    environ: Mapping[str, str] | None = None,
) -> Endpoint:
    """Resolve the settings instrument() and watch_init() share: keyword, environment, default.

    Raises ValueError naming ``caller``'s keyword for a keyword it does not accept.
    """
    base_port = resolve(PORT, port, caller=caller, environ=environ)
    local_rank = env_int(LOCAL_RANK, 0, environ)
    if base_port and base_port + local_rank > 65535:
        message = f"port {base_port} + LOCAL_RANK {local_rank} exceeds 65535"
        if port is not None:
            raise ValueError(f"exporter.{caller}(port=...): {message}")
        report_invalid(
            SETTINGS[PORT],
            _environ(environ).get(PORT, ""),
            accepted=f"a base port with port + LOCAL_RANK ({local_rank}) <= 65535",
            environ=environ,
        )
        base_port = DEFAULT_PORT if DEFAULT_PORT + local_rank <= 65535 else 0
    return Endpoint(
        port=0 if base_port == 0 else base_port + local_rank,
        addr=bind_addr(addr, environ, caller),
        heartbeat_s=resolve(HEARTBEAT_S, heartbeat_s, caller=caller, environ=environ),
        monitor_rank=monitoring_rank(monitor_rank, environ, caller),
        peer_series=resolve(PEER_SERIES, peer_series, caller=caller, environ=environ),
    )
