"""Run the goodput account of one rank: publish its work, and on the monitoring rank, account.

Every rank publishes its own work (:mod:`.peers`) every heartbeat interval from a background
thread. The monitoring rank's thread also, several times an interval, reads every rank's work,
feeds the account (:mod:`.account`) its own step split, its declared sections, the other ranks'
excess and the hang watcher's episodes, and keeps the run's file (:mod:`.ledger`) up to date.
Nothing runs on the training thread: the step split is what the recorder already measured, read
under its lock as a scrape reads it. :meth:`GoodputTracker.finish` ends the account (a clean
end, or not) and writes the summary next to the hang dumps.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from typing import Protocol

from ... import procfs, storekeys
from ...background import BackgroundLoop
from ...log import log
from ..context import RankContext
from ..ending import End
from ..training import or_main_thread
from .account import Account, Episode, StepTotals
from .categories import SECTION_CATEGORIES, Work, section_category
from .ledger import goodput_path, load_carried, save, summary_path
from .peers import PeerTally, decode_work, encode_work, work_key
from .summary import document, end_words, render

__all__ = ["CpuWait", "GoodputTracker", "HangFeed", "HostWait", "SectionClock", "Snapshot"]

#: Largest job whose monitoring rank reads every rank's work each tick, not each interval.
FAST_READ_MAX_RANKS = 256
#: Seconds between two writes of the run's file while the account grows.
SAVE_EVERY_S = 1.0


class CpuWait:
    """How long this process waited for a CPU, as the goodput account excuses it.

    Between two reads, the most that any one of its threads waited (the scheduler's run delay,
    :func:`exporter.procfs.run_delays`): threads wait side by side, so many threads each
    waiting a little add up to no more than the one that waited longest. A thread counts from
    the first read that sees it; where the kernel does not say, nothing is counted.
    """

    def __init__(self, delays: Callable[[], dict[int, float] | None] = procfs.run_delays) -> None:
        self._delays = delays
        self._last = delays() or {}
        self.total = 0.0

    def read(self) -> float:
        """Return the seconds counted so far, this read's included."""
        now = self._delays()
        if now:
            waited = max(d - self._last.get(tid, d) for tid, d in now.items())
            self.total += max(0.0, waited)
            self._last = now
        return self.total


class HostWait:
    """How long the run waited for a CPU, as the monitoring rank's account excuses it.

    Between two reads, the most that any one rank waited (each rank's :class:`CpuWait`, its own
    read fresh and its peers' as they published it): a collective waits for its slowest
    participant, whose threads may be the ones waiting to run; ranks wait side by side, so
    many ranks each waiting a little add up to no more than the one that waited longest. A
    rank counts from its first reading.
    """

    def __init__(self) -> None:
        self._last: dict[int, float] = {}
        self.total = 0.0

    def read(self, waits: dict[int, float]) -> float:
        """Take each rank's CPU wait so far; return the seconds counted so far."""
        waited = [w - self._last.get(rank, w) for rank, w in waits.items()]
        self._last.update(waits)
        self.total += max([0.0, *waited])
        return self.total


class HangFeed(Protocol):
    """What the account reads of the hang watcher (monitoring rank)."""

    def latest(self) -> Episode | None:
        """Return the run's latest hang episode in this attempt (None before the first)."""
        ...

    def aborted(self) -> float | None:
        """Return when the hang action decided to end the run (Unix time), None before."""
        ...

    def node_of(self, rank: int) -> str:
        """Return the node ``rank`` runs on ("" when unknown)."""
        ...


class SectionClock:
    """Time the declared sections that interrupt training on one thread, by category.

    A section with steps completing inside it (an epoch, an evaluation made of steps) is
    training, counted by the steps: it is not counted here.
    """

    wants_names = True

    def __init__(self, steps: Callable[[], int], thread_ident: int | None) -> None:
        self._steps = steps
        self._ident = thread_ident
        self._lock = threading.Lock()
        self._depth = 0
        self._open: tuple[str, float, int] | None = None  # category, monotonic start, steps
        self._done = dict.fromkeys(SECTION_CATEGORIES, 0.0)

    def section_begin(self, name: str) -> None:
        """Start timing ``name`` if it runs on the watched thread and none runs there."""
        if threading.get_ident() != self._ident:
            return
        with self._lock:
            self._depth += 1
            if self._depth == 1:
                self._open = (section_category(name), time.monotonic(), self._steps())

    def section_end(self, name: str) -> None:
        """Stop timing the outermost section once it ends."""
        if threading.get_ident() != self._ident:
            return
        with self._lock:
            self._depth = max(self._depth - 1, 0)
            if self._depth == 0 and self._open is not None:
                cat, start, steps = self._open
                self._open = None
                if self._steps() == steps:
                    self._done[cat] += time.monotonic() - start

    def totals(self) -> dict[str, float]:
        """Return the seconds by category so far, the running section included."""
        with self._lock:
            out = dict(self._done)
            if self._open is not None:
                cat, start, steps = self._open
                if self._steps() == steps:
                    out[cat] += time.monotonic() - start
            return out


Snapshot = tuple[dict[str, float], list[tuple[str, int, str, float]], float]


class GoodputTracker:
    """Publish this rank's work; on the monitoring rank keep the run's account."""

    def __init__(
        self,
        ctx: RankContext,
        *,
        hangs: HangFeed | None = None,
        start_unix: float | None = None,
        end: End | None = None,
    ) -> None:
        identity, recorder = ctx.identity, ctx.recorder
        self.identity = identity
        self._store = ctx.store
        self._rec = recorder
        self._registry = ctx.sections
        self._errors = ctx.errors
        self._hangs = hangs
        self._dump_dir = ctx.dump_dir
        self.interval_s = ctx.interval_s
        self._prefix = storekeys.for_run(identity.run, identity.attempt).prefix
        self._key = work_key(self._prefix, identity.rank)
        self._keys = [work_key(self._prefix, r) for r in range(identity.world_size)]
        self._clock = SectionClock(lambda: recorder.steps, or_main_thread(ctx.training_thread))
        ctx.sections.listen(self._clock)
        self._tick_s = max(ctx.interval_s / 4.0, 0.05)
        self._every = max(1, round(ctx.interval_s / self._tick_s))
        self._ticks = 0
        self._saved = 0.0
        self._tally = PeerTally()
        # The loop's tick and the end (the training thread, or the hang action's) both account
        # and write the run's file: one at a time.
        self._busy = threading.Lock()
        self.account: Account | None = None
        # Every rank's, published with its work: the monitoring rank's account excuses the
        # run's waits for a CPU (HostWait).
        self._cpu_wait = CpuWait()
        self._host_wait = HostWait()
        if ctx.monitor:
            self.account = self._new_account(ctx.start_step, start_unix)
            self.account.steps(time.time(), self._own_steps({}))
        self._loop = BackgroundLoop(
            "ddp-exporter-goodput",
            self._tick,
            self._tick_s,
            errors=ctx.errors,
            where="goodput",
            first_wait=0.0,
        )
        self._finished = False
        if end is not None:
            # A clean end ends the account before the rank waits for its final scrape.
            end.when_marked(lambda: self.finish(clean=True))

    def _new_account(self, start_step: int | None, start_unix: float | None) -> Account:
        ident = self.identity
        if start_unix is None:
            age = procfs.age_s(os.getpid())
            start_unix = time.time() - age if age is not None else time.time()
        try:
            carried = load_carried(self._dump_dir, ident.run, ident.attempt)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self._errors.record("goodput", exc)
            carried = None
        # A step's explanation arrives within two intervals: every rank's reading after it,
        # and the window it closes.
        hold = 2.5 * self.interval_s + max(self.interval_s / 4.0, 0.05)
        return Account(
            rank=ident.rank,
            attempt=ident.attempt,
            start_unix=start_unix,
            start_step=start_step,
            carried=carried,
            hold_s=hold,
        )

    def start(self) -> GoodputTracker:
        """Start the background thread; return self."""
        self._loop.start()
        return self

    # -- reading this rank -----------------------------------------------------------------------
    def _phases(self) -> tuple[int, list[float], float]:
        rec = self._rec
        with rec.lock:  # one consistent read, as a scrape takes it
            return rec.steps, list(rec.phase_sum), rec.step_hist.sum

    def _own_steps(self, peers: dict[int, float]) -> StepTotals:
        """Return this rank's steps so far, with the run's CPU wait (``peers``' as published)."""
        steps, ps, _ = self._phases()
        waits = {**peers, self.identity.rank: self._cpu_wait.read()}
        return StepTotals(steps, ps[0], ps[1] + ps[3], ps[2], self._host_wait.read(waits))

    def own_work(self) -> Work:
        """Return this rank's own work so far: what its peers compare theirs with."""
        steps, ps, _ = self._phases()
        sec = self._clock.totals()
        return Work(
            steps,
            ps[0],
            ps[1],
            sec["checkpoint"],
            sec["evaluation"],
            sec["section"],
            self._cpu_wait.read(),
        )

    def _publish(self, finished: bool = False) -> None:
        if self._store is not None:
            self._store.set(self._key, encode_work(self.own_work(), finished))

    # -- the loop ----------------------------------------------------------------------------
    def _tick(self) -> None:
        self._ticks += 1
        if self._ticks % self._every == 1 or self._every == 1:
            self._publish()
        account = self.account
        if account is None or account.until is not None:
            return
        with self._busy:
            if account.until is None:
                self._account(account, time.time())

    def _account(self, account: Account, now: float) -> None:
        small = len(self._keys) <= FAST_READ_MAX_RANKS
        peers: dict[int, float] = {}
        if self._store is not None and (small or self._ticks % self._every == 1):
            works = [decode_work(v) for v in self._store.multi_get(self._keys)]
            peers = {r: w.cpu_wait_s for r, w in enumerate(works) if w is not None}
            found = self._tally.observe(works, now)
            if found is not None:
                account.excess(found)
        self._first_step(account)
        account.sections(self._clock.totals())
        account.steps(now, self._own_steps(peers))
        hangs = self._hangs
        if hangs is not None:
            account.hang(now, hangs.latest(), self._rec.steps)
            aborted = hangs.aborted()
            if aborted is not None:
                account.end(min(aborted, now), "aborted")
        account.finalize(now)
        if account.until is not None:
            self._write(account, now, summary=True)
        elif now - self._saved >= SAVE_EVERY_S:
            self._write(account, now)

    def _first_step(self, account: Account) -> None:
        rec = self._rec
        since = rec.open_since()
        if since is None:
            return
        steps, _, stepped = self._phases()
        # Seen after some steps completed: the first started their time before the open one.
        account.first_step(rec.unix(since) - (stepped if steps else 0.0))

    def _node_of(self, rank: int) -> str:
        if self._hangs is None:
            return ""
        try:
            return self._hangs.node_of(rank)
        except Exception as exc:  # noqa: BLE001 - a node name is a courtesy
            self._errors.record("goodput", exc)
            return ""

    def _write(self, account: Account, now: float, summary: bool = False) -> None:
        self._saved = now
        ident = self.identity
        blame = account.blame(now, self._node_of)  # first: it learns the culprits' nodes
        doc = document(
            run=ident.run, world_size=ident.world_size, state=account.state(now), blame=blame
        )
        save(goodput_path(self._dump_dir, ident.run), json.dumps(doc, indent=1) + "\n")
        if summary:
            path = summary_path(self._dump_dir, ident.run)
            save(path, render(doc))
            ettr = doc["ettr"]
            log.info(
                "ddp-exporter: run %s %s: ETTR %s, largest badput %s; its goodput account is in %s",
                ident.run,
                end_words(account.ended),
                f"{ettr:.1%}" if ettr is not None else "unknown",
                doc["largest_badput"] or "none",
                path,
            )

    # -- what the collector reads ------------------------------------------------------------
    def snapshot(self) -> Snapshot | None:
        """Return ``(totals, blame, run start)`` to publish; None on other ranks."""
        account = self.account
        if account is None:
            return None
        now = time.time()
        return account.totals(now), account.blame(now), account.run_start

    # -- the end -------------------------------------------------------------------------------
    def finish(self, clean: bool) -> None:
        """End the account (a clean end, or not) and write the summary; say so to the peers."""
        if self._finished:
            return
        self._finished = True
        self._loop.stop()
        try:
            self._publish(finished=clean)
        except Exception as exc:  # noqa: BLE001 - a dead store must not stop the end
            self._errors.record("goodput", exc)
        account = self.account
        if account is None:
            return
        with self._busy:
            if account.until is not None:
                return
            now = time.time()
            try:
                self._account(account, now)  # the last readings (the store may be gone)
            except Exception as exc:  # noqa: BLE001
                self._errors.record("goodput", exc)
            try:
                if account.until is None:
                    account.end(now, "clean" if clean else "ended")
                    self._write(account, now, summary=True)
            except Exception as exc:  # noqa: BLE001
                self._errors.record("goodput", exc)

    def close(self) -> None:
        """End the account if no clean end did (the rank is not ending cleanly), stop the thread."""
        self.finish(clean=False)
        self._loop.close()
        self._registry.unlisten(self._clock)
