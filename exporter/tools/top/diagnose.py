"""Judge a read of every rank: per-step figures, then DOWN, HUNG, straggler or a note.

The same definitions as the generated alerts: a straggler by compute or data time per step
(:class:`~exporter.mixin.config.MixinConfig` thresholds), a hang by
:mod:`exporter.hangs.definition`, a slow link by the store round trips of the ranks behind it.
Every accusation must hold in two consecutive reads, as an alert must hold for its ``for``; a
straggler's in two reads whose intervals do not overlap (from Prometheus, a rate window apart)
and, read from the ranks' endpoints, in every read over :data:`ENDPOINT_HOLD_S`.
"""

from __future__ import annotations

import statistics
import time

from ... import catalog as c
from ...hangs import spans
from ...hangs.definition import SeqState, find_hangs
from ...hangs.heldup import HeldUp, held_up
from ...mixin.config import DEFAULT, MixinConfig
from ...network.judge import series_text
from ...ranklist import format_ranks
from .rows import COUNTERS, RankRow

__all__ = ["ACCUSATIONS", "ENDPOINT_HOLD_S", "accuses", "diagnose", "holding"]

#: Seconds a straggler read from the ranks' endpoints must hold, read after read, before it is
#: named: reads a second apart can both fall inside one burst of contention on a busy host
#: (a loaded rehearsal had a healthy FSDP2 rank's compute double in two such reads).
ENDPOINT_HOLD_S = 5.0


def _increases(r: RankRow, p: RankRow | None) -> dict[str, float]:
    """Return the counters' increases since ``p`` (or over the source's window)."""
    if r.window is not None:
        return r.window
    now = {
        c.STEPS.name: r.steps,
        COUNTERS[1]: r.step_sum,
        COUNTERS[3]: r.coll_sum,
        COUNTERS[4]: r.coll_count,
    }
    for phase, v in r.phase_sum.items():
        now[f"{COUNTERS[2]}:{phase}"] = v
    if p is None or not p.up:
        return now
    before = _increases(p, None)
    return {k: v - before.get(k, 0.0) for k, v in now.items()}


def _normal_latency(rows: list[RankRow]) -> float | None:
    """Return the run's mean collective latency since the ranks started (None: none yet)."""
    total = sum(r.coll_sum for r in rows)
    count = sum(r.coll_count for r in rows)
    return total / count if count > 0 else None


def diagnose(
    rows: list[RankRow],
    previous: dict[str, RankRow] | None = None,
    *,
    baseline: dict[str, RankRow] | None = None,
    config: MixinConfig = DEFAULT,
    now: float | None = None,
    held: HeldUp | None = None,
) -> list[RankRow]:
    """Fill in per-step figures and each verdict; ``previous`` is the last read, by target.

    Per-step figures are the increases since ``baseline`` (an older read, by target: see
    :class:`~.history.ReadHistory`), since ``previous`` where it is not given.

    A suspicion becomes a verdict only when the previous read held the same suspicion; a
    straggler's only once the reads holding it cover two intervals that do not overlap (each
    read from Prometheus covers its rate window, ending at ``read_at``).
    Strongest first: DOWN, HUNG (behind in a stalled collective), straggler; a weaker
    signal never replaces a stronger one. ``STUCK`` (every rank inside a stalled collective,
    nobody behind) and "waiting" notes describe the job and accuse no rank; nor do a declared
    section within its deadline (on the rank or on the ranks it holds up) and a clean end
    (``finished``). ``held``, kept from read to read, remembers the groups a section held up:
    their wait counts from the section's end, as the hang watcher counts it.
    """
    previous = previous or {}
    since = previous if baseline is None else baseline
    now = time.time() if now is None else now
    for r in rows:
        _figures(r, previous.get(r.target), since.get(r.target))
    _ended_by_mark(rows)
    live = [r for r in rows if r.up and not r.finished]
    states = _hangs(live, config, now, held)
    _stragglers(live, config)
    _slow_link(live, config)
    top_seq: dict[str, float] = {}
    for s in states:
        top_seq[s.pg] = max(top_seq.get(s.pg, s.last_enqueued), s.last_enqueued)
    _ended_with_peers(rows, previous)
    for r in rows:
        _verdict(r, previous.get(r.target), top_seq)
    return rows


def _ended_with_peers(rows: list[RankRow], previous: dict[str, RankRow]) -> None:
    """Count a rank whose endpoint closed as its peers ended cleanly as ended with them.

    A rank waits for its readers' final read before it leaves, but a reader that comes late
    (a slow read of another rank first) finds it gone. Where no rank of the run still runs, at
    least one ended cleanly and this one was up in the previous read, it ended with them: a
    job that ended cleanly is not dead. A rank already down before its peers ended stays down.
    """
    ended = [r.finished for r in rows if r.finished]
    if not ended or any(r.up and not r.finished for r in rows):
        return
    for r in rows:
        p = previous.get(r.target)
        if not r.up and not r.finished and p is not None and p.up and not p.finished:
            r.finished, r.with_peers = max(ended), True


def _ended_by_mark(rows: list[RankRow]) -> None:
    """Count a rank whose endpoint is gone as ended where the monitoring rank read its end mark.

    A rank that ended cleanly leaves once its readers had their final read; a top started later
    finds its endpoint gone while its peers train on (the last one saving a checkpoint). In a
    run within ``peer_series`` ranks the monitoring rank publishes the heartbeat age of every
    peer that has not ended, so a peer it leaves out ended. A rank this top never read has no
    number: those are ended where every rank it has not read ended. A larger run, or no
    monitoring rank read, leaves the rows as they are.
    """
    monitor = next((r for r in rows if r.up and r.peers_ended >= 0 and r.world_size), None)
    if monitor is None or len(monitor.peer_ages) + monitor.peers_ended != monitor.world_size:
        return  # not every live rank is published (itself too): one left out may be alive
    ended = set(range(monitor.world_size)) - set(monitor.peer_ages)
    gone = [r for r in rows if not r.up and not r.finished]
    unread = set(range(monitor.world_size)) - {r.rank for r in rows if r.rank >= 0}
    nameless = [r for r in gone if r.rank < 0]
    if nameless and not (unread <= ended and len(nameless) <= len(unread)):
        nameless = []  # some rank this top has not read has not ended: which one is unknown
    unnamed = {id(r) for r in nameless}
    for r in gone:
        if r.rank in ended or id(r) in unnamed:
            r.finished, r.ended_mark = monitor.read_at or time.time(), True
            if r.rank < 0 and len(unread) == 1:
                r.rank = next(iter(unread))


def _figures(r: RankRow, p: RankRow | None, since: RankRow | None) -> None:
    """Carry over what a rank that went down no longer says (from ``p``, the last read); fill
    in its per-step figures (the increases since ``since``)."""
    if r.rank < 0 and p is not None:
        r.rank = p.rank  # a rank that went down keeps its number
    if not r.node and p is not None:
        r.node = p.node  # a rank that went down keeps its node
    if not r.finished and p is not None and p.finished:
        r.finished = p.finished  # its clean end was in its last read before it left
        r.with_peers, r.ended_mark = p.with_peers, p.ended_mark
    inc = _increases(r, since)
    steps = inc.get(c.STEPS.name, 0.0)
    if steps > 0:
        r.step_time = inc.get(COUNTERS[1], 0.0) / steps
        prefix = COUNTERS[2] + ":"
        r.phases = {k[len(prefix) :]: v / steps for k, v in inc.items() if k.startswith(prefix)}
    n = inc.get(COUNTERS[4], 0.0)
    if n > 0:
        r.coll_latency = inc.get(COUNTERS[3], 0.0) / n


def _hangs(
    live: list[RankRow], config: MixinConfig, now: float, held: HeldUp | None
) -> list[SeqState]:
    """Suspect the ranks behind a stalled collective, note who waits; return the states read.

    By the one definition shared with the alert rules and the hang watcher; the wait of a group
    a section held up counts from the section's end: the run's last one its ranks publish, as
    the rules count it (a first read too), and where ``held`` remembers a later one.
    """
    ended = max((r.section_ended for r in live), default=0.0)
    since_end = now - ended if ended else float("inf")
    states = [
        SeqState(
            r.rank,
            pg,
            seq,
            min(r.pg_age.get(pg, 0.0), max(0.0, since_end)),
            r.pg_timeout.get(pg),
            bool(r.in_section(now)),
        )
        for r in live
        for pg, seq in r.pg_seq.items()
    ]
    latency = _normal_latency(live)
    findings = find_hangs(states, latency, config.hang_policy)
    if held is not None:
        now_held = held.note(states, findings, now)
        judged = held.ages_from_end(states, now)
        if judged is not states:  # a section's end is recent: judge its groups' waits from it
            # A group a section holds up in this read keeps its ages: the table says what it
            # waits for (the watcher, which acts, counts it from the end all the same).
            judged = [s if s.pg in now_held else j for s, j in zip(states, judged)]
            states, findings = judged, find_hangs(judged, latency, config.hang_policy)
    by_rank = {r.rank: r for r in live}
    # What the monitoring rank's probe found between the nodes, during a hang nobody is behind.
    probed = series_text([found for r in live for found in r.network])
    # A group stalled with nobody behind while another has a rank behind is held up by that
    # hang (a 2-D mesh): its ranks wait, they are not a job-wide STUCK of their own.
    culprit_pgs = sorted({f.pg for f in findings if f.kind == "behind"})
    # So is one whose ranks wait, through others, for a rank's declared section.
    held_pgs = held_up(states, findings)
    sections = sorted({f.pg for f in findings if f.kind == "section"})
    for f in findings:
        for rank in f.behind:
            by_rank[rank].suspect = "behind"
            last = by_rank[rank].pg_seq.get(f.pg)
            by_rank[rank].note = (
                f"{f.seq - (last or 0.0):.0f} collectives behind in pg {f.pg}: never entered "
                f"{spans.missed(last, f.seq)}, which ranks {_ranks(f.waiting)} wait in for "
                f"{f.age:.0f} s"
            )
        for rank in f.excused:
            r = by_rank[rank]
            name = r.in_section(now)
            started, deadline = r.sections.get(name, (now, 0.0))
            r.note = f"in section {name} for {now - started:.0f} s of {deadline:.0f} s"
        for rank in f.waiting:
            r = by_rank[rank]
            if f.kind == "behind":
                r.note = f"waiting for rank(s) {_ranks(f.behind)} in pg {f.pg} for {f.age:.0f} s"
            elif f.kind == "section":
                if rank not in f.excused:
                    r.note = (
                        f"waiting for rank(s) {_ranks(f.excused)} in a declared section, pg "
                        f"{f.pg}, {f.age:.0f} s"
                    )
            elif f.kind in ("waiting", "symmetric") and culprit_pgs:
                r.note = r.note or (
                    f"waiting in pg {f.pg} for {f.age:.0f} s, held up by the hang in pg "
                    f"{', '.join(culprit_pgs)}"
                )
            elif f.kind in ("waiting", "symmetric") and f.pg in held_pgs:
                r.note = r.note or (
                    f"waiting in pg {f.pg} for {f.age:.0f} s, held up by a declared section "
                    f"in pg {', '.join(sections)}"
                )
            else:
                r.suspect = r.suspect or "stuck"
                done, entered = r.pg_done.get(f.pg), r.pg_seq.get(f.pg, f.seq)
                queued = spans.queued(done, entered)
                r.note = (
                    f"inside collective {spans.number(spans.oldest(done, entered))} of pg "
                    f"{f.pg}{f' ({queued})' if queued else ''} for {f.age:.0f} s, no rank behind"
                )
                if probed:
                    r.note += f"; probe: {probed}"
    return states


def _arrival(r: RankRow) -> float:
    """Return when a rank reaches its step's collectives: its compute and data time per step."""
    return r.phases.get("compute", 0.0) + r.phases.get("data", 0.0)


def _stragglers(live: list[RankRow], config: MixinConfig) -> None:
    """Suspect a rank by its compute or data time per step (never by collective latency).

    Not a rank that waits for a later one: where another rank's compute and data time
    together exceed its own by the straggler thresholds (ratio and minimum excess), it waits
    for that rank like its peers. A rank slow in compute while another waits far longer for
    its data is such a rank (on a busy host the monitoring rank's compute grows first: its
    background threads want the interpreter lock too). Where the ranks that wait spend their
    wait inside their compute (DDP's data straggler on gloo), every rank arrives together and
    none is left out.
    """
    straggler_ratio = config.straggler_ratio
    straggler_min_excess = config.straggler_min_excess_seconds
    latest = max((_arrival(r) for r in live if r.phases), default=0.0)
    for key in ("compute", "data"):
        values = [r.phases.get(key, 0.0) for r in live if r.phases]
        med, against = _baseline(values)
        for r in live:
            v = r.phases.get(key, 0.0)
            own = _arrival(r)
            if latest > straggler_ratio * own and latest - own > straggler_min_excess:
                continue  # it waits for a later rank, as its peers do
            if med > 0 and v > straggler_ratio * med and v - med > straggler_min_excess:
                if not r.suspect:
                    r.suspect = f"straggler:{key}"
                    r.note = f"{key} {v * 1e3:.0f} ms vs {against} {med * 1e3:.0f} ms"
                    if key == "compute":
                        r.note += _gpu_cause(r, live, config)


def _baseline(values: list[float]) -> tuple[float, str]:
    """Return what a rank's compute or data time is judged against, and its name: the run's
    median, in a run of two ranks the faster one's, as the rules judge it."""
    if len(values) == 2:
        return min(values), "the other rank's"
    return (statistics.median(values) if values else 0.0), "median"


def _gpu_cause(r: RankRow, live: list[RankRow], config: MixinConfig) -> str:
    """Return why the straggler's GPU is slow, as DDPGPUThrottledStraggler says it, or ""."""
    clocks = [x.gpu_clock for x in live if x.gpu_clock > 0]
    if r.gpu_clock <= 0 or not clocks:
        return ""
    med = statistics.median(clocks)
    # A reason on half of the run's GPUs or more slows every rank alike.
    lone = [
        reason
        for reason in r.gpu_slowdown
        if 2 * sum(reason in x.gpu_slowdown for x in live) < len(clocks)
    ]
    if lone:
        cause = ", ".join(lone)
    elif r.gpu_clock < config.gpu_clock_ratio * med:
        cause = "its clocks are down"
    else:
        return ""
    return (
        f"; GPU {r.gpu_index or '?'} throttled: {cause}, SM {r.gpu_clock / 1e9:.2f} GHz vs "
        f"peers' {med / 1e9:.2f} GHz"
    )


def _slow_link(live: list[RankRow], config: MixinConfig) -> None:
    """Suspect a rank behind a slow link: its store round trips stand out while it waits.

    A slow link slows every rank alike; the store round trips of the ranks behind it stand out
    (the same test as DDPRankStraggler cause=link, on this read's last heartbeat). When the
    slow link is the store's own node's, every other node's round trips are inflated and not
    its own (the store is local): with three nodes or more, its ranks are named. A job on one
    node names no link: its round trips cross no network.
    """
    trips = [r.store_rtt for r in live if r.store_rtt >= 0]
    med = statistics.median(trips) if trips else 0.0
    nodes = len({r.node for r in live if r.node})
    if nodes == 1 and all(r.node for r in live):
        return  # one node: no network between the ranks and the store, only CPU contention
    for r in live:
        total = sum(r.phases.values())
        waits = total > 0 and r.phases.get("comm_wait", 0.0) / total > config.link_comm_share
        rtt = r.store_rtt
        if not (med > 0 and waits and not r.suspect and rtt >= 0):
            continue
        if rtt > config.link_rtt_ratio * med and rtt > config.link_min_rtt_seconds:
            r.suspect = "straggler:link"
            r.note = (
                f"link: store round trip {rtt * 1e3:.0f} ms vs median {med * 1e3:.1f} ms: the "
                "network link of its node is slow"
            )
        elif nodes >= 3 and rtt * config.link_rtt_ratio < med and med > config.link_min_rtt_seconds:
            r.suspect = "straggler:link"
            r.note = (
                f"link: store round trip {rtt * 1e3:.1f} ms here, median {med * 1e3:.0f} ms from "
                "the other nodes: its node hosts the store and its network link is slow"
            )


def _verdict(r: RankRow, p: RankRow | None, top_seq: dict[str, float]) -> None:
    """Turn a suspicion the previous read held too into the row's verdict."""
    if r.finished:
        r.suspect = ""
        at = time.strftime("%H:%M:%S", time.localtime(r.finished))
        if r.ended_mark:
            r.note = f"ended cleanly by {at} (the monitoring rank read its end mark)"
        elif r.with_peers:
            r.note = f"ended with its peers at {at}"
        else:
            r.note = f"ended cleanly at {at}"
        r.verdict = f"finished: {r.note}"
        return
    if not r.up:
        r.suspect, r.note = "down", "endpoint unreachable"
    else:
        r.seq_lag = max((top_seq[pg] - seq for pg, seq in r.pg_seq.items()), default=0.0)
    confirmed = bool(r.suspect) and p is not None and p.suspect == r.suspect
    r.suspect_since = p.suspect_since if confirmed and p is not None else r.read_at
    if confirmed and p is not None and r.suspect.startswith("straggler"):
        # A pace holds over two intervals that do not overlap: from endpoints, consecutive
        # reads never do, but must span ENDPOINT_HOLD_S too; from Prometheus, reads a rate
        # window apart (a burst of jitter fills the window of every read it is in).
        if r.window is not None:
            begins = r.read_at - r.window_s
        else:
            begins = min(p.read_at, r.read_at - ENDPOINT_HOLD_S)
        confirmed = r.suspect_since <= begins
    if not confirmed:
        if r.suspect == "down":
            r.note = "unreachable in this read"
        return
    if r.suspect == "down":
        r.verdict = "DOWN: endpoint unreachable"
    elif r.suspect == "behind":
        r.verdict = f"HUNG: {r.note}"
    elif r.suspect == "stuck":
        r.verdict = f"STUCK: {r.note}"
    else:
        r.verdict = f"straggler: {r.note}"
    if r.node and accuses(r):
        r.verdict += f" (node {r.node})"


def _ranks(ranks: tuple[int, ...]) -> str:
    return format_ranks(ranks, most=8)


#: Verdict prefixes that blame a rank, strongest first (STUCK describes the whole job).
ACCUSATIONS = ("DOWN", "HUNG", "straggler")


def accuses(row: RankRow) -> bool:
    """Say whether the row's verdict blames this rank (DOWN, HUNG or straggler)."""
    return row.verdict.startswith(ACCUSATIONS)


def holding(rows: list[RankRow]) -> bool:
    """Say whether a rank is suspected a straggler but not yet for long enough to be named."""
    return any(r.suspect.startswith("straggler") and not r.verdict for r in rows)
