"""Act on a hang: end every rank of a hung run so that its launcher restarts it, in seconds.

Opt-in: ``exporter.instrument(on_hang="abort")`` or ``DDP_EXPORTER_ON_HANG=abort``; the default
(``off``) alerts and dumps only. The action rides on the hang watcher's episode
(:mod:`exporter.hangs.watcher`): the same finding, the same dumps, one decision.

**What triggers it.** The monitoring rank decides, at each watch, when all of these hold:

1. a hang episode of kind ``behind`` (ranks that never entered the collective the others wait
   in) or ``symmetric`` (every rank inside it, nobody behind) was opened, and its dumps are
   complete: every rank answered, or the collection deadline passed;
2. the same collective is still stalled: the process group's finding has the episode's kind and
   sequence number, and a rank's own latest report puts it inside that collective for at least
   :meth:`ActionPolicy.due_s`: the larger of ``abort_after`` (``DDP_EXPORTER_ABORT_AFTER_S``,
   20 s) and twice the threshold that declared the hang (10 s or 20x the normal collective
   latency; a symmetric hang's own threshold is at least 60 s, so it acts at 120 s at the
   earliest), yet no later than half the process group's timeout. That is when the evidence is
   complete (:func:`certain`: a rank behind, every rank answered, each culprit located outside
   any collective, every other rank waiting in the stalled one, no mismatch); otherwise the
   action waits 1.5 times as long (30 s by default), for a late answer or a straggler;
3. every rank of the process group completed a step in this attempt;
4. the run is not in a restart loop: the attempts it aborted before made progress, or fewer
   than ``DDP_EXPORTER_ABORT_LIMIT`` of them in a row did not (:mod:`exporter.hangs.restarts`).
   The abort that reaches the limit is the last one (exit code 69, "do not requeue"); after it
   the action declines: dumps and alerts, no exit.

**What never triggers it:** a rank inside a declared section within its deadline, and the ranks
waiting for it (the finding is of kind ``section``); a straggler, however slow, that still
progresses (the collective completes, its sequence number moves on: that episode is over); a
slow start or a rank still building its model (no step completed yet); a rank still
initialising (the init watch never acts); ranks stuck inside a collective with nobody behind,
before the symmetric threshold (``waiting``); a rank that ended cleanly.

**How the run ends.** The monitoring rank writes the action to the store, records it in the
episode's ``episode.json`` and ``verdict.txt``, and adds the attempt to the run's ledger and to
the one-line file a requeue script reads (:mod:`exporter.hangs.restarts`; the local rank 0 of
every node writes copies next to its own dumps). Every rank that answered the episode (each one
checks while it has not progressed since) prints one line naming the culprit, its ``file:line``
and the dump folder, publishes ``ddp_hang_abort_timestamp_seconds`` and waits until its scrapers
read it (at most ``DDP_EXPORTER_FINAL_SCRAPE_S``), then says it is leaving. Once every rank that
answered is leaving, or a short deadline passed, the monitoring rank clears the attempt's
process-group keys from a store the launcher keeps for the next attempt
(:func:`exporter.sources.launcher.forget_attempt`), then lets them all go at once: the store may
live in its process, so it goes last, and ranks that exit together leave no survivor to unwind a
broken collective into user code. Each rank aborts its NCCL communicators
(bounded; the GPU is free at once) and ends with ``os._exit(exit_code)`` from the watcher
thread, whatever its training thread is doing: blocked in a collective, sleeping, or running C
code that releases the GIL. Every rank of the run exits, not only those of the stalled group:
launchers restart whole jobs, and a rank left running would only wait for peers that are gone.

A rank whose Python threads cannot run (SIGSTOP, a debugger, C code that holds the GIL) cannot
exit by itself. Its peers do; the launcher then ends it (torchrun stops its worker group,
``srun --kill-on-bad-exit=1`` its step, Kubernetes the job's pods).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NoReturn

from .. import settings
from ..errors import ErrorCounter
from ..log import log
from ..ranklist import format_ranks
from ..storekeys import Keys
from . import codec
from . import verdict as verdicts
from .capture import user_frame
from .channel import Store
from .definition import HangFinding
from .dumps import write_private
from .protocol import Action, DumpRequest, Episode, Located, Summary
from .restarts import RestartPolicy
from .verdict import Verdict

__all__ = [
    "ACTIONABLE",
    "ActionPolicy",
    "Leaving",
    "UNCERTAIN_FACTOR",
    "abort_communicators",
    "certain",
    "decide",
    "describe",
    "due",
    "exit_now",
    "policies",
    "record",
]

#: Hang kinds the action may end a run for.
ACTIONABLE: tuple[str, ...] = ("behind", "symmetric")
#: How much longer the action waits when the evidence is incomplete (:func:`certain`).
UNCERTAIN_FACTOR = 1.5
#: Most seconds a rank spends aborting its NCCL communicators before it exits anyway.
ABORT_COMMS_S = 5.0
#: Thread switch interval while a rank leaves: the longest the training thread waits for the
#: GIL before it may take it from the leaving thread (which needs well under a millisecond).
GIL_HOLD_S = 0.5


@dataclass(frozen=True)
class ActionPolicy:
    """When the ``abort`` action acts, and how the ranks it ends exit."""

    #: Seconds a hang with complete evidence lasts before the action
    #: (``DDP_EXPORTER_ABORT_AFTER_S``; incomplete evidence: ``UNCERTAIN_FACTOR`` times) ...
    after_s: float = settings.DEFAULT_ABORT_AFTER_S
    #: ... and at least this multiple of the threshold that declared the hang ...
    threshold_factor: float = 2.0
    #: ... but no later than this share of the process group's timeout.
    timeout_share: float = 0.5
    #: Exit code of every rank the action ends (``DDP_EXPORTER_ABORT_EXIT_CODE``).
    exit_code: int = settings.DEFAULT_ABORT_EXIT_CODE
    #: Most seconds a rank takes to publish the action (its scrapers' final read).
    publish_s: float = settings.DEFAULT_FINAL_SCRAPE_S

    def due_s(self, threshold: float, timeout: float | None, sure: bool = True) -> float:
        """Return how long a hang declared at ``threshold`` seconds lasts before the action.

        ``sure``: the episode's evidence is complete (:func:`certain`); else it waits longer.
        """
        after = self.after_s if sure else UNCERTAIN_FACTOR * self.after_s
        due = max(after, self.threshold_factor * threshold)
        if timeout is not None and timeout > 0:
            due = min(due, self.timeout_share * timeout)
        return due


def certain(episode: Episode, found: Verdict) -> bool:
    """Say whether an episode's dumps leave no doubt who hangs the run, and where.

    Complete evidence: a rank is behind (not a symmetric hang), every rank answered, no
    collective mismatch, every rank behind was located by its dump and is not itself inside a
    collective, and every other rank waits in the stalled collective (the trigger saw it
    waiting, or its Flight Recorder shows that collective in flight).
    """
    ep = episode
    req = ep.request
    if req.kind != "behind" or ep.missing or found.mismatches:
        return False
    behind = set(req.behind)
    summaries = ep.summaries or {}
    if not behind or not behind <= {p.rank for p in found.places}:
        return False
    pg, seq = str(req.pg), float(req.seq)
    waiting = set(req.waiting)
    for rank, s in summaries.items():
        if not s:
            return False
        if rank in behind:
            if s.phase == "collective" or user_frame(s.frames) is None:
                return False
            continue
        inside = any(str(e.pg) == pg and float(e.seq) == seq for e in s.inflight)
        if rank not in waiting and not inside:
            return False
    world = ep.world_size if ep.world_size is not None else len(summaries)
    return len(summaries) == world


def policies(
    on_hang: settings.OnHang | None, publish_s: float
) -> tuple[ActionPolicy | None, RestartPolicy]:
    """Return the action's policy (None when off) and the run's restart policy, from settings."""
    restart = RestartPolicy()
    if on_hang is None or on_hang.action == "off":
        return None, restart
    restart = RestartPolicy(on_hang.limit, on_hang.progress_steps, on_hang.give_up_exit_code)
    return ActionPolicy(on_hang.after_s, exit_code=on_hang.exit_code, publish_s=publish_s), restart


def due(
    policy: ActionPolicy,
    request: DumpRequest,
    finding: HangFinding | None,
    *,
    reported_age: float,
    steps: Mapping[int, int],
    timeout: float | None,
    sure: bool = False,
    evidence: bool = False,
) -> bool:
    """Say whether the episode of ``request`` calls for the action now.

    ``finding`` is the current finding for the episode's process group (None: it progressed),
    ``reported_age`` the longest time a rank of the group said, in its own latest report, that
    it has been inside its oldest collective (never extrapolated: a report is evidence, its age
    is not), ``steps`` the steps each rank of the group completed in this attempt, ``sure``
    whether the episode's evidence is complete (:func:`certain`). ``evidence``: the run-time
    probe found a broken link or node, so a symmetric episode was opened before its threshold:
    the collective still stalled with nobody behind (``waiting``) keeps it going.
    """
    req = request
    if finding is None or finding.seq != req.seq:
        return False
    kinds = ("symmetric", "waiting") if evidence and req.kind == "symmetric" else (req.kind,)
    if finding.kind not in kinds or req.kind not in ACTIONABLE:
        return False
    if not steps or min(steps.values()) < 1:
        return False
    return reported_age >= policy.due_s(float(req.threshold), timeout, sure)


def decide(
    policy: ActionPolicy,
    episode: Episode,
    located: Sequence[Located],
    folder: str,
    age: float,
    timeout: float | None,
    *,
    sure: bool = False,
    nodes: Sequence[str] | None = None,
    decision: str = "abort",
    exit_code: int | None = None,
    streak: int = 1,
    limit: int = 0,
    network: str | None = None,
) -> Action:
    """Return the action the monitoring rank publishes for ``episode``.

    ``decision`` is the ledger's (:func:`exporter.hangs.restarts.judge`): ``abort``,
    ``give_up`` (the last abort, with ``exit_code``) or ``decline``; ``nodes`` the node of each
    culprit (of a hang with nobody behind: the nodes the probe named), ``streak`` the aborts
    in a row without progress, this one included, ``network`` what the probe named.
    """
    where = None
    if located:
        first = located[0]
        where = f"{os.path.basename(first.file)}:{first.line} in {first.function}"
    req = episode.request
    return Action(
        action="abort" if decision != "decline" else "none",
        decision=decision,
        episode=req.episode,
        run=episode.run,
        attempt=episode.attempt if episode.attempt is not None else "0",
        pg=req.pg,
        seq=req.seq,
        kind=req.kind,
        culprits=req.behind,
        nodes=tuple(nodes or ()),
        where=where,
        folder=folder,
        age_s=round(age, 1),
        due_s=round(policy.due_s(float(req.threshold), timeout, sure), 1),
        certain=sure,
        exit_code=policy.exit_code if exit_code is None else exit_code,
        streak=streak,
        limit=limit,
        decided_unix=time.time(),
        network=network,
    )


def _seq(seq: float) -> str:
    return str(int(seq)) if float(seq).is_integer() else f"{seq:g}"


def _who(action: Action) -> str:
    culprits = action.culprits
    if not culprits:
        who = f"every rank is stuck inside collective #{_seq(action.seq)} (pg {action.pg})"
        return f"{who}: {action.network}" if action.network else who
    who = f"rank {format_ranks(culprits, ranges=True)}"
    nodes = sorted({n for n in action.nodes if n})
    if nodes:
        who += f" (node {', '.join(nodes)})"
    who += f" never entered collective #{_seq(action.seq)} (pg {action.pg})"
    if action.where:
        who += f", stuck at {action.where}"
    return who


def describe(action: Action) -> str:
    """Return the one line every rank prints before it exits (or the monitor, on declining)."""
    a = action
    head = f"run {a.run} on hang episode {a.episode}: {_who(a)}, "
    head += f"for {a.age_s:.0f} s (abort after {a.due_s:.0f} s)"
    streak, limit = a.streak, a.limit
    if a.decision == "decline":
        return (
            f"ddp-exporter: NOT aborting {head}: the run was aborted {streak - 1} times in a row "
            f"without progress (limit {limit}), so restarts do not help; dumps and verdict in "
            f"{a.folder}; the ranks wait for the collective timeout"
        )
    tail = "so that the launcher restarts the job from its last checkpoint"
    if a.decision == "give_up":
        tail = (
            f"and this is the last abort: {streak} in a row without progress (limit {limit}), "
            "do not requeue; the hang action stops here"
        )
    return (
        f"ddp-exporter: aborting {head}; dumps and verdict in {a.folder}; every rank "
        f"exits with code {a.exit_code} {tail}"
    )


def record(
    folder: str,
    episode: Episode,
    summaries: Mapping[int, Summary | None],
    action: Action,
    errors: ErrorCounter,
) -> None:
    """Add the action to the episode's ``episode.json`` and ``verdict.txt``."""
    episode = dataclasses.replace(episode, action=action)
    try:
        write_private(os.path.join(folder, "episode.json"), codec.episode_json(episode))
        text = verdicts.render(verdicts.verdict(episode, summaries))
        write_private(os.path.join(folder, "verdict.txt"), text)
    except OSError as exc:
        errors.record("forensics", exc)


def abort_communicators(timeout_s: float = ABORT_COMMS_S) -> None:
    """Abort this process's NCCL communicators within ``timeout_s``; nothing without NCCL.

    An aborted communicator releases the GPU work blocked on it at once. Gloo needs nothing:
    its sockets close with the process. Uses a private torch API where it exists
    (``_abort_process_group``, torch 2.5+), else the default group's ``abort()``.
    """
    try:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return
        if "nccl" not in str(dist.get_backend()).lower():
            return
        abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
        if abort is None:
            abort = getattr(dist.distributed_c10d._get_default_group(), "abort", None)
        if abort is None:
            return
    except Exception:  # noqa: BLE001 - the process exits next, whatever happens here
        return
    thread = threading.Thread(target=abort, name="ddp-exporter-abort", daemon=True)
    thread.start()
    thread.join(timeout_s)


def _quiet_training_thread() -> None:
    """Keep the training thread from reacting to the peers' exits in the last milliseconds.

    A peer's exit fails the collective this rank's training thread waits in. From here on this
    thread keeps the GIL once it holds it (the training thread would wait ``GIL_HOLD_S`` before
    taking it back), and what the process prints after its one line goes nowhere, so that a
    collective error raised in those milliseconds neither reaches user code nor the log.
    """
    sys.setswitchinterval(GIL_HOLD_S)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, stream.fileno())
            os.close(null)
        except Exception:  # noqa: BLE001, S110 - no real file behind the stream: nothing to hide
            pass


def exit_now(code: int) -> NoReturn:
    """End the process with ``code`` at once, from any thread, after flushing what it printed."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001, S110 - a closed stream must not keep the rank alive
            pass
    os._exit(code)


class Leaving:
    """Take one rank out of a run whose hang action was decided, together with the others.

    ``exit`` and ``quiet`` are the process-wide steps (``os._exit``, silencing the training
    thread); tests pass harmless ones. ``keep`` writes what this rank keeps of the action on its
    disk (the ledger and the launcher's line), handed the action as :meth:`leave` was;
    ``forget`` clears the attempt from a store that outlives it (monitoring rank, once every
    rank is leaving).
    """

    def __init__(
        self,
        store: Store,
        keys: Keys,
        rank: int,
        *,
        monitor: bool,
        policy: ActionPolicy,
        interval_s: float,
        publish: Callable[[], None],
        errors: ErrorCounter,
        exit: Callable[[int], Any] = exit_now,
        quiet: Callable[[], None] = _quiet_training_thread,
        keep: Callable[[Action], None] = lambda action: None,
        forget: Callable[[], None] = lambda: None,
    ) -> None:
        self._store = store
        self._keys = keys
        self._rank = rank
        self._monitor = monitor
        self._policy = policy
        self._publish = publish
        self._errors = errors
        self._exit = exit
        self._quiet = quiet
        self._keep: Callable[[Action], None] = keep
        self._forget = forget
        # Ranks see the action up to a watch apart, then each publishes for up to publish_s.
        self.deadline_s = policy.publish_s + interval_s + 2.0

    def leave(self, action: Action, answered: list[int] | None = None) -> None:
        """Print the line, publish, leave with the others and exit (``answered``: monitor only)."""
        code = self._policy.exit_code
        try:
            code = action.exit_code
            log.warning("%s", describe(action))
            steps: tuple[Callable[[], None], ...] = (lambda: self._keep(action), self._publish)
            for step in steps:
                try:
                    step()
                except Exception as exc:  # noqa: BLE001
                    self._errors.record("forensics", exc)
            self._store.set(self._keys.leaving(self._rank), "1")
            self._quiet()
            if self._monitor:
                self._let_go(answered or [])
            else:
                # The monitoring rank may publish for up to a deadline before it waits one.
                wait = timedelta(seconds=2 * self.deadline_s + 2.0)
                self._store.wait([self._keys.leave()], wait)
        except Exception as exc:  # noqa: BLE001 - a dead store must not keep the rank alive
            self._errors.record("forensics", exc)
        finally:
            abort_communicators()
            self._exit(code)

    def _let_go(self, answered: list[int]) -> None:
        """Wait until every rank that answered is leaving (bounded), then let them all go."""
        others = [self._keys.leaving(r) for r in answered if r != self._rank]
        end = time.monotonic() + self.deadline_s
        while others and time.monotonic() < end:
            if self._store.check(others):
                break
            time.sleep(0.05)
        try:
            self._forget()
        except Exception as exc:  # noqa: BLE001 - the next attempt may fail; this one must end
            self._errors.record("forensics", exc)
            log.error("ddp-exporter: could not clear the aborted attempt from the store: %r", exc)
        self._store.set(self._keys.leave(), "1")
        # The store may live in this process, and a set gets no answer: this round trip on the
        # same connection returns once the store has handled the set and woken the waiters.
        self._store.check([self._keys.leave()])
