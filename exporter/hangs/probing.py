"""Run the reach probe through the store: when, who tries whom, and the judgement of a round.

The monitoring rank starts a round (:class:`Rounds`) once every live rank has sat inside a
collective past the stall threshold with nobody behind (:func:`all_stuck`): a hang with nobody
behind is on its way, well before it is called symmetric. It reads every rank's start ack (its
node and probe address), plans one rank per node (:func:`exporter.network.judge.plan`) and
publishes a probe request, as it publishes a dump request: the request first, then the round
counter. Every rank that sits in a collective looks at that counter each quarter interval (a
rank that does not is no part of such a hang, and never asks); a rank the plan names tries its
peers on a thread of its own (:class:`Answering`) and sets its result. The monitoring rank
judges the round once every result is in, or at a deadline; a round that finds a fault is run a
second time, and only the faults found twice count. One probe per stuck collective.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..log import log
from ..network import judge as networks
from ..network.probe import CONNECT_S, MOVE_S, Listener, reach_all
from .channel import Channel, Site
from .definition import HangFinding, SeqState
from .protocol import Network, ProbeRequest, ProbeResult

__all__ = ["Answering", "Rounds", "all_stuck"]

#: Stuck collectives remembered (probed, and what was found).
KEEP = 32
#: Findings some rank is to blame for, or excused from: no probe then.
_ACCUSING = ("behind", "section")


def all_stuck(
    states: Iterable[SeqState],
    findings: Iterable[HangFinding],
    stall: float,
    fresh: set[int],
) -> tuple[str, float] | None:
    """Return the stuck collective ``(pg, seq)`` when every live rank sits inside a collective
    past ``stall`` with nobody behind or in a section, and every rank's report is ``fresh``
    (changed lately: it answers); else None.

    The collective is the first stalled group's (by name): in a deadlock across two groups
    every rank waits in one of them.
    """
    found = sorted(findings, key=lambda f: f.pg)
    if not found or any(f.kind in _ACCUSING for f in found):
        return None
    age: dict[int, float] = {}
    for s in states:
        if s.in_section:
            return None
        age[s.rank] = max(age.get(s.rank, 0.0), s.inflight_age)
    if not age or not set(age) <= fresh or min(age.values()) <= stall:
        return None
    return found[0].pg, found[0].seq


class Answering:
    """Every rank's part: keep a listener, and try the peers a round names it for."""

    def __init__(self, site: Site, channel: Channel, listener: Listener | None) -> None:
        self._site = site
        self._channel = channel
        self._listener = listener
        self._answered = 0
        self._busy = threading.Event()

    @property
    def address(self) -> str:
        """Return where this rank's listener accepts its peers (``""``: none)."""
        return self._listener.address if self._listener is not None else ""

    def start(self) -> None:
        """Set this rank's placeholder result (the monitoring rank reads every one at once)."""
        self._channel.put_probe_result(self._site.rank, ProbeResult(0, self._site.rank))
        self._answered = self._channel.probe_round()

    def close(self) -> None:
        """Stop listening."""
        if self._listener is not None:
            self._listener.close()

    def check(self) -> None:
        """Serve peers' attempts, and try this rank's peers once a new round names it."""
        if self._listener is not None:
            self._listener.serve()
        number = self._channel.probe_round()
        if number <= self._answered:
            return
        self._answered = number
        request = self._channel.probe_request()
        mine = request.plan.get(self._site.rank)
        if request.round != number or mine is None or self._busy.is_set():
            return
        targets = {peer: request.peers[peer] for peer in mine if peer in request.peers}
        self._busy.set()
        threading.Thread(
            target=self._try, args=(request.round, targets), name="ddp-exporter-probe", daemon=True
        ).start()

    def _try(self, number: int, targets: Mapping[int, str]) -> None:
        site = self._site
        try:
            result = ProbeResult(number, site.rank, reach_all(targets))
        except Exception as exc:  # noqa: BLE001 - the probe is a courtesy; training goes on
            site.errors.record("forensics", exc)
            result = ProbeResult(number, site.rank, error=repr(exc)[:200])
        try:
            self._channel.put_probe_result(site.rank, result)
        except Exception as exc:  # noqa: BLE001
            site.errors.record("forensics", exc)
        finally:
            self._busy.clear()


@dataclass
class _Round:
    """A round whose results are still coming in."""

    request: ProbeRequest
    deadline: float
    nodes: dict[int, str]
    #: The first round's finding, when this round confirms it.
    first: Network | None = None


class Rounds:
    """The monitoring rank's part: start a round for a stuck collective, judge it once."""

    def __init__(self, site: Site, channel: Channel, *, enabled: bool) -> None:
        self._site = site
        self._channel = channel
        self._enabled = enabled
        self._open: _Round | None = None
        self._tried: dict[tuple[str, float], None] = {}
        self._done: dict[tuple[str, float], Network] = {}

    @property
    def busy(self) -> bool:
        """Say whether a round is waiting for results."""
        return self._open is not None

    def result(self, pg: str, seq: float) -> Network | None:
        """Return what the probe found for the collective ``(pg, seq)`` (None: not probed)."""
        return self._done.get((pg, float(seq)))

    def pending(self, pg: str, seq: float) -> bool:
        """Say whether a round for ``(pg, seq)`` is still running."""
        r = self._open
        return r is not None and (r.request.pg, float(r.request.seq)) == (pg, float(seq))

    def begin(self, pg: str, seq: float) -> None:
        """Probe the collective ``(pg, seq)``, once; nothing while another round runs."""
        key = (pg, float(seq))
        if not self._enabled or key in self._tried or self._open is not None:
            return
        self._tried[key] = None
        while len(self._tried) > KEEP:
            self._tried.pop(next(iter(self._tried)))
        world = self._site.world_size
        acks = self._channel.acks(list(range(world)))
        nodes = {r: a.node for r, a in enumerate(acks) if a.node}
        peers, plan = networks.plan(nodes, {r: a.probe for r, a in enumerate(acks)})
        if len(set(nodes.values())) < 2 or len(peers) < 2:
            note = (
                "one node: no link between nodes to probe"
                if len(set(nodes.values())) < 2
                else "no probe listener on two nodes: nothing probed"
            )
            self._done[key] = Network(pg, float(seq), time.time(), note=note)
            return
        self._start(pg, float(seq), peers, plan, nodes, None)

    def _start(
        self,
        pg: str,
        seq: float,
        peers: Mapping[int, str],
        plan: Mapping[int, tuple[int, ...]],
        nodes: dict[int, str],
        first: Network | None,
    ) -> None:
        number = self._channel.probe_round() + 1
        request = ProbeRequest(
            number, pg, seq, dict(peers), dict(plan), CONNECT_S + MOVE_S, time.time()
        )
        self._channel.open_probe(request)
        # Ranks look each quarter interval while stuck, then try for at most one attempt's time.
        deadline = time.monotonic() + CONNECT_S + MOVE_S + self._site.interval_s + 2.0
        self._open = _Round(request, deadline, nodes, first)
        log.warning(
            "ddp-exporter: every rank of run %s waits in pg %s #%g, nobody behind: probing the "
            "links between %d nodes (round %d%s)",
            self._site.run,
            pg,
            seq,
            len(peers),
            number,
            ", to confirm" if first is not None else "",
        )

    def poll(self) -> Network | None:
        """Judge the open round once every result is in or its deadline passed; return the
        finding when it is final (once), else None."""
        r = self._open
        if r is None:
            return None
        ranks = sorted(r.request.plan)
        results = dict(zip(ranks, self._channel.probe_results(ranks)))
        current = {k: v if v.round == r.request.round else None for k, v in results.items()}
        if any(v is None for v in current.values()) and time.monotonic() < r.deadline:
            return None
        found = networks.judge(r.request, current, r.nodes)
        req = r.request
        if r.first is None and found.faulty:
            self._open = None
            self._start(req.pg, float(req.seq), req.peers, req.plan, r.nodes, found)
            return None
        if r.first is not None:
            found = networks.confirm(r.first, found)
        self._open = None
        self._done[(req.pg, float(req.seq))] = found
        while len(self._done) > KEEP:  # one entry per stuck collective: keep the latest
            self._done.pop(next(iter(self._done)))
        log.warning(
            "ddp-exporter: probe of run %s: %s", self._site.run, "; ".join(networks.lines(found))
        )
        return found
