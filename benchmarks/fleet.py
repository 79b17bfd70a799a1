"""Time the fleet rules on a real Prometheus remembering 10,000 nodes and 30 days of runs.

A synthetic fleet: ``--nodes`` nodes, each in ``--runs-per-day`` runs a day for ``--days`` days
(job sizes 1 to 64 nodes), so ``nodes x days x runs-per-day`` (node, run) pairs to remember
(600,000 by default). ``--bad`` nodes (1 %) are blamed in half of their runs, every other node
in 0.5 % of its runs. A tiny HTTP exporter here serves what the fleet rules read: one
``ddp_rank_info{run, rank, node}`` per pair and the firing ``ALERTS`` of the blamed ranks.

Prometheus scrapes it and evaluates the generated fleet group (``fleet_window`` = the days).
First every pair is served once (the history), then only the runs still alive (2 %), the others
being remembered by the group's own carried records, as after 30 days. The carry window is
kept at 30 evaluations, as in the DEFAULT config (1 min interval, 30 min carry), but compressed
in time (``--interval``, 15 s) so the steady state is reached in minutes: an evaluation then
reads as many samples per remembered pair as it would in production.

Reported: the group's evaluation time (Prometheus's own ``evaluationTime`` of the group, median
and max over the last evaluations), the series the fleet records hold, Prometheus's head
series and resident memory, and whether DDPSuspectNode names the bad nodes (and how many
others).

    python benchmarks/fleet.py                  # 10,000 nodes, 30 days (~12 min, ~4 GB RAM)
    python benchmarks/fleet.py --nodes 1000 --days 7
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from exporter.mixin.config import DEFAULT  # noqa: E402
from exporter.mixin.fleet import fleet_group, fleet_recorded  # noqa: E402
from exporter.tools.localstack import free_port  # noqa: E402
from exporter.tools.reaper import raise_on_signals  # noqa: E402

SIZES = (1, 1, 2, 2, 4, 4, 8, 8, 16, 32, 64)
#: Samples of a carried record within its carry window, as in DEFAULT (30 min / 1 min).
CARRY_EVALUATIONS = 30


@dataclasses.dataclass
class Fleet:
    """Runs as lists of nodes, and which (run, rank) are blamed."""

    runs: list[list[int]]
    blamed: set[tuple[int, int]]
    bad: set[int]

    def pairs(self) -> int:
        return sum(len(r) for r in self.runs)


def make_fleet(nodes: int, days: int, per_day: float, bad: int, seed: int = 1) -> Fleet:
    """Place runs on nodes until each node hosted about ``days x per_day`` runs."""
    rnd = random.Random(seed)
    target = int(nodes * days * per_day)
    bad_nodes = set(rnd.sample(range(nodes), bad))
    runs: list[list[int]] = []
    blamed: set[tuple[int, int]] = set()
    total = 0
    while total < target:
        size = min(rnd.choice(SIZES), nodes)
        members = rnd.sample(range(nodes), size)
        run = len(runs)
        for rank, node in enumerate(members):
            p = 0.5 if node in bad_nodes else 0.005
            if size > 1 and rnd.random() < p:
                blamed.add((run, rank))
        runs.append(members)
        total += size
    return Fleet(runs, blamed, bad_nodes)


def exposition(fleet: Fleet, runs: range | list[int]) -> bytes:
    """Return the text the synthetic exporter serves for ``runs``."""
    out = []
    for run in runs:
        for rank, node in enumerate(fleet.runs[run]):
            lab = f'run="r{run}",rank="{rank}",node="node-{node:05d}"'
            out.append(f"ddp_rank_info{{{lab}}} 1\n")
            if (run, rank) in fleet.blamed:
                out.append(
                    f'ALERTS{{alertname="DDPRankStraggler",alertstate="firing",'
                    f'severity="warning",cause="compute",run="r{run}",rank="{rank}"}} 1\n'
                )
    return "".join(out).encode()


class Exporter:
    """Serve one exposition body on loopback; :meth:`serve` swaps it."""

    def __init__(self) -> None:
        self.body = b""
        self.scrapes = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                body = outer.body
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                outer.scrapes += 1

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _api(url: str, path: str, **params: str) -> dict:
    q = urllib.parse.urlencode(params)
    with urllib.request.urlopen(f"{url}{path}?{q}", timeout=300) as r:
        doc = json.loads(r.read())
    if doc.get("status") != "success":
        raise RuntimeError(f"{path} failed: {doc}")
    return doc["data"]


def _fleet_eval_times(url: str) -> tuple[float, str]:
    for g in _api(url, "/api/v1/rules")["groups"]:
        if g["name"] == "ddp-exporter.fleet":
            return float(g["evaluationTime"]), g["lastEvaluation"]
    raise RuntimeError("no fleet group loaded")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=10000)
    p.add_argument("--days", type=int, default=30)
    p.add_argument("--runs-per-day", type=float, default=2.0, help="runs per node per day")
    p.add_argument("--bad", type=int, default=None, help="bad nodes (default 1 %%)")
    p.add_argument("--interval", type=int, default=15, help="seconds between evaluations")
    p.add_argument("--alive", type=float, default=0.02, help="share of runs still alive")
    p.add_argument("--keep", action="store_true", help="keep the work folder")
    args = p.parse_args(argv)
    if shutil.which("prometheus") is None:
        print("benchmarks/fleet.py needs the prometheus binary (Debian package prometheus)")
        return 2
    bad = args.bad if args.bad is not None else max(1, args.nodes // 100)
    raise_on_signals()  # SIGTERM/SIGHUP stop Prometheus like Ctrl-C does
    t0 = time.monotonic()
    fleet = make_fleet(args.nodes, args.days, args.runs_per_day, bad)
    print(f"fleet: {args.nodes} nodes, {len(fleet.runs)} runs over {args.days} days, "
          f"{fleet.pairs()} (node, run) pairs, {len(fleet.blamed)} blamed ranks, {bad} bad "
          f"nodes ({time.monotonic() - t0:.0f} s to build)", flush=True)  # fmt: skip
    cfg = dataclasses.replace(
        DEFAULT,
        fleet_window=f"{args.days}d",
        fleet_interval=f"{args.interval}s",
        fleet_carry=f"{args.interval * CARRY_EVALUATIONS}s",
        # A rank's node is looked up over the baseline window (30 min = 30 evaluations too).
        baseline_window=f"{args.interval * CARRY_EVALUATIONS}s",
    )
    f = fleet_recorded(cfg)
    work = tempfile.mkdtemp(prefix="ddp-fleet-bench-")
    exporter = Exporter()
    history = exposition(fleet, range(len(fleet.runs)))
    alive_runs = range(len(fleet.runs) - max(1, int(len(fleet.runs) * args.alive)),
                       len(fleet.runs))  # fmt: skip
    alive = exposition(fleet, alive_runs)
    exporter.body = history
    with open(os.path.join(work, "rules.yml"), "w") as fh:
        yaml.safe_dump({"groups": [fleet_group(cfg)]}, fh, sort_keys=False)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(os.path.join(work, "prometheus.yml"), "w") as fh:
        yaml.safe_dump({
            "global": {"scrape_interval": f"{args.interval}s",
                       "evaluation_interval": f"{args.interval}s"},
            "rule_files": [os.path.join(work, "rules.yml")],
            "scrape_configs": [{"job_name": "ddp", "honor_labels": True,
                                "scrape_timeout": f"{args.interval - 1}s",
                                "static_configs": [{"targets": [f"127.0.0.1:{exporter.port}"]}]},
                               {"job_name": "self",
                                "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}],
        }, fh)  # fmt: skip
    prom = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={work}/prometheus.yml",
            f"--storage.tsdb.path={work}/data",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
            "--query.max-samples=500000000",
        ],  # fmt: skip
        stdout=subprocess.DEVNULL,
        stderr=open(os.path.join(work, "prometheus.log"), "w"),  # noqa: SIM115
        start_new_session=True,
    )
    times: list[float] = []
    try:
        # History: until the fleet group has remembered every pair served once.
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            time.sleep(args.interval)
            try:
                n = _api(url, "/api/v1/query", query=f"count({f.seen})")["result"]
            except OSError:
                continue
            if n and int(float(n[0]["value"][1])) >= fleet.pairs() * 0.99:
                break
        else:
            raise RuntimeError("the fleet group never remembered the history")
        print(f"history remembered after {time.monotonic() - t0:.0f} s; now only "
              f"{len(alive_runs)} runs alive", flush=True)  # fmt: skip
        exporter.body = alive
        # Steady state: the carried records' windows fill up, then sample evaluations.
        steady = time.monotonic() + args.interval * (CARRY_EVALUATIONS + 2)
        seen_eval = ""
        while time.monotonic() < steady + args.interval * 8:
            time.sleep(args.interval / 3)
            took, when = _fleet_eval_times(url)
            if when != seen_eval and time.monotonic() > steady:
                times.append(took)
            seen_eval = when
        q = {
            "remembered (node, run) pairs": f"count({f.seen})",
            "blamed (node, run, cause)": f"count({f.blamed})",
            "last-N (node, run) series": f"count({f.recent})",
            "per-node series": f"count({f.runs_seen}) + count({f.runs_blamed})",
            "head series": "prometheus_tsdb_head_series",
            "resident memory (GB)": 'process_resident_memory_bytes{job="self"} / 1e9',
        }
        figures = {}
        for name, expr in q.items():
            res = _api(url, "/api/v1/query", query=expr)["result"]
            figures[name] = float(res[0]["value"][1]) if res else 0.0
        suspects = {
            int(s["metric"]["node"].split("-")[1])
            for s in _api(
                url, "/api/v1/query",
                query='ALERTS{alertname="DDPSuspectNode"}',
            )["result"]
        }  # fmt: skip
    finally:
        exporter.close()
        if prom.poll() is None:
            prom.send_signal(signal.SIGTERM)
            try:
                prom.wait(timeout=120)
            except subprocess.TimeoutExpired:
                prom.kill()
                prom.wait()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"fleet group evaluation: median {statistics.median(times):.2f} s, max "
          f"{max(times):.2f} s over {len(times)} evaluations (every {cfg.fleet_interval} here, "
          f"carry {cfg.fleet_carry} = {CARRY_EVALUATIONS} evaluations)")  # fmt: skip
    for name, value in figures.items():
        print(f"  {name}: {value:,.1f}")
    print(f"  DDPSuspectNode (pending or firing): {len(suspects & fleet.bad)} of {len(fleet.bad)} "
          f"bad nodes, {len(suspects - fleet.bad)} others")  # fmt: skip
    print(f"fleet_eval_seconds={statistics.median(times):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
