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
:class:`~exporter.heartbeat.Heartbeat` under its own key prefix (run and restart attempt). The
monitoring rank's heartbeat creates every peer's counter at zero, so a counter still at zero is
a rank that never arrived; which peers are published follows the heartbeat's bound
(``peer_series``). Without an agent store (srun, one process per rank, where rank 0 only starts
the store inside ``init_process_group``) the watch says so once in the log and publishes this
rank's phase only.

:func:`exporter.instrument` takes over: the same server, port and registry go on serving, the
init series stop and the training series appear in their place.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING

import torch.distributed as dist
from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from . import catalog as c
from . import env
from .collector import DDPCollector, _family
from .core import _default_run, _env_int, endpoint_settings
from .errors import ErrorCounter, log
from .heartbeat import Heartbeat
from .server import MetricsServer

if TYPE_CHECKING:
    from .core import Observer

__all__ = [
    "InitWatch",
    "STORE_CONNECT_TIMEOUT_S",
    "init_key_prefix",
    "running",
    "take_over",
    "watch_init",
]

#: How long one attempt to reach the launcher's store may take before it is retried (and the
#: failure logged, once). A reachable store answers in milliseconds.
STORE_CONNECT_TIMEOUT_S = 30.0

#: How often the watch thread looks whether the process group exists yet.
_POLL_S = 0.25

_lock = threading.Lock()
_watch: InitWatch | None = None


def init_key_prefix(run: str, attempt: str) -> str:
    """Return the heartbeat ``run`` namespace of one init attempt in the launcher's store."""
    return f"{run}/init/{attempt}"


def _agent_store_address() -> tuple[str, int] | None:
    """Return torchrun's agent store address, or None when the workers have no such store."""
    if os.environ.get(env.TORCHELASTIC_USE_AGENT_STORE) != "True":
        return None
    addr, port = os.environ.get(env.MASTER_ADDR), os.environ.get(env.MASTER_PORT)
    if not addr or not port:
        return None
    try:
        return addr, int(port)
    except ValueError:
        return None


class InitWatch:
    """Handle of one rank's init watch: its endpoint, phase and store check-in.

    Create it with :func:`watch_init`. ``port`` is the bound port (None when the endpoint could
    not start). :meth:`close` stops everything unless :func:`exporter.instrument` took over.
    """

    def __init__(
        self,
        *,
        port: int,
        addr: str,
        run: str,
        heartbeat_s: float,
        monitor_rank: int,
        peer_series: int,
        serve: bool,
        initialized: Callable[[], bool] | None = None,
    ) -> None:
        # Whether the default process group exists; injectable because a test process may
        # already hold one (init would then be over before it is watched).
        self._initialized = initialized or (lambda: dist.is_available() and dist.is_initialized())
        self.run = run
        self.rank = _env_int(env.RANK, 0)
        self.world_size = _env_int(env.WORLD_SIZE, 1)
        self.errors = ErrorCounter()
        self.started = time.time()
        self._heartbeat_s = heartbeat_s
        self._monitor = self.rank == monitor_rank
        self._peer_series = peer_series
        self._store_addr = _agent_store_address() if heartbeat_s > 0 else None
        self._lock = threading.Lock()
        self.phase = "store" if self._store_addr else "process_group"
        self.phase_since = self.started
        self.heartbeat: Heartbeat | None = None
        self.store_attempts = 0  # connection attempts to the launcher's store so far
        self.observer: Observer | None = None
        self._stop = threading.Event()
        if self._store_addr is None:
            log.info(
                "ddp-exporter: init watch has no launcher store to check in with (%s); it "
                "publishes this rank's init phase only, not which ranks have not arrived",
                "heartbeat_s=0"
                if heartbeat_s <= 0
                else f"{env.TORCHELASTIC_USE_AGENT_STORE} is not True: not under torchrun",
            )
        self._refresh()
        self.registry = CollectorRegistry(auto_describe=False)
        self._collector = _InitCollector(self)
        self.registry.register(self._collector)
        self._server = MetricsServer(self.registry, addr, port) if serve else None
        self.port: int | None = self._server.start() if self._server else None
        self._thread = threading.Thread(target=self._run, name="ddp-exporter-init", daemon=True)
        self._thread.start()

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
    def _run(self) -> None:
        try:
            store = self._connect() if self._store_addr else None
            if store is not None:
                self._check_in(store)
            while self.phase != "done" and not self._stop.wait(_POLL_S):
                self._refresh()
        except Exception as exc:  # noqa: BLE001 - the watch must never break the job
            self.errors.record("heartbeat", exc)
        finally:
            # Init is over (or the watch closed): stop beating into the launcher's store and
            # let the client connection go.
            hb, self.heartbeat = self.heartbeat, None
            if hb is not None:
                hb.close()

    def _connect(self) -> dist.Store | None:
        """Connect to the agent store, retrying until it answers or init is over."""
        assert self._store_addr is not None
        host, port = self._store_addr
        logged = False
        while not self._stop.is_set() and self.phase != "done":
            self.store_attempts += 1
            try:
                return dist.TCPStore(
                    host, port, is_master=False, timeout=timedelta(seconds=STORE_CONNECT_TIMEOUT_S)
                )
            except Exception as exc:  # noqa: BLE001
                self._refresh()
                if not logged:
                    logged = True
                    log.warning(
                        "ddp-exporter: init watch cannot reach the launcher's store at %s:%d "
                        "(%s); this rank stays in init phase 'store' until it can (a firewall "
                        "blocking MASTER_PORT shows like this). Retrying.",
                        host,
                        port,
                        exc,
                    )
                # A refused connection may fail fast: do not spin.
                self._stop.wait(min(1.0, STORE_CONNECT_TIMEOUT_S))
        return None

    def _check_in(self, store: dist.Store) -> None:
        attempt = os.environ.get(env.TORCHELASTIC_RESTART_COUNT, "0")
        hb = Heartbeat(
            store,
            init_key_prefix(self.run, attempt),
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

    def published_arrivals(self) -> list[tuple[int, bool]]:
        """Return ``(peer, arrived)`` to publish: monitoring rank, checked in, not done."""
        hb = self.heartbeat
        if hb is None or not hb.monitor or self.phase == "done":
            return []
        return hb.published_arrivals()

    # -- end ---------------------------------------------------------------------------------
    def hand_over(self, obs: Observer) -> None:
        """Give this watch's server, port and registry to ``obs``; the init series stop."""
        self._stop.set()
        obs.errors.merge(self.errors)
        # Observer was built with serve=False: it adopts the running server rather than
        # binding a second port, so scrapers see one endpoint from start to end.
        obs.registry = self.registry
        obs._server = self._server
        obs.port = self.port
        obs.start_discovery()  # /sd and file_sd need the endpoint obs just adopted
        self.observer = obs
        self._collector.delegate = DDPCollector(obs)
        # No join: instrument() runs on the training thread; the watch thread sees the stop
        # within _POLL_S and closes its heartbeat by itself.

    def close(self) -> None:
        """Stop the watch and its endpoint (unless instrument() took it over); idempotent."""
        global _watch
        self._stop.set()
        with _lock:
            if _watch is self:
                _watch = None
        if self.observer is None and self._server is not None:
            self._server.close()
        self._thread.join(timeout=2.0)


class _InitCollector(Collector):
    """Collect the init series, or, once instrument() took over, the observer's series."""

    def __init__(self, watch: InitWatch) -> None:
        self._watch = watch
        self.delegate: DDPCollector | None = None

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
        fams = {m.name: _family(m) for m in (c.INIT_STARTED, c.INIT_PHASE, c.INIT_PEER_ARRIVED)}
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
        errors = _family(c.EXPORTER_ERRORS)
        for where, n in w.errors.snapshot().items():
            errors.add_metric(base + [where], n)
        for fam in (*fams.values(), errors):
            if fam.samples:
                yield fam


def watch_init(
    *,
    port: int | None = None,
    addr: str | None = None,
    run: str | None = None,
    heartbeat_s: float | None = None,
    monitor_rank: int | None = None,
    peer_series: int | None = None,
    serve: bool = True,
) -> InitWatch | None:
    """Serve this rank's endpoint now and publish its init phase until instrument() takes over.

    Call it before ``dist.init_process_group``. Settings mean what they mean for
    :func:`exporter.instrument` and fall back to the same environment variables: the rank serves
    on ``port + LOCAL_RANK``; under torchrun every rank checks in through the agent's store every
    ``heartbeat_s`` and ``monitor_rank`` publishes ``ddp_init_peer_arrived`` (bounded by
    ``peer_series``). A later ``instrument()`` keeps this endpoint (its own port and address
    arguments are then not used). Calling it twice warns and returns the same handle; after
    ``instrument()`` it warns and returns None. Raises ValueError for bad settings.
    """
    global _watch
    from .core import active

    with _lock:
        if _watch is not None:
            warnings.warn(
                "exporter.watch_init() called twice; returning the existing handle",
                RuntimeWarning,
                stacklevel=2,
            )
            return _watch
        if active() is not None:
            warnings.warn(
                "exporter.watch_init() called after exporter.instrument(); nothing to watch",
                RuntimeWarning,
                stacklevel=2,
            )
            return None
        bound, hb, peer_series = endpoint_settings("watch_init", port, heartbeat_s, peer_series)
        watch = InitWatch(
            port=bound,
            addr=addr if addr is not None else os.environ.get(env.ADDR, "0.0.0.0"),
            run=run if run is not None else _default_run(),
            heartbeat_s=hb,
            monitor_rank=_env_int(env.MONITOR_RANK, 0) if monitor_rank is None else monitor_rank,
            peer_series=peer_series,
            serve=serve,
        )
        _watch = watch
    atexit.register(watch.close)
    return watch


def running() -> InitWatch | None:
    """Return the init watch of this process, if one runs."""
    return _watch


def take_over(watch: InitWatch, obs: Observer) -> None:
    """Let ``obs`` (just built by instrument(), not serving) adopt ``watch``'s endpoint."""
    global _watch
    with _lock:
        if _watch is watch:
            _watch = None
    watch.hand_over(obs)
