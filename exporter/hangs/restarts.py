"""Remember a run's hang aborts across its attempts, and stop acting when restarts do not help.

A restart only helps when the next attempt gets further. A culprit that stays broken (a node
whose file system hangs, a data shard that never arrives, a bug at one step) hangs every attempt
at the same place, and an action that aborts forever pays the detection and the restart each
time while nobody is told. So each run keeps a **ledger**: one entry per attempt whose hang
reached the action, in ``<dump_dir>/<run>-restarts.json`` (user-only), written by the ranks that
leave and read by the monitoring rank of the next attempt.

**Progress.** An attempt's *furthest step* is the step it resumed at plus the steps every rank of
the stalled group completed in it. ``instrument(start_step=...)`` says where it resumed (the
Lightning and Hugging Face callbacks pass it); when it is not given, the attempt is taken to have
resumed where the run had got furthest, so progress then means training ``progress_steps`` in
this attempt. An attempt made progress when its furthest step passes the furthest of the run's
earlier attempts by ``progress_steps`` (``DDP_EXPORTER_ABORT_PROGRESS_STEPS``, 50). The run's
first abort counts as progress: there is nothing to compare it with.

**Streak.** Aborts in a row without progress, the first of them included: 1 after an abort with
progress, one more after each without. The abort that brings the streak to ``limit``
(``DDP_EXPORTER_ABORT_LIMIT``, 3) is the last (``give_up``): every rank exits with
``DDP_EXPORTER_GIVE_UP_EXIT_CODE`` (69) instead of the abort code, which tells a requeue script
"do not requeue". Past it (a launcher that restarts anyway) the action *declines*: the hang is
dumped and alerted as with the action off, the entry is still written so that the streak
carries on, and an attempt that makes progress again re-arms the action (its streak drops to 0
as soon as its steps pass the mark). ``limit`` 0 never stops.

**Chain.** An attempt continues the ledger only when its last entry is the previous attempt
(torchrun's restart count, else Slurm's requeue count; ``Identity.attempt``). A new job reusing
the run name (attempt 0), or an attempt that ended for another reason in between, starts afresh:
a stale ledger can make the action act, never stop it.

**For the launcher.** ``<dump_dir>/<run>-abort.txt`` holds one line about the run's latest
abort, for a requeue script, e.g. ``requeue=yes exit_code=75 attempt=1 aborts_without_progress=2
limit=3 culprit_ranks=1 culprit_nodes=node-7 folder=ddp-exporter-dumps/job-attempt-1-hang-1``
(``requeue=no`` on the last abort; ``none`` for a list that is empty).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import settings
from . import codec
from .dumps import makedirs_private, replace_private, safe_run
from .protocol import LedgerEntry

__all__ = [
    "DECISIONS",
    "HISTORY_SERIES",
    "Judgement",
    "RestartPolicy",
    "RestartState",
    "abort_path",
    "entry",
    "judge",
    "launcher_line",
    "ledger_path",
    "load_entries",
    "record",
]

#: What the action does with a hang that is due: abort (restart), give up (last abort), decline.
DECISIONS: tuple[str, ...] = ("abort", "give_up", "decline")
#: Most aborted attempts the monitoring rank publishes (``ddp_hang_aborted_attempt_step``).
HISTORY_SERIES = 10
#: Most entries a ledger keeps.
_KEEP = 50


@dataclass(frozen=True)
class RestartPolicy:
    """When the hang action stops restarting a run, and how it says so."""

    #: Aborts in a row without progress after which the action stops (0: never).
    limit: int = settings.DEFAULT_ABORT_LIMIT
    #: Steps past the furthest step of the earlier attempts that count as progress.
    progress_steps: int = settings.DEFAULT_ABORT_PROGRESS_STEPS
    #: Exit code of the last abort ("do not requeue").
    give_up_exit_code: int = settings.DEFAULT_GIVE_UP_EXIT_CODE


@dataclass(frozen=True)
class Judgement:
    """What the ledger says of the attempt now due for the action."""

    #: The furthest step this attempt reached (in the run's steps when ``start_step`` is known).
    furthest: int
    #: It passed the earlier attempts' furthest step by the margin (or is the run's first abort).
    progress: bool
    #: Aborts in a row without progress, this one included.
    streak: int
    #: ``abort``, ``give_up`` (the last abort) or ``decline`` (the action has stopped).
    decision: str


def ledger_path(dump_dir: str, run: str) -> str:
    """Return the file holding ``run``'s ledger."""
    return os.path.join(dump_dir, f"{safe_run(run)}-restarts.json")


def abort_path(dump_dir: str, run: str) -> str:
    """Return the one-line file a requeue script reads about ``run``'s latest abort."""
    return os.path.join(dump_dir, f"{safe_run(run)}-abort.txt")


def load_entries(dump_dir: str, run: str, attempt: str) -> list[LedgerEntry]:
    """Return the ledger's entries that lead up to ``attempt`` (empty when they do not).

    Raises OSError or ValueError for a ledger that exists but cannot be read.
    """
    try:
        with open(ledger_path(dump_dir, run)) as f:
            entries = codec.ledger_from_json(f.read())
    except FileNotFoundError:
        return []
    if not attempt.isdigit() or not entries:
        return []
    chain: list[LedgerEntry] = []
    want = int(attempt) - 1
    for e in reversed(entries):
        if e.run != run or e.attempt != want:
            break
        chain.append(e)
        want -= 1
    return chain[::-1]


def judge(
    chain: Sequence[LedgerEntry],
    policy: RestartPolicy,
    *,
    start_step: int | None,
    steps: int,
) -> Judgement:
    """Judge an attempt due for the action: its progress, the streak, what to do."""
    entries = list(chain)
    best = max((e.furthest for e in entries), default=None)
    start = start_step if start_step is not None else (best or 0)
    furthest = start + steps
    if best is None:
        progress, streak = True, 1
    else:
        progress = furthest >= best + policy.progress_steps
        streak = 1 if progress else entries[-1].streak + 1
    if policy.limit <= 0 or streak < policy.limit:
        decision = "abort"
    elif streak == policy.limit:
        decision = "give_up"
    else:
        decision = "decline"
    return Judgement(furthest, progress, streak, decision)


def record(
    dump_dir: str,
    run: str,
    chain: Sequence[LedgerEntry],
    entry: LedgerEntry,
) -> None:
    """Write the ledger: ``chain`` then ``entry`` (a new chain replaces an old ledger whole)."""
    makedirs_private(os.path.join(dump_dir, "."))
    entries = [*chain, entry][-_KEEP:]
    replace_private(ledger_path(dump_dir, run), codec.ledger_json(entries))


def _items(values: Sequence[Any]) -> str:
    return ",".join(str(v) for v in values if v not in (None, "")) or "none"


def launcher_line(entry: LedgerEntry, limit: int) -> str:
    """Return the one line of ``<run>-abort.txt`` for ``entry`` (an abort or the last one)."""
    e = entry
    return (
        f"requeue={'no' if e.decision == 'give_up' else 'yes'} "
        f"exit_code={e.exit_code} attempt={e.attempt} "
        f"aborts_without_progress={e.streak} limit={limit} "
        f"culprit_ranks={_items(e.culprits)} culprit_nodes={_items(e.nodes)} "
        f"folder={e.folder}\n"
    )


class RestartState:
    """What the monitoring rank publishes of its run's ledger (``ddp_hang_abort*`` series).

    Built from the chain at start, updated when this attempt's hang is judged, and re-armed as
    soon as this attempt's steps pass the mark (progress). Read by the collector at scrape time.
    """

    def __init__(
        self,
        policy: RestartPolicy,
        chain: Sequence[LedgerEntry],
        start_step: int | None = None,
    ) -> None:
        self.policy = policy
        self.chain: list[LedgerEntry] = list(chain)
        self.start_step = start_step
        #: Aborts in a row without progress so far (the last entry's, or this attempt's).
        self.streak = self.chain[-1].streak if self.chain else 0
        self._lock = threading.Lock()

    @property
    def limit(self) -> int:
        """Return the aborts in a row without progress after which the action stops."""
        return self.policy.limit

    @property
    def suspended(self) -> bool:
        """Say whether the action has stopped (the limit was reached without progress since)."""
        return 0 < self.policy.limit <= self.streak

    def progressed(self, steps: int) -> bool:
        """Re-arm once this attempt has made progress (``steps`` done by every rank); say so."""
        if self.streak == 0 or not self.chain:
            return False
        if not judge(self.chain, self.policy, start_step=self.start_step, steps=steps).progress:
            return False
        with self._lock:
            self.streak = 0
        return True

    def add(self, entry: LedgerEntry) -> None:
        """Count this attempt's entry (just judged)."""
        with self._lock:
            self.chain = [*self.chain, entry]
            self.streak = entry.streak

    def attempts(self) -> list[tuple[str, str, str, int]]:
        """Return ``(attempt, culprit rank, its node, furthest step)`` of the latest entries."""
        with self._lock:
            chain = self.chain[-HISTORY_SERIES:]
        return [
            (
                str(e.attempt),
                str(e.culprits[0]) if e.culprits else "",
                str(e.nodes[0]) if e.nodes else "",
                e.furthest,
            )
            for e in chain
        ]


def entry(
    *,
    run: str,
    attempt: str,
    judgement: Judgement,
    culprits: Sequence[int],
    nodes: Sequence[str],
    steps: int,
    start_step: int | None,
    episode: int,
    folder: str,
    exit_code: int | None,
) -> LedgerEntry:
    """Return one ledger entry."""
    return LedgerEntry(
        run=run,
        attempt=int(attempt) if attempt.isdigit() else 0,
        episode=episode,
        decision=judgement.decision,
        exit_code=exit_code,
        progress=judgement.progress,
        streak=judgement.streak,
        furthest=judgement.furthest,
        steps=steps,
        start_step=start_step,
        culprits=tuple(culprits),
        nodes=tuple(nodes),
        folder=folder,
        decided_unix=time.time(),
    )
