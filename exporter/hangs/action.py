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
   30 s) and twice the threshold that declared the hang (10 s or 20x the normal collective
   latency; a symmetric hang's own threshold is at least 60 s, so it acts at 120 s at the
   earliest), yet no later than half the process group's timeout;
3. every rank of the process group completed a step in this attempt.

**What never triggers it:** a rank inside a declared section within its deadline, and the ranks
waiting for it (the finding is of kind ``section``); a straggler, however slow, that still
progresses (the collective completes, its sequence number moves on: that episode is over); a
slow start or a rank still building its model (no step completed yet); a rank still
initialising (the init watch never acts); ranks stuck inside a collective with nobody behind,
before the symmetric threshold (``waiting``); a rank that ended cleanly.

**How the run ends.** The monitoring rank writes the action to the store and records it in the
episode's ``episode.json`` and ``verdict.txt``. Every rank that answered the episode (each one
checks while it has not progressed since) prints one line naming the culprit, its ``file:line``
and the dump folder, publishes ``ddp_hang_abort_timestamp_seconds`` and waits until its scrapers
read it (at most ``DDP_EXPORTER_FINAL_SCRAPE_S``), then says it is leaving. Once every rank that
answered is leaving, or a short deadline passed, the monitoring rank lets them all go at once:
the store may live in its process, so it goes last, and ranks that exit together leave no
survivor to unwind a broken collective into user code. Each rank aborts its NCCL communicators
(bounded; the GPU is free at once) and ends with ``os._exit(exit_code)`` from the watcher
thread, whatever its training thread is doing: blocked in a collective, sleeping, or running C
code that releases the GIL. Every rank of the run exits, not only those of the stalled group:
launchers restart whole jobs, and a rank left running would only wait for peers that are gone.

A rank whose Python threads cannot run (SIGSTOP, a debugger, C code that holds the GIL) cannot
exit by itself. Its peers do; the launcher then ends it (torchrun stops its worker group,
``srun --kill-on-bad-exit=1`` its step, Kubernetes the job's pods).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NoReturn

from .. import settings
from ..errors import ErrorCounter
from ..log import log
from ..ranklist import format_ranks
from ..storekeys import Keys
from . import verdict as verdicts
from .definition import HangFinding
from .dumps import write_private

__all__ = [
    "ACTIONABLE",
    "ActionPolicy",
    "Leaving",
    "abort_communicators",
    "describe",
    "due",
    "exit_now",
    "plan",
    "record",
]

#: Hang kinds the action may end a run for.
ACTIONABLE: tuple[str, ...] = ("behind", "symmetric")
#: Most seconds a rank spends aborting its NCCL communicators before it exits anyway.
ABORT_COMMS_S = 5.0
#: Thread switch interval while a rank leaves: the longest the training thread waits for the
#: GIL before it may take it from the leaving thread (which needs well under a millisecond).
GIL_HOLD_S = 0.5


@dataclass(frozen=True)
class ActionPolicy:
    """When the ``abort`` action acts, and how the ranks it ends exit."""

    #: Seconds a hang lasts before the action (``DDP_EXPORTER_ABORT_AFTER_S``) ...
    after_s: float = settings.DEFAULT_ABORT_AFTER_S
    #: ... and at least this multiple of the threshold that declared the hang ...
    threshold_factor: float = 2.0
    #: ... but no later than this share of the process group's timeout.
    timeout_share: float = 0.5
    #: Exit code of every rank the action ends (``DDP_EXPORTER_ABORT_EXIT_CODE``).
    exit_code: int = settings.DEFAULT_ABORT_EXIT_CODE
    #: Most seconds a rank takes to publish the action (its scrapers' final read).
    publish_s: float = settings.DEFAULT_FINAL_SCRAPE_S

    def due_s(self, threshold: float, timeout: float | None) -> float:
        """Return how long a hang declared at ``threshold`` seconds lasts before the action."""
        due = max(self.after_s, self.threshold_factor * threshold)
        if timeout is not None and timeout > 0:
            due = min(due, self.timeout_share * timeout)
        return due


def due(
    policy: ActionPolicy,
    request: Mapping[str, Any],
    finding: HangFinding | None,
    *,
    reported_age: float,
    steps: Mapping[int, int],
    timeout: float | None,
) -> bool:
    """Say whether the episode of ``request`` calls for the action now.

    ``finding`` is the current finding for the episode's process group (None: it progressed),
    ``reported_age`` the longest time a rank of the group said, in its own latest report, that
    it has been inside its oldest collective (never extrapolated: a report is evidence, its age
    is not), ``steps`` the steps each rank of the group completed in this attempt.
    """
    if finding is None or finding.kind not in ACTIONABLE:
        return False
    if finding.kind != request["kind"] or finding.seq != request["seq"]:
        return False
    if not steps or min(steps.values()) < 1:
        return False
    return reported_age >= policy.due_s(float(request["threshold"]), timeout)


def plan(
    policy: ActionPolicy,
    episode: Mapping[str, Any],
    located: list[dict],
    folder: str,
    age: float,
    timeout: float | None,
) -> dict:
    """Return the action the monitoring rank publishes for ``episode`` (JSON-ready)."""
    where = None
    if located:
        first = located[0]
        where = f"{os.path.basename(first['file'])}:{first['line']} in {first['function']}"
    return {
        "action": "abort",
        "episode": episode["episode"],
        "run": episode.get("run"),
        "pg": episode["pg"],
        "seq": episode["seq"],
        "kind": episode["kind"],
        "culprits": [int(r) for r in episode.get("behind", [])],
        "where": where,
        "folder": folder,
        "age_s": round(age, 1),
        "due_s": round(policy.due_s(float(episode["threshold"]), timeout), 1),
        "exit_code": policy.exit_code,
        "decided_unix": time.time(),
    }


def _seq(seq: float) -> str:
    return str(int(seq)) if float(seq).is_integer() else f"{seq:g}"


def describe(action: Mapping[str, Any]) -> str:
    """Return the one line every rank prints before it exits: culprit, place, dumps, code."""
    culprits = action.get("culprits") or []
    if culprits:
        who = f"rank {format_ranks(culprits, ranges=True)} never entered collective "
        who += f"#{_seq(action['seq'])} (pg {action['pg']})"
        if action.get("where"):
            who += f", stuck at {action['where']}"
    else:
        who = f"every rank is stuck inside collective #{_seq(action['seq'])} (pg {action['pg']})"
    return (
        f"ddp-exporter: aborting run {action.get('run')} on hang episode {action['episode']}: "
        f"{who}, for {action['age_s']:.0f} s (abort after {action['due_s']:.0f} s); dumps and "
        f"verdict in {action['folder']}; every rank exits with code {action['exit_code']} so "
        "that the launcher restarts the job from its last checkpoint"
    )


def record(
    folder: str,
    episode: dict,
    summaries: dict[int, dict | None],
    action: Mapping[str, Any],
    errors: ErrorCounter,
) -> None:
    """Add the action to the episode's ``episode.json`` and ``verdict.txt``."""
    episode = dict(episode, action=dict(action))
    try:
        write_private(os.path.join(folder, "episode.json"), json.dumps(episode, indent=1))
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
    thread); tests pass harmless ones.
    """

    def __init__(
        self,
        store: Any,
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
        # Ranks see the action up to a watch apart, then each publishes for up to publish_s.
        self.deadline_s = policy.publish_s + interval_s + 2.0

    def leave(self, action: Mapping[str, Any], answered: list[int] | None = None) -> None:
        """Print the line, publish, leave with the others and exit (``answered``: monitor only)."""
        try:
            log.warning("%s", describe(action))
            try:
                self._publish()
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
            self._exit(int(action.get("exit_code", self._policy.exit_code)))

    def _let_go(self, answered: list[int]) -> None:
        """Wait until every rank that answered is leaving (bounded), then let them all go."""
        others = [self._keys.leaving(r) for r in answered if r != self._rank]
        end = time.monotonic() + self.deadline_s
        while others and time.monotonic() < end:
            if self._store.check(others):
                break
            time.sleep(0.05)
        self._store.set(self._keys.leave(), "1")
        # The store may live in this process, and a set gets no answer: this round trip on the
        # same connection returns once the store has handled the set and woken the waiters.
        self._store.check([self._keys.leave()])
