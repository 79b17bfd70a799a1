"""Turn one hang episode's dumps into a verdict: who is stuck where, culprits first.

Used twice: the monitoring rank logs the verdict as soon as every rank answered (or the
deadline passed), from the short summaries the ranks sent through the store; and
``ddp-exporter hangs DIR`` (:mod:`exporter.tools.hangs`) prints it from the files of an episode
folder.

Order of the verdict: the culprits (ranks that never entered the collective the others wait
in, with the innermost frame of their training thread in user code; ranks that did not answer
the dump request), collective mismatches (ranks in different ops at the same sequence number),
the ranks waiting inside the collective, then every rank grouped by identical training-thread
stack, so thousands of ranks print as a few groups.
"""

from __future__ import annotations

import glob
import json
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..network import judge as networks
from ..ranklist import format_ranks
from . import codec, spans
from .capture import summary_of
from .codec.generic import load as load_json
from .dumps import EPISODE_GLOB
from .protocol import Action, Episode, Frame, Located, Network, RankDump, Summary

__all__ = ["MARKER", "Verdict", "find_episode", "load_episode", "render", "verdict"]

_T = TypeVar("_T")

#: Prefix of every verdict line in the monitoring rank's log (the demo shows these lines).
MARKER = "ddp-exporter hangs:"
#: More ranks than any job has: a file claiming a world past it is not one a rank wrote (a rank
#: per missing one would be listed, for as long as that takes).
MAX_WORLD_SIZE = 1 << 22


@dataclass
class Verdict:
    """The findings of one episode, in the order they are printed."""

    header: str
    culprits: list[str] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)
    groups: list[tuple[list[int], list[Frame]]] = field(default_factory=list)
    #: Where each culprit that answered is stuck (the action names the first).
    places: list[Located] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)
    #: What the run-time probe saw between the nodes while every rank waited.
    network: list[str] = field(default_factory=list)
    #: What NCCL's RAS reported as wrong (NCCL only, where it answered).
    ras: list[str] = field(default_factory=list)
    #: What the hang action did (``instrument(on_hang="abort")``), None when it did nothing.
    action: str | None = None

    @property
    def located(self) -> list[dict[str, Any]]:
        """Return :attr:`places` as JSON-ready dicts (rank, op, seq, pg, file, line, function)."""
        return [codec.located_to_dict(p) for p in self.places]


def _ranks(ranks: list[int]) -> str:
    return format_ranks(ranks, ranges=True)


def _at(frame: Frame | None) -> str:
    if not frame:
        return "an unknown place (no Python frame)"
    return f"{os.path.basename(frame.file)}:{frame.line} in {frame.function}"


def _action(action: Action | None) -> str | None:
    if not action:
        return None
    when = time.strftime("%H:%M:%S UTC", time.gmtime(float(action.decided_unix)))
    streak, limit = action.streak, action.limit
    if action.decision == "decline":
        return (
            f"none: at {when} the hang action declined (on_hang=abort): the run was aborted "
            f"{int(streak) - 1} times in a row without progress (limit {limit}); restarts do not "
            "help, the ranks wait for the collective timeout"
        )
    why = "for the launcher to restart the job from its last checkpoint"
    if action.decision == "give_up":
        why = f"the last abort: {streak} in a row without progress (limit {limit}), do not requeue"
    return (
        f"aborted: at {when} every rank of the run exited with code {action.exit_code} "
        f"(on_hang=abort), the hang having lasted {action.age_s} s (abort after "
        f"{action.due_s} s), {why}"
    )


#: Process group descriptions that say nothing more than the group's number.
_PLAIN_DESCS = frozenset({"default_pg", "undefined"})
#: What a rank that did not answer may be.
_SILENT = (
    "did not answer the dump request: frozen (SIGSTOP, debugger), dead, its node cut off "
    "from the store's (network, firewall), or a thread holds the GIL"
)


def verdict(episode: Episode, summaries: Mapping[int, Summary | None]) -> Verdict:
    """Build the verdict of ``episode`` (the monitoring rank's request) from rank summaries.

    ``summaries`` maps every rank to its summary, or None when it did not answer (read from
    the files: :func:`load_episode`).
    """
    ep = episode
    req = ep.request
    pg, seq, kind = str(req.pg), req.seq, req.kind
    answered = {r: s for r, s in summaries.items() if s is not None}
    missing = sorted(r for r, s in summaries.items() if s is None)
    # Read from one node's files without the monitoring rank's episode.json: a rank without a
    # file here may have answered on its own node, so it is not called silent.
    local_only = ep.local_only
    behind = sorted(req.behind)
    # Which op(s) sit at each (pg, seq) across ranks, from the Flight Recorder.
    at_seq: dict[tuple[str, int], dict[str, list[int]]] = {}
    for r, s in answered.items():
        for e in s.inflight:
            at_seq.setdefault((str(e.pg), int(e.seq)), {}).setdefault(e.op, []).append(r)
    # The collective the waiting ranks are stuck in: the oldest they have in flight (with two
    # DDP buckets in flight, the group's highest number is queued behind it).
    stalled = _stalled(answered, pg, seq, behind)
    ops_here = at_seq.get((pg, int(stalled))) or at_seq.get((pg, int(seq)), {})
    op = "/".join(sorted(ops_here)) if ops_here else "collective"
    # What the group is, where torch says (a DeviceMesh dimension: "mesh_shard").
    descs = {str(e.pg): str(e.pg_desc or "") for s in answered.values() for e in s.inflight}

    def group(p: str) -> str:
        desc = descs.get(p, "")
        return f"pg {p} {desc}" if desc and desc not in _PLAIN_DESCS else f"pg {p}"

    named = group(pg)
    queued = spans.queued(stalled - 1, seq)
    v = Verdict(
        header=(
            f"hang episode {req.episode} in run {ep.run}: "
            f"{'a rank is behind' if kind == 'behind' else 'symmetric hang'} in {named} at "
            f"{op} {spans.number(stalled)}{f' ({queued})' if queued else ''}, oldest in flight "
            f"{req.age:.1f}s (threshold {req.threshold:.1f}s); "
            + (
                f"{len(answered)}/{len(summaries)} ranks answered"
                if not local_only
                else f"dumps of {len(answered)}/{len(summaries)} ranks in this folder"
            )
        ),
        missing=missing,
        action=_action(ep.action),
    )
    nodes = dict(ep.nodes)

    def on(r: int) -> str:
        return f" (node {nodes[r]})" if r in nodes else ""

    for r in behind:
        got = answered.get(r)
        last = ep.last_enqueued.get(r)
        if last is None and got is not None and pg in got.seqs:
            last = got.seqs[pg].last_enqueued
        never = f"never entered {op} {spans.missed(last, seq)} ({named})"
        was = f" (last reported collective {spans.number(last)})" if last is not None else ""
        if got is None and local_only:
            v.culprits.append(
                f"rank {r} {never}{was}; its dump is not in this folder (another node's disk)"
            )
            continue
        if got is None:
            v.culprits.append(f"rank {r}{on(r)} {never}{was} and {_SILENT}")
            continue
        where = got.where or (got.frames[-1] if got.frames else None)
        v.culprits.append(
            f"rank {r}{on(r)} {never}; it is at {_at(where)} (step {got.step}, phase {got.phase})"
        )
        if where:
            v.places.append(Located(r, op, seq, pg, where.file, where.line, where.function))
    for r in missing:
        if r not in behind and not local_only:
            v.culprits.append(f"rank {r}{on(r)} {_SILENT}")
    crossed = _crossed(answered, group) if kind == "symmetric" and not behind else []
    if kind == "symmetric" and not v.culprits:
        inside = f"{op} {spans.stuck(stalled - 1, seq)} ({named})"
        _symmetric(v, ep.network, crossed, inside, _device(answered, pg, stalled))
    if ep.network is not None:
        v.network = networks.details(ep.network)
    v.ras = list(ep.ras)
    for (mpg, mseq), ops in sorted(at_seq.items()):
        if len(ops) > 1:
            parts = ", ".join(f"rank {_ranks(rs)} in {o}" for o, rs in sorted(ops.items()))
            v.mismatches.append(f"collective #{mseq} (pg {mpg}): {parts}")
    _waiting(
        v,
        answered,
        pg,
        f"{op} {spans.stuck(stalled - 1, seq)}",
        behind,
        set(req.waiting),
        group,
        bool(crossed),
    )
    v.groups = _groups(answered)
    return v


def _oldest_of(s: Summary, pg: str) -> tuple[float, float] | None:
    """Return ``(oldest in flight, last entered)`` of one rank in ``pg`` (None: nothing in
    flight there): its sequence numbers, else its Flight Recorder entries."""
    seqs = s.seqs.get(pg)
    if seqs is not None and seqs.last_enqueued > seqs.last_completed:
        return spans.oldest(seqs.last_completed, seqs.last_enqueued), float(seqs.last_enqueued)
    mine = sorted(float(e.seq) for e in s.inflight if str(e.pg) == pg)
    return (mine[0], mine[-1]) if mine else None


def _stalled(answered: Mapping[int, Summary], pg: str, seq: float, behind: list[int]) -> float:
    """Return the collective the waiting ranks are stuck in: the oldest any has in flight."""
    found = [
        got[0]
        for r, s in answered.items()
        if r not in behind
        for got in [_oldest_of(s, pg)]
        if got is not None and got[0] <= seq
    ]
    return min(found, default=float(seq))


def _inflight(s: Summary) -> list[tuple[str, str, float, float]]:
    """Return ``(pg, op, oldest, last entered)`` of every group a rank has collectives in
    flight in, by its sequence numbers or else its Flight Recorder entries, oldest first."""
    pgs = {str(e.pg) for e in s.inflight} | set(s.seqs)
    out = []
    for pg in pgs:
        got = _oldest_of(s, pg)
        if got is not None:
            ops = [e.op for e in s.inflight if str(e.pg) == pg and float(e.seq) == got[0]]
            out.append((pg, ops[0] if ops else "collective", got[0], got[1]))
    return sorted(out, key=lambda x: (x[2], x[0]))


def _crossed(answered: Mapping[int, Summary], group: Callable[[str], str]) -> list[str]:
    """Return ``rank R waits in OP #N (pg P)`` per group when the ranks wait in different
    process groups with nobody behind (else nothing): collectives entered in opposite orders."""
    where: dict[tuple[str, str], list[int]] = {}
    for r, s in sorted(answered.items()):
        found = _inflight(s)
        if found:
            pg, op, first, _ = found[0]
            where.setdefault((pg, f"{op} {spans.number(first)}"), []).append(r)
    if len({p for p, _ in where}) < 2:
        return []
    return [
        f"rank {_ranks(rs)} {'waits' if len(rs) == 1 else 'wait'} in {what} ({group(p)})"
        for (p, what), rs in sorted(where.items())
    ]


def _device(answered: Mapping[int, Summary], pg: str, stalled: float) -> list[int]:
    """Return the ranks whose stuck collective never started on the device while the others'
    did (the Flight Recorder's states, NCCL): their device, or its stream, is suspect."""
    states = {
        r: e.state
        for r, s in answered.items()
        for e in s.inflight
        if str(e.pg) == pg and float(e.seq) == stalled and e.state
    }
    if "started" not in states.values():
        return []
    return sorted(r for r, state in states.items() if state == "scheduled")


def _symmetric(
    v: Verdict, network: Network | None, crossed: list[str], inside: str, device: list[int]
) -> None:
    """Add what a hang with nobody behind is: a broken link or node, a deadlock across process
    groups, or every rank in one collective that the network can (or cannot) be blamed for."""
    if network is not None and network.faulty:
        v.culprits += [
            f"{line}; every rank is stuck in {inside}" for line in networks.lines(network)
        ]
        return
    if crossed:
        v.culprits.append(
            "no rank is behind: " + " and ".join(crossed) + ": the ranks entered the collectives "
            "of these process groups in different orders, each waiting in one the others have "
            "not entered (a deadlock in the training code)"
        )
    else:
        v.culprits.append(f"no rank is behind: every rank is stuck in {inside} and none completes")
    if network is None:
        v.culprits.append(
            "the network was not probed (network or NCCL trouble, or mismatched collectives below)"
        )
        return
    suspect = (
        f"suspect the device of rank {_ranks(device)}: its collective never started while the "
        "others' did"
        if device
        else "suspect a rank's device or the backend"
    )
    if crossed:
        suspect = "fix the order of the collectives"
    v.culprits.append(f"{'; '.join(networks.lines(network))}; {suspect}")


def _waiting(
    v: Verdict,
    answered: Mapping[int, Summary],
    pg: str,
    what_here: str,
    behind: list[int],
    triggered: set[int],
    group: Callable[[str], str],
    crossed: bool,
) -> None:
    """Add the ranks waiting in the stalled collective, and those held up elsewhere."""
    named = group(pg)
    waiting: dict[tuple[str, str], list[int]] = {}
    # The trigger's waiting ranks, plus every rank whose dump shows it inside the collective
    # (the trigger only lists those already past the threshold when it fired).
    inside = {r for r, s in answered.items() if _oldest_of(s, pg) is not None}
    for r in sorted(triggered | inside):
        found = answered.get(r)
        if found is None or r in behind:
            continue
        got = _oldest_of(found, pg)
        what = what_here
        if got is not None:
            first = [e.op for e in found.inflight if str(e.pg) == pg and float(e.seq) == got[0]]
            what = f"{first[0] if first else what_here.split(' #')[0]} "
            what += spans.stuck(got[0] - 1, got[1])
        waiting.setdefault((what, _at(found.where)), []).append(r)
    for (what, at), rs in waiting.items():
        verb = "waits" if len(rs) == 1 else "wait"
        v.waiting.append(f"rank {_ranks(rs)} {verb} in {what} ({named}), called at {at}")
    # Ranks held up in another group (a 2-D mesh: the replicate group waits for a rank that
    # waits here): not culprits, and worth a line so that nobody goes looking there.
    elsewhere: dict[tuple[str, str], list[int]] = {}
    for r, s in sorted(answered.items()):
        if r in behind or r in inside:
            continue
        for p, op, oldest, last in _inflight(s)[:1]:
            key = (f"{op} {spans.stuck(oldest - 1, last)}", group(p))
            elsewhere.setdefault(key, []).append(r)
    why = "which the others have not entered" if crossed else "held up by this hang"
    for (what, where_pg), rs in elsewhere.items():
        verb = "waits" if len(rs) == 1 else "wait"
        v.waiting.append(f"rank {_ranks(rs)} {verb} in {what} ({where_pg}), {why}")


def _groups(answered: Mapping[int, Summary]) -> list[tuple[list[int], list[Frame]]]:
    """Return the answering ranks grouped by identical training-thread stack, smallest first."""
    groups: dict[tuple[tuple[str, int | None, str], ...], list[int]] = {}
    frames_of: dict[tuple[tuple[str, int | None, str], ...], list[Frame]] = {}
    for r, s in sorted(answered.items()):
        key = tuple((f.file, f.line, f.function) for f in s.frames)
        groups.setdefault(key, []).append(r)
        frames_of[key] = list(s.frames)
    return sorted(((rs, frames_of[k]) for k, rs in groups.items()), key=lambda g: (len(g[0]), g[0]))


def render(v: Verdict, frames: int = 12) -> str:
    """Return the verdict as text: culprits, mismatches, waiting ranks, stack groups."""
    lines = [v.header]
    if v.action:
        lines.append(f"ACTION: {v.action}")
    lines.append("CULPRITS:")
    lines += [f"  {c}" for c in v.culprits] or ["  none named"]
    if v.network:
        lines.append("NETWORK (probed between the nodes while every rank waited):")
        lines += [f"  {n}" for n in v.network]
    if v.ras:
        lines.append("NCCL RAS (what NCCL's own monitor reported as wrong):")
        lines += [f"  {n}" for n in v.ras]
    if v.mismatches:
        lines.append("COLLECTIVE MISMATCH (ranks in different ops at the same sequence number):")
        lines += [f"  {m}" for m in v.mismatches]
    if v.waiting:
        lines.append("WAITING:")
        lines += [f"  {w}" for w in v.waiting]
    lines.append("STACKS (training thread, ranks grouped by identical stack, innermost last):")
    for ranks, fr in v.groups:
        n = len(ranks)
        lines.append(f"  rank {_ranks(ranks)} ({n} rank{'s' if n != 1 else ''}):")
        shown = fr[-frames:]
        if len(fr) > len(shown):
            lines.append(f"    ... {len(fr) - len(shown)} outer frames")
        lines += [f"    {f.file}:{f.line} in {f.function}" for f in shown]
    return "\n".join(lines) + "\n"


def find_episode(path: str) -> str:
    """Return the episode folder at ``path``: itself, or the newest episode under it."""
    if glob.glob(os.path.join(path, "rank-*.json")) or os.path.exists(
        os.path.join(path, "episode.json")
    ):
        return path
    found = [
        d
        for d in glob.glob(os.path.join(path, EPISODE_GLOB))
        if os.path.isdir(d)
        and (
            glob.glob(os.path.join(d, "rank-*.json"))
            or os.path.exists(os.path.join(d, "episode.json"))
        )
    ]
    if not found:
        raise FileNotFoundError(f"no hang episode (rank-*.json or episode.json) under {path}")
    return max(found, key=os.path.getmtime)


def load_episode(
    folder: str, skipped: list[str] | None = None
) -> tuple[Episode, dict[int, Summary | None]]:
    """Read an episode folder: the monitoring rank's episode.json and every rank's dump.

    A file that holds no episode or dump (cut short by a rank killed as it wrote, edited,
    unreadable) raises ValueError naming it and what is wrong; with ``skipped``, it is left out
    instead and that line appended there, so that the other files still give a verdict.
    """
    summaries: dict[int, Summary | None] = {}
    episode: Episode | None = None
    path = os.path.join(folder, "episode.json")
    if os.path.exists(path):
        episode = _read(path, "an episode", _episode, skipped)
        if episode is not None:
            summaries.update(episode.summaries or {})
    for p in sorted(glob.glob(os.path.join(folder, "rank-*.json"))):
        found = _read(p, "a rank's dump", _dump_summary, skipped)
        if found is None:
            continue
        dump, summary = found
        # The full dump beats the store's summary.
        summaries[dump.rank] = summary
        if episode is None:
            episode = Episode(
                dump.request, run=dump.run, world_size=dump.world_size, local_only=True
            )
    if episode is None:
        raise FileNotFoundError(f"{folder} holds no episode.json and no rank-*.json")
    world = int(episode.world_size or (max(summaries) + 1 if summaries else 0))
    for r in range(world):
        summaries.setdefault(r, None)
    return episode, summaries


def _episode(m: Mapping[str, Any]) -> Episode:
    episode = codec.episode_from_dict(m)
    _check_world(episode.world_size, episode.summaries or ())
    return episode


def _dump_summary(m: Mapping[str, Any]) -> tuple[RankDump, Summary]:
    dump = codec.dump_from_dict(m)
    _check_world(dump.world_size, (dump.rank,))
    return dump, summary_of(dump.rank, dump.state)


def _check_world(world_size: int | None, ranks: Iterable[int]) -> None:
    """Refuse a world size or ranks no job has (ValueError, which skips the file)."""
    if world_size is not None and not 0 <= world_size <= MAX_WORLD_SIZE:  # 0: not known
        raise ValueError(f"world_size {world_size} is not a job's (1 to {MAX_WORLD_SIZE})")
    for rank in ranks:
        if not 0 <= rank < (world_size or MAX_WORLD_SIZE):
            raise ValueError(f"rank {rank} is not one of the job's")


def _read(
    path: str, what: str, decode: Callable[[Mapping[str, Any]], _T], skipped: list[str] | None
) -> _T | None:
    """Return the file at ``path`` decoded; None where it is skipped (see :func:`load_episode`)."""
    try:
        with open(path, encoding="utf-8") as f:
            return decode(load_json(f.read()))
    except OSError as exc:
        why = exc.strerror or str(exc)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        why = f"not JSON ({exc})"
    except KeyError as exc:
        why = f"not {what}: no field {exc.args[0]!r}"
    # The codec's readers refuse a value of the wrong kind with any of these.
    except (ValueError, TypeError, AttributeError) as exc:
        why = f"not {what}: {exc}"
    if skipped is None:
        raise ValueError(f"{path}: {why}")
    skipped.append(f"{path}: {why}")
    return None
