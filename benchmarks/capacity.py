"""Measure what the exporter costs Prometheus: series, scrape bytes, samples/s, memory.

One rank's exposition is rendered by the real collector (a DDP rank on CUDA: the recorder fed
with buckets and steps, a GPU memory source giving fixed figures, the store round trip, the
hang-dump counter), then served for ``--ranks`` ranks (the ``rank`` and ``node`` labels
rewritten, 8 ranks per node, counters advancing every scrape) from ``--targets`` HTTP targets
on loopback. A real ``prometheus`` scrapes them every ``--interval`` seconds for ``--duration``
seconds with the generated per-run rules loaded (what one shard evaluates), then reports:

* series per rank and per node (exposition), recorded series per rank (the rules' output);
* scrape bytes per rank (plain text, and gzip as Prometheus asks for it);
* samples appended per second, measured, and what 1 s and 15 s intervals mean per rank;
* Prometheus's head series, resident memory and Go heap in use: memory per million series.

    python benchmarks/capacity.py                           # 2048 ranks, 15 s, 4 min
    python benchmarks/capacity.py --ranks 512 --interval 1 --duration 120
"""

from __future__ import annotations

import argparse
import gzip
import http.server
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from exporter.deploy.sharding import shard_rule_groups  # noqa: E402
from exporter.errors import ErrorCounter  # noqa: E402
from exporter.export.collector import DDPCollector, RankSources  # noqa: E402
from exporter.mixin.config import DEFAULT  # noqa: E402
from exporter.mixin.render import dump_yaml  # noqa: E402
from exporter.sources.flight import InFlight  # noqa: E402
from exporter.sources.memory import GPUMemory  # noqa: E402
from exporter.sources.recorder import Recorder  # noqa: E402
from exporter.sources.walltime import JobClock  # noqa: E402
from exporter.tools.promapi import instant_query  # noqa: E402

RANKS_PER_NODE = 8
_LINE = re.compile(r"^(\w+)\{(.*)\} (\S+)$")
_COUNTING = ("_total", "_sum", "_count", "_bucket")


def rank_template() -> list[tuple[str, str, float, bool]]:
    """Render one CUDA DDP rank's exposition; return ``(name, labels, value, counts)`` lines."""
    from prometheus_client import CollectorRegistry, generate_latest

    rec = Recorder("optimizer")
    st = rec.collective_stats("allreduce", "0", 1800.0)
    for _ in range(10):
        rec.bucket_done(st, rec.bucket_launched(st, 1 << 20), True)
        rec.optimizer_begin()
        rec.optimizer_end()
    errors = ErrorCounter()
    gb = 1 << 30
    sources = RankSources(
        run="cap",
        rank=0,
        errors=errors,
        info=lambda: {
            "world_size": "80000",
            "node": "node00000",
            "backend": "nccl",
            "device": "cuda",
            "torch_version": "2.13.0",
            "cuda_version": "12.8",
            "nccl_version": "2.27.3",
        },
        recorder=rec,
        inflight=InFlight(rec, errors, flight_recorder=False),
        job_clock=JobClock(),
        store_round_trip=lambda: 0.0004,
        memory=lambda: GPUMemory(allocated=30 * gb, reserved=34 * gb, peak=36 * gb, total=80 * gb),
    )
    reg = CollectorRegistry(auto_describe=False)
    reg.register(DDPCollector(sources))
    out = []
    for line in generate_latest(reg).decode().splitlines():
        m = _LINE.match(line)
        if m:
            name, labels, value = m.group(1), m.group(2), float(m.group(3))
            out.append((name, labels, value, name.endswith(_COUNTING)))
    return out


class Targets:
    """Serve ``ranks`` ranks' expositions from ``targets`` loopback HTTP servers."""

    def __init__(self, template: list, ranks: int, targets: int) -> None:
        self.template, self.ranks, self.scrapes = template, ranks, 0
        self.servers: list[http.server.ThreadingHTTPServer] = []
        per = -(-ranks // targets)
        self.groups = [range(i, min(ranks, i + per)) for i in range(0, ranks, per)]
        for group in self.groups:
            self.servers.append(self._serve(group))
        self.bytes_plain = self.bytes_gzip = 0

    def body(self, group: range, tick: int) -> bytes:
        lines = []
        for r in group:
            node = f"node{r // RANKS_PER_NODE:05d}"
            for name, labels, value, counts in self.template:
                labels = labels.replace('rank="0"', f'rank="{r}"').replace(
                    'node="node00000"', f'node="{node}"'
                )
                v = value + tick * (1 + r % 3) if counts else value
                lines.append(f"{name}{{{labels}}} {v:g}\n")
        return "".join(lines).encode()

    def _serve(self, group: range) -> http.server.ThreadingHTTPServer:
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                outer.scrapes += 1
                body = outer.body(group, outer.scrapes)
                if "gzip" in self.headers.get("Accept-Encoding", ""):
                    body = gzip.compress(body, 1)
                    self.send_response(200)
                    self.send_header("Content-Encoding", "gzip")
                else:
                    self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server

    def close(self) -> None:
        for s in self.servers:
            s.shutdown()
            s.server_close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _query(url: str, expr: str) -> float:
    return sum(float(s["value"][1]) for s in instant_query(url, expr, timeout=60))


def _per_rank_figures() -> tuple[list[tuple[str, str, float, bool]], int]:
    """Print what one rank costs (series, bytes, samples); return its template and series."""
    template = rank_template()
    per_rank = len(template)
    one = Targets(template, 1, 1)
    plain = one.body(range(1), 1)
    one.close()
    print(f"series per rank: {per_rank} (a CUDA DDP rank; the monitoring rank adds peer ages)")
    print(f"series per node ({RANKS_PER_NODE} ranks): {per_rank * RANKS_PER_NODE}")
    print(f"scrape bytes per rank: {len(plain)} plain, {len(gzip.compress(plain))} gzip")
    for interval in (1, 15):
        print(
            f"samples/s per rank at {interval} s: {per_rank / interval:.1f}; "
            f"per 100,000 ranks: {per_rank * 100_000 / interval / 1e6:.2f} M/s"
        )
    return template, per_rank


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=2048)
    p.add_argument("--targets", type=int, default=16, help="HTTP targets the ranks are split over")
    p.add_argument("--interval", type=float, default=15.0, help="scrape and rule interval, s")
    p.add_argument("--duration", type=float, default=240.0, help="seconds of scraping")
    p.add_argument("--no-rules", action="store_true", help="raw series only")
    args = p.parse_args(argv)
    if shutil.which("prometheus") is None:
        print("prometheus not found (apt-get install prometheus)", file=sys.stderr)
        return 2

    template, per_rank = _per_rank_figures()

    work = tempfile.mkdtemp(prefix="ddp-capacity-")
    targets = Targets(template, args.ranks, args.targets)
    proc = None
    try:
        rules = os.path.join(work, "rules.yml")
        with open(rules, "w") as f:
            f.write(dump_yaml(shard_rule_groups(DEFAULT)))
        interval = f"{args.interval:g}s"
        config = {
            "global": {
                "scrape_interval": interval,
                "evaluation_interval": interval,
                "scrape_timeout": f"{min(args.interval, 10):g}s",
            },
            "rule_files": [] if args.no_rules else [rules],
            "scrape_configs": [
                {
                    "job_name": DEFAULT.job,
                    "honor_labels": True,
                    "static_configs": [
                        {"targets": [f"127.0.0.1:{s.server_address[1]}" for s in targets.servers]}
                    ],
                }
            ],
        }
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        # Its own metrics too: head series, memory and sample rate are read from them.
        config["scrape_configs"].append(
            {"job_name": "prometheus", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
        )
        cfg = os.path.join(work, "prometheus.yml")
        with open(cfg, "w") as f:
            f.write(dump_yaml(config, with_header=False))
        proc = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={cfg}",
                f"--storage.tsdb.path={work}/data",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        start = time.monotonic()
        while time.monotonic() - start < 60:
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=1):
                    break
            except OSError:
                time.sleep(0.2)
        time.sleep(args.duration)
        raw = _query(url, f'count({{job="{DEFAULT.job}", __name__=~"ddp_.*"}})')
        head = _query(url, "prometheus_tsdb_head_series")
        recorded = _query(url, 'count({__name__=~".+:.+"})')
        rate = _query(url, "rate(prometheus_tsdb_head_samples_appended_total[1m])")
        rss = _query(url, "process_resident_memory_bytes")
        heap = _query(url, "go_memstats_heap_inuse_bytes")
        lag = _query(url, f'max(scrape_duration_seconds{{job="{DEFAULT.job}"}})')
        evals = _query(url, "max(prometheus_rule_group_last_duration_seconds)")
        print(
            f"\n{args.ranks} ranks over {args.targets} targets, every {interval}, "
            f"{args.duration:g} s, rules {'off' if args.no_rules else 'on'}:"
        )
        print(
            f"  raw series {raw:.0f} ({raw / args.ranks:.1f} per rank); recorded {recorded:.0f} "
            f"({recorded / args.ranks:.1f} per rank); head series {head:.0f}"
        )
        print(
            f"  samples appended {rate:.0f}/s; slowest target scrape {lag:.2f} s; "
            f"slowest rule group {evals:.2f} s"
        )
        print(
            f"  resident {rss / 2**20:.0f} MiB, Go heap in use {heap / 2**20:.0f} MiB: "
            f"{rss / head * 1e6 / 2**30:.2f} GiB resident and {heap / head * 1e6 / 2**30:.2f} "
            "GiB heap per million head series"
        )
        print(
            f"series_per_rank={per_rank} recorded_per_rank={recorded / args.ranks:.1f} "
            f"gib_per_million_series={rss / head * 1e6 / 2**30:.2f} "
            f"slowest_group_s={evals:.2f}"
        )
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        targets.close()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
