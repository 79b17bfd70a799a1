"""Watch for hangs and capture where every rank is stuck, seconds after a hang starts.

Everything goes through the c10d store, never through collectives (they are what hangs), and
runs on one background thread per rank, never on the training thread:

* every interval each rank ``set``s one small *report* key (per process group: last enqueued
  sequence number, oldest in-flight age, timeout; and its recent collective latency), and
  reads the run's *episode* counter with one ``add(key, 0)``;
* the monitoring rank reads every report with one ``multi_get`` per quarter interval (per
  interval beyond :data:`FAST_WATCH_MAX_RANKS` ranks), runs
  :func:`exporter.hangs.definition.find_hangs` (the one definition of "hung", shared with
  ``top`` and the alert rules) and, for a ``behind`` or ``symmetric`` finding, writes a request
  and bumps the episode counter: one episode per hang, a new one only after progress resumed;
* every rank that sees a new episode captures its state (:mod:`exporter.hangs.capture`),
  writes ``rank-N.json`` and ``rank-N.txt`` (:mod:`exporter.hangs.dumps`) and sets its *ack*
  key with a short summary;
* the monitoring rank collects acks until every rank answered or a deadline passed, then logs
  the verdict (:mod:`exporter.hangs.verdict`) and writes it next to its dump. A rank that
  never answers (SIGSTOPped, dead, or a thread holding the GIL) is named as such;
* while every rank waits inside a collective with nobody behind, the monitoring rank has one
  rank per node probe the others over the backend's interface (:mod:`exporter.hangs.probing`;
  every rank listens from the start, ``DDP_EXPORTER_HANG_PROBE=0`` turns it off), and the
  verdict names the broken link or node, or says it is not the network.

With ``on_hang="abort"`` the monitoring rank also decides, after an episode's dumps, whether
the hang has lasted long enough to end the run, and every rank that answered the episode checks
for that decision until it progresses again (:mod:`exporter.hangs.action`). The run's ledger
(:mod:`exporter.hangs.restarts`) decides whether the action still acts: the monitoring rank reads
it at start and keeps it, with the culprits' nodes, when it acts or declines. From a quarter
interval before the action can be due (jobs of up to :data:`FAST_WATCH_MAX_RANKS` ranks), the
ranks of the episode report, read and look for the decision every :data:`ACTION_POLL_S`, so the
action comes as soon as it is due and every rank leaves at once.

The watcher is handed what it reads (the rank's identity, store, in-flight state and
recorder) and, for the action, a callable that publishes it; never the observer. It owns the
background loop and its cadence; what every rank does is :mod:`exporter.hangs.responder`'s, what
the monitoring rank does :mod:`exporter.hangs.monitor`'s, and what travels between them
:mod:`exporter.hangs.protocol`'s, through :mod:`exporter.hangs.channel`.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable

from .. import storekeys
from ..background import BackgroundLoop
from ..errors import ErrorCounter
from ..log import log
from ..network import netcheck
from ..network.probe import Listener
from ..sources import launcher, ras
from ..sources.context import RankContext
from ..sources.flight import InFlight
from .action import ActionPolicy
from .channel import Channel, Site, Store
from .definition import DEFAULT_POLICY, HangPolicy
from .monitor import Monitor
from .probing import Answering, Rounds
from .protocol import DumpRequest, Summary
from .responder import FAULTHANDLER_S, Responder
from .restarts import RestartPolicy, RestartState

__all__ = ["ACTION_POLL_S", "FAST_WATCH_MAX_RANKS", "FAULTHANDLER_S", "HangWatcher"]

#: Largest job whose monitoring rank reads the reports every quarter interval, not every one.
FAST_WATCH_MAX_RANKS = 256
#: How often a rank of a hung episode looks for the hang action once it may be due.
ACTION_POLL_S = 0.1


def _forgetting(store: Store) -> Callable[[], None]:
    """Return what clears this attempt from a store the launcher keeps for the next attempt."""
    if not launcher.launch().shared_store:
        return lambda: None

    def forget() -> None:
        launcher.forget_attempt(store)

    return forget


def _backend() -> str:
    """Return the default process group's backend (``""`` when torch cannot say)."""
    try:
        import torch.distributed as dist

        return str(dist.get_backend()) if dist.is_initialized() else ""
    except Exception:  # noqa: BLE001 - the probe then listens where gloo would
        return ""


def _listener(backend: str, errors: ErrorCounter) -> Listener | None:
    """Listen for the peers' probes at the backend's address (None, logged once, when not)."""
    host, why = netcheck.backend_address(os.environ, backend)
    try:
        return Listener(host, errors)
    except OSError as exc:
        errors.record("forensics", exc)
        log.warning(
            "ddp-exporter: no hang probe listener on %s (%s): %r; a hang with nobody "
            "behind is judged without it",
            host,
            why,
            exc,
        )
        return None


class HangWatcher:
    """Report, trigger and answer dump requests on one rank, from one background thread."""

    def __init__(
        self,
        ctx: RankContext,
        *,
        inflight: InFlight,
        policy: HangPolicy = DEFAULT_POLICY,
        action: ActionPolicy | None = None,
        publish_abort: Callable[[], None] = lambda: None,
        restart: RestartPolicy | None = None,
        forget: Callable[[], None] | None = None,
        probe: bool = True,
        backend: str | None = None,
    ) -> None:
        """Watch on this rank; ``backend``: the default process group's (None: ask torch)."""
        identity, store, errors = ctx.identity, ctx.store, ctx.errors
        self.world_size = identity.world_size
        self._action = action
        site = Site(
            identity.run,
            identity.attempt,
            identity.rank,
            identity.world_size,
            identity.local_rank,
            identity.node or socket.gethostname(),
            ctx.monitor,
            ctx.interval_s,
            ctx.dump_dir,
            policy,
            errors,
        )
        channel = Channel(
            store, storekeys.for_run(identity.run, identity.attempt), identity.world_size
        )
        backend = _backend() if backend is None else backend
        listener = _listener(backend, errors) if probe else None
        answering = Answering(site, channel, listener) if probe else None
        self._rank = Responder(
            site,
            channel,
            inflight=inflight,
            recorder=ctx.recorder,
            sections=ctx.sections,
            action=action,
            publish_abort=publish_abort,
            forget=forget if forget is not None else _forgetting(store),
            probe=answering,
            training_thread=ctx.training_thread,
        )
        self._monitor: Monitor | None = None
        if ctx.monitor:
            rounds = Rounds(site, channel, enabled=probe)
            self._monitor = Monitor(
                site,
                channel,
                action=action,
                restart=restart,
                start_step=ctx.start_step,
                answer=self._rank.check_request,
                leave=self._rank.leave,
                keep=self._rank.keep,
                rounds=rounds,
                ras_address=ras.ras_address() if "nccl" in backend.lower() else None,
            )
        self._loop = BackgroundLoop(
            "ddp-exporter-forensics",
            self._tick_once,
            max(ctx.interval_s / 4.0, 0.05),
            errors=errors,
            where="forensics",
        )
        self._tick = 0
        #: When the next full tick is due (ticks in between only look for the action).
        self._next_tick = 0.0

    # -- what the collector and the observer read ------------------------------------------------
    @property
    def dumps(self) -> int:
        """Return the dumps this rank wrote (``ddp_hang_dumps_total``)."""
        return self._rank.dumps

    @property
    def location(self) -> tuple[str, str, str] | None:
        """Return ``(file, line, function)`` while this rank is the culprit of an open episode."""
        return self._rank.location

    @property
    def aborted(self) -> tuple[float, str, str] | None:
        """Return ``(unix time, culprit rank label, its node)`` once leaving on an abort."""
        return self._rank.aborted

    def when_aborting(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once this rank leaves on an abort, before it publishes and exits
        (on the thread that decided; it must be quick)."""
        self._rank.when_aborting.append(callback)

    @property
    def network(self) -> tuple[tuple[str, str, str], ...]:
        """Return ``(finding, node, peer_node)`` of the open hang's probe (monitoring rank)."""
        return self._monitor.network if self._monitor is not None else ()

    @property
    def restarts(self) -> RestartState | None:
        """Return the run's restart ledger as the monitoring rank publishes it (action on)."""
        return self._monitor.restarts if self._monitor is not None else None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> HangWatcher:
        """Publish this rank's keys synchronously (the monitor waits for all), then run."""
        self._rank.start()
        self._loop.start()
        return self

    def finish(self) -> None:
        """Report that this rank ended cleanly: the monitoring rank stops counting it."""
        self._rank.finished = True
        self._rank.publish(self._tick)

    def close(self) -> None:
        """Stop the thread (a daemon: it may be stuck on a dead store) and the probe listener."""
        self._loop.close()
        self._rank.close()

    def dump(self, episode: int, request: DumpRequest) -> Summary:
        """Write this rank's dump for ``episode`` now; return its summary as the ack carries it."""
        return self._rank.dump(episode, request)

    # -- the loop ----------------------------------------------------------------------------
    def _tick_once(self) -> float | None:
        # A dead store raises here: the loop counts it and training goes on.
        rank, monitor = self._rank, self._monitor
        now = time.monotonic()
        if now < self._next_tick:
            # Between two ticks, while the hang action may be due any moment: a rank inside
            # the stalled collective reports its age, the monitoring rank reads the reports,
            # every rank looks for the decision. The action then comes within ACTION_POLL_S of
            # the first report that makes it due, and every rank leaves within ACTION_POLL_S.
            if rank.in_episode is not None:
                if rank.self_stuck():
                    rank.publish(self._tick)
                rank.check_action()
            if monitor is not None and monitor.acting is not None:
                monitor.watch()
            return self._poll_wait(now)
        self._next_tick = now + self._loop.interval_s
        self._tick += 1
        full = self._tick % 4 == 0
        stuck = rank.self_stuck()
        small = self.world_size <= FAST_WATCH_MAX_RANKS
        # A rank stuck in a collective reports every quarter interval (small jobs): the hang
        # action acts on reported ages, so fresher reports make it act sooner, never earlier.
        if full or stuck and small:
            rank.publish(self._tick)
        if full or stuck:
            rank.check_request()
        if stuck:
            rank.check_probe()
        rank.update_location()
        if rank.in_episode is not None:
            rank.check_action()
        # Reports are read every quarter interval (a hang is seen up to 3/4 of an interval
        # sooner); in large jobs once per interval, to bound store traffic.
        if monitor is not None and (full or small):
            monitor.watch()
        return self._poll_wait(now) if self._action_soon() else None

    def _poll_wait(self, now: float) -> float:
        """Return the wait until the next look for the action (no later than the next tick)."""
        return max(0.0, min(ACTION_POLL_S, self._next_tick - now))

    def _action_soon(self) -> bool:
        """Say whether the action on this rank's episode may be decided within a tick.

        Only in jobs of up to FAST_WATCH_MAX_RANKS ranks, and only from a tick before the
        earliest time the action can be due (complete evidence) to a tick after the latest
        (incomplete evidence): every ACTION_POLL_S each rank of the episode checks the action
        key (and reports, when inside the collective) and the monitoring rank reads the
        reports, a few store calls per second per rank for about 12 s of a hang. A hang the
        action does not end (a slow start, a declined restart loop) goes back to the usual
        cadence.
        """
        if self.world_size > FAST_WATCH_MAX_RANKS or self._action is None:
            return False
        if self._rank.in_episode is not None:
            request = self._rank.in_episode.request
        elif self._monitor is not None and self._monitor.acting is not None:
            request = self._monitor.acting.episode.request
        else:
            return False
        # The hang's age by this rank's clock (a hint for polling, never for the decision).
        age = float(request.age) + time.time() - float(request.requested_unix)
        states = self._rank.last_states
        timeout = min((s.timeout_s for s in states if s.timeout_s), default=None)
        threshold, tick = float(request.threshold), self._loop.interval_s
        earliest = self._action.due_s(threshold, timeout, sure=True)
        latest = self._action.due_s(threshold, timeout, sure=False)
        return earliest - tick <= age <= latest + tick
