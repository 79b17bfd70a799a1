"""Build one rank's parts for the :class:`~exporter.observer.Observer`: its hooks and watchers.

The observer holds the parts together, serves them and closes them; building them is here, one
function per group: what times the steps (:func:`hook_steps`) and what watches the job through
the c10d store (:func:`start_watchers`). A part whose start fails is counted, not raised.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from . import settings, storekeys
from .errors import ErrorCounter
from .hangs.action import policies
from .hangs.episodes import EpisodeFeed
from .hangs.watcher import HangWatcher
from .log import log
from .sources.backends import backend_name
from .sources.commtiming import CommTiming, start_comm_timing
from .sources.context import RankContext
from .sources.ending import End
from .sources.flight import InFlight
from .sources.goodput import GoodputTracker
from .sources.gpu.health import HealthSource
from .sources.gpu.nvml import nvml_source
from .sources.heartbeat import Heartbeat
from .sources.instrumentors import DataLoaderInstrumentor, OptimizerInstrumentor
from .sources.joinwaits import JoinWaits
from .sources.parallelism import compute_device, kind_of
from .sources.recorder import Recorder
from .sources.sections import REGISTRY as SECTIONS
from .sources.threadsections import ThreadSections
from .sources.training import or_main_thread

__all__ = [
    "StepHooks",
    "Watchers",
    "hook_steps",
    "rank_context",
    "start_goodput",
    "start_gpu_health",
    "start_watchers",
    "started",
]

_T = TypeVar("_T")


def started(errors: ErrorCounter, where: str, start: Callable[[], _T]) -> _T | None:
    """Return what ``start()`` built and started, or None after counting its error."""
    try:
        return start()
    except Exception as exc:  # noqa: BLE001 - a dead store must not stop training
        errors.record(where, exc)
        return None


@dataclass
class StepHooks:
    """What times one rank's steps, hooked on its model, DataLoader and optimizer."""

    #: ``ddp``, ``fsdp2``, ``fsdp``, ``module`` or ``none`` (exporter.sources.parallelism).
    parallelism: str
    recorder: Recorder
    device: torch.device
    #: The process group's backend (``none`` before ``init_process_group``).
    backend: str
    inflight: InFlight
    #: What times communication (exporter.sources.commtiming).
    timing: CommTiming
    loader: DataLoaderInstrumentor | None
    optim: OptimizerInstrumentor | None
    #: Declared sections on the training thread, listened to (no step runs inside one).
    sections: ThreadSections
    #: A rank's wait inside ``Join`` for peers with more inputs, timed as comm_wait.
    joins: JoinWaits


def start_gpu_health(
    cfg: settings.InstrumentSettings,
    device: torch.device,
    errors: ErrorCounter,
    injected: HealthSource | None,
) -> tuple[HealthSource | None, list[Callable[[], None]]]:
    """Return the rank's GPU health source and what closes it: ``injected``, else NVML's on CUDA.

    Off (no NVML call) with ``DDP_EXPORTER_GPU_HEALTH=0`` or on a rank without a GPU.
    """
    if injected is not None:
        return injected, []
    if not cfg.gpu_health or device.type != "cuda":
        return None, []
    found = started(errors, "gpu", lambda: nvml_source(device, errors))
    source, watch = found if found is not None else (None, None)
    closers = [part.close for part in (watch, source) if part is not None]
    return source, closers


def _closer(optimizer: Any, dataloader: Any, ddp: bool) -> str:
    """Return what closes a step: without DDP only the optimizer, the DataLoader or step()."""
    if optimizer is not None:
        return "optimizer"
    if dataloader is not None:
        return "dataloader"
    return "comm_hook" if ddp else "explicit"


def hook_steps(
    model: torch.nn.Module | None,
    cfg: settings.InstrumentSettings,
    errors: ErrorCounter,
    dataloader: torch.utils.data.DataLoader | None,
    optimizer: torch.optim.Optimizer | None,
    training_thread: int | None = None,
) -> StepHooks:
    """Hook what times ``model``'s steps: the recorder, in-flight state, communication timing.

    ``training_thread``: the thread that trains (default: the main thread); only its waits and
    declared sections count in its steps.
    """
    parallelism = kind_of(model)
    ddp = parallelism == "ddp"
    recorder = Recorder(_closer(optimizer, dataloader, ddp))
    device = compute_device(model)
    pg = model.process_group if ddp and model is not None else None
    backend = backend_name(pg, device)
    # In-flight state: the Flight Recorder where it works, else the hook's bookkeeping.
    inflight = InFlight(
        recorder,
        errors,
        flight_recorder=cfg.flight_recorder,
        before_first_collective=not ddp,
    )
    timing = start_comm_timing(
        model,
        parallelism,
        recorder,
        errors,
        requested=cfg.comm_timing,
        inflight=inflight.name,
        cuda=device.type == "cuda",
        keyword="comm_timing" in cfg.keywords,
        device_every=cfg.device_wait_every,
        gpu=device.index if device.type == "cuda" else None,
        training_thread=training_thread,
    )
    loader = None if dataloader is None else DataLoaderInstrumentor(dataloader, recorder, errors)
    optim = None if optimizer is None else OptimizerInstrumentor(optimizer, recorder, errors)
    for part in (loader, optim):
        if part is not None:
            part.instrument()
    # A checkpoint or evaluation in a declared section on the training thread is no step.
    sections = ThreadSections(recorder, or_main_thread(training_thread))
    SECTIONS.listen(sections)
    joins = JoinWaits(recorder, errors, training_thread).instrument()
    return StepHooks(
        parallelism, recorder, device, backend, inflight, timing, loader, optim, sections, joins
    )


@dataclass
class Watchers:
    """What watches the job through the store: the heartbeat and the hang watcher (or None)."""

    heartbeat: Heartbeat | None
    hangs: HangWatcher | None


def rank_context(
    cfg: settings.InstrumentSettings,
    store: Any,
    recorder: Recorder,
    errors: ErrorCounter,
    training_thread: int | None = None,
) -> RankContext:
    """Return what the rank's hang watcher and goodput account share."""
    identity, endpoint = cfg.identity, cfg.endpoint
    return RankContext(
        identity=identity,
        store=store,
        recorder=recorder,
        sections=SECTIONS,
        interval_s=endpoint.heartbeat_s,
        monitor=identity.rank == endpoint.monitor_rank,
        dump_dir=cfg.dump_dir,
        errors=errors,
        start_step=cfg.start_step,
        training_thread=training_thread,
    )


def start_watchers(
    cfg: settings.InstrumentSettings,
    ctx: RankContext,
    hooks: StepHooks,
    publish_abort: Callable[[], None],
) -> Watchers:
    """Start the heartbeat and, riding on it, the hang watcher; either may be None."""
    identity, endpoint = cfg.identity, cfg.endpoint
    store, errors = ctx.store, ctx.errors
    rank, beat = identity.rank, endpoint.heartbeat_s
    monitor = rank == endpoint.monitor_rank
    heartbeat: Heartbeat | None = None
    if beat > 0 and store is not None:
        keys = storekeys.for_run(identity.run, identity.attempt)
        heartbeat = started(
            errors,
            "heartbeat",
            lambda: Heartbeat(
                store,
                keys,
                rank,
                identity.world_size,
                beat,
                monitor=monitor,
                errors=errors,
                peer_series=endpoint.peer_series,
            ).start(),
        )
    # Hang watching rides on the heartbeat's store and interval; without a monitoring rank
    # nobody would decide a hang, so nothing is reported either.
    action, restart = policies(cfg.on_hang, cfg.final_scrape_s)
    hangs: HangWatcher | None = None
    if heartbeat is not None and 0 <= endpoint.monitor_rank < identity.world_size:
        hangs = started(
            errors,
            "forensics",
            lambda: HangWatcher(
                ctx,
                inflight=hooks.inflight,
                action=action,
                publish_abort=publish_abort,
                restart=restart,
                probe=cfg.hang_probe,
            ).start(),
        )
    if action is not None and hangs is None:
        log.error(
            "ddp-exporter: on_hang=abort needs the hang watcher, which is not running "
            "(no c10d store, or its start failed): a hang will not end the run"
        )
    return Watchers(heartbeat, hangs)


def start_goodput(ctx: RankContext, watchers: Watchers, end: End) -> GoodputTracker | None:
    """Start the rank's goodput account beside its heartbeat (None without one); never raises.

    Every rank publishes its work; the monitoring rank keeps the account, reading the hang
    watcher's episodes when it runs one. A clean end (``end`` marked) ends the account, and so
    does the hang action's abort, before the rank exits.
    """
    store = ctx.store
    if watchers.heartbeat is None or store is None:
        return None
    watcher = watchers.hangs if ctx.monitor else None

    def start() -> GoodputTracker:
        tracker = GoodputTracker(
            ctx,
            hangs=EpisodeFeed(store, ctx.identity, watcher) if watcher is not None else None,
            end=end,
        )
        if watcher is not None:
            # The account ends at the abort and is on disk before the exit (the next attempt
            # carries it on); the final scrapes the abort waits for read its last totals.
            watcher.when_aborting(lambda: tracker.finish(clean=False))
        return tracker.start()

    return started(ctx.errors, "goodput", start)
