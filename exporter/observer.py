"""Hold one instrumented rank together: its sources, its endpoint and its background threads.

The :class:`Observer` builds the sources, hands each exporting part the small things it reads
(the collector a :class:`~exporter.export.collector.RankSources`, the hang watcher its identity,
store and sources) and restores everything it patched in :meth:`Observer.close`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch
from prometheus_client import CollectorRegistry

from . import settings
from .assembly import (
    hook_steps,
    rank_context,
    start_goodput,
    start_gpu_health,
    start_watchers,
    started,
)
from .errors import ErrorCounter
from .export import discovery, push, server
from .export.collector import DDPCollector, RankSources
from .export.server import MetricsServer
from .log import log
from .sources import ending, launcher
from .sources.gpu.health import HealthSource
from .sources.instrumentors import FirstForward
from .sources.memory import MemorySource, cuda_memory_source
from .sources.sections import REGISTRY as SECTIONS
from .sources.versions import rank_info
from .sources.walltime import JobClock

__all__ = ["Observer"]


class Observer:
    """Handle of one instrumented rank: its metrics endpoint, hooks and background threads.

    Create it with :func:`exporter.instrument`. ``port`` is the bound port (None when the
    endpoint could not start); :meth:`close` restores everything that was patched.
    """

    def __init__(
        self,
        model: torch.nn.Module | None,
        cfg: settings.InstrumentSettings,
        *,
        dataloader: torch.utils.data.DataLoader | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        memory_source: MemorySource | None = None,
        gpu_source: HealthSource | None = None,
        serve: bool = True,
        job_clock: JobClock | None = None,
    ) -> None:
        identity, endpoint = cfg.identity, cfg.endpoint
        self.model = model
        self.identity = identity
        self.run, self.rank = identity.run, identity.rank
        self.world_size, self.local_rank = identity.world_size, identity.local_rank
        #: The job's wall-clock deadline and total steps (exporter.sources.walltime).
        self.job_clock = job_clock if job_clock is not None else JobClock()
        self.errors = ErrorCounter()
        self._closed = False
        self.end = ending.End()
        self._final_scrape_s, self._file_sd_dir = cfg.final_scrape_s, cfg.file_sd_dir
        #: The training thread: the one that instrumented (Ray Train's runner thread, say).
        self.training_thread = threading.get_ident()
        self._crash = ending.ThreadCrash(self.training_thread).install()
        hooks = hook_steps(model, cfg, self.errors, dataloader, optimizer, self.training_thread)
        self.parallelism, self.recorder = hooks.parallelism, hooks.recorder
        self.device, self.backend, self.inflight = hooks.device, hooks.backend, hooks.inflight
        timing = hooks.timing
        self.comm_timing, self.hook, self._timers = timing.mode, timing.hook, timing.threads()
        #: What times the compute stream's waits on a GPU (None where they are not timed).
        self.device_waits = timing.device
        #: What times communication (exporter.sources.commtiming; benchmarks toggle it).
        self.comm_instrumentor = self._comm = timing.instrumentor
        self._loader, self._optim, self._sections = hooks.loader, hooks.optim, hooks.sections
        self._joins = hooks.joins
        # The first forward opens the first step, whatever source closes steps.
        self._forward_handle = (
            model.register_forward_pre_hook(FirstForward(self._forward_pre))
            if model is not None
            else None
        )
        if memory_source is None and self.device.type == "cuda":
            memory_source = cuda_memory_source(self.device)
        self.memory_source = memory_source
        gpu, self._gpu_closers = start_gpu_health(cfg, self.device, self.errors, gpu_source)
        store = started(self.errors, "heartbeat", launcher.job_store)
        self._monitor = self.rank == endpoint.monitor_rank
        # What the hang watcher and the goodput account share, made once.
        ctx = rank_context(cfg, store, self.recorder, self.errors, self.training_thread)
        watchers = start_watchers(cfg, ctx, hooks, self._publish_abort)
        self.heartbeat, self.hangs = watchers.heartbeat, watchers.hangs
        self.goodput = start_goodput(ctx, watchers, self.end)
        peers = self.heartbeat if self.heartbeat and self._monitor else None
        self.collector = DDPCollector(
            RankSources(
                run=self.run,
                rank=self.rank,
                errors=self.errors,
                info=self.info_labels,
                recorder=self.recorder,
                inflight=self.inflight,
                job_clock=self.job_clock,
                peer_ages=peers.published_ages if peers else None,
                peers_ended=peers.ended_count if peers else None,
                memory=memory_source,
                gpu=gpu,
                hangs=self.hangs,
                store_round_trip=(lambda hb=self.heartbeat: hb.round_trip_s)
                if self.heartbeat
                else None,
                finished=lambda: self.end.unix,
                goodput=self.goodput,
                settle=tuple(timing.settlers()),
            )
        )
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        self._server: MetricsServer | None = None
        self.port: int | None = None
        if serve:
            self._server, self.port = server.serve(self.registry, endpoint)
        self._store = store
        self.discovery: discovery.Discovery | None = None
        self._start_discovery()
        self.otlp = push.start(cfg.otlp, identity, self.registry, self.errors)

    # -- setup -------------------------------------------------------------------------------
    def _start_discovery(self) -> None:
        if self.discovery is None and self._server is not None:
            self.discovery = discovery.start(
                self.identity,
                self._server,
                monitor=self._monitor,
                errors=self.errors,
                store=self._store,
                file_sd_dir=self._file_sd_dir,
            )

    def _forward_pre(self, module: Any, args: Any) -> None:
        # Once a step is open one stays open (each boundary opens the next): drop the hook.
        if self._forward_handle is not None:
            self._forward_handle.remove()
        if threading.get_ident() != self.training_thread:
            log.warning(
                "ddp-exporter: the model's first forward ran on another thread than the one "
                "that called exporter.instrument(): that thread's waits count as compute and "
                "its sections do not pause steps; call instrument() on the thread that trains"
            )
        try:
            self.recorder.open_step()
        except Exception as exc:  # noqa: BLE001
            self.errors.record("step", exc)

    # -- public ------------------------------------------------------------------------------
    def adopt_endpoint(self, server: MetricsServer | None, registry: CollectorRegistry) -> None:
        """Serve through ``server`` and ``registry`` (the init watch's), binding no second port.

        The init watch calls this when :func:`exporter.instrument` takes over; its registry then
        collects from :attr:`collector`, so scrapers see one endpoint from start to end.
        """
        self._server, self.registry = server, registry
        self.port = server.port if server is not None else None
        self._start_discovery()  # /sd and file_sd need the endpoint just adopted

    def info_labels(self) -> dict[str, str]:
        """Return the static facts published as ``ddp_rank_info``."""
        return rank_info(
            self.identity,
            self.backend,
            self.device.type,
            self.inflight.name,
            self.comm_timing,
            self.parallelism,
        )

    def timed_batches(self, iterator: Iterator) -> Iterator:
        """Return ``iterator`` timing its batches (one made before the DataLoader was hooked)."""
        return self._loader.timed(iterator) if self._loader is not None else iterator

    def optimizer_phase_begins(self, optimizer: torch.optim.Optimizer) -> None:
        """Start the optimizer phase now, for frameworks that step inside a closure."""
        if self._optim is None or optimizer is not self._optim.optimizer:
            return  # an optimizer without the exporter's step hooks
        try:
            self.recorder.optimizer_begin()
        except Exception as exc:  # noqa: BLE001
            self.errors.record("optimizer", exc)

    @property
    def url(self) -> str | None:
        """Return this rank's metrics URL, or None when the endpoint is not serving."""
        server = self._server
        return server.url if server is not None and server.serving else None

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """Mark one step explicitly (loops without an optimizer, e.g. evaluation); where the
        optimizer or DDP closes the job's steps, it closes them again after the block."""
        rec, before = self.recorder, "explicit"
        try:
            before = rec.block_begin()
        except Exception as exc:  # noqa: BLE001
            self.errors.record("step", exc)
        try:
            yield
        finally:
            try:
                rec.block_end(before)
            except Exception as exc:  # noqa: BLE001
                self.errors.record("step", exc)

    @property
    def closed(self) -> bool:
        """Say whether :meth:`close` ran."""
        return self._closed

    def close(self, clean: bool | None = None) -> None:
        """Stop serving, stop threads and restore every patched object; idempotent.

        ``clean``: whether training ended normally; by default, yes unless an exception is
        propagating (see :mod:`exporter.sources.ending`). A clean end is published
        (``ddp_finished_timestamp_seconds``, the heartbeat and hang reports) and this call waits,
        at most ``DDP_EXPORTER_FINAL_SCRAPE_S``, until every scraper has read it.
        """
        if self._closed:
            return
        self._closed = True
        self._comm.uninstrument()
        if self._forward_handle is not None:
            self._forward_handle.remove()
        SECTIONS.unlisten(self._sections)
        for part in (self._loader, self._optim, self._joins):
            if part is not None:
                part.uninstrument()
        if ending.ending_cleanly() if clean is None else clean:
            self._publish_end()
        self._crash.uninstall()
        for thread in (self.heartbeat, self.hangs, *self._timers, self.goodput):
            if thread is not None:
                thread.close()
        if self.otlp is not None:
            try:
                self.otlp.close()  # final flush: a short job's last steps are not lost
            except Exception as exc:  # noqa: BLE001
                self.errors.record("collect", exc)
        if self.discovery is not None:
            self.discovery.close()
        if self._server is not None:
            self._server.close()
        for close in self._gpu_closers:  # after the last scrape, which reads the GPU
            started(self.errors, "gpu", close)

    def forget_after_fork(self) -> None:
        """In a process forked from this rank: let go of its endpoint, never close it from here
        (closing would wait for a serving thread fork did not copy and publish the rank's end
        through the rank's store connection while the rank trains on)."""
        self._closed = True
        if self._server is not None:
            self._server.release_after_fork()

    def close_at_exit(self) -> None:
        """Close at interpreter exit: a clean end unless an uncaught exception ended the program.

        Or ended the training thread, where that is not the main thread.
        """
        self.close(clean=ending.exiting_cleanly() and not self._crash.raised)

    def _publish_end(self) -> None:
        since = self._server.scrapers.now() if self._server is not None else 0.0
        self.end.mark()
        for part in (self.heartbeat, self.hangs):
            if part is not None:
                where = "heartbeat" if part is self.heartbeat else "forensics"
                started(self.errors, where, part.finish)
        self._wait_scrapers(since)

    def _publish_abort(self) -> None:
        # The hang watcher already set what the collector publishes: make sure it is read.
        self._wait_scrapers(self._server.scrapers.now() if self._server is not None else 0.0)
        if self.otlp is not None:
            self.otlp.close()  # a last push, bounded

    def _wait_scrapers(self, since: float) -> None:
        """Wait until every recent scraper read this rank after ``since``, at most the cap."""
        if self._server is not None and self._final_scrape_s > 0:
            self._server.scrapers.wait_after(since, self._final_scrape_s)
