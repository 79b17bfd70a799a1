"""Time every generated rule and dashboard query on a real Prometheus holding 1024/4096 ranks.

For each rank count: write OpenMetrics text for one run of N CUDA ranks (every series of the
catalog, the ``up`` series, realistic values: rank N//3 straggles in compute, rank 2N//3 hangs
``--hang-before`` before the end, the others then wait inside the allreduce), load it with
``promtool tsdb create-blocks-from openmetrics``, start ``prometheus`` on loopback over it,
backfill the recording rules level by level with ``promtool tsdb create-blocks-from rules``
(rules that read other recorded series need those first), then time through the HTTP API:

* every rule expression of rules.yml as an instant query at two times: before the hang (the
  straggler is visible) and at the end (the hang is visible); a group's time is the sum of its
  rules' times (Prometheus evaluates a group's rules one after another); the worse time wins;
* every dashboard panel target as Grafana sends it: a range query over the data with a 15 s
  step (instant targets: an instant query at the end), ``$run``/``$node``/``$rank`` = All
  (``.*``), ``$__rate_interval`` = 60s, ``$__interval`` = 15s;
* how many alerts the hung job raises: the series each alert expression returns at the end (its
  condition; ``for`` aside). One page per fact: the stalled run is one DDPTrainingStalled, the
  hung rank one DDPCollectiveStalled / DDPCollectiveTimeoutImminent, whatever the rank count.

Times are client wall times of the HTTP request (median of ``--repeats``), JSON decoding of the
answer included; Prometheus's own evalTotalTime is shown beside them.

    python benchmarks/scale.py                       # 1024 and 4096 ranks, 10 min of data
    python benchmarks/scale.py --ranks 4096 --duration 600 --mixin ROOT --verbose
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import IO, Any

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from exporter import catalog as c  # noqa: E402
from exporter.settings import DEFAULT_PEER_SERIES  # noqa: E402
from exporter.tools.promapi import api  # noqa: E402
from exporter.tools.reaper import raise_on_signals  # noqa: E402

GOAL_GROUP_S = 2.0
GOAL_PANEL_S = 1.0
RUN = "bench"
BUCKETS_PER_STEP = 4
BUCKET_BYTES = 25 * 2**20


# -- monitoring files ---------------------------------------------------------------------------
def mixin_files(root: str | None) -> tuple[str, list[str]]:
    """Return (rules.yml, dashboard JSONs) under ``root``/dashboards; default: this checkout's.

    Without committed files there, generate them with ``python -m exporter.mixin generate``.
    """
    root = root or REPO
    rules = os.path.join(root, "dashboards", "prometheus", "rules.yml")
    if not os.path.exists(rules):
        root = tempfile.mkdtemp(prefix="ddp-mixin-")
        rules = os.path.join(root, "dashboards", "prometheus", "rules.yml")
        subprocess.run(
            [sys.executable, "-m", "exporter.mixin", "generate", "--out", root],
            cwd=REPO,
            check=True,
            capture_output=True,
        )
    return rules, sorted(glob.glob(os.path.join(root, "dashboards", "grafana", "*.json")))


# -- synthetic data -----------------------------------------------------------------------------
class Model:
    """Values of every series of rank ``r`` at time ``t`` for one run."""

    def __init__(self, ranks: int, start: float, end: float, hang_before: float) -> None:
        self.ranks = ranks
        self.start, self.end = start, end
        self.t_job = start - 3600.0  # the job started an hour before the data window
        self.t_hang = end - hang_before
        self.straggler = ranks // 3
        self.hung = (2 * ranks) // 3
        self.data, self.opt, self.comm = 0.04, 0.02, 0.05
        self.compute = [
            0.30 * (1 + 0.04 * (((r * 7919) % 101) / 100 - 0.5))
            + (0.25 if r == self.straggler else 0)
            for r in range(ranks)
        ]
        self.step = max(self.data + x for x in self.compute) + self.comm + self.opt

    def steps(self, t: float) -> int:
        return int((min(t, self.t_hang) - self.t_job) / self.step)

    def phases(self, r: int) -> tuple[float, float, float, float]:
        wait = self.step - self.data - self.compute[r] - self.opt
        return self.data, self.compute[r], wait, self.opt

    def coll_latency(self, r: int) -> float:
        # Peers wait for the straggler inside the allreduce; the straggler itself does not.
        return 0.004 if r == self.straggler else self.phases(r)[2] / BUCKETS_PER_STEP + 0.004


def _cum(bounds: tuple[float, ...], value: float, count: int) -> list[int]:
    """Cumulative bucket counts: 90% of observations at ``value``, 10% in the next bucket up."""
    out, i = [], 0
    for b in bounds:
        if b >= value * 1.15:
            out.append(count)
        elif b >= value:
            out.append(count - count // 10)
        else:
            out.append(0)
        i += 1
    return out + [count]


class _Series:
    """Write OpenMetrics families and series, every series sampled at the same ``times``."""

    def __init__(self, f: IO[str], times: list[float], labels: list[str]) -> None:
        self.f, self.times, self.labels = f, times, labels
        self.count = 0

    def family(self, name: str, typ: str) -> None:
        self.f.write(f"# TYPE {name} {typ}\n")

    def series(self, name: str, lab: str, values: list) -> None:
        self.count += 1
        rows = zip(values, self.times)
        self.f.write("".join(f"{name}{{{lab}}} {v} {t:.0f}\n" for v, t in rows))

    def per_rank(self, metric: c.MetricDef, fn: Callable[[int, int, float], Any]) -> None:
        self.family(metric.family, metric.type)
        for r, lab in enumerate(self.labels):
            self.series(metric.name, lab, [fn(r, k, t) for k, t in enumerate(self.times)])


def _identity(w: _Series, m: Model, steps_at: list[int]) -> None:
    """Write ``up``, the ranks' info and their steps."""
    w.family("up", "gauge")
    for r in range(m.ranks):
        w.series("up", w.labels[r], [1] * len(w.times))
    w.family(c.RANK_INFO.family, "info")
    for r in range(m.ranks):
        info = (
            f'backend="nccl",device="cuda",exporter_version="0.1.0",'
            f'inflight_source="flight_recorder",local_rank="{r % 8}",node="node{r // 8:04d}",'
            f'torch_version="2.6.0",world_size="{m.ranks}",python_version="3.11.7",'
            f'cuda_version="12.4",nccl_version="2.21.5"'
        )
        w.series(c.RANK_INFO.name, w.labels[r] + "," + info, [1] * len(w.times))
    w.per_rank(c.STEPS, lambda r, k, t: steps_at[k])


def _steps(w: _Series, m: Model, steps_at: list[int]) -> None:
    """Write the step duration histogram and the step phases."""
    w.family(c.STEP_DURATION.name, "histogram")
    les = [repr(float(b)) for b in c.STEP_BUCKETS] + ["+Inf"]
    for r in range(m.ranks):
        cums = [_cum(c.STEP_BUCKETS, m.step, n) for n in steps_at]
        for i, le in enumerate(les):
            name = c.STEP_DURATION.name + "_bucket"
            w.series(name, f'{w.labels[r]},le="{le}"', [cu[i] for cu in cums])
        total = [f"{n * m.step:.3f}" for n in steps_at]
        w.series(c.STEP_DURATION.name + "_sum", w.labels[r], total)
        w.series(c.STEP_DURATION.name + "_count", w.labels[r], steps_at)
    w.family(c.STEP_PHASE.name, "summary")
    for r in range(m.ranks):
        for phase, per_step in zip(c.PHASES, m.phases(r)):
            lab = f'{w.labels[r]},phase="{phase}"'
            w.series(c.STEP_PHASE.name + "_sum", lab, [f"{n * per_step:.3f}" for n in steps_at])
            w.series(c.STEP_PHASE.name + "_count", lab, steps_at)


def _collectives(w: _Series, m: Model, steps_at: list[int]) -> None:
    """Write the collectives' latency histogram and bytes."""
    w.family(c.COLLECTIVE_DURATION.name, "histogram")
    les = [repr(float(b)) for b in c.COLLECTIVE_BUCKETS] + ["+Inf"]
    for r in range(m.ranks):
        lat = m.coll_latency(r)
        counts = [n * BUCKETS_PER_STEP for n in steps_at]
        cums = [_cum(c.COLLECTIVE_BUCKETS, lat, n) for n in counts]
        lab = f'{w.labels[r]},op="allreduce",pg="0"'
        for i, le in enumerate(les):
            name = c.COLLECTIVE_DURATION.name + "_bucket"
            w.series(name, f'{lab},le="{le}"', [cu[i] for cu in cums])
        w.series(c.COLLECTIVE_DURATION.name + "_sum", lab, [f"{n * lat:.3f}" for n in counts])
        w.series(c.COLLECTIVE_DURATION.name + "_count", lab, counts)
    w.family(c.COLLECTIVE_BYTES.family, "counter")
    for r in range(m.ranks):
        sent = [n * BUCKETS_PER_STEP * BUCKET_BYTES for n in steps_at]
        w.series(c.COLLECTIVE_BYTES.name, f'{w.labels[r]},op="allreduce",pg="0"', sent)


def _inflight(w: _Series, m: Model, steps_at: list[int]) -> None:
    """Write the in-flight collectives: every rank but the hung one enqueues one more."""
    hung_after = [t > m.t_hang for t in w.times]

    def enq(r: int, k: int) -> int:
        base = steps_at[k] * BUCKETS_PER_STEP
        return base + 1 if hung_after[k] and r != m.hung else base

    def age(r: int, k: int, t: float) -> str:
        return f"{t - m.t_hang:.1f}" if hung_after[k] and r != m.hung else "0"

    for metric, fn in (
        (c.LAST_ENQUEUED_SEQ, lambda r, k, t: enq(r, k)),
        (c.LAST_COMPLETED_SEQ, lambda r, k, t: steps_at[k] * BUCKETS_PER_STEP),
        (c.INFLIGHT_AGE, age),
        (c.COLLECTIVE_TIMEOUT, lambda r, k, t: 1800),
    ):
        w.family(metric.family, metric.type)
        for r in range(m.ranks):
            values = [fn(r, k, t) for k, t in enumerate(w.times)]
            w.series(metric.name, w.labels[r] + ',pg="0"', values)


def _health(w: _Series, m: Model) -> None:
    """Write heartbeats, memory, the job's clock and the exporter's errors."""
    w.per_rank(c.HEARTBEAT, lambda r, k, t: f"{min(t, m.t_hang) - 0.2:.1f}")
    w.family(c.PEER_HEARTBEAT_AGE.family, "gauge")
    # Published by the monitoring rank 0 only, at most peer_series of them: here the worst
    # case, as many as allowed (in a larger job only late peers are published).
    for p in range(min(m.ranks, DEFAULT_PEER_SERIES)):
        ages = [f"{(k * 7 + p) % 50 / 10:.1f}" for k in range(len(w.times))]
        w.series(c.PEER_HEARTBEAT_AGE.name, f'{w.labels[0]},peer_rank="{p}"', ages)
    w.per_rank(c.GPU_MEM_ALLOCATED, lambda r, k, t: 30_000_000_000 + r * 4096)
    w.per_rank(c.GPU_MEM_RESERVED, lambda r, k, t: 34_000_000_000)
    w.per_rank(c.GPU_MEM_PEAK, lambda r, k, t: 36_000_000_000)
    w.per_rank(c.GPU_MEM_TOTAL, lambda r, k, t: 85_899_345_920)
    w.per_rank(c.HOST_MEM_RESIDENT, lambda r, k, t: 6_000_000_000 + r * 4096)
    # The job's wall-clock limit and total work: the ETA rules have data.
    w.per_rank(c.JOB_DEADLINE, lambda r, k, t: f"{w.times[-1] + 3600:.0f}")
    w.per_rank(c.JOB_TOTAL_STEPS, lambda r, k, t: 100_000)
    w.family(c.EXPORTER_ERRORS.family, "counter")
    for r in range(m.ranks):
        for where in c.ERROR_WHERE:
            lab = f'{w.labels[r]},where="{where}"'
            w.series(c.EXPORTER_ERRORS.name, lab, [0] * len(w.times))


def write_openmetrics(path: str, m: Model, interval: float) -> int:
    """Write the run's series to ``path``; return the number of series."""
    times = []
    t = m.start
    while t <= m.end + 1e-9:
        times.append(t)
        t += interval
    labels = [
        f'instance="node{r // 8:04d}:{19400 + r % 8}",job="ddp",rank="{r}",run="{RUN}"'
        for r in range(m.ranks)
    ]
    steps_at = [m.steps(t) for t in times]
    with open(path, "w", buffering=1 << 22) as f:
        w = _Series(f, times, labels)
        _identity(w, m, steps_at)
        _steps(w, m, steps_at)
        _collectives(w, m, steps_at)
        _inflight(w, m, steps_at)
        _health(w, m)
        f.write("# EOF\n")
    return w.count


# -- Prometheus -----------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    """A prometheus process over ``data`` on a loopback port (no scrape targets)."""

    def __init__(self, workdir: str, data: str) -> None:
        self.workdir, self.data = workdir, data
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self) -> None:
        cfg = os.path.join(self.workdir, "prometheus.yml")
        with open(cfg, "w") as f:
            f.write("global:\n  scrape_interval: 15s\n  evaluation_interval: 15s\n")
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={cfg}",
                f"--storage.tsdb.path={self.data}",
                "--storage.tsdb.retention.time=3650d",
                f"--web.listen-address=127.0.0.1:{port}",
                "--query.max-samples=500000000",
                "--query.timeout=5m",
                "--log.level=warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(self.workdir, "prometheus.log"), "a"),  # noqa: SIM115
            start_new_session=True,
        )
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited; see {self.workdir}/prometheus.log")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise RuntimeError("prometheus not ready after 300 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def query(self, expr: str, at: float | None = None, rng: tuple | None = None) -> tuple:
        """Run a query; return (wall s, result count, evalTotalTime s or None)."""
        params = {"query": expr, "stats": "all"}
        if rng is None:
            path = "/api/v1/query"
            params["time"] = f"{at:.3f}"
        else:
            path = "/api/v1/query_range"
            params.update(start=f"{rng[0]:.3f}", end=f"{rng[1]:.3f}", step=f"{rng[2]:g}")
        t0 = time.perf_counter()
        try:
            data = api(self.url, path, params, timeout=600, post=True)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}: {expr}") from None
        wall = time.perf_counter() - t0
        result = data["result"]
        n = len(result) if isinstance(result, list) else 1
        ev = data.get("stats", {}).get("timings", {}).get("evalTotalTime")
        return wall, n, ev


# -- rules --------------------------------------------------------------------------------------
def rule_levels(groups: list[dict]) -> list[list[dict]]:
    """Split recording rules into levels: level k reads only raw or lower-level recorded series."""
    recs = [r for g in groups for r in g.get("rules", []) if "record" in r]
    names = {r["record"] for r in recs}
    level: dict[str, int] = {}

    def refs(expr: str) -> set[str]:
        return {n for n in names if re.search(rf"(?<![\w:]){re.escape(n)}(?![\w:])", expr)}

    pending = list(recs)
    while pending:
        progressed = False
        for r in list(pending):
            deps = refs(r["expr"]) - {r["record"]}
            if all(d in level for d in deps):
                level[r["record"]] = 1 + max((level[d] for d in deps), default=-1)
                pending.remove(r)
                progressed = True
        if not progressed:
            raise RuntimeError(f"cyclic recording rules: {[r['record'] for r in pending]}")
    out: list[list[dict]] = [[] for _ in range(max(level.values(), default=-1) + 1)]
    for r in recs:
        out[level[r["record"]]].append(r)
    return out


def backfill(prom: Prometheus, levels: list[list[dict]], m: Model, interval: float) -> float:
    """Backfill recorded series level by level; return seconds spent."""
    t0 = time.perf_counter()
    for i, rules in enumerate(levels):
        path = os.path.join(prom.workdir, f"level{i}.yml")
        with open(path, "w") as f:
            yaml.safe_dump({"groups": [{"name": f"level{i}", "rules": rules}]}, f)
        out = os.path.join(prom.workdir, f"backfill{i}")
        subprocess.run(
            [
                "promtool",
                "tsdb",
                "create-blocks-from",
                "rules",
                "--quiet",
                f"--url={prom.url}",
                f"--start={int(m.start)}",
                f"--end={int(m.end) + 1}",
                f"--eval-interval={int(interval)}s",
                f"--output-dir={out}",
                path,
            ],
            check=True,
            capture_output=True,
        )
        prom.stop()
        for block in glob.glob(os.path.join(out, "*", "meta.json")):
            shutil.move(os.path.dirname(block), prom.data)
        prom.start()
    return time.perf_counter() - t0


# -- dashboards ---------------------------------------------------------------------------------
def panel_targets(paths: list[str]) -> list[tuple[str, str, str, bool]]:
    """Return (dashboard, panel title, expr, instant) for every panel target."""
    out = []

    def walk(dash: str, panels: list) -> None:
        for p in panels:
            walk(dash, p.get("panels", []))
            for t in p.get("targets", []):
                if t.get("expr"):
                    out.append((dash, p.get("title", ""), t["expr"], bool(t.get("instant"))))

    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        walk(os.path.basename(path)[: -len(".json")], doc.get("panels", []))
    return out


def substitute(expr: str, step: float) -> str:
    """Replace Grafana's template variables the way an 'All' selection sends them."""
    rate = f"{int(max(4 * 15, step + 15))}s"
    for var, val in (
        ("$__rate_interval", rate),
        ("${__rate_interval}", rate),
        ("$__interval", f"{int(step)}s"),
        ("${__interval}", f"{int(step)}s"),
        ("$__range", "10m"),
    ):
        expr = expr.replace(var, val)
    return re.sub(r"\$\{?(cluster|run|node|rank|datasource|job|instance)\}?", ".*", expr)


# -- main -----------------------------------------------------------------------------------------
def _timed(prom: Prometheus, expr: str, repeats: int, **kw) -> tuple[float, int, float | None]:
    runs = [prom.query(expr, **kw) for _ in range(repeats)]
    wall = statistics.median(r[0] for r in runs)
    ev = [r[2] for r in runs if r[2] is not None]
    return wall, runs[-1][1], statistics.median(ev) if ev else None


def bench(ranks: int, args: argparse.Namespace, rules_path: str, dash_paths: list[str]) -> dict:
    work = tempfile.mkdtemp(prefix=f"ddp-scale-{ranks}-", dir=args.workdir)
    data = os.path.join(work, "data")
    os.makedirs(data)
    end = (time.time() // args.interval) * args.interval - 60
    m = Model(ranks, end - args.duration, end, args.hang_before)
    t0 = time.perf_counter()
    om = os.path.join(work, "data.om")
    n_series = write_openmetrics(om, m, args.interval)
    t_gen = time.perf_counter() - t0
    size = os.path.getsize(om)
    t0 = time.perf_counter()
    subprocess.run(
        ["promtool", "tsdb", "create-blocks-from", "openmetrics", "--quiet", om, data],
        check=True,
        capture_output=True,
    )
    t_load = time.perf_counter() - t0
    os.remove(om)
    samples = n_series * (int(args.duration / args.interval) + 1)
    print(
        f"\n== {ranks} ranks: {n_series} series, {samples / 1e6:.1f} M samples "
        f"({size / 2**20:.0f} MiB OpenMetrics, written in {t_gen:.0f} s, loaded by promtool in "
        f"{t_load:.0f} s); straggler rank {m.straggler}, hung rank {m.hung} from "
        f"{args.hang_before:.0f} s before the end"
    )
    with open(rules_path) as f:
        groups = yaml.safe_load(f)["groups"]
    prom = Prometheus(work, data)
    prom.start()
    result = {"ranks": ranks, "groups": [], "panels": [], "alerts": {}}
    try:
        t_bf = backfill(prom, rule_levels(groups), m, args.interval)
        print(f"recording rules backfilled in {t_bf:.0f} s")
        before, at_end = m.t_hang - args.interval, m.end
        print(f"{'rule group / rule':<64} {'wall s':>7} {'eval s':>7} {'series':>13}")
        for g in groups:
            total_w, total_e, lines = 0.0, 0.0, []
            for r in g.get("rules", []):
                name = r.get("record") or r.get("alert")
                w1, n1, e1 = _timed(prom, r["expr"], args.repeats, at=before)
                w2, n2, e2 = _timed(prom, r["expr"], args.repeats, at=at_end)
                total_w += max(w1, w2)
                total_e += max(e1 or 0.0, e2 or 0.0)
                lines.append(
                    f"  {name:<62} {max(w1, w2):7.3f} {max(e1 or 0, e2 or 0):7.3f} {n1:>6}/{n2:<6}"
                )
                if "alert" in r:
                    result["alerts"][name] = result["alerts"].get(name, 0) + n2
            ok = "ok" if total_w < GOAL_GROUP_S else "SLOW"
            print(f"{g['name']:<64} {total_w:7.3f} {total_e:7.3f} {'':>13} {ok}")
            if args.verbose or ok == "SLOW":
                print("\n".join(lines))
            result["groups"].append((g["name"], total_w))
        step = float(args.interval)
        rng = (m.start, m.end, step)
        print(
            f"{'dashboard / panel (range query, 15 s step)':<64} {'wall s':>7} {'eval s':>7} {'series':>6}"
        )
        for dash, title, expr, instant in panel_targets(dash_paths):
            q = substitute(expr, step)
            kw = {"at": at_end} if instant else {"rng": rng}
            w, n, e = _timed(prom, q, args.repeats, **kw)
            ok = "ok" if w < GOAL_PANEL_S else "SLOW"
            print(f"{(dash + ' / ' + title)[:64]:<64} {w:7.3f} {e or 0:7.3f} {n:>6} {ok}")
            result["panels"].append((f"{dash} / {title}", w))
        raised = ", ".join(f"{name} {n}" for name, n in sorted(result["alerts"].items()) if n)
        print(f"alerts the hung job raises at {ranks} ranks (series per alert): {raised}")
    finally:
        prom.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[1024, 4096])
    p.add_argument("--duration", type=float, default=600.0, help="seconds of data")
    p.add_argument("--interval", type=float, default=15.0, help="scrape interval of the data, s")
    p.add_argument(
        "--hang-before", type=float, default=180.0, help="hang starts this long before the end"
    )
    p.add_argument("--repeats", type=int, default=3, help="runs per query (median)")
    p.add_argument(
        "--mixin",
        default=None,
        help="root holding dashboards/ (default: this checkout; `python -m exporter.mixin generate --out ROOT` writes one)",
    )
    p.add_argument("--workdir", default=None, help="where to put the TSDBs (default: $TMPDIR)")
    p.add_argument("--keep", action="store_true", help="keep the TSDB directories")
    p.add_argument("--verbose", action="store_true", help="print every rule's time")
    args = p.parse_args(argv)
    raise_on_signals()  # SIGTERM/SIGHUP run the finally blocks that stop Prometheus
    for tool in ("promtool", "prometheus"):
        if shutil.which(tool) is None:
            print(f"{tool} not found (Debian: apt-get install prometheus)", file=sys.stderr)
            return 2
    rules_path, dash_paths = mixin_files(args.mixin)
    print(f"rules {rules_path}; {len(dash_paths)} dashboards; {os.cpu_count()} CPUs")
    t0 = time.perf_counter()
    results = [bench(n, args, rules_path, dash_paths) for n in args.ranks]
    print(f"\nsummary (goal: rule group < {GOAL_GROUP_S} s, panel < {GOAL_PANEL_S} s)")
    for r in results:
        g_name, g_s = max(r["groups"], key=lambda x: x[1])
        p_name, p_s = max(r["panels"], key=lambda x: x[1])
        print(
            f"  {r['ranks']:>5} ranks: slowest group {g_name} {g_s:.3f} s; slowest panel {p_name} {p_s:.3f} s"
        )
    worst = results[-1]
    print(f"total {time.perf_counter() - t0:.0f} s")
    print(
        f"scale_worst_group_s={max(x[1] for x in worst['groups']):.3f} "
        f"scale_worst_panel_s={max(x[1] for x in worst['panels']):.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
