"""One rank's doctor run: check alone, publish through the store, compare on rank 0.

Facts travel through the c10d store, not through collectives, so a rank that never arrives is
reported as missing instead of hanging everyone; every step has its own deadline. The steps
live in rooms of their own: reaching the store (:mod:`.connect`), the keys on it
(:mod:`.board`), the gloo all_reduce and the links (:mod:`.gloo`); the network's own tests are
:mod:`exporter.network`'s.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict

from ... import settings, storekeys
from ...network import netcheck
from .board import Board
from .checks import (
    CHECKS,
    FAIL,
    FIX_GLOO,
    OK,
    POLL_S,
    REACH_S,
    VERDICT_GRACE_S,
    Check,
    Checks,
    Deadline,
    Report,
    check_env,
    check_ifnames,
    local_versions,
    made_and_failed,
)
from .compare import compare, judge_reach, reach_targets
from .connect import connect_store
from .gloo import all_reduce, judge_links
from .report import own_failures, render

__all__ = [
    "Exchange",
]


class Exchange:
    """One rank's run: local checks, publish through the store, then compare on rank 0."""

    def __init__(
        self, environ: Mapping[str, str], timeout: float, step: float, links_mib: float = 0.0
    ) -> None:
        self.env = environ
        #: MiB each way per pair of nodes for the links check; 0: not asked for.
        self.links_mib = links_mib
        self.columns = CHECKS + (("links",) if links_mib > 0 else ())
        self.dl = Deadline(timeout, step)
        self.timeout = timeout
        # Rank 0 gathers the reports until then, and the others wait for its store until then:
        # what is left is for the collective after the gather, unless a rank never comes.
        self.arrive_by = self.dl.end - min(step + 2, timeout / 2)
        self.rank = settings.int_or_none(environ, settings.RANK)
        self.world = settings.int_or_none(environ, settings.WORLD_SIZE)
        self.prefix = storekeys.doctor_prefix(settings.restart_count(environ))
        # Under torchrun the agent hosts the store on MASTER_PORT; else rank 0 does.
        self.agent_store = environ.get(settings.TORCHELASTIC_USE_AGENT_STORE) == "True"
        self.board: Board
        self.report = Report(
            rank=self.rank,
            world_size=self.world,
            local_rank=settings.int_or_none(environ, settings.LOCAL_RANK),
            host=socket.gethostname(),
            pid=os.getpid(),
            versions=local_versions(environ),
        )
        self.report.checks = Checks.skipped(self.columns)
        self.report.checks.versions = Check(OK)

    def run(self) -> int:
        checks = self.report.checks
        checks.env = check_env(self.env)
        checks.ifname = check_ifnames(self.env)
        if made_and_failed(checks.env) and (
            self.rank is None
            or self.world is None
            or settings.int_or_none(self.env, settings.MASTER_PORT) is None
        ):
            return self._alone()
        store = connect_store(
            self.env, self.rank, self.agent_store, self.dl, checks, self.prefix, self.arrive_by
        )
        if store is None:
            return self._alone()
        self.board = Board(store, self.prefix)
        self._listen()
        try:
            # The counter gives each process its own key: duplicate RANKs do not overwrite.
            n = self.board.add("arrived", 1)
            self.board.publish(f"report/{n}", self.report.to_json())
        except Exception as exc:  # noqa: BLE001 - the store host left after the round trip
            checks.store = Check(FAIL, f"publishing failed: {exc}", "rank 0 left early")
            return self._alone()
        return self._rank0() if self.rank == 0 else self._peer()

    # -- steps -----------------------------------------------------------------------------
    def _listen(self) -> None:
        """Listen where gloo would, so that every other rank can try to connect there."""
        addr, why = netcheck.gloo_address(self.env)
        self.report.reach_why = why
        try:
            self.report.reach = netcheck.listen(addr)
        except OSError as exc:
            self.report.checks.reach = Check(
                FAIL, f"cannot listen on {addr} ({why}): {exc}", FIX_GLOO
            )

    def _reach(self) -> None:
        """Try every target rank's gloo address at once; publish how each attempt ended."""
        assert self.world is not None and self.rank is not None
        peers = json.loads(self.board.wait("peers", self.dl.end) or "{}")
        targets = reach_targets(self.rank, self.world)
        results = netcheck.probe_all({p: peers.get(str(p), "") for p in targets}, REACH_S)
        failed = {str(p): k for p, k in results.items() if k != "ok"}
        self.board.publish(f"reach/{self.rank}", json.dumps(failed))

    def _all_reduce(self) -> Check:
        assert self.world is not None and self.rank is not None  # run() returned before if not
        return all_reduce(self.board, self.rank, self.world, self.dl, self.links_mib)

    # -- roles -------------------------------------------------------------------------------
    def _alone(self) -> int:
        """Print this rank's failures when it cannot reach the others (nobody else can)."""
        text = own_failures(self.report)
        print(text or "ddp-exporter doctor: could not reach the store", file=sys.stderr, flush=True)
        if self.env.get(settings.TORCHELASTIC_RUN_ID):
            # torchrun's agent stops every worker when one exits non-zero: stay until rank 0
            # has printed its table (it is done by then).
            time.sleep(self.dl.left() + VERDICT_GRACE_S)
        return 1

    def _rank0(self) -> int:
        assert self.world is not None
        reports = self.board.gather(self.world, self.arrive_by)
        rows, notes = compare(reports, self.world)
        complete = all(isinstance(r, Report) for r in rows) and len(rows) == self.world
        if complete:
            self.board.publish("peers", json.dumps({str(r.rank): r.reach for r in reports}))
            self.board.publish("plan", "go")
            reachable = self._judge_reach(reports, notes)
            self.board.publish("gloo", "go" if reachable else "skip")
            if reachable:
                self._gloo(reports, notes)
            else:
                notes.append("gloo all_reduce skipped: the ranks cannot all reach each other")
        else:
            self.board.publish("plan", "skip")
            notes.append("gloo all_reduce skipped: it needs every rank, each exactly once")
        missing = (
            f"it never reported within {self.dl.elapsed():.0f} s: check that it was started "
            "(launcher logs) and read its own doctor output (a rank that cannot reach "
            "MASTER_ADDR:MASTER_PORT reports only there)"
        )
        text = render(rows, notes, missing, self.columns)
        failed = any(isinstance(r, int) or r.failures() for r in rows)
        verdict = 1 if failed else 0
        mode = "torchrun agent store" if self.agent_store else "store hosted by rank 0"
        head = (
            f"ddp-exporter doctor: {self.world} rank{'' if self.world == 1 else 's'}, MASTER "
            f"{self.env[settings.MASTER_ADDR]}:{self.env[settings.MASTER_PORT]} ({mode})"
        )
        warned = " (see WARN above)" if "\nWARN " in f"\n{text}" else ""
        tail = (
            f"ddp-exporter doctor: {'FAIL' if failed else 'all checks passed' + warned} "
            f"after {self.dl.elapsed():.1f} s"
        )
        sys.stdout.write(f"{head}\n{text}\n{tail}\n")
        sys.stdout.flush()
        self.board.publish("verdict", str(verdict))
        # Keep a store hosted here up until the others read the verdict (bounded).
        until = time.monotonic() + VERDICT_GRACE_S
        while self.board.add("read", 0) < len(reports) - 1:
            if time.monotonic() >= until:
                break
            time.sleep(POLL_S)
        return verdict

    def _judge_reach(self, reports: list[Report], notes: list[str]) -> bool:
        """Collect every rank's reach attempts; set their checks; say whether all reached all."""
        assert self.world is not None
        self._reach()
        failed: dict[int, dict[int, str]] = {}
        until = min(self.dl.end, time.monotonic() + REACH_S + self.dl.step_s)
        for rep in reports:
            got = self.board.wait(f"reach/{rep.rank}", until)
            if got is not None and rep.rank is not None:
                failed[rep.rank] = {int(p): k for p, k in json.loads(got).items()}
        checks, more = judge_reach(reports, failed, self.world)
        for rep in reports:
            if rep.rank in checks and not made_and_failed(rep.checks.reach):
                rep.checks.reach = checks[rep.rank]
        notes.extend(more)
        return all(not made_and_failed(rep.checks.reach) for rep in reports)

    def _gloo(self, reports: list[Report], notes: list[str]) -> None:
        """Run the gloo all_reduce with every rank; set each rank's check from its result."""
        assert self.world is not None
        mine = self._all_reduce()
        self.board.publish(f"gloo/{self.rank}", json.dumps(asdict(mine)))
        for rep in reports:
            got = self.board.wait(f"gloo/{rep.rank}", self.dl.end)
            rep.checks.gloo = (
                Check(**json.loads(got))
                if got
                else Check(FAIL, f"no all_reduce result within {self.timeout:.0f} s", FIX_GLOO)
            )
        if self.links_mib > 0 and not mine.failed:
            judge_links(self.board, reports, notes, self.dl.end, self.timeout, self.links_mib)

    def _peer(self) -> int:
        plan = self.board.wait("plan", self.dl.end)
        if plan == "go":
            assert self.world is not None
            self._reach()
            if self.board.wait("gloo", self.dl.end) == "go":
                mine = self._all_reduce()
                self.report.checks.gloo = mine
                self.board.publish(f"gloo/{self.rank}", json.dumps(asdict(mine)))
        own = own_failures(self.report)
        if own:
            print(own, file=sys.stderr, flush=True)
        verdict = self.board.wait("verdict", self.dl.end + VERDICT_GRACE_S)
        try:
            self.board.add("read", 1)
        except Exception:  # noqa: BLE001 - rank 0 already left; nothing to tell it
            pass
        if verdict is None:
            print(
                f"ddp-exporter doctor rank {self.rank}: no verdict from rank 0 within "
                f"{self.timeout:.0f} s; read rank 0's output",
                file=sys.stderr,
                flush=True,
            )
            return 1
        return 1 if own else int(verdict)
