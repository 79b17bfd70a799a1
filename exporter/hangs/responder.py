"""Do what every rank does for hang watching: report, answer a dump request, leave on the action.

Each rank ``set``s its *report* (per process group: last enqueued sequence number, oldest
in-flight age, timeout; its recent collective latency; whether it is inside a declared section
or finished) and reads the run's *episode* counter. On a new episode it captures its state
(:mod:`exporter.hangs.capture`), writes ``rank-N.json`` and ``rank-N.txt``
(:mod:`exporter.hangs.dumps`) and sets its *ack* with its summary. While it sits in a
collective itself it serves its peers' reach probes and tries its own when a probe round names
it (:class:`exporter.hangs.probing.Answering`). While it is the culprit of
an open episode it publishes where it is stuck, and with ``on_hang="abort"`` it looks for the
monitoring rank's decision until it progresses again, then leaves with the others
(:class:`exporter.hangs.action.Leaving`).

Runs on the hang watcher's thread (:mod:`exporter.hangs.watcher`), never on the training thread.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO

from ..sources import flight
from ..sources.flight import InFlight, PGState
from ..sources.recorder import Recorder
from ..sources.sections import SectionRegistry
from ..sources.training import or_main_thread
from . import codec
from . import restarts as ledger
from .action import ActionPolicy, Leaving
from .capture import capture_state, summary_of
from .channel import Channel, Site
from .dumps import episode_dir, makedirs_private, render_dump, replace_private, write_private
from .probing import Answering
from .protocol import (
    Ack,
    Action,
    DumpRequest,
    PgReport,
    PgSeqs,
    RankDump,
    RankState,
    Report,
    Summary,
)

__all__ = ["FAULTHANDLER_S", "Answered", "Mark", "Responder"]

#: Seconds the C-level fallback (faulthandler) waits before it dumps every thread's stack.
FAULTHANDLER_S = 3.0

#: Where a rank is: steps done and the last collective enqueued per process group.
Mark = tuple[int, tuple[tuple[str, int], ...]]


@dataclass(frozen=True)
class Answered:
    """The episode a rank answered and may be told to leave for, while it has not progressed."""

    episode: int
    mark: Mark
    request: DumpRequest


class Responder:
    """Report, answer dump requests and leave on the action: one rank's part."""

    def __init__(
        self,
        site: Site,
        channel: Channel,
        *,
        inflight: InFlight,
        recorder: Recorder,
        sections: SectionRegistry,
        action: ActionPolicy | None,
        publish_abort: Callable[[], None],
        forget: Callable[[], None],
        probe: Answering | None = None,
        training_thread: int | None = None,
    ) -> None:
        self._site = site
        self._probe = probe
        self._channel = channel
        self._inflight = inflight
        self._recorder = recorder
        self._sections = sections
        self._action = action
        self._training = or_main_thread(training_thread)
        self._lat: tuple[float, int] = (0.0, 0)
        self._recent_latency: float | None = None
        self._answered = 0
        #: Set once the rank ended cleanly: its reports say so.
        self.finished = False
        #: The in-flight state of the last report (for the hang action's timing).
        self.last_states: list[PGState] = []
        #: Dumps written by this rank (``ddp_hang_dumps_total``).
        self.dumps = 0
        #: ``(file, line, function)`` while this rank is the culprit of an open episode.
        self.location: tuple[str, str, str] | None = None
        self._location_mark: Mark | None = None
        #: ``(unix time, culprit rank label, its node)`` once this rank is leaving on an abort.
        self.aborted: tuple[float, str, str] | None = None
        #: Called once this rank knows it leaves on an abort, before it publishes and exits.
        self.when_aborting: list[Callable[[], None]] = []
        #: The episode this rank answered while it may be told to leave (action on).
        self.in_episode: Answered | None = None
        self._leaving: Leaving | None = None
        if action is not None:
            self._leaving = Leaving(
                channel.store,
                channel.keys,
                site.rank,
                monitor=site.monitor,
                policy=action,
                interval_s=site.interval_s,
                publish=publish_abort,
                errors=site.errors,
                keep=self.keep,
                forget=forget,
            )

    def start(self) -> None:
        """Publish this rank's first report and ack (the monitor waits for every rank's)."""
        self.publish(0)
        if self._probe is not None:
            self._probe.start()
        self._channel.put_ack(self._site.rank, Ack(0, self._site.node, probe=self._address))
        self._answered = self._channel.episode()

    @property
    def _address(self) -> str:
        return self._probe.address if self._probe is not None else ""

    def check_probe(self) -> None:
        """Serve the peers' reach probes, and try this rank's when a round names it."""
        if self._probe is not None:
            self._probe.check()

    def close(self) -> None:
        """Stop the probe's listener."""
        if self._probe is not None:
            self._probe.close()

    # -- reports -----------------------------------------------------------------------------
    def _latency(self) -> float | None:
        """Return the mean collective latency since the last full tick (last known if none)."""
        total, count = self._recorder.collective_totals()
        s0, c0 = self._lat
        if count > c0:
            self._recent_latency = (total - s0) / (count - c0)
            self._lat = (total, count)
        return self._recent_latency

    def publish(self, tick: int) -> None:
        """Publish this rank's report (``tick``: the watcher's, so a live report changes)."""
        states = self._inflight.read()
        self.last_states = states
        pgs = tuple(
            PgReport(s.pg, s.last_enqueued, s.inflight_age_s, s.timeout_s, s.last_completed)
            for s in states
        )
        # Inside a declared section within its deadline (or just out of one, while the ranks
        # it held up finish their collective): excused, not hung.
        section = self._sections.busy(grace_s=2 * self._site.interval_s) is not None
        report = Report(tick, pgs, self._latency(), section, self.finished, self._recorder.steps)
        self._channel.put_report(self._site.rank, report)

    def self_stuck(self) -> bool:
        """Say whether this rank sits in a collective long enough to expect a request soon."""
        half = self._site.policy.stall_min_seconds / 2
        return any(s.inflight_age_s > half for s in self.last_states)

    # -- dumps -------------------------------------------------------------------------------
    def check_request(self) -> None:
        """Answer a new episode's request with this rank's dump (its summary in the ack)."""
        episode = self._channel.episode()
        if episode <= self._answered:
            return
        self._answered = episode
        request = self._channel.request()
        if request.episode != episode:
            return  # a newer request replaced it; the next check answers that one
        summary = self.dump(episode, request)
        self._channel.put_ack(
            self._site.rank, Ack(episode, self._site.node, summary, self._address)
        )

    def dump(self, episode: int, request: DumpRequest) -> Summary:
        """Write this rank's dump for ``episode``; return its summary (the ack).

        A dump folder that cannot be written still gets an ack (with the error in it): the
        monitoring rank must not mistake a full disk for a frozen rank.
        """
        site = self._site
        # Where this rank stands now, not at its last report: the marks taken below say when it
        # has progressed since, and a report older than the dump would say so at once.
        self.last_states = self._inflight.read()
        folder = episode_dir(site.dump_dir, site.run, episode, site.attempt)
        base = os.path.join(folder, f"rank-{site.rank}")
        state = self._capture_guarded(base, episode)
        summary = summary_of(site.rank, state)
        data = RankDump(
            state,
            episode,
            site.run,
            site.rank,
            site.world_size,
            socket.gethostname(),
            site.node,
            os.getpid(),
            request,
            summary,
        )
        try:
            write_private(base + ".json", codec.dump_json(data))
            write_private(base + ".txt", render_dump(site.rank, data))
            self.dumps += 1
        except OSError as exc:
            site.errors.record("forensics", exc)
            summary = dataclasses.replace(
                summary, errors=(*summary.errors, f"dump files not written: {exc!r}")
            )
        if site.rank in request.behind and summary.where:
            w = summary.where
            self.location = (w.file, str(w.line), w.function)
            self._location_mark = self._progress_mark()
        if self._action is not None and not site.monitor:
            self.in_episode = Answered(episode, self._progress_mark(), request)
        return summary

    def _capture_guarded(self, base: str, episode: int) -> RankState:
        """Capture this rank, with faulthandler writing ``base``.txt should the capture hang."""
        fallback: IO[str] | None = None
        try:
            makedirs_private(os.path.dirname(base))
            fd = os.open(base + ".txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            fallback = os.fdopen(fd, "w")
            fallback.write(
                f"ddp-exporter hang dump: rank {self._site.rank}, episode {episode}: the Python "
                "capture did not finish; C-level stacks from faulthandler follow.\n"
            )
            fallback.flush()
        except OSError as exc:
            self._site.errors.record("forensics", exc)
        # C-level fallback: if this thread cannot get the GIL back (a thread holding it in C
        # code), faulthandler's own watchdog thread still writes every thread's stack there.
        # (It replaces a dump_traceback_later the application armed itself, for this moment.)
        try:
            if fallback is not None:
                faulthandler.dump_traceback_later(FAULTHANDLER_S, repeat=False, file=fallback)
            try:
                return self._capture()
            finally:
                if fallback is not None:
                    faulthandler.cancel_dump_traceback_later()
        finally:
            if fallback is not None:
                fallback.close()

    def _capture(self) -> RankState:
        """Capture this rank; the Flight Recorder only while it is the in-flight source."""
        in_use = self._inflight.name == "flight_recorder"
        return capture_state(
            training_ident=self._training,
            flight_recorder=flight.entries_report if in_use else None,
            step=self._recorder.steps,
            seqs=self._seqs,
        )

    def _seqs(self) -> dict[str, PgSeqs]:
        return {s.pg: PgSeqs(s.last_enqueued, s.last_completed) for s in self._inflight.read()}

    def _progress_mark(self) -> Mark:
        states = self.last_states
        return (self._recorder.steps, tuple(sorted((s.pg, s.last_enqueued) for s in states)))

    def update_location(self) -> None:
        """Drop the published location once this rank progresses again (episode over)."""
        if self.location is not None and self._progress_mark() != self._location_mark:
            self.location = None

    # -- the hang action ---------------------------------------------------------------------
    def check_action(self) -> None:
        """Leave with the others once the monitoring rank decided to act on this episode."""
        answered = self.in_episode
        if answered is None:
            return
        if self._progress_mark() != answered.mark:
            self.in_episode = None  # this rank progressed: the episode is over for it
            return
        if not self._channel.action_decided():
            return
        action = self._channel.action()
        if action.episode == answered.episode:
            self.leave(action)

    def leave(self, action: Action, answered: list[int] | None = None) -> None:
        """Leave the run on ``action`` (``answered``: the ranks to wait for, monitoring rank)."""
        culprits, nodes = action.culprits, action.nodes
        self.aborted = (
            float(action.decided_unix),
            str(culprits[0]) if culprits else "",
            str(nodes[0]) if nodes else "",
        )
        for callback in self.when_aborting:
            try:
                callback()
            except Exception as exc:  # noqa: BLE001 - a listener must not keep the rank alive
                self._site.errors.record("forensics", exc)
        if self._leaving is not None:
            self._leaving.leave(action, answered)

    def keep(self, action: Action) -> None:
        """Write the run's ledger and the launcher's line (monitoring rank, local rank 0)."""
        site = self._site
        entries = action.ledger
        if entries is None or not (site.monitor or site.local_rank == 0):
            return
        last = entries[-1]
        ledger.record(site.dump_dir, site.run, entries[:-1], last)
        if last.decision != "decline":
            line = ledger.launcher_line(last, action.limit)
            replace_private(ledger.abort_path(site.dump_dir, site.run), line)
