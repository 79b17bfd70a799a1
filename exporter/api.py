"""The functions a training script calls: instrument(), watch_init(), step() and active().

Each resolves its settings (keyword, environment, default: :mod:`exporter.settings`), checks
its arguments, and keeps the process-wide handle: one observer and one init watch per process.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import warnings
from collections.abc import Iterator
from dataclasses import replace

import torch
import torch.distributed as dist

from . import settings
from .initwatch import InitWatch
from .log import log
from .observer import Observer
from .sources import launcher, parallelism
from .sources.gpu.health import HealthSource
from .sources.memory import MemorySource
from .sources.walltime import resolve_job_clock

__all__ = ["active", "instrument", "running_watch", "step", "watch_init"]

_lock = threading.Lock()
_active: Observer | None = None
_watch: InitWatch | None = None


def _forget_after_fork() -> None:
    """In a process forked from a rank: let go of its endpoint, end nothing at exit."""
    # Without the lock: another thread of the rank may have held it when fork() copied it.
    for part in (_active, _watch):
        try:
            if part is not None and not part.closed:
                part.forget_after_fork()
        except Exception as exc:  # noqa: BLE001 - never into the user's fork()
            log.warning(
                "ddp-exporter: a forked child could not let go of the rank's endpoint: %r", exc
            )


os.register_at_fork(after_in_child=_forget_after_fork)


def _group() -> tuple[int, int] | None:
    """Return ``(rank, world_size)`` of the default process group, None before it exists."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def _required_group() -> tuple[int, int]:
    """Return ``(rank, world_size)`` of the default process group; raise before it exists."""
    group = _group()
    if group is None:
        raise ValueError(
            "exporter.instrument(): no process group; call "
            "torch.distributed.init_process_group() first"
        )
    return group


def _check_types(
    model: object, dataloader: object, optimizer: object, sources: dict[str, object]
) -> str:
    """Check the arguments' types; return the model's parallelism (raises TypeError)."""
    kind = parallelism.kind_of(model)
    for name, source in sources.items():
        if source is not None and not callable(source):
            raise TypeError(f"exporter.instrument({name}=...): expected a callable")
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
    return kind


def _abort_someone_can_restart(cfg: settings.InstrumentSettings) -> settings.InstrumentSettings:
    """Return ``cfg``, its hang action off where an abort's restart could not connect.

    A shared store kept dirty would stop the restarted job: ``on_hang="abort"`` given as a
    keyword raises ValueError; from ``DDP_EXPORTER_ON_HANG`` it is logged and turned off.
    """
    if cfg.on_hang.action != "abort":
        return cfg
    blocker = launcher.restart_blocker(launcher.launch(), launcher.job_store(), torch.__version__)
    if blocker is None:
        return cfg
    if "on_hang" in cfg.keywords:
        raise ValueError(f"exporter.instrument(on_hang='abort'): {blocker}")
    return replace(cfg, on_hang=settings.off_hang(cfg.on_hang, f"'off' here: {blocker}"))


def instrument(
    model: torch.nn.Module | None = None,
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
    gpu_source: HealthSource | None = None,
    serve: bool = True,
    otlp: bool | str | None = None,
    peer_series: int | None = None,
    dump_dir: str | os.PathLike | None = None,
    total_steps: int | None = None,
    epochs: int | None = None,
    on_hang: str | None = None,
    abort_after: float | None = None,
    abort_limit: int | None = None,
    start_step: int | None = None,
    comm_timing: str | None = None,
    web_config: str | os.PathLike | None = None,
) -> Observer:
    """Instrument a training job (its model, DataLoader and optimizer); serve metrics.

    ``model``: a ``DistributedDataParallel`` model, an FSDP2 (``fully_shard``) or classic FSDP
    model, another ``torch.nn.Module`` of a distributed job, or None (a loop of collectives: steps
    then come from ``dataloader``, ``optimizer`` or ``with exporter.step():``). Without DDP every
    ``torch.distributed`` collective is timed where it is called
    (:mod:`exporter.sources.collectives`; ``ddp_rank_info{parallelism}`` says which kind).

    Each rank serves ``/metrics`` on ``port + LOCAL_RANK`` (``port=0``: a free port; see
    ``Observer.port``). Settings not given fall back to the environment (:mod:`exporter.settings`)
    and then to defaults. ``otlp``: True or an OTLP/HTTP endpoint URL also pushes the same
    signals with OpenTelemetry (extra ``otlp``); None enables it when ``OTEL_EXPORTER_OTLP_ENDPOINT``
    or ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` is set. ``peer_series`` bounds the monitoring
    rank's peer-heartbeat series: every peer in jobs of up to that many ranks, else only late
    peers (see :mod:`exporter.sources.heartbeat`). ``total_steps`` (or ``epochs`` times the
    DataLoader's length) and the job deadline from the environment
    (:mod:`exporter.sources.walltime`) let the rules project whether the job finishes before its
    wall-clock limit. ``on_hang="abort"`` ends every rank of the run (exit code 75) once a hang
    has lasted ``abort_after`` seconds (default 20, 30 when its evidence is incomplete), for the
    launcher to restart the job from its last checkpoint (:mod:`exporter.hangs.action`), and
    stops after ``abort_limit`` aborts in a row without progress (default 3; the last exits 69,
    "do not requeue"; :mod:`exporter.hangs.restarts`); the default ``"off"`` alerts and dumps
    only. ``start_step``: the step this attempt resumed at (from its checkpoint), so that
    progress across restarts is measured in the run's steps.
    ``comm_timing``: ``"auto"`` (default) leaves DDP's built-in allreduce in place and times
    each iteration's communication with DDP's own reducer timers (CPU) or with three marks per
    iteration (``"events"``: CUDA events on a GPU, nothing per gradient bucket); ``"hook"`` wraps
    the allreduce in a timing comm hook (per-bucket detail, a Python call per bucket); see
    :mod:`exporter.sources.commtiming`. A CUDA rank reads its GPU's health through NVML at each
    scrape (extra ``gpu``); ``gpu_source``, a callable returning a
    :class:`~exporter.sources.gpu.GPUHealth`, replaces it as ``memory_source`` does memory.
    ``web_config``: TLS and passwords for every path the rank serves, an exporter-toolkit web
    configuration file (:mod:`exporter.web`; extra ``web``). Calling it again warns and returns the same handle.
    Call it on the thread that trains: only that thread's waits are comm_wait, its sections
    pause steps, and its stack is the one a hang dump names.
    Raises TypeError/ValueError for bad arguments; never raises once training runs.
    """
    global _active, _watch
    with _lock:
        if _active is not None and not _active.closed:
            warnings.warn(
                "exporter.instrument() called twice; returning the existing handle",
                RuntimeWarning,
                stacklevel=2,
            )
            return _active
        sources = {"memory_source": memory_source, "gpu_source": gpu_source}
        kind = _check_types(model, dataloader, optimizer, sources)
        group = _required_group()
        watch = running_watch()  # watch_init() ran: adopt its endpoint, bind no second one
        cfg = settings.for_instrument(
            parallelism=kind,
            group=group,
            run=run if run is not None or watch is None else watch.run,
            port=port,
            addr=addr,
            heartbeat_s=heartbeat_s,
            monitor_rank=monitor_rank,
            peer_series=peer_series,
            web_config=web_config,
            flight_recorder_on=flight_recorder,
            otlp=otlp,
            dump_folder=dump_dir,
            hang_action=on_hang,
            abort_after=abort_after,
            abort_limit=abort_limit,
            start_step=start_step,
            timing=comm_timing,
        )
        cfg = _abort_someone_can_restart(cfg)
        if kind != "ddp" and dataloader is None and optimizer is None:
            log.info(
                "ddp-exporter: no DataLoader or optimizer given for a %s job: steps are counted "
                "only inside `with exporter.step():`",
                kind,
            )
        job_clock = resolve_job_clock(total_steps=total_steps, epochs=epochs, dataloader=dataloader)
        obs = Observer(
            model,
            cfg,
            dataloader=dataloader,
            optimizer=optimizer,
            memory_source=memory_source,
            gpu_source=gpu_source,
            serve=serve and watch is None,
            job_clock=job_clock,
        )
        if watch is not None:
            _watch = None
            obs.errors.merge(watch.errors)
            obs.adopt_endpoint(*watch.hand_over(obs.collector))
        _active = obs
    atexit.register(obs.close_at_exit)
    return obs


def watch_init(
    *,
    port: int | None = None,
    addr: str | None = None,
    run: str | None = None,
    heartbeat_s: float | None = None,
    monitor_rank: int | None = None,
    peer_series: int | None = None,
    serve: bool = True,
    web_config: str | os.PathLike | None = None,
) -> InitWatch | None:
    """Serve this rank's endpoint now and publish its init phase until instrument() takes over.

    Call it before ``dist.init_process_group``. Settings mean what they mean for
    :func:`instrument` and fall back to the same environment variables: the rank serves on
    ``port + LOCAL_RANK``; under torchrun every rank checks in through the agent's store every
    ``heartbeat_s`` and ``monitor_rank`` publishes ``ddp_init_peer_arrived`` (bounded by
    ``peer_series``). A later ``instrument()`` keeps this endpoint (its own port and address
    arguments are then not used). Calling it twice warns and returns the same handle; after
    ``instrument()`` it warns and returns None. Raises ValueError for bad settings.
    """
    global _watch
    with _lock:
        running = running_watch()
        if running is not None:
            warnings.warn(
                "exporter.watch_init() called twice; returning the existing handle",
                RuntimeWarning,
                stacklevel=2,
            )
            return running
        if _active is not None and not _active.closed:
            warnings.warn(
                "exporter.watch_init() called after exporter.instrument(); nothing to watch",
                RuntimeWarning,
                stacklevel=2,
            )
            return None
        endpoint = settings.endpoint(
            "watch_init",
            port=port,
            addr=addr,
            heartbeat_s=heartbeat_s,
            monitor_rank=monitor_rank,
            peer_series=peer_series,
            web_config=web_config,
        )
        watch = InitWatch(settings.identity(run=run, caller="watch_init"), endpoint, serve=serve)
        _watch = watch
    atexit.register(_close_watch, watch)
    return watch


def _close_watch(watch: InitWatch) -> None:
    """Close ``watch`` and forget it (at exit, or when a test closes it)."""
    global _watch
    with _lock:
        if _watch is watch:
            _watch = None
    watch.close()


def running_watch() -> InitWatch | None:
    """Return the init watch of this process while it runs (before instrument() takes over)."""
    watch = _watch
    if watch is not None and watch.closed:
        return None
    return watch


def active() -> Observer | None:
    """Return the handle of this process's instrumented model, if any."""
    obs = _active
    return obs if obs is not None and not obs.closed else None


@contextlib.contextmanager
def step() -> Iterator[None]:
    """Mark one step explicitly; a no-op when nothing is instrumented."""
    obs = active()
    if obs is None:
        yield
        return
    with obs.step():
        yield
