"""Keep one run's time account on the monitoring rank: every second in one category, by tick.

The tracker (:mod:`.tracker`) feeds the account from its background thread: the rank's own step
split as steps complete, the other ranks' excess work (:class:`~.peers.PeerTally`), its declared
sections, the hang watcher's episodes. Time-based categories (startup, restart, sections, hang)
are published as they pass; a step's time is split into categories once the other ranks'
readings that explain it have had :attr:`Account.hold_s` to arrive, so that a category never
has to be taken back: every published total only grows (the counters' contract). What is not
yet split is pending; at the end the rest of the wall clock is ``other``.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import fmean, median

from .categories import (
    BASELINE_CLIP,
    CATEGORIES,
    CAUSES,
    COMM_NOISE_SHARE,
    COMM_SLACK_STEPS,
    SECTION_CATEGORIES,
    category_of_cause,
)
from .peers import Excess

__all__ = ["Account", "Carried", "Episode", "StepTotals"]

#: Most per-step communication samples the healthy baseline is taken over.
_BASELINE_SAMPLES = 256
#: Fewest samples before the baseline is trusted (until then no communication is excess).
_BASELINE_MIN = 16
#: A straggler's windows less than this far apart are one episode.
_EPISODE_GAP_S = 15.0
#: Most episodes of each kind the account keeps (the latest).
_EPISODES = 100
#: A straggler episode that cost the run less than this is not listed in the run's account (a
#: window's blip at a phase change: a rank's checkpoint, a hang's onset); its seconds still are.
_EPISODE_MIN_S = 0.5


def _clipped_mean(samples: deque[float]) -> float:
    """Return the mean of ``samples``, each counted at most :data:`BASELINE_CLIP` x the median."""
    if len(samples) < 2:
        return samples[0] if samples else 0.0
    cap = BASELINE_CLIP * median(samples)
    return fmean(min(s, cap) for s in samples)


@dataclass(frozen=True)
class StepTotals:
    """The monitoring rank's own steps so far in this attempt, split by phase (seconds)."""

    steps: int
    data_s: float
    #: Compute and optimizer.
    compute_s: float
    #: Exposed communication (waits included).
    comm_s: float
    #: The seconds the run waited for a CPU so far (:class:`.tracker.HostWait`, 0 where the
    #: kernel does not say): the host's contention, not the network's.
    cpu_wait_s: float = 0.0


@dataclass(frozen=True)
class Episode:
    """A hang episode as the hang watcher opened it."""

    number: int
    onset_unix: float
    #: The rank behind (None: every rank stuck inside the collective).
    culprit: int | None
    node: str = ""


@dataclass
class Carried:
    """What the run's earlier attempts left: their account and where they got."""

    run_start_unix: float
    #: When the previous attempt's account ends (its abort, its end, its last save).
    until_unix: float
    totals: dict[str, float]
    #: ``(category, culprit rank) -> seconds``.
    blame: dict[tuple[str, int], float] = field(default_factory=dict)
    nodes: dict[int, str] = field(default_factory=dict)
    furthest_step: int | None = None
    baseline_s: float | None = None
    attempts: tuple[str, ...] = ()
    split: dict[str, float] = field(default_factory=dict)
    stragglers: list[dict[str, object]] = field(default_factory=list)
    hangs: list[dict[str, object]] = field(default_factory=list)


@dataclass
class _Chunk:
    unix: float
    steps0: int
    steps1: int
    data: float
    compute: float
    comm: float
    #: When the previous chunk was taken: the steps in this one ran after it.
    since: float = 0.0


@dataclass
class _Wait:
    unix: float
    seconds: float


@dataclass
class _Credit:
    unix: float
    culprit: int
    cause: str
    seconds: float
    #: The median rank's time per step for this cause (data, compute), 0 when not per step.
    usual: float = 0.0
    #: False: jitter (:attr:`.peers.Excess.lasting`), booked as the healthy pace.
    lasting: bool = True


class Account:
    """The time account of one run, kept by its monitoring rank (thread-safe)."""

    def __init__(
        self,
        *,
        rank: int,
        attempt: str,
        start_unix: float,
        start_step: int | None = None,
        carried: Carried | None = None,
        hold_s: float = 3.0,
    ) -> None:
        self.rank = rank
        self.attempt = attempt
        self.hold_s = hold_s
        self._lock = threading.Lock()
        self._carried = carried
        self.run_start = carried.run_start_unix if carried is not None else start_unix
        self._since = carried.until_unix if carried is not None else start_unix
        # Before the first step: the run's startup, or, in a later attempt, its restart.
        self._before = "startup" if carried is None and attempt in ("", "0") else "restart"
        self._base = dict.fromkeys(CATEGORIES, 0.0)
        if carried is not None:
            self._base.update({k: v for k, v in carried.totals.items() if k in self._base})
            # An attempt that crashed left time it had not split: the run's, so other.
            unsplit = carried.until_unix - carried.run_start_unix - sum(self._base.values())
            self._base["other"] += max(0.0, unsplit)
        self._cats = dict.fromkeys(CATEGORIES, 0.0)  # this attempt's finalized step categories
        self._sections = dict.fromkeys(SECTION_CATEGORIES, 0.0)
        self._first: float | None = None
        self._pre_sections = 0.0
        self._hang_closed = 0.0
        self._hang_open: Episode | None = None
        self._hang_steps = 0
        self._hang_seen = 0
        self._hang_credit = 0.0
        self._debt = 0.0
        self._blame: dict[tuple[str, int], float] = dict(carried.blame) if carried else {}
        self.nodes: dict[int, str] = dict(carried.nodes) if carried else {}
        self._chunks: deque[_Chunk] = deque()
        self._credits: deque[_Credit] = deque()
        #: The run's waits for a CPU, by tick, until the chunks they may explain used them.
        self._waits: deque[_Wait] = deque()
        self._chunk_unix: float | None = None
        self._last: StepTotals | None = None
        self._samples: deque[float] = deque(maxlen=_BASELINE_SAMPLES)
        #: This rank's own compute per step in the same healthy chunks: the host's pace.
        self._compute: deque[float] = deque(maxlen=_BASELINE_SAMPLES)
        #: Baseline communication that faster chunks left unused, which a slower one may spend.
        self._comm_slack = 0.0
        if carried is not None and carried.baseline_s is not None:
            self._samples.extend([carried.baseline_s] * _BASELINE_MIN)
        self.start_step = start_step
        self._prev_furthest = carried.furthest_step if carried else None
        self.split = {"input": 0.0, "compute": 0.0, "communication": 0.0}
        if carried is not None:
            self.split.update({k: v for k, v in carried.split.items() if k in self.split})
        self.stragglers: list[dict[str, object]] = list(carried.stragglers) if carried else []
        self.hangs: list[dict[str, object]] = list(carried.hangs) if carried else []
        self.attempts = (*carried.attempts, attempt) if carried else (attempt,)
        self._published = dict.fromkeys(CATEGORIES, 0.0)
        #: When the account ended (frozen), and how: clean, aborted, ended.
        self.until: float | None = None
        self.ended = ""

    # -- what the tracker tells it -----------------------------------------------------------
    def first_step(self, unix: float) -> None:
        """Note when this attempt's first step started (once)."""
        with self._lock:
            if self._first is None and self.until is None:
                self._first = max(unix, self._since)
                self._pre_sections = sum(self._sections.values())

    def sections(self, by_category: dict[str, float]) -> None:
        """Set this attempt's own declared-section time so far, by category."""
        with self._lock:
            if self.until is None:
                for cat in SECTION_CATEGORIES:
                    self._sections[cat] = max(self._sections[cat], by_category.get(cat, 0.0))

    def steps(self, now: float, own: StepTotals) -> None:
        """Take the steps completed since the last call (split once ``hold_s`` has passed)."""
        with self._lock:
            last = self._last
            self._last = own
            if last is None or self.until is not None or own.steps < last.steps:
                return
            chunk = _Chunk(
                now,
                last.steps,
                own.steps,
                own.data_s - last.data_s,
                own.compute_s - last.compute_s,
                own.comm_s - last.comm_s,
                now if self._chunk_unix is None else self._chunk_unix,
            )
            if chunk.steps1 > chunk.steps0 or chunk.comm or chunk.compute or chunk.data:
                self._chunks.append(chunk)
                self._chunk_unix = now
            waited = own.cpu_wait_s - last.cpu_wait_s
            if waited > 0:
                self._waits.append(_Wait(now, waited))

    def excess(self, found: Excess) -> None:
        """Take one window's excess of a slower rank: what the run waited for it, by cause."""
        with self._lock:
            if self.until is None:
                for cause, seconds in found.causes.items():
                    if seconds > 0:
                        usual = found.usual.get(cause, 0.0)
                        self._credits.append(
                            _Credit(found.unix, found.culprit, cause, seconds, usual, found.lasting)
                        )

    def hang(self, now: float, episode: Episode | None, own_steps: int) -> None:
        """Follow the hang watcher's latest episode: open until this rank steps again."""
        with self._lock:
            if self.until is not None:
                return
            if episode is not None and episode.number > self._hang_seen:
                self._hang_seen = episode.number
                if self._hang_open is not None:
                    self._close_hang(now, "recovered")
                self._hang_open, self._hang_steps = episode, own_steps
                if episode.culprit is not None and episode.node:
                    self.nodes[episode.culprit] = episode.node
            elif self._hang_open is not None and own_steps > self._hang_steps:
                self._close_hang(now, "recovered")

    def _close_hang(self, end: float, how: str) -> None:
        episode = self._hang_open
        assert episode is not None
        self._hang_open = None
        seconds = max(0.0, end - episode.onset_unix)
        self._hang_closed += seconds
        if episode.culprit is not None:
            key = ("hang", episode.culprit)
            self._blame[key] = self._blame.get(key, 0.0) + seconds
        if how == "recovered":
            # The steps it held up complete with this time inside: take it out of them.
            self._hang_credit += seconds
        self._add_episode(
            self.hangs,
            {
                "onset_unix": round(episode.onset_unix, 3),
                "end_unix": round(end, 3),
                "seconds": round(seconds, 3),
                "culprit_rank": episode.culprit,
                "node": self.nodes.get(episode.culprit, "") if episode.culprit is not None else "",
                "how": how,
                "attempt": self.attempt,
            },
        )

    # -- splitting steps -----------------------------------------------------------------------
    def finalize(self, now: float) -> None:
        """Split every step whose explanation had time to arrive; drop excess nobody waited for."""
        with self._lock:
            self._finalize(now, everything=False)

    def _finalize(self, now: float, everything: bool) -> None:
        while self._chunks and (everything or self._chunks[0].unix <= now - self.hold_s):
            self._split(self._chunks.popleft())
        ttl = 0.0 if everything else 3 * self.hold_s
        while self._credits and self._credits[0].unix < now - ttl:
            self._credits.popleft()  # the run never waited for it (or the wait was a hang's)
        while self._waits and self._waits[0].unix < now - ttl:
            self._waits.popleft()

    def _take(self, chunk: _Chunk, part: str, seconds: float) -> float:
        have = getattr(chunk, part)
        got = min(have, seconds) if have > 0 else 0.0
        setattr(chunk, part, have - got)
        return got

    def _split(self, ch: _Chunk) -> None:
        n = ch.steps1 - ch.steps0
        healthy = self._hang_credit <= 0
        if self._hang_credit > 0:
            netted = 0.0
            for part in ("comm", "compute", "data"):
                netted += self._take(ch, part, self._hang_credit - netted)
            self._hang_credit -= netted
            self._debt += netted  # the slow rank's own excess for it is the same time
        healthy = not self._apply_credits(ch) and healthy
        cats = self._cats
        cats["data"] += ch.data
        base = ch.comm
        if n > 0:
            host = self._host_slowdown(ch.compute / n)
            if len(self._samples) >= _BASELINE_MIN:
                base = self._within_baseline(ch.comm, n, host)
            if healthy:  # the baseline is what steps nobody held up needed
                self._samples.append(ch.comm / n)
                self._compute.append(ch.compute / n)
        # What the ranks' threads waited for a CPU meanwhile is the host's, not the network's.
        base += self._host_wait(ch, ch.comm - base)
        cats["communication"] += ch.comm - base
        clean = ch.compute + base
        redone = self._redone(ch)
        lost = clean * redone / n if n > 0 else 0.0
        cats["productive"] += clean - lost
        cats["lost_work"] += lost
        self.split["input"] += ch.data
        self.split["compute"] += ch.compute
        self.split["communication"] += ch.comm

    def _host_wait(self, ch: _Chunk, excess: float) -> float:
        """Return how much of ``excess`` communication the run's waits for a CPU explain.

        A wait is read after the steps it slowed: this rank's own with them, the other ranks'
        up to a heartbeat later (they publish theirs once a heartbeat). So the waits that explain
        a chunk are those read since the previous chunk, up to ``hold_s`` after it; each second
        of waiting explains one second once, earlier chunks first.
        """
        explained = 0.0
        for wait in self._waits:
            if excess - explained <= 0 or wait.unix > ch.unix + self.hold_s:
                break
            if wait.unix > ch.since:
                taken = min(wait.seconds, excess - explained)
                wait.seconds -= taken
                explained += taken
        # Read with or before this chunk's steps: no later chunk's steps ran before them.
        while self._waits and (self._waits[0].seconds <= 1e-9 or self._waits[0].unix <= ch.unix):
            self._waits.popleft()
        return explained

    def _host_slowdown(self, compute: float) -> float:
        """Return how much slower than usual this rank's own compute ran (1: not slower).

        A busy host (other processes on the cores, a checkpoint writer) slows the rank's compute
        and the CPU side of its collectives alike, where a slower network slows the collectives
        alone: communication is held to its baseline scaled by the host's pace, both baselines
        taken over the same healthy chunks.
        """
        if len(self._compute) < _BASELINE_MIN or compute <= 0:
            return 1.0
        usual = _clipped_mean(self._compute)
        return max(1.0, compute / usual) if usual > 0 else 1.0

    def _within_baseline(self, comm: float, steps: int, host: float = 1.0) -> float:
        """Return the part of ``steps`` steps' communication ``comm`` that is the healthy pace.

        Steps jitter around their baseline (scaled by the host's pace, ``host``), and up to
        :data:`COMM_NOISE_SHARE` above it is still the pace; what faster steps left unused pays
        for slower ones (up to :data:`COMM_SLACK_STEPS` steps' worth), so only a lasting
        slowdown is excess.
        """
        usual = self.baseline() * host * (1 + COMM_NOISE_SHARE)
        within = min(comm, usual * steps + self._comm_slack)
        self._comm_slack = min(usual * COMM_SLACK_STEPS, self._comm_slack + usual * steps - within)
        return within

    def _apply_credits(self, ch: _Chunk) -> bool:
        """Book the excess of slower ranks this chunk waited for; say whether any was."""
        booked = False
        for credit in list(self._credits):
            before = credit.seconds
            if self._debt > 0:
                dropped = min(self._debt, credit.seconds)
                credit.seconds -= dropped
                self._debt -= dropped
            if credit.culprit == self.rank:
                if credit.cause in CAUSES:
                    # Its own work above the median rank's is what the others waited for.
                    part = "data" if credit.cause == "data" else "compute"
                    spare = getattr(ch, part) - credit.usual * (ch.steps1 - ch.steps0)
                    if spare > 0:
                        taken = self._take(ch, part, min(spare, credit.seconds))
                        self._book(credit, taken, ch.unix)
                else:
                    credit.seconds = 0.0  # this rank's own sections are counted as they run
            else:
                # This rank waited for it in the collective: above its usual communication.
                spare = ch.comm - self._usual_comm(ch)
                if spare > 0:
                    self._book(credit, self._take(ch, "comm", min(spare, credit.seconds)), ch.unix)
            booked = booked or credit.seconds < before
            if credit.seconds <= 1e-9:
                self._credits.remove(credit)
        return booked

    def _usual_comm(self, ch: _Chunk) -> float:
        """Return the chunk's communication at the healthy baseline (0 before it is known)."""
        if len(self._samples) < _BASELINE_MIN:
            return 0.0
        return self.baseline() * (ch.steps1 - ch.steps0)

    def _book(self, credit: _Credit, seconds: float, unix: float) -> None:
        if seconds <= 0:
            return
        credit.seconds -= seconds
        category = category_of_cause(credit.cause)
        jitter = category == "straggler" and not credit.lasting
        self._cats["productive" if jitter else category] += seconds
        if category == "straggler":
            self.split["compute" if credit.cause == "compute" else "input"] += seconds
        if category == "straggler" and not jitter:
            key = ("straggler", credit.culprit)
            self._blame[key] = self._blame.get(key, 0.0) + seconds
            self._straggled(credit, seconds, unix)

    def _straggled(self, credit: _Credit, seconds: float, unix: float) -> None:
        last = self.stragglers[-1] if self.stragglers else None
        if (
            last is not None
            and last["culprit_rank"] == credit.culprit
            and last["cause"] == credit.cause
            and unix - float(last["end_unix"]) <= _EPISODE_GAP_S  # type: ignore[arg-type]
        ):
            last["end_unix"] = round(unix, 3)
            last["seconds"] = round(float(last["seconds"]) + seconds, 3)  # type: ignore[arg-type]
            return
        self._add_episode(
            self.stragglers,
            {
                "culprit_rank": credit.culprit,
                "node": self.nodes.get(credit.culprit, ""),
                "cause": credit.cause,
                "start_unix": round(min(credit.unix, unix), 3),
                "end_unix": round(unix, 3),
                "seconds": round(seconds, 3),
                "attempt": self.attempt,
            },
        )

    @staticmethod
    def _add_episode(episodes: list[dict[str, object]], episode: dict[str, object]) -> None:
        episodes.append(episode)
        del episodes[:-_EPISODES]

    def _redone(self, ch: _Chunk) -> float:
        """Return how many of the chunk's steps an earlier attempt had already done."""
        if self.start_step is None or self._prev_furthest is None:
            return 0.0
        first, last = self.start_step + ch.steps0, self.start_step + ch.steps1
        return float(max(0, min(last, self._prev_furthest) - first))

    def baseline(self) -> float:
        """Return the healthy exposed communication per step: the mean of recent samples."""
        return _clipped_mean(self._samples)

    @property
    def furthest_step(self) -> int | None:
        """Return the furthest step any attempt of the run reached (None where unknown)."""
        own = None
        if self.start_step is not None and self._last is not None:
            own = self.start_step + self._last.steps
        known = [s for s in (own, self._prev_furthest) if s is not None]
        return max(known) if known else None

    # -- the end -------------------------------------------------------------------------------
    def end(self, until: float, how: str) -> None:
        """End the account at ``until``: split every step, the rest of the wall clock is other."""
        with self._lock:
            if self.until is not None:
                return
            if self._hang_open is not None:
                self._close_hang(until, "aborted" if how == "aborted" else "open at the end")
            self._finalize(until, everything=True)
            self.until, self.ended = until, how
            wall = until - self.run_start
            rest = wall - sum(self._totals(until).values())
            self._cats["other"] += max(0.0, rest)

    # -- what is published -------------------------------------------------------------------
    def _totals(self, now: float) -> dict[str, float]:
        """Return every category's seconds at ``now`` (caller holds the lock)."""
        out = dict(self._base)
        for cat, seconds in self._cats.items():
            out[cat] += seconds
        for cat, seconds in self._sections.items():
            out[cat] += seconds
        now = self.until if self.until is not None else now
        if self._first is None:
            before = now - self._since - sum(self._sections.values())
        else:
            before = self._first - self._since - self._pre_sections
        out[self._before] += max(0.0, before)
        hang = self._hang_closed
        if self._hang_open is not None:
            hang += max(0.0, now - self._hang_open.onset_unix)
        out["hang"] += hang
        return out

    def totals(self, now: float) -> dict[str, float]:
        """Return every category's seconds so far; each only ever grows (counters)."""
        with self._lock:
            out = self._totals(now)
            for cat, seconds in out.items():
                out[cat] = self._published[cat] = max(self._published[cat], seconds)
            return out

    def blame(
        self, now: float, node_of: Callable[[int], str] | None = None
    ) -> list[tuple[str, int, str, float]]:
        """Return ``(category, culprit rank, node, seconds)`` of the time blamed on a rank."""
        with self._lock:
            blame = dict(self._blame)
            episode = self._hang_open
            if episode is not None and episode.culprit is not None and self.until is None:
                key = ("hang", episode.culprit)
                blame[key] = blame.get(key, 0.0) + max(0.0, now - episode.onset_unix)
        out = []
        for (cat, culprit), seconds in sorted(blame.items()):
            node = self.nodes.get(culprit, "")
            if not node and node_of is not None:
                node = self.nodes.setdefault(culprit, node_of(culprit))
            out.append((cat, culprit, node, seconds))
        return out

    def _with_node(self, episode: dict[str, object]) -> dict[str, object]:
        culprit = episode.get("culprit_rank")
        if not episode.get("node") and isinstance(culprit, int) and culprit in self.nodes:
            episode["node"] = self.nodes[culprit]
        return dict(episode)

    def state(self, now: float) -> dict[str, object]:
        """Return the account as the run's goodput file holds it (JSON-ready)."""
        totals = self.totals(now)
        until = self.until if self.until is not None else now
        with self._lock:
            return {
                "run_start_unix": round(self.run_start, 3),
                "until_unix": round(until, 3),
                "ended": self.ended,
                "attempts": list(self.attempts),
                "totals": {k: round(v, 3) for k, v in totals.items()},
                "furthest_step": self.furthest_step,
                "baseline_comm_per_step_s": round(self.baseline(), 6) if self._samples else None,
                "split": {k: round(v, 3) for k, v in self.split.items()},
                "stragglers": [
                    self._with_node(e)
                    for e in self.stragglers
                    if float(e["seconds"]) >= _EPISODE_MIN_S  # type: ignore[arg-type]
                ],
                "hangs": [self._with_node(e) for e in self.hangs],
            }
