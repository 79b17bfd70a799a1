"""Time the fleet rules on a real Prometheus remembering 10,000 nodes and 30 days of runs.

A synthetic fleet: ``--nodes`` nodes, each in ``--runs-per-day`` runs a day for ``--days`` days
(job sizes 1 to 64 nodes, in time order), so ``nodes x days x runs-per-day`` (node, run) pairs
(600,000 by default). ``--bad`` nodes (1 %) are blamed in half of their runs, every other node
in 0.5 % of its runs.

The state the fleet group carries after those days (each node's run counter; each blamed pair's
time, place among its node's runs and whether it counts) is written as it would stand, with
``promtool tsdb create-blocks-from openmetrics``, and Prometheus starts over it. A tiny HTTP
exporter here serves what is alive now (``--alive``, 2 % of the runs): their
``ddp_rank_info{run, rank, node}`` and the firing ``ALERTS`` of their blamed ranks. The group
then carries the state forward at every evaluation, as in production. The carry window is
kept at 30 evaluations as in the DEFAULT config (1 min interval, 30 min carry), compressed in
time (``--interval``, 15 s) so the steady state is reached in minutes.

Reported: the group's evaluation time (Prometheus's own ``evaluationTime``, median and max over
the last evaluations) and each rule's, the series the fleet records hold, Prometheus's head
series and resident memory, and whether DDPSuspectNode names the bad nodes (and how many
others).

    python benchmarks/fleet.py                  # 10,000 nodes, 30 days (~12 min)
    python benchmarks/fleet.py --nodes 1000 --days 7 --interval 5
"""

from __future__ import annotations

import argparse
import dataclasses
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
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from exporter.mixin.config import DEFAULT  # noqa: E402
from exporter.mixin.fleet import fleet_recorded  # noqa: E402
from exporter.mixin.rules import fleet_group  # noqa: E402
from exporter.tools.localstack import free_port  # noqa: E402
from exporter.tools.promapi import api  # noqa: E402
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

    def suspects(self, last: int, blamed: int) -> set[int]:
        """Return the nodes the definition makes suspect (blamed alone in K of the last N)."""
        per_run: dict[int, int] = {}
        for run, _rank in self.blamed:
            per_run[run] = per_run.get(run, 0) + 1
        history: dict[int, list[bool]] = {}
        for run, members in enumerate(self.runs):
            for rank, node in enumerate(members):
                alone = (run, rank) in self.blamed and per_run[run] * 2 <= len(members)
                history.setdefault(node, []).append(alone)
        return {n for n, h in history.items() if sum(h[-last:]) >= blamed}


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


def seed_openmetrics(fleet: Fleet, f, upto: int, days: int, now: float) -> str:
    """Return OpenMetrics text of the state the fleet group carries after runs ``< upto``.

    Runs are spread evenly over the last ``days`` days in id order; a pair counts (``alone``)
    when at most half of its run's nodes were blamed, as the rules decide.
    """
    per_node: dict[int, int] = {}
    blamed_by_run: dict[int, int] = {}
    for run, _rank in fleet.blamed:
        blamed_by_run[run] = blamed_by_run.get(run, 0) + 1
    at = int(now) - 30  # a sample just before Prometheus starts: within the carry window
    span = days * 86400
    lines = []
    for run in range(upto):
        members = fleet.runs[run]
        when = now - span * (1 - run / max(1, len(fleet.runs)))
        for rank, node in enumerate(members):
            per_node[node] = per_node.get(node, 0) + 1
            if (run, rank) not in fleet.blamed:
                continue
            lab = f'node="node-{node:05d}",run="r{run}"'
            lines.append(f'{f.blamed}{{{lab},cause="compute"}} {when:.0f} {at}')
            lines.append(f"{f.blamed_index}{{{lab}}} {per_node[node]} {at}")
            if blamed_by_run[run] * 2 <= len(members):
                lines.append(f"{f.blamed_alone}{{{lab}}} {when:.0f} {at}")
    for node, count in per_node.items():
        lines.append(f'{f.runs_total}{{node="node-{node:05d}"}} {count} {at}')
    return "\n".join(lines) + "\n# EOF\n"


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
    return api(url, path, params, timeout=300)


def _fleet_eval_times(url: str) -> tuple[float, str, dict[str, float]]:
    """Return the fleet group's last evaluation time, when it ran, and each rule's time."""
    for g in _api(url, "/api/v1/rules")["groups"]:
        if g["name"] == "ddp-exporter.fleet":
            rules = {r["name"]: float(r.get("evaluationTime", 0.0)) for r in g["rules"]}
            return float(g["evaluationTime"]), g["lastEvaluation"], rules
    raise RuntimeError("no fleet group loaded")


def _write_config(work: str, interval: int, target_port: int, port: int) -> None:
    """Write the Prometheus configuration: the synthetic exporter and Prometheus itself."""
    with open(os.path.join(work, "prometheus.yml"), "w") as fh:
        yaml.safe_dump(
            {
                "global": {
                    "scrape_interval": f"{interval}s",
                    "evaluation_interval": f"{interval}s",
                },
                "rule_files": [os.path.join(work, "rules.yml")],
                "scrape_configs": [
                    {
                        "job_name": "ddp",
                        "honor_labels": True,
                        "scrape_timeout": f"{interval - 1}s",
                        "static_configs": [{"targets": [f"127.0.0.1:{target_port}"]}],
                    },
                    {"job_name": "self", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]},
                ],
            },
            fh,
        )


def _start_prometheus(work: str, port: int) -> subprocess.Popen:
    """Start Prometheus on the seeded storage, on loopback."""
    return subprocess.Popen(
        [
            "prometheus",
            f"--config.file={work}/prometheus.yml",
            f"--storage.tsdb.path={work}/data",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
            "--query.max-samples=500000000",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(os.path.join(work, "prometheus.log"), "w"),  # noqa: SIM115
        start_new_session=True,
    )


def _measure(
    url: str, f: Any, nodes: int, interval: int
) -> tuple[list[float], dict[str, list[float]], dict[str, float], set[int]]:
    """Wait until the seeded state is carried, then sample the group's evaluations and figures."""
    times: list[float] = []
    per_rule: dict[str, list[float]] = {}
    # The seeded state must be carried: wait for the group's first evaluations.
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        time.sleep(interval)
        try:
            n = _api(url, "/api/v1/query", query=f"count({f.runs_total})")["result"]
        except OSError:
            continue
        if n and int(float(n[0]["value"][1])) >= 0.99 * nodes:
            break
    else:
        raise RuntimeError("the fleet group never carried the seeded state")
    # Steady state: the carried records' windows fill up, then sample evaluations.
    steady = time.monotonic() + interval * (CARRY_EVALUATIONS + 2)
    seen_eval = ""
    while time.monotonic() < steady + interval * 8:
        time.sleep(interval / 3)
        took, when, rules = _fleet_eval_times(url)
        if when != seen_eval and time.monotonic() > steady:
            times.append(took)
            for name, t in rules.items():
                per_rule.setdefault(name, []).append(t)
        seen_eval = when
    q = {
        "runs counted (sum over nodes)": f"sum({f.runs_total})",
        "live (node, run) series": f"count({f.live})",
        "blamed (node, run, cause)": f"count({f.blamed})",
        "blamed pairs kept (index, alone)": f"count({f.blamed_index}) + count({f.blamed_alone})",
        "per-node series": (
            f"count({f.runs_total}) + count({f.runs_seen}) + count({f.runs_blamed})"
        ),
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
            url,
            "/api/v1/query",
            query='ALERTS{alertname="DDPSuspectNode"}',
        )["result"]
    }
    return times, per_rule, figures, suspects


def _report(
    fleet: Any,
    cfg: Any,
    times: list[float],
    per_rule: dict[str, list[float]],
    figures: dict[str, float],
    suspects: set[int],
) -> None:
    """Print the evaluation times, the figures and how the alert compares with the definition."""
    print(
        f"fleet group evaluation: median {statistics.median(times):.2f} s, max "
        f"{max(times):.2f} s over {len(times)} evaluations (every {cfg.fleet_interval} here, "
        f"carry {cfg.fleet_carry} = {CARRY_EVALUATIONS} evaluations)"
    )
    for name, ts in sorted(per_rule.items(), key=lambda kv: -statistics.median(kv[1])):
        print(f"  rule {name}: median {statistics.median(ts):.2f} s")
    for name, value in figures.items():
        print(f"  {name}: {value:,.1f}")
    want = fleet.suspects(int(cfg.fleet_runs), int(cfg.fleet_blamed_runs))
    print(
        f"  DDPSuspectNode (pending or firing): {len(suspects)} nodes; the definition applied "
        f"to the synthetic history names {len(want)} ({len(want & fleet.bad)} of the "
        f"{len(fleet.bad)} bad ones): {len(suspects & want)} named, {len(want - suspects)} "
        f"missed, {len(suspects - want)} extra"
    )
    print(f"fleet_eval_seconds={statistics.median(times):.3f}")


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
    print(
        f"fleet: {args.nodes} nodes, {len(fleet.runs)} runs over {args.days} days, "
        f"{fleet.pairs()} (node, run) pairs, {len(fleet.blamed)} blamed ranks, {bad} bad "
        f"nodes ({time.monotonic() - t0:.0f} s to build)",
        flush=True,
    )
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
    first_alive = len(fleet.runs) - max(1, int(len(fleet.runs) * args.alive))
    alive_runs = range(first_alive, len(fleet.runs))
    t_seed = time.monotonic()
    with open(os.path.join(work, "seed.om"), "w") as fh:
        fh.write(seed_openmetrics(fleet, f, first_alive, args.days, time.time()))
    subprocess.run(
        [
            "promtool",
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            f"{work}/seed.om",
            f"{work}/data",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    print(
        f"carried state of {first_alive} finished runs written in "
        f"{time.monotonic() - t_seed:.0f} s; {len(alive_runs)} runs alive",
        flush=True,
    )
    exporter = Exporter()
    exporter.body = exposition(fleet, alive_runs)
    with open(os.path.join(work, "rules.yml"), "w") as fh:
        yaml.safe_dump({"groups": [fleet_group(cfg)]}, fh, sort_keys=False)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    _write_config(work, args.interval, exporter.port, port)
    prom = _start_prometheus(work, port)
    try:
        times, per_rule, figures, suspects = _measure(url, f, args.nodes, args.interval)
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
    _report(fleet, cfg, times, per_rule, figures, suspects)
    return 0


if __name__ == "__main__":
    sys.exit(main())
