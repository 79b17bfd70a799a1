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
  never answers (SIGSTOPped, dead, or a thread holding the GIL) is named as such.

With ``on_hang="abort"`` the monitoring rank also decides, after an episode's dumps, whether
the hang has lasted long enough to end the run, and every rank that answered the episode checks
for that decision until it progresses again (:mod:`exporter.hangs.action`). The run's ledger
(:mod:`exporter.hangs.restarts`) decides whether the action still acts: the monitoring rank reads
it at start and keeps it, with the culprits' nodes, when it acts or declines. From a quarter
interval before the action can be due (jobs of up to :data:`FAST_WATCH_MAX_RANKS` ranks), the
ranks of the episode report, read and look for the decision every :data:`ACTION_POLL_S`, so the
action comes as soon as it is due and every rank leaves at once.

The watcher is handed what it reads (the rank's identity, store, in-flight state and
recorder) and, for the action, a callable that publishes it; never the observer.
"""

from __future__ import annotations

import faulthandler
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from .. import storekeys
from ..background import BackgroundLoop
from ..errors import ErrorCounter
from ..log import log
from ..settings import Identity
from ..sources import flight, launcher
from ..sources.flight import InFlight
from ..sources.recorder import Recorder
from ..sources.sections import SectionRegistry
from . import action as actions
from . import restarts as ledger
from . import verdict as verdicts
from .action import ActionPolicy
from .capture import capture, summarize
from .definition import DEFAULT_POLICY, HangFinding, HangPolicy, SeqState, find_hangs
from .dumps import episode_dir, makedirs_private, render_dump, replace_private, write_private
from .restarts import RestartPolicy, RestartState

__all__ = ["ACTION_POLL_S", "FAST_WATCH_MAX_RANKS", "FAULTHANDLER_S", "HangWatcher"]

#: Largest job whose monitoring rank reads the reports every quarter interval, not every one.
FAST_WATCH_MAX_RANKS = 256
#: Seconds the C-level fallback (faulthandler) waits before it dumps every thread's stack.
FAULTHANDLER_S = 3.0
#: How often a rank of a hung episode looks for the hang action once it may be due.
ACTION_POLL_S = 0.1


class HangWatcher:
    """Report, trigger and answer dump requests on one rank, from one background thread."""

    def __init__(
        self,
        identity: Identity,
        store: Any,
        *,
        inflight: InFlight,
        recorder: Recorder,
        sections: SectionRegistry,
        interval_s: float,
        monitor: bool,
        dump_dir: str,
        errors: ErrorCounter,
        policy: HangPolicy = DEFAULT_POLICY,
        action: ActionPolicy | None = None,
        publish_abort: Callable[[], None] = lambda: None,
        restart: RestartPolicy | None = None,
        start_step: int | None = None,
        forget: Callable[[], None] | None = None,
    ) -> None:
        self._store = store
        self._inflight = inflight
        self._recorder = recorder
        self._sections = sections
        self._finished = False
        self._run = identity.run
        self._node = identity.node or socket.gethostname()
        self._attempt = identity.attempt
        self._local_rank = identity.local_rank
        self.rank = identity.rank
        self.world_size = identity.world_size
        self.interval = interval_s
        self.monitor = monitor
        self.dump_dir = dump_dir
        self.policy = policy
        self._errors = errors
        keys = storekeys.for_run(identity.run, identity.attempt)
        self._keys = keys
        self._episode_key = keys.episode()
        self._request_key = keys.request()
        self._report_keys = [keys.report(r) for r in range(self.world_size)]
        self._ack_keys = [keys.ack(r) for r in range(self.world_size)]
        self._main_ident = threading.main_thread().ident
        self._loop = BackgroundLoop(
            "ddp-exporter-forensics",
            self._tick_once,
            max(interval_s / 4.0, 0.05),
            errors=errors,
            where="forensics",
        )
        self._tick = 0
        self._lat: tuple[float, int] = (0.0, 0)
        self._recent_latency: float | None = None
        self._answered = 0
        self._last_states: list = []
        #: Dumps written by this rank (``ddp_hang_dumps_total``).
        self.dumps = 0
        #: ``(file, line, function)`` while this rank is the culprit of an open episode.
        self.location: tuple[str, str, str] | None = None
        self._location_mark: Any = None
        #: ``(unix time, culprit rank label, its node)`` once this rank is leaving on an abort.
        self.aborted: tuple[float, str, str] | None = None
        self._action = action
        self._action_key = keys.action()
        self._leaving = None
        if forget is None:
            # A store the launcher keeps for the next attempt is cleared of this one's.
            shared = launcher.launch().shared_store
            forget = (lambda: launcher.forget_attempt(store)) if shared else (lambda: None)
        if action is not None:
            self._leaving = actions.Leaving(
                store, keys, self.rank, monitor=monitor, policy=action, interval_s=interval_s,
                publish=publish_abort, errors=errors, keep=self._keep, forget=forget,
            )  # fmt: skip
        #: The run's restart ledger as the monitoring rank publishes it (action on), else None.
        self.restarts: RestartState | None = None
        if action is not None and monitor:
            self.restarts = RestartState(restart or RestartPolicy(), self._chain(), start_step)
        #: Node of each rank, from its acks (monitoring rank; culprits are named by node).
        self._nodes: dict[int, str] = {}
        #: ``(episode, progress mark)`` while this rank may be told to leave (action on).
        self._in_episode: tuple[int, Any, dict] | None = None
        #: When the next full tick is due (ticks in between only look for the action).
        self._next_tick = 0.0
        # Monitoring rank only.
        self._all_keys_exist = False
        self._seen: list[tuple[bytes, float]] | None = None
        self._episode: dict | None = None
        self._blocked_pg: str | None = None
        #: The completed episode the action may still act on (action on).
        self._acting: dict | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> HangWatcher:
        """Publish this rank's keys synchronously (the monitor waits for all), then run."""
        self._store.set(self._report_keys[self.rank], self._report())
        self._store.set(self._ack_keys[self.rank], json.dumps({"episode": 0, "node": self._node}))
        self._answered = int(self._store.add(self._episode_key, 0))
        self._loop.start()
        return self

    def finish(self) -> None:
        """Report that this rank ended cleanly: the monitoring rank stops counting it."""
        self._finished = True
        self._store.set(self._report_keys[self.rank], self._report())

    def close(self) -> None:
        """Stop the thread (a daemon: it may be stuck on a dead store)."""
        self._loop.close()

    def _tick_once(self) -> float | None:
        # A dead store raises here: the loop counts it and training goes on.
        now = time.monotonic()
        if now < self._next_tick:
            # Between two ticks, while the hang action may be due any moment: a rank inside
            # the stalled collective reports its age, the monitoring rank reads the reports,
            # every rank looks for the decision. The action then comes within ACTION_POLL_S of
            # the first report that makes it due, and every rank leaves within ACTION_POLL_S.
            if self._in_episode is not None:
                if self._self_stuck():
                    self._store.set(self._report_keys[self.rank], self._report())
                self._check_action()
            if self.monitor and self._acting is not None:
                self._watch()
            return self._poll_wait(now)
        self._next_tick = now + self._loop.interval_s
        self._tick += 1
        full = self._tick % 4 == 0
        stuck = self._self_stuck()
        # A rank stuck in a collective reports every quarter interval (small jobs): the hang
        # action acts on reported ages, so fresher reports make it act sooner, never earlier.
        if full or stuck and self.world_size <= FAST_WATCH_MAX_RANKS:
            self._store.set(self._report_keys[self.rank], self._report())
        if full or stuck:
            self._check_request()
        self._update_location()
        if self._in_episode is not None:
            self._check_action()
        # Reports are read every quarter interval (a hang is seen up to 3/4 of an interval
        # sooner); in large jobs once per interval, to bound store traffic.
        if self.monitor and (full or self.world_size <= FAST_WATCH_MAX_RANKS):
            self._watch()
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
        if self._in_episode is not None:
            request = self._in_episode[2]
        elif self.monitor and self._acting is not None:
            request = self._acting["episode"]
        else:
            return False
        # The hang's age by this rank's clock (a hint for polling, never for the decision).
        age = float(request.get("age", 0.0)) + time.time() - float(request["requested_unix"])
        timeout = min((s.timeout_s for s in self._last_states if s.timeout_s), default=None)
        threshold, tick = float(request["threshold"]), self._loop.interval_s
        earliest = self._action.due_s(threshold, timeout, sure=True)
        latest = self._action.due_s(threshold, timeout, sure=False)
        return earliest - tick <= age <= latest + tick

    # -- every rank --------------------------------------------------------------------------
    def _latency(self) -> float | None:
        """Return the mean collective latency since the last full tick (last known if none)."""
        total, count = self._recorder.collective_totals()
        s0, c0 = self._lat
        if count > c0:
            self._recent_latency = (total - s0) / (count - c0)
            self._lat = (total, count)
        return self._recent_latency

    def _report(self) -> str:
        states = self._inflight.read()
        self._last_states = states
        return json.dumps(
            {
                "n": self._tick,
                "pgs": [
                    [s.pg, s.last_enqueued, s.inflight_age_s, s.timeout_s, s.last_completed]
                    for s in states
                ],
                "lat": self._latency(),
                # Inside a declared section within its deadline (or just out of one, while the
                # ranks it held up finish their collective): excused, not hung.
                "sec": self._sections.busy(grace_s=2 * self.interval) is not None,
                "fin": self._finished,
                "st": self._recorder.steps,
            }
        )

    def _self_stuck(self) -> bool:
        """Say whether this rank sits in a collective long enough to expect a request soon."""
        states = self._last_states
        return any(s.inflight_age_s > self.policy.stall_min_seconds / 2 for s in states)

    def _check_request(self) -> None:
        episode = int(self._store.add(self._episode_key, 0))
        if episode <= self._answered:
            return
        self._answered = episode
        request = json.loads(self._store.get(self._request_key))
        if int(request.get("episode", -1)) != episode:
            return  # a newer request replaced it; the next check answers that one
        summary = self.dump(episode, request)
        ack = {"episode": episode, "summary": summary, "node": self._node}
        self._store.set(self._ack_keys[self.rank], json.dumps(ack))

    def dump(self, episode: int, request: dict) -> dict:
        """Write this rank's dump for ``episode``; return its summary (the ack).

        A dump folder that cannot be written still gets an ack (with the error in it): the
        monitoring rank must not mistake a full disk for a frozen rank.
        """
        folder = episode_dir(self.dump_dir, self._run, episode, self._attempt)
        base = os.path.join(folder, f"rank-{self.rank}")
        fallback = None
        try:
            makedirs_private(folder)
            fd = os.open(base + ".txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            fallback = os.fdopen(fd, "w")
            fallback.write(
                f"ddp-exporter hang dump: rank {self.rank}, episode {episode}: the Python "
                "capture did not finish; C-level stacks from faulthandler follow.\n"
            )
            fallback.flush()
        except OSError as exc:
            self._errors.record("forensics", exc)
        # C-level fallback: if this thread cannot get the GIL back (a thread holding it in C
        # code), faulthandler's own watchdog thread still writes every thread's stack there.
        # (It replaces a dump_traceback_later the application armed itself, for this moment.)
        try:
            if fallback is not None:
                faulthandler.dump_traceback_later(FAULTHANDLER_S, repeat=False, file=fallback)
            try:
                data = self._capture()
            finally:
                if fallback is not None:
                    faulthandler.cancel_dump_traceback_later()
        finally:
            if fallback is not None:
                fallback.close()
        data.update(
            episode=episode,
            run=self._run,
            rank=self.rank,
            world_size=self.world_size,
            host=socket.gethostname(),
            node=self._node,
            pid=os.getpid(),
            request=request,
        )
        summary = summarize(self.rank, data)
        data["summary"] = summary
        try:
            write_private(base + ".json", json.dumps(data, indent=1, default=str))
            write_private(base + ".txt", render_dump(self.rank, data))
            self.dumps += 1
        except OSError as exc:
            self._errors.record("forensics", exc)
            summary["errors"] = [*summary["errors"], f"dump files not written: {exc!r}"]
        if self.rank in request.get("behind", ()) and summary.get("where"):
            w = summary["where"]
            self.location = (w["file"], str(w["line"]), w["function"])
            self._location_mark = self._progress_mark()
        if self._action is not None and not self.monitor:
            self._in_episode = (episode, self._progress_mark(), request)
        return summary

    def _capture(self) -> dict:
        """Capture this rank; the Flight Recorder only while it is the in-flight source."""
        in_use = self._inflight.name == "flight_recorder"
        return capture(
            main_ident=self._main_ident,
            flight_recorder=flight.entries_report if in_use else None,
            step=self._recorder.steps,
            seqs=self._seqs,
        )

    def _seqs(self) -> dict:
        return {
            s.pg: {"last_enqueued": s.last_enqueued, "last_completed": s.last_completed}
            for s in self._inflight.read()
        }

    def _progress_mark(self) -> tuple:
        states = self._last_states
        return (self._recorder.steps, tuple(sorted((s.pg, s.last_enqueued) for s in states)))

    def _check_action(self) -> None:
        """Leave with the others once the monitoring rank decided to act on this episode."""
        episode, mark, _ = self._in_episode
        if self._progress_mark() != mark:
            self._in_episode = None  # this rank progressed: the episode is over for it
            return
        if not self._store.check([self._action_key]):
            return
        action = json.loads(self._store.get(self._action_key))
        if int(action.get("episode", -1)) == episode:
            self._leave(action)

    def _leave(self, action: dict, answered: list[int] | None = None) -> None:
        culprits, nodes = action.get("culprits") or [], action.get("nodes") or []
        self.aborted = (
            float(action["decided_unix"]),
            str(culprits[0]) if culprits else "",
            str(nodes[0]) if nodes else "",
        )
        self._leaving.leave(action, answered)

    def _keep(self, action: Mapping[str, Any]) -> None:
        """Write the run's ledger and the launcher's line (monitoring rank, local rank 0)."""
        entries = action.get("ledger")
        if entries is None or not (self.monitor or self._local_rank == 0):
            return
        last = entries[-1]
        ledger.record(self.dump_dir, self._run, entries[:-1], last)
        if last["decision"] != "decline":
            line = ledger.launcher_line(last, int(action.get("limit", 0)))
            replace_private(ledger.abort_path(self.dump_dir, self._run), line)

    def _chain(self) -> list[dict]:
        """Return the ledger's entries leading up to this attempt (monitoring rank, at start)."""
        try:
            return ledger.load_chain(self.dump_dir, self._run, self._attempt)
        except (OSError, ValueError) as exc:
            self._errors.record("forensics", exc)
            return []

    def _update_location(self) -> None:
        """Drop the published location once this rank progresses again (episode over)."""
        if self.location is not None and self._progress_mark() != self._location_mark:
            self.location = None

    # -- monitoring rank ---------------------------------------------------------------------
    def _watch(self) -> None:
        if not self._all_keys_exist:
            keys = self._report_keys + self._ack_keys
            if not self._store.check(keys):
                return
            self._all_keys_exist = True
        raw = self._store.multi_get(self._report_keys)
        now = time.monotonic()
        if self._seen is None:
            self._seen = [(v, now) for v in raw]
        else:
            self._seen = [(v, t if v == old else now) for v, (old, t) in zip(raw, self._seen)]
        states, lats, last = [], [], {}
        # For the hang action: what each rank itself reported (never extrapolated).
        reported: dict[str, float] = {}
        steps: dict[str, dict[int, int]] = {}
        timeouts: dict[str, float] = {}
        reports = [(json.loads(value), seen_at) for value, seen_at in self._seen]
        # A collective some rank has completed is over for every rank: a report still showing
        # it in flight predates its end (reports are read up to an interval apart; the ranks a
        # checkpoint held up for 30 s must not look stuck just after it ends).
        done: dict[str, float] = {}
        for rep, _ in reports:
            for _pg, _enq, _age, _tmo, *completed in rep.get("pgs", []):
                if completed:
                    done[str(_pg)] = max(done.get(str(_pg), -1.0), float(completed[0]))
        for rank, (rep, seen_at) in enumerate(reports):
            if rep.get("fin"):
                continue  # ended cleanly: gone, neither behind nor waiting
            if rep.get("lat"):
                lats.append(float(rep["lat"]))
            section = bool(rep.get("sec"))
            # A live rank's report is up to an interval old: age it by the time since it
            # changed, but by one interval at most. A rank silent for longer (frozen, dead, a
            # thread holding the GIL) is not known to sit in that collective still; aging it
            # on would call a frozen rank that never entered the next collective "waiting".
            lag = min(now - seen_at, self.interval)
            for pg, enq, age, tmo, *_ in rep.get("pgs", []):
                pg = str(pg)
                if age and float(enq) <= done.get(pg, -1.0):
                    age = 0.0  # stale: that collective has completed
                reported[pg] = max(reported.get(pg, 0.0), float(age or 0.0))
                steps.setdefault(pg, {})[rank] = int(rep.get("st", 0))
                if tmo:
                    timeouts[pg] = min(timeouts.get(pg, float(tmo)), float(tmo))
                age = float(age) + lag if age else 0.0
                states.append(SeqState(rank, pg, float(enq), age, tmo, section))
                last[(rank, pg)] = enq
        lats.sort()
        normal = lats[len(lats) // 2] if lats else None
        self._rearm(steps)
        findings = find_hangs(states, normal, self.policy)
        ep = self._episode
        if ep is not None:
            self._collect(ep, last)
        if self._blocked_pg is not None and not any(f.pg == self._blocked_pg for f in findings):
            self._blocked_pg = None  # progress resumed: the next hang is a new episode
        if self._acting is not None:
            pg = self._acting["episode"]["pg"]
            finding = next((f for f in findings if f.pg == pg), None)
            self._maybe_act(finding, reported.get(pg, 0.0), steps.get(pg, {}), timeouts.get(pg))
        if self._episode is None and self._blocked_pg is None:
            act = [f for f in findings if f.kind in ("behind", "symmetric")]
            if act:
                act.sort(key=lambda f: f.kind != "behind")
                self._open(act[0])
                self._check_request()  # the monitoring rank dumps at once

    def _rearm(self, steps: dict[str, dict[int, int]]) -> None:
        """Count aborts without progress from zero again once this attempt made progress."""
        state = self.restarts
        if state is None or state.streak == 0:
            return
        done = [n for per_pg in steps.values() for n in per_pg.values()]
        stopped = state.suspended
        if done and state.progressed(min(done)) and stopped:
            log.warning(
                "ddp-exporter: run %s got past the furthest step of its aborted attempts: the "
                "hang action, stopped after %d aborts without progress, acts again",
                self._run,
                state.limit,
            )

    def _maybe_act(
        self, finding: HangFinding | None, age: float, steps: dict[int, int], timeout: float | None
    ) -> None:
        """Act on the completed episode once the action is due; forget it once it progressed."""
        acting = self._acting
        episode = acting["episode"]
        if finding is None or finding.seq != episode["seq"]:
            self._acting = None  # the collective completed: no action for this episode
            return
        sure = acting["sure"]
        if not actions.due(self._action, episode, finding, reported_age=age, steps=steps,
                           timeout=timeout, sure=sure):  # fmt: skip
            return
        self._acting = None
        state = self.restarts or RestartState(RestartPolicy(), [])
        done = min(steps.values())
        judged = ledger.judge(state.chain, state.policy, start_step=state.start_step, steps=done)
        culprits = [int(r) for r in episode.get("behind", [])]
        nodes = self._nodes_of(culprits)
        policy = state.policy
        code = {"abort": self._action.exit_code, "give_up": policy.give_up_exit_code}
        action = actions.plan(
            self._action, dict(episode, attempt=self._attempt), acting["located"],
            acting["folder"], age, timeout, sure=sure, nodes=nodes, decision=judged.decision,
            exit_code=code.get(judged.decision), streak=judged.streak, limit=policy.limit,
        )  # fmt: skip
        entry = ledger.entry(
            run=self._run, attempt=self._attempt, judgement=judged, culprits=culprits,
            nodes=nodes, steps=done, start_step=state.start_step, episode=int(episode["episode"]),
            folder=acting["folder"], exit_code=code.get(judged.decision),
        )  # fmt: skip
        action["ledger"] = [*state.chain, entry]
        state.add(entry)
        actions.record(acting["folder"], episode, acting["summaries"], action, self._errors)
        if judged.decision == "decline":
            log.warning("%s", actions.describe(action))
            try:
                self._keep(action)
            except (OSError, ValueError) as exc:
                self._errors.record("forensics", exc)
            return
        self._store.set(self._action_key, json.dumps(action))
        self._leave(action, episode["answered"])

    def _nodes_of(self, ranks: list[int]) -> list[str]:
        """Return the node of each of ``ranks`` (``""`` when it never said), from their acks."""
        unknown = [r for r in ranks if r not in self._nodes]
        if unknown:
            try:
                raw = self._store.multi_get([self._ack_keys[r] for r in unknown])
                for r, value in zip(unknown, raw):
                    node = json.loads(value).get("node")
                    if node:
                        self._nodes[r] = str(node)
            except Exception as exc:  # noqa: BLE001 - nodes are a courtesy; the abort is not
                self._errors.record("forensics", exc)
        return [self._nodes.get(r, "") for r in ranks]

    def _open(self, finding: HangFinding) -> None:
        request = {
            "pg": finding.pg,
            "kind": finding.kind,
            "seq": finding.seq,
            "behind": list(finding.behind),
            "waiting": list(finding.waiting),
            "age": finding.age,
            "threshold": finding.threshold,
            "requested_unix": time.time(),
        }
        # Publish the request before bumping the counter: a rank that sees the new number
        # always finds its request. Only the monitoring rank writes either key.
        number = int(self._store.add(self._episode_key, 0)) + 1
        request["episode"] = number
        self._store.set(self._request_key, json.dumps(request))
        self._store.add(self._episode_key, 1)
        self._blocked_pg = finding.pg
        deadline = time.monotonic() + 3 * self.interval + FAULTHANDLER_S + 2.0
        self._episode = {"request": request, "deadline": deadline, "acks": {}}
        log.warning(
            "ddp-exporter: hang detected in run %s (pg %s, %s, seq %g, oldest in flight %.1fs "
            "> %.1fs); asking every rank for a dump (episode %d)",
            self._run,
            finding.pg,
            finding.kind,
            finding.seq,
            finding.age,
            finding.threshold,
            number,
        )

    def _collect(self, ep: dict, last: dict) -> None:
        number = ep["request"]["episode"]
        acks = ep["acks"]
        missing = [r for r in range(self.world_size) if r not in acks]
        if missing:
            for rank, value in zip(
                missing, self._store.multi_get([self._ack_keys[r] for r in missing])
            ):
                ack = json.loads(value)
                if ack.get("node"):
                    self._nodes[rank] = str(ack["node"])
                if int(ack.get("episode", 0)) == number:
                    acks[rank] = ack.get("summary") or {"rank": rank}
        if len(acks) < self.world_size and time.monotonic() < ep["deadline"]:
            return
        self._episode = None
        last_seq = {r: v for (r, pg), v in last.items() if pg == ep["request"]["pg"]}
        episode = dict(
            ep["request"],
            run=self._run,
            world_size=self.world_size,
            answered=sorted(acks),
            missing=[r for r in range(self.world_size) if r not in acks],
            # The nodes of the ranks a verdict may name (behind, or silent: a partitioned
            # node), from their acks; as many as those ranks, not the job.
            nodes={
                str(r): self._nodes[r]
                for r in range(self.world_size)
                if (r not in acks or r in ep["request"]["behind"]) and r in self._nodes
            },
            last_enqueued=last_seq,
            complete_unix=time.time(),
        )
        summaries: dict[int, dict | None] = {r: acks.get(r) for r in range(self.world_size)}
        found = verdicts.verdict(episode, summaries)
        text = verdicts.render(found)
        folder = episode_dir(self.dump_dir, self._run, number, self._attempt)
        episode["summaries"] = {str(r): s for r, s in summaries.items()}
        if self._action is not None and episode["kind"] in actions.ACTIONABLE:
            self._acting = {"episode": episode, "summaries": summaries, "folder": folder,
                            "located": found.located, "sure": actions.certain(episode, found)}  # fmt: skip
        try:
            makedirs_private(folder)
            write_private(os.path.join(folder, "episode.json"), json.dumps(episode, indent=1))
            write_private(os.path.join(folder, "verdict.txt"), text)
        except OSError as exc:
            self._errors.record("forensics", exc)
        log.warning(
            "%s",
            "\n".join(f"{verdicts.MARKER} {line}" for line in text.rstrip("\n").splitlines()),
        )
