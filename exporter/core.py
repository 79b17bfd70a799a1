"""Instrument a DDP model and serve this rank's metrics: the :class:`Observer` handle."""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from prometheus_client import CollectorRegistry
from torch.nn.parallel import DistributedDataParallel

from . import discovery, env
from .catalog import DEFAULT_PEER_SERIES
from .collector import DDPCollector
from .commhook import CommHookWrapper, CudaEventResolver, allreduce_mean_hook
from .errors import ErrorCounter, log
from .flight import FlightRecorderSource, HookBookkeepingSource, pg_timeout_seconds
from .forensics import DEFAULT_DUMP_DIR, Forensics
from .heartbeat import Heartbeat
from .instrumentors import DataLoaderInstrumentor, OptimizerInstrumentor
from .memory import MemorySource, cuda_memory_source
from .recorder import Recorder
from .server import MetricsServer
from .versions import versions
from .walltime import JobClock, resolve_job_clock

__all__ = ["DEFAULT_PORT", "Observer", "instrument", "step", "active"]

#: Base port; rank ``LOCAL_RANK`` serves on ``DEFAULT_PORT + LOCAL_RANK``. Outside the
#: 9100-9999 range that Prometheus exporters have allocated among themselves.
DEFAULT_PORT = 19400
DEFAULT_HEARTBEAT_S = 5.0

_lock = threading.Lock()
_active: Observer | None = None


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None


def _default_run() -> str:
    run = os.environ.get(env.RUN)
    if run:
        return run
    run = os.environ.get(env.TORCHELASTIC_RUN_ID)
    if run and run != "none":
        return run
    run = os.environ.get(env.SLURM_JOB_ID)
    if run:
        return run
    addr, port = os.environ.get(env.MASTER_ADDR), os.environ.get(env.MASTER_PORT)
    if addr and port:
        return f"{addr}:{port}"
    return "local"


class Observer:
    """Handle of one instrumented rank: its metrics endpoint, hooks and background threads.

    Create it with :func:`exporter.instrument`. ``port`` is the bound port (None when the
    endpoint could not start); :meth:`close` restores everything that was patched.
    """

    def __init__(
        self,
        model: DistributedDataParallel,
        *,
        dataloader: torch.utils.data.DataLoader | None,
        optimizer: torch.optim.Optimizer | None,
        port: int,
        addr: str,
        run: str,
        heartbeat_s: float,
        monitor_rank: int,
        flight_recorder: bool,
        peer_series: int = DEFAULT_PEER_SERIES,
        memory_source: MemorySource | None,
        serve: bool,
        otlp: bool | str | None = None,
        dump_dir: str = DEFAULT_DUMP_DIR,
        job_clock: JobClock | None = None,
    ) -> None:
        self.model = model
        #: The job's wall-clock deadline and total steps (exporter.walltime).
        self.job_clock = job_clock if job_clock is not None else JobClock()
        self.run = run
        self.rank = dist.get_rank() if dist.is_initialized() else _env_int(env.RANK, 0)
        self.world_size = (
            dist.get_world_size() if dist.is_initialized() else _env_int(env.WORLD_SIZE, 1)
        )
        self.local_rank = _env_int(env.LOCAL_RANK, 0)
        self.errors = ErrorCounter()
        self._closed = False
        self._cuda = None
        if optimizer is not None:
            mode = "optimizer"
        elif dataloader is not None:
            mode = "dataloader"
        else:
            mode = "comm_hook"
        self.recorder = Recorder(mode)
        self.device = self._model_device(model)
        self.backend = dist.get_backend(model.process_group) if dist.is_initialized() else "none"

        # Comm hook: wrap the user's hook, or stand in for the built-in allreduce.
        pg = model.process_group
        pg_name = getattr(pg, "group_name", "0") or "0"
        stats = self.recorder.collective_stats("allreduce", pg_name, pg_timeout_seconds(pg))
        if self.device.type == "cuda":
            self._cuda = CudaEventResolver(self.recorder, self.errors)
        self.hook = CommHookWrapper(
            self.recorder, self.errors, stats, allreduce_mean_hook, pg, self._cuda
        )
        self._hook_patched = False
        self._install_comm_hook(model)
        # The first forward opens the first step, whatever source closes steps.
        self._forward_handle = model.register_forward_pre_hook(self._forward_pre)

        self._loader = (
            DataLoaderInstrumentor(dataloader, self.recorder, self.errors)
            if (dataloader is not None)
            else None
        )
        self._optim = (
            OptimizerInstrumentor(optimizer, self.recorder, self.errors)
            if (optimizer is not None)
            else None
        )
        if self._loader:
            self._loader.instrument()
        if self._optim:
            self._optim.instrument()

        # In-flight state: the Flight Recorder where it works, else our own bookkeeping.
        fr = FlightRecorderSource(self.errors) if flight_recorder else None
        if fr is not None and fr.available:
            self.inflight_source: Any = fr
        else:
            if flight_recorder:
                log.info(
                    "ddp-exporter: torch %s has no usable Flight Recorder; in-flight state "
                    "covers DDP buckets only",
                    torch.__version__,
                )
            self.inflight_source = HookBookkeepingSource(self.recorder)

        if memory_source is None and self.device.type == "cuda":
            memory_source = cuda_memory_source(self.device)
        self.memory_source = memory_source

        self.heartbeat: Heartbeat | None = None
        self._start_heartbeat(heartbeat_s, monitor_rank, peer_series)
        self.forensics: Forensics | None = None
        self._start_forensics(heartbeat_s, monitor_rank, dump_dir)

        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(DDPCollector(self))
        self._server = MetricsServer(self.registry, addr, port) if serve else None
        self.port: int | None = self._server.start() if self._server else None
        self._monitor_rank = monitor_rank
        self.discovery: discovery.Discovery | None = None
        self.start_discovery()
        self._otlp = self._start_otlp(otlp)

    # -- setup -------------------------------------------------------------------------------
    @staticmethod
    def _model_device(model: DistributedDataParallel) -> torch.device:
        for p in model.parameters():
            return p.device
        return torch.device("cpu")

    def _install_comm_hook(self, model: DistributedDataParallel) -> None:
        existing = list(getattr(model, "_comm_hooks", []))
        if existing:
            # DDP's reducer accepts one hook, once: a hook registered before instrument()
            # cannot be wrapped. Training is untouched; per-bucket timing is lost.
            log.warning(
                "ddp-exporter: a comm hook (%s) was registered before instrument(); collective "
                "latency and comm_wait are not measured. Call exporter.instrument() before "
                "ddp.register_comm_hook() to measure them.",
                getattr(existing[0][0], "__qualname__", existing[0][0]),
            )
            self.hook.enabled = False
            return
        model.register_comm_hook(self.hook.inner_state, self.hook)
        observer = self
        registered: list[bool] = []

        def register_comm_hook(state: object, hook) -> None:
            """Put the user's hook under the exporter's timing wrapper (DDP's signature)."""
            if registered:
                raise RuntimeError(
                    "register_comm_hook or register_builtin_comm_hook can only be called once."
                )
            model._check_comm_hook(hook)
            observer.hook.set_inner(hook, state)
            model._comm_hooks.append((hook, state))
            registered.append(True)

        def register_builtin_comm_hook(comm_hook_type) -> None:
            """Map a built-in hook onto its Python equivalent under the timing wrapper."""
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            if comm_hook_type == dist.BuiltinCommHookType.FP16_COMPRESS:
                register_comm_hook(model.process_group, default_hooks.fp16_compress_hook)
            else:
                register_comm_hook(model.process_group, allreduce_mean_hook)

        # Instance attributes shadow DDP's methods; close() deletes them to restore exactly.
        model.register_comm_hook = register_comm_hook
        model.register_builtin_comm_hook = register_builtin_comm_hook
        self._hook_patched = True

    def _start_heartbeat(self, interval_s: float, monitor_rank: int, peer_series: int) -> None:
        if interval_s <= 0 or not dist.is_initialized():
            return
        try:
            store = dist.distributed_c10d._get_default_store()
            self.heartbeat = Heartbeat(
                store,
                self.run,
                self.rank,
                self.world_size,
                interval_s,
                monitor=self.rank == monitor_rank,
                errors=self.errors,
                peer_series=peer_series,
            )
            self.heartbeat.start()
        except Exception as exc:  # noqa: BLE001
            self.errors.record("heartbeat", exc)
            self.heartbeat = None

    def start_discovery(self) -> None:
        """Register this rank for discovery and mount ``/sd`` once its endpoint serves.

        Called at start and again by :mod:`exporter.initwatch` when this observer adopts the
        init watch's endpoint (it had none to register before).
        """
        if self.discovery is None and self._server is not None:
            self.discovery = discovery.start(
                self, self._server, self._server.addr, self._monitor_rank
            )

    def _start_forensics(self, interval_s: float, monitor_rank: int, dump_dir: str) -> None:
        # Hang forensics ride on the heartbeat's store and interval (see exporter.forensics);
        # without a monitoring rank nobody would decide a hang, so nothing is reported either.
        if self.heartbeat is None or not 0 <= monitor_rank < self.world_size:
            return
        try:
            store = dist.distributed_c10d._get_default_store()
            self.forensics = Forensics(
                self, store, interval_s, self.rank == monitor_rank, dump_dir, self.errors
            )
            self.forensics.start()
        except Exception as exc:  # noqa: BLE001
            self.errors.record("forensics", exc)
            self.forensics = None

    def _start_otlp(self, otlp: bool | str | None) -> Any:
        """Start the OTLP push path when asked to (keyword or OTEL_* environment)."""
        if otlp is None:
            otlp = bool(
                os.environ.get(env.OTEL_ENDPOINT) or os.environ.get(env.OTEL_METRICS_ENDPOINT)
            )
        if otlp is False:
            return None
        try:
            from .otlp import start_push
        except ImportError as exc:
            log.error(
                "ddp-exporter: OTLP push requested but unavailable (%s); install "
                "ddp-exporter[otlp]. Prometheus metrics are still served.",
                exc,
            )
            return None
        try:
            return start_push(self, otlp if isinstance(otlp, str) else None)
        except Exception as exc:  # noqa: BLE001
            self.errors.record("collect", exc)
            return None

    def _forward_pre(self, module: Any, args: Any) -> None:
        # Once a step is open one stays open (each boundary opens the next): drop the hook.
        self._forward_handle.remove()
        try:
            self.recorder.open_step()
        except Exception as exc:  # noqa: BLE001
            self.errors.record("step", exc)

    def inflight_failed(self, exc: BaseException) -> None:
        """Fall back to comm-hook bookkeeping after the Flight Recorder failed once."""
        self.errors.record("flight_recorder", exc)
        self.inflight_source = HookBookkeepingSource(self.recorder)

    def info_labels(self) -> dict[str, str]:
        """Return the static facts published as ``ddp_rank_info``."""
        from . import __version__

        return {
            "local_rank": str(self.local_rank),
            "node": socket.gethostname(),
            "world_size": str(self.world_size),
            "backend": str(self.backend),
            "device": self.device.type,
            "torch_version": torch.__version__,
            "exporter_version": __version__,
            "inflight_source": self.inflight_source.name,
            **versions(),
        }

    # -- public ------------------------------------------------------------------------------
    @property
    def url(self) -> str | None:
        """Return this rank's metrics URL, or None when the endpoint is not serving."""
        if self.port is None:
            return None
        host = (
            self._server.addr
            if self._server.addr not in ("0.0.0.0", "::", "")
            else (socket.gethostname())
        )
        return f"http://{host}:{self.port}/metrics"

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """Mark one step explicitly (loops without an optimizer, e.g. evaluation)."""
        rec = self.recorder
        try:
            if rec.mode != "explicit":
                rec.set_mode("explicit")
            rec.open_step()
        except Exception as exc:  # noqa: BLE001
            self.errors.record("step", exc)
        try:
            yield
        finally:
            try:
                rec.boundary("explicit")
            except Exception as exc:  # noqa: BLE001
                self.errors.record("step", exc)

    def close(self) -> None:
        """Stop serving, stop threads and restore every patched object; idempotent."""
        global _active
        if self._closed:
            return
        self._closed = True
        with _lock:
            if _active is self:
                _active = None
        self.hook.enabled = False
        self._forward_handle.remove()
        if self._hook_patched:
            for name in ("register_comm_hook", "register_builtin_comm_hook"):
                self.model.__dict__.pop(name, None)
            self._hook_patched = False
        if self._loader:
            self._loader.uninstrument()
        if self._optim:
            self._optim.uninstrument()
        if self.heartbeat is not None:
            self.heartbeat.close()
        if self.forensics is not None:
            self.forensics.close()
        if self._cuda is not None:
            self._cuda.close()
        if self._otlp is not None:
            try:
                self._otlp.close()  # final flush: a short job's last steps are not lost
            except Exception as exc:  # noqa: BLE001
                self.errors.record("collect", exc)
        if self.discovery is not None:
            self.discovery.close()
        if self._server is not None:
            self._server.close()


def _check_types(model: Any, dataloader: Any, optimizer: Any) -> None:
    if not isinstance(model, DistributedDataParallel):
        raise TypeError(
            "exporter.instrument(model): expected a torch.nn.parallel.DistributedDataParallel "
            f"model, got {type(model).__module__}.{type(model).__qualname__}; wrap the model "
            "with DistributedDataParallel(model) first"
        )
    if dataloader is not None and not isinstance(dataloader, torch.utils.data.DataLoader):
        raise TypeError(
            "exporter.instrument(dataloader=...): expected a torch.utils.data.DataLoader, got "
            f"{type(dataloader).__qualname__}"
        )
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            "exporter.instrument(optimizer=...): expected a torch.optim.Optimizer, got "
            f"{type(optimizer).__qualname__}"
        )


def endpoint_settings(
    caller: str, port: Any, heartbeat_s: Any, peer_series: Any
) -> tuple[int, float, int]:
    """Resolve the settings instrument() and watch_init() share: keyword, environment, default.

    Return the port this rank binds (``port + LOCAL_RANK``; 0 for a free port), the heartbeat
    interval and ``peer_series``; raise ValueError naming ``caller``'s keyword or the variable.
    """
    base_port = _env_int(env.PORT, DEFAULT_PORT) if port is None else port
    if isinstance(base_port, bool) or not isinstance(base_port, int) or not 0 <= base_port <= 65535:
        raise ValueError(
            f"exporter.{caller}(port=...): expected an int in 0..65535, got {base_port!r}"
        )
    local_rank = _env_int(env.LOCAL_RANK, 0)
    bound = 0 if base_port == 0 else base_port + local_rank
    if bound > 65535:
        raise ValueError(f"port {base_port} + LOCAL_RANK {local_rank} exceeds 65535")
    hb = _env_float(env.HEARTBEAT_S, DEFAULT_HEARTBEAT_S) if heartbeat_s is None else heartbeat_s
    source = f"exporter.{caller}(peer_series=...)"
    if peer_series is None:
        source, peer_series = env.PEER_SERIES, _env_int(env.PEER_SERIES, DEFAULT_PEER_SERIES)
    if isinstance(peer_series, bool) or not isinstance(peer_series, int) or peer_series < 0:
        raise ValueError(f"{source}: expected an int >= 0, got {peer_series!r}")
    return bound, float(hb), peer_series


def instrument(
    model: DistributedDataParallel,
    *,
    dataloader: torch.utils.data.DataLoader | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    port: int | None = None,
    addr: str | None = None,
    run: str | None = None,
    heartbeat_s: float | None = None,
    monitor_rank: int | None = None,
    flight_recorder: bool | None = None,
    memory_source: MemorySource | None = None,
    serve: bool = True,
    otlp: bool | str | None = None,
    peer_series: int | None = None,
    dump_dir: str | os.PathLike | None = None,
    total_steps: int | None = None,
    epochs: int | None = None,
) -> Observer:
    """Instrument a DDP model (and optionally its DataLoader and optimizer); serve metrics.

    Each rank serves ``/metrics`` on ``port + LOCAL_RANK`` (``port=0``: a free port; see
    ``Observer.port``). Settings not given fall back to the environment (:mod:`exporter.env`)
    and then to defaults. ``otlp``: True or an OTLP/HTTP endpoint URL also pushes the same
    signals with OpenTelemetry (extra ``otlp``); None enables it when ``OTEL_EXPORTER_OTLP_ENDPOINT``
    or ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` is set. ``peer_series`` bounds the monitoring
    rank's peer-heartbeat series: every peer in jobs of up to that many ranks, else only late
    peers (see :mod:`exporter.heartbeat`). ``total_steps`` (or ``epochs`` times the DataLoader's
    length) and the job deadline from the environment (:mod:`exporter.walltime`) let the rules
    project whether the job finishes before its wall-clock limit.
    Calling it again warns and returns the same handle.
    Raises TypeError/ValueError for bad arguments; never raises once training runs.
    """
    global _active
    with _lock:
        if _active is not None:
            warnings.warn(
                "exporter.instrument() called twice; returning the existing handle",
                RuntimeWarning,
                stacklevel=2,
            )
            return _active
        _check_types(model, dataloader, optimizer)
        bound, hb, peer_series = endpoint_settings("instrument", port, heartbeat_s, peer_series)
        if memory_source is not None and not callable(memory_source):
            raise TypeError("exporter.instrument(memory_source=...): expected a callable")
        if dump_dir is not None and not isinstance(dump_dir, (str, os.PathLike)):
            raise TypeError(
                f"exporter.instrument(dump_dir=...): expected a path, got {type(dump_dir).__name__}"
            )
        if flight_recorder is None:
            flight_recorder = os.environ.get(env.FLIGHT_RECORDER, "1") not in ("0", "false", "")
        from . import initwatch  # here: initwatch imports this module

        watch = initwatch.running()  # watch_init() ran: adopt its endpoint, bind no second one
        job_clock = resolve_job_clock(total_steps=total_steps, epochs=epochs, dataloader=dataloader)
        obs = Observer(
            model,
            dataloader=dataloader,
            optimizer=optimizer,
            port=bound,
            addr=addr if addr is not None else os.environ.get(env.ADDR, "0.0.0.0"),
            run=run if run is not None else (watch.run if watch else _default_run()),
            heartbeat_s=hb,
            monitor_rank=_env_int(env.MONITOR_RANK, 0) if monitor_rank is None else monitor_rank,
            flight_recorder=flight_recorder,
            memory_source=memory_source,
            serve=serve and watch is None,
            otlp=otlp,
            peer_series=peer_series,
            dump_dir=os.fspath(dump_dir or os.environ.get(env.DUMP_DIR) or DEFAULT_DUMP_DIR),
            job_clock=job_clock,
        )
        if watch is not None:
            initwatch.take_over(watch, obs)
        _active = obs
    atexit.register(obs.close)
    return obs


def active() -> Observer | None:
    """Return the handle of this process's instrumented model, if any."""
    return _active


@contextlib.contextmanager
def step() -> Iterator[None]:
    """Mark one step explicitly; a no-op when nothing is instrumented."""
    obs = _active
    if obs is None:
        yield
        return
    with obs.step():
        yield
