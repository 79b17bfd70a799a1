"""Do what the monitoring rank does for hang watching: decide, collect the dumps, judge, act.

The monitoring rank reads every report with one ``multi_get``, runs
:func:`exporter.hangs.definition.find_hangs` (the one definition of "hung", shared with ``top``
and the alert rules) and, for a ``behind`` or ``symmetric`` finding, publishes a dump request
and bumps the episode counter: one episode per hang, a new one only after progress resumed. It
collects the acks until every rank answered or a deadline passed, then logs the verdict
(:mod:`exporter.hangs.verdict`) and writes it next to its dump. A rank that never answers
(SIGSTOPped, dead, or a thread holding the GIL) is named as such. In a process group a declared
section held up, the wait counts from the section's end (:mod:`exporter.hangs.heldup`).

While every rank waits inside a collective with nobody behind, it probes the links between the
nodes (:mod:`exporter.hangs.probing`): a broken link or an unreachable node, found twice with
every rank answering, opens a ``symmetric`` episode at once instead of at the symmetric
threshold, and every symmetric episode's verdict says what the probe found. On NCCL it asks the
local RAS (:mod:`exporter.sources.ras`) as it opens an episode, and the verdict quotes what RAS
reports as wrong.

With ``on_hang="abort"`` it then decides, from the ranks' own reports, whether the hang has
lasted long enough to end the run (:mod:`exporter.hangs.action`), judged by the run's ledger
(:mod:`exporter.hangs.restarts`), which it reads at start and keeps, with the culprits' nodes.

What this rank does as any rank (its own dump, leaving) it is handed as callables by the
watcher (:mod:`exporter.hangs.watcher`) that owns both roles.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ..log import log
from ..network import judge as networks
from ..sources import ras
from . import action as actions
from . import codec
from . import restarts as ledger
from . import verdict as verdicts
from .action import ActionPolicy
from .channel import Channel, Site
from .definition import HangFinding, SeqState, find_hangs
from .dumps import episode_dir, makedirs_private, write_private
from .heldup import HeldUp
from .probing import Rounds, all_stuck
from .protocol import Action, DumpRequest, Episode, LedgerEntry, Located, Summary
from .responder import FAULTHANDLER_S
from .restarts import RestartPolicy, RestartState

__all__ = ["Acting", "Monitor"]


@dataclass
class _Collecting:
    """An open episode whose acks are still coming in."""

    request: DumpRequest
    #: Monotonic time after which the episode completes without the missing acks.
    deadline: float
    acks: dict[int, Summary] = field(default_factory=dict)
    #: NCCL's RAS, asked as the episode opened (None: not asked).
    asking: ras.Asking | None = None


@dataclass(frozen=True)
class Acting:
    """A completed episode the hang action may still act on."""

    episode: Episode
    summaries: Mapping[int, Summary | None]
    folder: str
    places: tuple[Located, ...]
    #: The evidence is complete (:func:`exporter.hangs.action.certain`).
    sure: bool


@dataclass
class _Reading:
    """What one read of every report says, per process group."""

    states: list[SeqState] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    #: Last sequence number enqueued, per (rank, process group).
    last: dict[tuple[int, str], float] = field(default_factory=dict)
    #: The longest in-flight age a rank itself reported (never extrapolated).
    reported: dict[str, float] = field(default_factory=dict)
    #: Steps each rank completed in this attempt.
    steps: dict[str, dict[int, int]] = field(default_factory=dict)
    timeouts: dict[str, float] = field(default_factory=dict)
    #: Ranks whose report changed within two intervals: they answer.
    fresh: set[int] = field(default_factory=set)
    #: Process groups where a rank's in-flight report predates a completion seen less than two
    #: intervals ago: its next report may still show it inside, so nobody is behind there yet.
    pending: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class _Done:
    """The highest collective some rank of a process group completed, as first seen."""

    seq: float
    #: Monotonic time of the read that first saw it.
    since: float
    #: How many times each rank's report had changed by that read.
    changes: tuple[int, ...]


@dataclass(frozen=True)
class _Seen:
    """One rank's report as the monitoring rank last read it."""

    value: bytes
    #: Monotonic time of the read that first saw this value.
    at: float
    #: How many times the report changed since the first read (a read can miss one change).
    changes: int = 0


class Monitor:
    """Decide hangs, collect every rank's dump, write the verdict and act: the monitor's part."""

    def __init__(
        self,
        site: Site,
        channel: Channel,
        *,
        action: ActionPolicy | None,
        restart: RestartPolicy | None,
        start_step: int | None,
        answer: Callable[[], None],
        leave: Callable[[Action, list[int]], None],
        keep: Callable[[Action], None],
        rounds: Rounds | None = None,
        ras_address: tuple[str, int] | None = None,
    ) -> None:
        self._site = site
        self._rounds = rounds
        self._ras_address = ras_address
        self._channel = channel
        self._action = action
        self._answer = answer
        self._leave = leave
        self._keep = keep
        self._all_keys_exist = False
        self._seen: list[_Seen] | None = None
        self._collecting: _Collecting | None = None
        self._blocked_pg: str | None = None
        #: The groups a declared section held up lately (their wait counts from its end).
        self._held = HeldUp()
        #: Per process group, the highest collective any rank completed, when it was seen and
        #: how often each rank's report had changed by then.
        self._done: dict[str, _Done] = {}
        #: Node of each rank, from its acks (culprits are named by node).
        self._nodes: dict[int, str] = {}
        #: The completed episode the action may still act on (action on).
        self.acting: Acting | None = None
        #: ``(finding, node, peer_node)`` of the open episode's probe (``ddp_hang_network_info``).
        self.network: tuple[tuple[str, str, str], ...] = ()
        #: The run's restart ledger as this rank publishes it (action on), else None.
        self.restarts: RestartState | None = None
        if action is not None:
            self.restarts = RestartState(restart or RestartPolicy(), self._chain(), start_step)

    def _chain(self) -> list[LedgerEntry]:
        """Return the ledger's entries leading up to this attempt."""
        site = self._site
        try:
            return ledger.load_entries(site.dump_dir, site.run, site.attempt)
        except (OSError, ValueError) as exc:
            site.errors.record("forensics", exc)
            return []

    # -- every watch ---------------------------------------------------------------------------
    def watch(self) -> None:
        """Read every report; open, collect, complete and act on episodes."""
        if not self._all_keys_exist:
            if not self._channel.all_published():
                return
            self._all_keys_exist = True
        raw = self._channel.raw_reports()
        now = time.monotonic()
        if self._seen is None:
            self._seen = [_Seen(v, now) for v in raw]
        else:
            self._seen = [
                old if v == old.value else _Seen(v, now, old.changes + 1)
                for v, old in zip(raw, self._seen)
            ]
        reading = self._read(self._seen, now)
        lats = sorted(reading.latencies)
        normal = lats[len(lats) // 2] if lats else None
        self._rearm(reading.steps)
        policy = self._site.policy
        findings = find_hangs(reading.states, normal, policy)
        self._held.note(reading.states, findings, now)
        states = self._held.ages_from_end(reading.states, now)
        if states is not reading.states:  # ages of held-up groups changed: judge them again
            findings = find_hangs(states, normal, policy)
        stuck = all_stuck(states, findings, policy.stall_seconds(normal), reading.fresh)
        early = self._probe(stuck, findings)
        if self._collecting is not None:
            self._collect(self._collecting, reading.last)
        if self._blocked_pg is not None and not any(f.pg == self._blocked_pg for f in findings):
            self._blocked_pg = None  # progress resumed: the next hang is a new episode
            self.network = ()
        if self.acting is not None:
            pg = self.acting.episode.request.pg
            finding = next((f for f in findings if f.pg == pg), None)
            self._maybe_act(
                finding,
                self._held.age(pg, reading.reported.get(pg, 0.0), now),
                reading.steps.get(pg, {}),
                reading.timeouts.get(pg),
            )
        if self._collecting is None and self._blocked_pg is None:
            act = [
                f
                for f in findings
                if f.kind in ("behind", "symmetric") and f.pg not in reading.pending
            ]
            if act:
                act.sort(key=lambda f: f.kind != "behind")
                self._open(act[0])
                self._answer()  # the monitoring rank dumps at once
            elif early is not None:
                self._open(early, "decided by the probe")
                self._answer()

    def _probe(
        self, stuck: tuple[str, float] | None, findings: list[HangFinding]
    ) -> HangFinding | None:
        """Start a probe round for a collective every rank is stuck in; judge the open round.

        Return a ``symmetric`` finding to open an episode for now: the round found a broken
        link or node twice, every rank answered, and the same collective is still stuck.
        """
        rounds = self._rounds
        if rounds is None:
            return None
        if stuck is not None and self._collecting is None and self._blocked_pg is None:
            rounds.begin(*stuck)
        found = rounds.poll()
        if found is None or not found.faulty or found.silent or stuck != (found.pg, found.seq):
            return None
        f = next((f for f in findings if f.pg == found.pg), None)
        if f is None:
            return None
        return HangFinding(f.pg, "symmetric", f.seq, (), f.waiting, f.age, f.threshold)

    def _read(self, seen: list[_Seen], now: float) -> _Reading:
        """Read every report: sequence states for the definition, evidence for the action."""
        out = _Reading()
        reports = [(codec.decode_report(s.value), s.at) for s in seen]
        # A collective some rank has completed is over for every rank, as far as reports that
        # predate the completion can tell (reports are read up to an interval apart; the ranks
        # a checkpoint held up for 30 s must not look stuck just after it ends). That includes
        # the first report published after the completion was seen: a rank takes its reading
        # before it publishes, and on a busy host the completion can fall in between. A rank
        # whose second report since still shows it inside is stuck in it (a ring all-reduce
        # ends on one rank and not on the ranks behind a broken link), not behind. Nor is a rank
        # behind on the strength of a stale report until it had two intervals to report again
        # (a monitor that starts on a stuck job sees every completion at its first read).
        done: dict[str, float] = {}
        for rep, _ in reports:
            for p in rep.pgs:
                if p.last_completed is not None:
                    done[p.pg] = max(done.get(p.pg, -1.0), float(p.last_completed))
        changes = tuple(s.changes for s in seen)
        for pg, seq in done.items():
            known = self._done.get(pg)
            if known is None or known.seq != seq:
                self._done[pg] = _Done(seq, now, changes)
        interval = self._site.interval_s
        for rank, (rep, seen_at) in enumerate(reports):
            if rep.finished:
                continue  # ended cleanly: gone, neither behind nor waiting
            if now - seen_at <= 2 * interval:
                out.fresh.add(rank)
            if rep.latency_s:
                out.latencies.append(float(rep.latency_s))
            # A live rank's report is up to an interval old: age it by the time since it
            # changed, but by one interval at most. A rank silent for longer (frozen, dead, a
            # thread holding the GIL) is not known to sit in that collective still; aging it
            # on would call a frozen rank that never entered the next collective "waiting".
            lag = min(now - seen_at, interval)
            for p in rep.pgs:
                pg, age, tmo = p.pg, p.inflight_age_s, p.timeout_s
                known = self._done.get(pg)
                if (
                    age
                    and known is not None
                    and float(p.last_enqueued) <= known.seq
                    and seen[rank].changes < known.changes[rank] + 2
                ):
                    age = 0.0  # stale: maybe taken before that collective's end was seen
                    if now - max(known.since, seen_at) <= 2 * interval:
                        out.pending.add(pg)
                out.reported[pg] = max(out.reported.get(pg, 0.0), float(age or 0.0))
                out.steps.setdefault(pg, {})[rank] = rep.steps
                if tmo:
                    out.timeouts[pg] = min(out.timeouts.get(pg, float(tmo)), float(tmo))
                age = float(age) + lag if age else 0.0
                out.states.append(
                    SeqState(rank, pg, float(p.last_enqueued), age, tmo, rep.in_section)
                )
                out.last[(rank, pg)] = p.last_enqueued
        return out

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
                self._site.run,
                state.limit,
            )

    # -- episodes ------------------------------------------------------------------------------
    def _open(self, finding: HangFinding, why: str = "") -> None:
        """Ask every rank for a dump: a new episode (``why``: what decided it, besides age)."""
        site = self._site
        number = self._channel.episode() + 1
        request = DumpRequest(
            number,
            finding.pg,
            finding.kind,
            finding.seq,
            tuple(finding.behind),
            tuple(finding.waiting),
            finding.age,
            finding.threshold,
            time.time(),
        )
        self._channel.open_episode(request)
        self._blocked_pg = finding.pg
        deadline = time.monotonic() + 3 * site.interval_s + FAULTHANDLER_S + 2.0
        asking = ras.Asking(self._ras_address) if self._ras_address is not None else None
        self._collecting = _Collecting(request, deadline, asking=asking)
        if finding.kind == "symmetric" and self._rounds is not None:
            self._rounds.begin(finding.pg, finding.seq)  # the verdict says what it finds
        log.warning(
            "ddp-exporter: hang detected in run %s (pg %s, %s, seq %g, oldest in flight %.1fs "
            "> %.1fs%s); asking every rank for a dump (episode %d)",
            site.run,
            finding.pg,
            finding.kind,
            finding.seq,
            finding.age,
            finding.threshold,
            f", {why}" if why else "",
            number,
        )

    def _collect(self, ep: _Collecting, last: Mapping[tuple[int, str], float]) -> None:
        """Gather acks; once all are in or the deadline passed, write and log the verdict."""
        site, world = self._site, self._site.world_size
        number, acks = ep.request.episode, ep.acks
        missing = [r for r in range(world) if r not in acks]
        if missing:
            for rank, ack in zip(missing, self._channel.acks(missing)):
                if ack.node:
                    self._nodes[rank] = ack.node
                if ack.episode == number:
                    acks[rank] = ack.summary or Summary(rank)
        if len(acks) < world and time.monotonic() < ep.deadline:
            return
        rounds, req = self._rounds, ep.request
        if rounds is not None and rounds.pending(req.pg, req.seq):
            return  # the probe's own deadline bounds this wait
        if ep.asking is not None and not ep.asking.done():
            return  # so does the RAS query's
        network = rounds.result(req.pg, req.seq) if rounds is not None else None
        self._collecting = None
        summaries: dict[int, Summary | None] = {r: acks.get(r) for r in range(world)}
        episode = Episode(
            ep.request,
            run=site.run,
            world_size=world,
            answered=tuple(sorted(acks)),
            missing=tuple(r for r in range(world) if r not in acks),
            # The nodes of the ranks a verdict may name (behind, or silent: a partitioned
            # node), from their acks; as many as those ranks, not the job.
            nodes={
                r: self._nodes[r]
                for r in range(world)
                if (r not in acks or r in ep.request.behind) and r in self._nodes
            },
            last_enqueued={r: v for (r, pg), v in last.items() if pg == ep.request.pg},
            complete_unix=time.time(),
            summaries=summaries,
            network=network,
            ras=ep.asking.lines() if ep.asking is not None else (),
        )
        self.network = tuple(networks.series(network))
        found = verdicts.verdict(episode, summaries)
        text = verdicts.render(found)
        folder = episode_dir(site.dump_dir, site.run, number, site.attempt)
        if self._action is not None and episode.request.kind in actions.ACTIONABLE:
            self.acting = Acting(
                episode, summaries, folder, tuple(found.places), actions.certain(episode, found)
            )
        try:
            makedirs_private(folder)
            write_private(os.path.join(folder, "episode.json"), codec.episode_json(episode))
            write_private(os.path.join(folder, "verdict.txt"), text)
        except OSError as exc:
            site.errors.record("forensics", exc)
        log.warning(
            "%s",
            "\n".join(f"{verdicts.MARKER} {line}" for line in text.rstrip("\n").splitlines()),
        )

    # -- the hang action -------------------------------------------------------------------------
    def _maybe_act(
        self, finding: HangFinding | None, age: float, steps: dict[int, int], timeout: float | None
    ) -> None:
        """Act on the completed episode once the action is due; forget it once it progressed."""
        acting, policy = self.acting, self._action
        if acting is None or policy is None:
            return
        episode = acting.episode
        if finding is None or finding.seq != episode.request.seq:
            self.acting = None  # the collective completed: no action for this episode
            return
        sure = acting.sure
        network = episode.network
        evidence = network is not None and network.faulty
        if not actions.due(
            policy,
            episode.request,
            finding,
            reported_age=age,
            steps=steps,
            timeout=timeout,
            sure=sure,
            evidence=evidence,
        ):
            return
        self.acting = None
        site = self._site
        state = self.restarts or RestartState(RestartPolicy(), [])
        done = min(steps.values())
        judged = ledger.judge(state.chain, state.policy, start_step=state.start_step, steps=done)
        culprits = list(episode.request.behind)
        nodes = self._nodes_of(culprits) if culprits else networks.blamed_nodes(network)
        exit_code = (
            policy.exit_code
            if judged.decision == "abort"
            else state.policy.give_up_exit_code
            if judged.decision == "give_up"
            else None
        )
        action = actions.decide(
            policy,
            dataclasses.replace(episode, attempt=site.attempt),
            acting.places,
            acting.folder,
            age,
            timeout,
            sure=sure,
            nodes=nodes,
            decision=judged.decision,
            exit_code=exit_code,
            streak=judged.streak,
            limit=state.policy.limit,
            network=networks.reason(network),
        )
        entry = ledger.entry(
            run=site.run,
            attempt=site.attempt,
            judgement=judged,
            culprits=culprits,
            nodes=nodes,
            steps=done,
            start_step=state.start_step,
            episode=episode.request.episode,
            folder=acting.folder,
            exit_code=exit_code,
        )
        action = dataclasses.replace(action, ledger=(*state.chain, entry))
        state.add(entry)
        actions.record(acting.folder, episode, acting.summaries, action, site.errors)
        if judged.decision == "decline":
            log.warning("%s", actions.describe(action))
            try:
                self._keep(action)
            except (OSError, ValueError) as exc:
                site.errors.record("forensics", exc)
            return
        self._channel.put_action(action)
        self._leave(action, list(episode.answered))

    def _nodes_of(self, ranks: list[int]) -> list[str]:
        """Return the node of each of ``ranks`` (``""`` when it never said), from their acks."""
        unknown = [r for r in ranks if r not in self._nodes]
        if unknown:
            try:
                for r, ack in zip(unknown, self._channel.acks(unknown)):
                    if ack.node:
                        self._nodes[r] = ack.node
            except Exception as exc:  # noqa: BLE001 - nodes are a courtesy; the abort is not
                self._site.errors.record("forensics", exc)
        return [self._nodes.get(r, "") for r in ranks]
