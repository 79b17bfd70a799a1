"""One rank's doctor run: check alone, publish through the store, compare on rank 0.

Facts travel through the c10d store, not through collectives, so a rank that never arrives is
reported as missing instead of hanging everyone; every step has its own deadline.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from ... import settings, storekeys
from ...network import links, netcheck
from .checks import (
    CHECKS,
    FAIL,
    FIX_GLOO,
    FIX_LAUNCHER,
    OK,
    POLL_S,
    REACH_S,
    VERDICT_GRACE_S,
    Check,
    Checks,
    Deadline,
    Report,
    bounded,
    check_env,
    check_ifnames,
    check_master_is_here,
    check_restart,
    local_versions,
    made_and_failed,
    probe_port,
    resolve_master,
    round_trip,
)
from .compare import compare, judge_reach, reach_targets
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
        self.rank = settings.int_or_none(environ, settings.RANK)
        self.world = settings.int_or_none(environ, settings.WORLD_SIZE)
        self.prefix = storekeys.doctor_prefix(settings.restart_count(environ))
        # Under torchrun the agent hosts the store on MASTER_PORT; else rank 0 does.
        self.agent_store = environ.get(settings.TORCHELASTIC_USE_AGENT_STORE) == "True"
        self.store: Any = None
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
        self._connect()
        if self.store is None:
            return self._alone()
        self._listen()
        try:
            # The counter gives each process its own key: duplicate RANKs do not overwrite.
            n = self.store.add(self.prefix + "arrived", 1)
            self._publish(f"report/{n}", self.report.to_json())
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
            sock = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET)
            sock.bind((addr, 0))
            sock.listen(64)
        except OSError as exc:
            self.report.checks.reach = Check(
                FAIL, f"cannot listen on {addr} ({why}): {exc}", FIX_GLOO
            )
            return
        self.report.reach = f"{addr}:{sock.getsockname()[1]}"

        def accept() -> None:
            while True:
                try:
                    conn, _ = sock.accept()
                    conn.close()
                except OSError:
                    return

        threading.Thread(target=accept, name="ddp-exporter-doctor-reach", daemon=True).start()

    def _reach(self) -> None:
        """Try every target rank's gloo address at once; publish how each attempt ended."""
        from concurrent.futures import ThreadPoolExecutor

        assert self.world is not None and self.rank is not None
        peers = json.loads(self._wait_key("peers", self.dl.end) or "{}")

        def attempt(peer: int) -> tuple[int, str]:
            where = peers.get(str(peer), "")
            if not where:
                return peer, "unresolved"
            host, _, port = where.rpartition(":")
            return peer, netcheck.probe_tcp(host, int(port), REACH_S).kind

        targets = reach_targets(self.rank, self.world)
        with ThreadPoolExecutor(max_workers=min(32, max(1, len(targets)))) as pool:
            results = dict(pool.map(attempt, targets))
        failed = {str(p): k for p, k in results.items() if k != "ok"}
        self._publish(f"reach/{self.rank}", json.dumps(failed))

    def _connect(self) -> None:
        from torch.distributed import TCPStore

        checks = self.report.checks
        addr, port = self.env[settings.MASTER_ADDR], int(self.env[settings.MASTER_PORT])
        checks.addr, ip = resolve_master(addr, self.dl.step(5.0))
        if ip is None:
            return
        timeout = datetime.timedelta(seconds=self.dl.step())
        host = self.rank == 0 and not self.agent_store
        if host:
            checks.addr = check_master_is_here(addr, ip)
            if made_and_failed(checks.addr):
                return  # the store's own client would dial MASTER_ADDR: another host
            try:
                self.store = TCPStore(addr, port, None, True, timeout, wait_for_workers=False)
            except Exception as exc:  # noqa: BLE001 - reported with its fix
                in_use = "in use" in str(exc).lower()
                checks.port = Check(
                    FAIL,
                    f"cannot listen on MASTER_PORT {port}: {str(exc).splitlines()[0]}",
                    "another process holds the port (a leftover job, or a second rank 0): "
                    "choose a free MASTER_PORT"
                    if in_use
                    else FIX_LAUNCHER,
                )
                return
            checks.port = Check(OK, f"listening on {port}")
        else:
            checks.port = probe_port(addr, port, self.dl.step())
            if made_and_failed(checks.port):
                return
            finished, value = bounded(
                lambda: TCPStore(addr, port, None, False, timeout), self.dl.step() + 1
            )
            if not finished:
                checks.store = Check(
                    FAIL,
                    f"cannot connect to the c10d store at {addr}:{port}: {value}",
                    "MASTER_PORT answers but is not a c10d store: another program uses it",
                )
                return
            self.store = value
        finished, value = bounded(
            lambda: round_trip(self.store, self.prefix + f"rtt/{self.rank}/{os.getpid()}"),
            self.dl.step(),
        )
        checks.store = (
            value
            if finished
            else Check(FAIL, f"set+get failed: {value}", "the store host is overloaded or gone")
        )
        if made_and_failed(checks.store):
            self.store = None
            return
        import torch

        checks.restart = check_restart(self.env, self.store, torch.__version__)

    def _publish(self, key: str, value: str) -> None:
        self.store.set(self.prefix + key, value)

    def _wait_key(self, key: str, until: float) -> str | None:
        """Poll for ``key`` until the monotonic time ``until``; never block past it."""
        full = self.prefix + key
        while True:
            try:
                if self.store.check([full]):
                    return str(self.store.get(full).decode())
            except Exception:  # noqa: BLE001 - the store host left: the key will not come
                return None
            if time.monotonic() >= until:
                return None
            time.sleep(POLL_S)

    def _collective(self, world: int) -> Check:
        import torch
        import torch.distributed as dist

        seconds = self.dl.step()

        def run() -> float:
            dist.init_process_group(
                "gloo",
                store=dist.PrefixStore(self.prefix + "pg", self.store),
                rank=self.rank,
                world_size=world,
                timeout=datetime.timedelta(seconds=seconds),
            )
            assert self.rank is not None  # a rank without RANK never gets this far (run())
            t = torch.tensor([float(self.rank + 1)])
            dist.all_reduce(t)
            return float(t.item())

        t0 = time.monotonic()
        finished, value = bounded(run, seconds + 1)
        if finished and value == world * (world + 1) / 2:
            took = time.monotonic() - t0
            if self.links_mib > 0:
                self._links(dist)
            bounded(dist.destroy_process_group, 2.0)
            return Check(OK, f"all_reduce in {took * 1e3:.0f} ms")
        if finished:
            return Check(FAIL, f"all_reduce returned {value}", FIX_GLOO)
        first = str(value).splitlines()[0] if str(value) else type(value).__name__
        return Check(FAIL, f"gloo all_reduce: {first}", FIX_GLOO)

    def _links(self, dist: Any) -> None:
        """Measure the links between nodes in the live group; publish this rank's pairs."""

        def run() -> list[links.Pair]:
            hosts: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(hosts, socket.gethostname())
            return links.measure(dist, dist.get_rank(), hosts, self.links_mib)

        finished, value = bounded(run, self.dl.left())
        if finished and isinstance(value, list):
            self._publish(f"links/{self.rank}", json.dumps([asdict(p) for p in value]))
        else:
            first = str(value).splitlines()[0] if str(value) else "no result in time"
            self._publish(f"links/{self.rank}", json.dumps({"error": first}))

    def _judge_links(self, reports: list[Report], notes: list[str]) -> None:
        """Collect every rank's measured pairs; name the node whose links are slow."""
        pairs: list[links.Pair] = []
        errors: dict[int, str] = {}
        for rep in reports:
            got = self._wait_key(f"links/{rep.rank}", self.dl.end)
            found = json.loads(got) if got else {"error": f"no result within {self.timeout:.0f} s"}
            if isinstance(found, dict):
                errors[rep.rank] = found["error"]  # type: ignore[index]
            else:
                pairs += [links.Pair(**p) for p in found]
        slow = links.judge(pairs)
        # The ranks that measured for their node (every rank reported: the gloo group ran).
        first_on = links.representatives(
            [r.host for r in sorted(reports, key=lambda r: r.rank or 0)]
        )
        for rep in reports:
            if rep.rank in errors:
                rep.checks.links = Check(FAIL, f"links: {errors[rep.rank]}", FIX_GLOO)
            elif rep.host in slow and first_on[rep.host] == rep.rank:
                rep.checks.links = Check(
                    FAIL,
                    f"{rep.host}: {slow[rep.host]}",
                    f"check {rep.host}'s NIC (negotiated speed, errors: ethtool, ip -s link), its "
                    "cable and switch port, and other traffic on it; drain it until it is fixed",
                )
            else:
                rep.checks.links = Check(OK)
        if pairs:
            notes.extend(links.render(pairs, self.links_mib))
        if len({r.host for r in reports}) == 2:
            notes.append(
                "links: 2 nodes, one pair: no third node to tell which end is slow (run with a "
                "healthy third node to name it)"
            )
        elif len({r.host for r in reports}) < 2:
            notes.append("links: one node: no link between nodes to measure")

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
        # Leave time for the collective after the gather, unless a rank never comes.
        reserve = min(self.dl.step_s + 2, self.timeout / 2)
        reports = self._gather(self.dl.end - reserve)
        rows, notes = compare(reports, self.world)
        complete = all(isinstance(r, Report) for r in rows) and len(rows) == self.world
        if complete:
            self._publish("peers", json.dumps({str(r.rank): r.reach for r in reports}))
            self._publish("plan", "go")
            reachable = self._judge_reach(reports, notes)
            self._publish("gloo", "go" if reachable else "skip")
            if reachable:
                self._gloo(reports, notes)
            else:
                notes.append("gloo all_reduce skipped: the ranks cannot all reach each other")
        else:
            self._publish("plan", "skip")
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
        self._publish("verdict", str(verdict))
        # Keep a store hosted here up until the others read the verdict (bounded).
        until = time.monotonic() + VERDICT_GRACE_S
        while self.store.add(self.prefix + "read", 0) < len(reports) - 1:
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
            got = self._wait_key(f"reach/{rep.rank}", until)
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
        mine = self._collective(self.world)
        self._publish(f"gloo/{self.rank}", json.dumps(asdict(mine)))
        for rep in reports:
            got = self._wait_key(f"gloo/{rep.rank}", self.dl.end)
            rep.checks.gloo = (
                Check(**json.loads(got))
                if got
                else Check(FAIL, f"no all_reduce result within {self.timeout:.0f} s", FIX_GLOO)
            )
        if self.links_mib > 0 and not mine.failed:
            self._judge_links(reports, notes)

    def _gather(self, until: float) -> list[Report]:
        assert self.world is not None  # rank 0 without WORLD_SIZE never gets this far (run())
        reports: dict[int, Report] = {}
        while True:
            count = self.store.add(self.prefix + "arrived", 0)
            for i in range(1, count + 1):
                key = self.prefix + f"report/{i}"
                if i not in reports and self.store.check([key]):
                    reports[i] = Report.from_json(self.store.get(key))
            ranks = {r.rank for r in reports.values()}
            if len(reports) >= self.world and ranks >= set(range(self.world)):
                break
            if time.monotonic() >= until:
                break
            time.sleep(POLL_S)
        return list(reports.values())

    def _peer(self) -> int:
        plan = self._wait_key("plan", self.dl.end)
        if plan == "go":
            assert self.world is not None
            self._reach()
            if self._wait_key("gloo", self.dl.end) == "go":
                mine = self._collective(self.world)
                self.report.checks.gloo = mine
                self._publish(f"gloo/{self.rank}", json.dumps(asdict(mine)))
        own = own_failures(self.report)
        if own:
            print(own, file=sys.stderr, flush=True)
        verdict = self._wait_key("verdict", self.dl.end + VERDICT_GRACE_S)
        try:
            self.store.add(self.prefix + "read", 1)
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
