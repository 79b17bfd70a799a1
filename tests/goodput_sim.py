"""A lockstep job simulated in time, fed to the goodput account as the tracker feeds it.

Steps are DDP's: every rank does its own work (data, compute, declared sections), the step ends
when the slowest is done plus the communication and the optimizer, and each rank waits for the
slowest inside the collective. The ranks publish their work at their own phase of the heartbeat
interval; the monitoring rank (rank 0) ticks four times an interval, as
exporter.sources.goodput.tracker does. Used by tests/test_goodput.py.
"""

from __future__ import annotations

from dataclasses import replace

from exporter.sources.goodput import Account, Carried, Episode, PeerTally, StepTotals, Work

#: When the hang watcher opens an episode (its stall floor).
HANG_THRESHOLD_S = 10.0


class Sim:
    """Drive an :class:`Account` through a simulated job."""

    def __init__(
        self,
        ranks: int = 3,
        *,
        interval: float = 1.0,
        startup: float = 5.0,
        start: float = 1000.0,
        attempt: str = "0",
        start_step: int | None = None,
        carried: Carried | None = None,
        step: float = 0.1,
        comm: float = 0.005,
        opt: float = 0.002,
    ) -> None:
        self.ranks, self.interval, self.tick_s = ranks, interval, interval / 4
        self.step_s, self.comm, self.opt = step, comm, opt
        self.start = start
        self.now = start
        self.account = Account(
            rank=0,
            attempt=attempt,
            start_unix=start,
            start_step=start_step,
            carried=carried,
            hold_s=2.5 * interval + self.tick_s,
        )
        self.tally = PeerTally()
        self.work = [Work() for _ in range(ranks)]
        self.published = [Work() for _ in range(ranks)]
        self.own = StepTotals(0, 0.0, 0.0, 0.0)
        self.sections = {"checkpoint": 0.0, "evaluation": 0.0, "section": 0.0}
        self.first: float | None = None
        self.episode: Episode | None = None
        self._next_tick = start
        self._next_pub = [start + r * interval / ranks for r in range(ranks)]
        self.advance(startup)

    # -- time --------------------------------------------------------------------------------
    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass: publish and tick whenever due."""
        end = self.now + seconds
        while True:
            nxt = min(self._next_tick, *self._next_pub)
            if nxt > end:
                break
            self.now = nxt
            for r in range(self.ranks):
                if self._next_pub[r] <= self.now:
                    self.published[r] = self.work[r]
                    self._next_pub[r] += self.interval
            if self._next_tick <= self.now:
                self.tick()
                self._next_tick += self.tick_s
        self.now = end

    def tick(self) -> None:
        """What the tracker does on the monitoring rank each tick."""
        acc = self.account
        found = self.tally.observe(self.published, self.now)
        if found is not None:
            acc.excess(found)
        if self.first is not None:
            acc.first_step(self.first)
        acc.sections(self.sections)
        acc.steps(self.now, self.own)
        acc.hang(self.now, self.episode, self.own.steps)
        acc.finalize(self.now)

    # -- training ----------------------------------------------------------------------------
    def steps(
        self,
        n: int,
        *,
        compute: dict[int, float] | None = None,
        data: dict[int, float] | None = None,
        comm: float | None = None,
    ) -> None:
        """Run ``n`` lockstep steps; ``compute``/``data``: extra seconds per rank per step."""
        for _ in range(n):
            self.one_step(compute=compute, data=data, comm=comm)

    def one_step(
        self,
        *,
        compute: dict[int, float] | None = None,
        data: dict[int, float] | None = None,
        comm: float | None = None,
        section: tuple[int, str, float] | None = None,
        stall: tuple[int, float] | None = None,
        cpu_wait: float = 0.0,
    ) -> None:
        """One step; ``section``: (rank, category, seconds) before it; ``stall``: (rank, s);
        ``cpu_wait``: the seconds the monitoring rank's threads waited for a CPU meanwhile."""
        compute, data = compute or {}, data or {}
        if self.first is None:
            self.first = self.now
        own_work = []
        for r in range(self.ranks):
            c = self.step_s + compute.get(r, 0.0) + (stall[1] if stall and stall[0] == r else 0)
            own_work.append((data.get(r, 0.0), c))
        held = section[2] if section else 0.0
        slowest = max(
            d + c + (held if section and section[0] == r else 0.0)
            for r, (d, c) in enumerate(own_work)
        )
        c_s = self.comm if comm is None else comm
        duration = slowest + c_s + self.opt
        if section and section[0] == 0:
            self.advance(section[2])  # the monitor's own section: out of its step
            self.sections[section[1]] += section[2]
            duration -= section[2]
        if stall and stall[1] > HANG_THRESHOLD_S:
            # The hang watcher opens an episode once the collective is older than its threshold.
            onset = self.now
            self.advance(HANG_THRESHOLD_S)
            number = self.episode.number + 1 if self.episode else 1
            self.episode = Episode(number, onset, stall[0], "node-b")
            duration -= HANG_THRESHOLD_S
        self.advance(duration)
        for r, (d, c) in enumerate(own_work):
            w = self.work[r]
            extra = {}
            if section and section[0] == r:
                extra[section[1] + "_s"] = getattr(w, section[1] + "_s") + section[2]
            self.work[r] = replace(
                w, steps=w.steps + 1, data_s=w.data_s + d, compute_s=w.compute_s + c, **extra
            )
        d0, c0 = own_work[0]
        wait = duration - d0 - c0 - self.opt
        o = self.own
        self.own = StepTotals(
            o.steps + 1,
            o.data_s + d0,
            o.compute_s + c0 + self.opt,
            o.comm_s + wait,
            o.cpu_wait_s + cpu_wait,
        )

    def totals(self) -> dict[str, float]:
        """Return the published totals now."""
        return self.account.totals(self.now)

    def end(self, how: str = "clean") -> dict[str, float]:
        """End the account now (after a last tick, as the tracker's end); return its totals."""
        self.tick()
        self.account.end(self.now, how)
        return self.totals()
