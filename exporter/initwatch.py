"""Watch a rank from process start until its process group exists: the init watch.

:func:`watch_init`, called before ``dist.init_process_group``, serves the rank's endpoint at
once and publishes the init phase the rank is in and since when (Unix timestamps, not ages):

- ``store``: connecting to the launcher's c10d store to check in (a blocked ``MASTER_PORT``
  keeps a rank here);
- ``process_group``: checked in (or no launcher store to check in with), waiting for
  ``init_process_group`` to complete;
- ``done``: the default process group exists.

Under torchrun the elastic agent hosts a TCPStore at ``MASTER_ADDR:MASTER_PORT`` before any
worker starts, and tells the workers so with ``TORCHELASTIC_USE_AGENT_STORE=True`` (see
``torch.distributed.rendezvous._create_c10d_store``: the workers' own rendezvous connects to it
as a client). The watch connects to it as one more client and checks in with a
:class:`~exporter.sources.heartbeat.Heartbeat` under its own key prefix (run and restart attempt). The
monitoring rank's heartbeat creates every peer's counter at zero, so a counter still at zero is
a rank that never arrived; which peers are published follows the heartbeat's bound
(``peer_series``). Without an agent store (srun, one process per rank, where rank 0 only starts
the store inside ``init_process_group``) the watch says so once in the log and publishes this
rank's phase only.

Before it connects, the watch tries a plain TCP connection (:mod:`exporter.network.netcheck`):
to the launcher's store, or, without one, on every rank but 0, to ``MASTER_ADDR:MASTER_PORT``,
where rank 0 will host the store. A dropped port, an address nobody answers or a name that does
not resolve is said once in the log within :data:`STORE_PROBE_S`, with the node it is seen
from and the fix (the words ``ddp-exporter doctor`` uses), long before a TCPStore client's
timeout (30 minutes by default) would say "timed out"; a refusal only once it lasts
:data:`STORE_CONNECT_TIMEOUT_S` (rank 0 may start late).

:func:`exporter.instrument` takes over: the same server, port and registry go on serving, the
init series stop and the training series appear in their place.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from . import catalog as c
from . import settings, storekeys
from .background import DONE, BackgroundLoop
from .errors import ErrorCounter
from .export import server
from .export.collector import add_invalid_settings, family
from .export.server import MetricsServer
from .log import log
from .network import netcheck
from .sources.heartbeat import Heartbeat

__all__ = ["STORE_CONNECT_TIMEOUT_S", "STORE_PROBE_S", "InitWatch"]

#: How long one attempt to reach the launcher's store may take before it is retried (and the
#: failure logged, once). A reachable store answers in milliseconds.
STORE_CONNECT_TIMEOUT_S = 30.0

#: How long the plain TCP probe before each attempt may try (refused connections are retried
#: within it; a dropped port or an address nobody answers shows as such when it ends).
STORE_PROBE_S = 5.0
#: How often the watch thread looks whether the process group exists yet.
_POLL_S = 0.25
#: How long the watch waits before it tries an unreachable launcher store again.
_RETRY_S = 1.0


class InitWatch:
    """Handle of one rank's init watch: its endpoint, phase and store check-in.

    Create it with :func:`exporter.watch_init`. ``port`` is the bound port (None when the
    endpoint could not start). :meth:`close` stops everything unless :meth:`hand_over` gave the
    endpoint to :func:`exporter.instrument`'s observer.
    """

    def __init__(
        self,
        identity: settings.Identity,
        endpoint: settings.Endpoint,
        *,
        serve: bool = True,
        initialized: Callable[[], bool] | None = None,
    ) -> None:
        # Whether the default process group exists; injectable because a test process may
        # already hold one (init would then be over before it is watched).
        self._initialized = initialized or (lambda: dist.is_available() and dist.is_initialized())
        self.identity = identity
        self.run, self.rank, self.world_size = identity.run, identity.rank, identity.world_size
        self.errors = ErrorCounter()
        self.started = time.time()
        self._heartbeat_s = endpoint.heartbeat_s
        self._monitor = self.rank == endpoint.monitor_rank
        self._peer_series = endpoint.peer_series
        self._store_addr = settings.agent_store_address() if endpoint.heartbeat_s > 0 else None
        # Without a launcher store (srun, one process per rank) rank 0 hosts the store inside
        # init_process_group; the other ranks still probe MASTER_ADDR:MASTER_PORT to say early
        # why they could not reach it.
        self._master = (
            settings.master_address() if self._store_addr is None and self.rank != 0 else None
        )
        self._lock = threading.Lock()
        self.phase = "store" if self._store_addr else "process_group"
        self.phase_since = self.started
        self.heartbeat: Heartbeat | None = None
        self.store_attempts = 0  # connection attempts to the launcher's store so far
        self._connect_logged = False
        self._reached = False  # a TCP connection to the store's port succeeded once
        self._closed = False
        self.handed_over = False
        if self._store_addr is None:
            log.info(
                "ddp-exporter: init watch has no launcher store to check in with (%s); it "
                "publishes this rank's init phase only, not which ranks have not arrived",
                "heartbeat_s=0"
                if endpoint.heartbeat_s <= 0
                else f"{settings.TORCHELASTIC_USE_AGENT_STORE} is not True: not under torchrun",
            )
        self._refresh()
        self.registry = CollectorRegistry(auto_describe=False)
        self._collector = _InitCollector(self)
        self.registry.register(self._collector)
        self._server: MetricsServer | None = None
        self.port: int | None = None
        if serve:
            self._server, self.port = server.serve(self.registry, endpoint)
        self._loop = BackgroundLoop(
            "ddp-exporter-init",
            self._tick,
            _POLL_S,
            errors=self.errors,
            where="heartbeat",
            final=self._stop_beating,
            first_wait=0.0,
        ).start()

    # -- phase -------------------------------------------------------------------------------
    def _advance(self, phase: str) -> None:
        """Enter ``phase`` now unless already there or later."""
        with self._lock:
            if c.INIT_PHASES.index(phase) > c.INIT_PHASES.index(self.phase):
                self.phase, self.phase_since = phase, time.time()

    def _refresh(self) -> None:
        if self._initialized():
            self._advance("done")

    # -- store check-in (background thread) --------------------------------------------------
    def _tick(self) -> Any:
        """Check in through the launcher's store once, then follow the phase until done."""
        if self._master is not None and not self._reached:
            self._probe_master(*self._master)
            self._refresh()
            return DONE if self.phase == "done" else (None if self._reached else _RETRY_S)
        if self._store_addr is not None and self.heartbeat is None:
            store = self._connect()
            if store is None:
                self._refresh()
                # A refused connection may fail fast: do not spin.
                return DONE if self.phase == "done" else min(_RETRY_S, STORE_CONNECT_TIMEOUT_S)
            try:
                self._check_in(store)
            except Exception as exc:  # noqa: BLE001 - no check-in; the phase is still followed
                self.errors.record("heartbeat", exc)
                self._store_addr = None
        self._refresh()
        return DONE if self.phase == "done" else None

    def _connect(self) -> dist.Store | None:
        """Try once to connect to the agent store; log the first failure."""
        assert self._store_addr is not None
        host, port = self._store_addr
        self.store_attempts += 1
        if not self._reached:
            # A plain TCP connect first: a TCPStore client retries a dropped or unroutable
            # address for its whole timeout and then says only "timed out"; this says within
            # seconds whether the port is dropped, refused or the address unreachable, and why.
            found = netcheck.probe_tcp(host, port, STORE_PROBE_S)
            if not found.ok:
                self._log_unreachable(*netcheck.explain_master(found, socket.gethostname()))
                return None
            self._reached = True
        try:
            return dist.TCPStore(
                host, port, is_master=False, timeout=timedelta(seconds=STORE_CONNECT_TIMEOUT_S)
            )
        except Exception as exc:  # noqa: BLE001
            self._log_unreachable(f"MASTER_ADDR:MASTER_PORT {host}:{port}: {exc}", "")
            return None

    def _probe_master(self, host: str, port: int) -> None:
        """Try MASTER_ADDR:MASTER_PORT once (no launcher store); log a failure that lasts."""
        found = netcheck.probe_tcp(host, port, STORE_PROBE_S)
        if found.ok:
            self._reached = True
        # Refused is normal while rank 0 has not started yet: only a lasting refusal is said.
        elif found.kind != "refused" or time.time() - self.started > STORE_CONNECT_TIMEOUT_S:
            detail, fix = netcheck.explain_master(found, socket.gethostname())
            self._log_unreachable(detail, fix, "rank 0's store")

    def _log_unreachable(self, detail: str, fix: str, what: str = "the launcher's store") -> None:
        """Say once why this rank cannot reach the store, and the fix."""
        if self._connect_logged:
            return
        self._connect_logged = True
        log.warning(
            "ddp-exporter: init watch on %s cannot reach %s: %s; this rank stays in init "
            "phase '%s' until it can.%s Retrying.",
            socket.gethostname(),
            what,
            detail,
            self.phase,
            f" Fix: {fix}." if fix else "",
        )

    def _check_in(self, store: dist.Store) -> None:
        hb = Heartbeat(
            store,
            storekeys.for_init(self.run, settings.restart_count()),
            self.rank,
            self.world_size,
            self._heartbeat_s,
            monitor=self._monitor,
            errors=self.errors,
            peer_series=self._peer_series,
        )
        hb.start()
        self.heartbeat = hb
        self._advance("process_group")

    def _stop_beating(self) -> None:
        # Init is over (or the watch closed): stop beating into the launcher's store and let
        # the client connection go.
        hb, self.heartbeat = self.heartbeat, None
        if hb is not None:
            hb.close()

    def published_arrivals(self) -> list[tuple[int, bool]]:
        """Return ``(peer, arrived)`` to publish: monitoring rank, checked in, not done."""
        hb = self.heartbeat
        if hb is None or not hb.monitor or self.phase == "done":
            return []
        return hb.published_arrivals()

    # -- end ---------------------------------------------------------------------------------
    def hand_over(self, collector: Collector) -> tuple[MetricsServer | None, CollectorRegistry]:
        """Stop watching and return this watch's server and registry, now serving ``collector``.

        The observer that :func:`exporter.instrument` builds adopts them (it binds no second
        port), so scrapers see one endpoint from start to end: the init series stop and the
        training series appear in their place.
        """
        # No join: instrument() runs on the training thread; the watch thread sees the stop
        # within _POLL_S and closes its heartbeat by itself.
        self._loop.stop()
        self.handed_over = True
        self._collector.delegate = collector
        return self._server, self.registry

    @property
    def closed(self) -> bool:
        """Say whether :meth:`close` ran."""
        return self._closed

    def forget_after_fork(self) -> None:
        """In a forked child: let go of the parent's endpoint; end nothing (see Observer's)."""
        self._closed = True
        if not self.handed_over and self._server is not None:
            self._server.release_after_fork()

    def close(self) -> None:
        """Stop the watch and its endpoint (unless it was handed over); idempotent."""
        self._closed = True
        self._loop.close()
        if not self.handed_over and self._server is not None:
            self._server.close()


class _InitCollector(Collector):
    """Collect the init series, or, once handed over, the observer's series."""

    def __init__(self, watch: InitWatch) -> None:
        self._watch = watch
        self.delegate: Collector | None = None

    def describe(self) -> list[Metric]:
        """Describe nothing, so registering does not call collect()."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Yield this rank's init phase, the monitor's peer arrivals and the error counts."""
        delegate = self.delegate
        if delegate is not None:
            yield from delegate.collect()
            return
        w = self._watch
        base = [w.run, str(w.rank)]
        fams = {m.name: family(m) for m in c.INIT_METRICS}
        try:
            w._refresh()
            fams[c.INIT_STARTED.name].add_metric(base, w.started)
            with w._lock:
                phase, since = w.phase, w.phase_since
            fams[c.INIT_PHASE.name].add_metric(base + [phase], since)
            arrived = fams[c.INIT_PEER_ARRIVED.name]
            for peer, ok in w.published_arrivals():
                arrived.add_metric(base + [str(peer)], 1.0 if ok else 0.0)
        except Exception as exc:  # noqa: BLE001 - serve what we can
            w.errors.record("collect", exc)
        errors = family(c.EXPORTER_ERRORS)
        for where, n in w.errors.snapshot().items():
            errors.add_metric(base + [where], n)
        invalid = family(c.INVALID_SETTING)
        add_invalid_settings(invalid, base)
        for fam in (*fams.values(), errors, invalid):
            if fam.samples:
                yield fam
