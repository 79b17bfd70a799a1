"""Show every rank of a run in one terminal table, the outlier highlighted with its reason.

Reads the ranks' own endpoints (no Prometheus or Grafana needed: useful over ssh during an
incident), or one run's series from a Prometheus server. Rates come from two consecutive reads, so the first table after start shows
totals since the job began. Sorts by badness and shows the worst N, so thousands of ranks fit.
"""

from __future__ import annotations

import json
import statistics
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from . import catalog as c

__all__ = ["RankRow", "fetch", "fetch_prometheus", "diagnose", "render"]

_STRAGGLER_FACTOR = 1.5


@dataclass
class RankRow:
    """What one rank's endpoint says, reduced to the figures ``top`` shows."""

    target: str
    rank: int = -1
    up: bool = False
    steps: float = 0.0
    step_sum: float = 0.0
    phase_sum: dict[str, float] = field(default_factory=dict)
    coll_sum: float = 0.0
    coll_count: float = 0.0
    enqueued: float = 0.0
    inflight_age: float = 0.0
    timeout: float = 0.0
    heartbeat: float = 0.0
    memory: float = 0.0
    # Derived by diagnose():
    step_time: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)
    coll_latency: float = 0.0
    seq_lag: float = 0.0
    verdict: str = ""


def _read(target: str, timeout: float) -> RankRow:
    row = RankRow(target)
    url = target if "://" in target else f"http://{target}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            text = resp.read().decode()
    except OSError:
        return row
    row.up = True
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            _apply(row, s.name, s.labels, s.value)
    return row


def _apply(row: RankRow, n: str, labels: dict[str, str], v: float) -> None:
    """Fold one sample into ``row``."""
    if "rank" in labels and row.rank < 0:
        row.rank = int(labels["rank"])
    if n == c.STEPS.name:
        row.steps = v
    elif n == c.STEP_DURATION.name + "_sum":
        row.step_sum = v
    elif n == c.STEP_PHASE.name + "_sum":
        row.phase_sum[labels["phase"]] = v
    elif n == c.COLLECTIVE_DURATION.name + "_sum":
        row.coll_sum += v
    elif n == c.COLLECTIVE_DURATION.name + "_count":
        row.coll_count += v
    elif n == c.LAST_ENQUEUED_SEQ.name:
        row.enqueued = max(row.enqueued, v)
    elif n == c.INFLIGHT_AGE.name:
        row.inflight_age = max(row.inflight_age, v)
    elif n == c.COLLECTIVE_TIMEOUT.name:
        row.timeout = max(row.timeout, v)
    elif n == c.HEARTBEAT.name:
        row.heartbeat = v
    elif n == c.GPU_MEM_ALLOCATED.name or (n == c.HOST_MEM_RESIDENT.name and not row.memory):
        row.memory = v


_PROM_NAMES = (
    c.STEPS.name,
    c.STEP_DURATION.name + "_sum",
    c.STEP_PHASE.name + "_sum",
    c.COLLECTIVE_DURATION.name + "_sum",
    c.COLLECTIVE_DURATION.name + "_count",
    c.LAST_ENQUEUED_SEQ.name,
    c.INFLIGHT_AGE.name,
    c.COLLECTIVE_TIMEOUT.name,
    c.HEARTBEAT.name,
    c.GPU_MEM_ALLOCATED.name,
    c.HOST_MEM_RESIDENT.name,
)


def fetch_prometheus(url: str, run: str, timeout: float = 5.0) -> list[RankRow]:
    """Read one run's ranks from Prometheus with two queries (works for thousands of ranks)."""

    def query(expr: str) -> list[dict]:
        q = urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(f"{url.rstrip('/')}/api/v1/query?{q}", timeout=timeout) as r:
            body = json.loads(r.read())
        if body.get("status") != "success":
            raise RuntimeError(f"Prometheus query failed: {body.get('error', body)}")
        return body["data"]["result"]

    run_sel = f'run="{run}"'
    rows: dict[str, RankRow] = {}
    for s in query(f'{{__name__=~"{"|".join(_PROM_NAMES)}", {run_sel}}}'):
        lab = s["metric"]
        key = f"rank {lab.get('rank', '?')}"
        row = rows.setdefault(key, RankRow(key, up=True))
        _apply(row, lab["__name__"], lab, float(s["value"][1]))
    for s in query(f"up{{{run_sel}}}"):
        lab = s["metric"]
        key = f"rank {lab.get('rank', '?')}"
        row = rows.setdefault(key, RankRow(key))
        if lab.get("rank", "").isdigit():
            row.rank = int(lab["rank"])
        row.up = float(s["value"][1]) == 1.0
    return sorted(rows.values(), key=lambda r: r.rank)


def fetch(targets: list[str], timeout: float = 2.0) -> list[RankRow]:
    """Read every target concurrently; an unreachable one comes back with ``up=False``."""
    with ThreadPoolExecutor(max_workers=min(32, max(1, len(targets)))) as pool:
        return list(pool.map(lambda t: _read(t, timeout), targets))


def diagnose(rows: list[RankRow], previous: dict[str, RankRow] | None = None) -> list[RankRow]:
    """Fill in per-step figures (over the interval since ``previous``) and each verdict."""
    previous = previous or {}
    for r in rows:
        p = previous.get(r.target)
        if r.rank < 0 and p is not None:
            r.rank = p.rank  # a rank that went down keeps its number
        steps = r.steps - (p.steps if p else 0.0)
        if steps > 0:
            r.step_time = (r.step_sum - (p.step_sum if p else 0.0)) / steps
            r.phases = {
                k: (v - (p.phase_sum.get(k, 0.0) if p else 0.0)) / steps
                for k, v in r.phase_sum.items()
            }
        n = r.coll_count - (p.coll_count if p else 0.0)
        if n > 0:
            r.coll_latency = (r.coll_sum - (p.coll_sum if p else 0.0)) / n
    live = [r for r in rows if r.up]
    top_seq = max((r.enqueued for r in live), default=0.0)
    stuck = any(r.inflight_age > 0 for r in live)
    for key in ("compute", "data"):
        values = [r.phases.get(key, 0.0) for r in live if r.phases]
        med = statistics.median(values) if values else 0.0
        for r in live:
            v = r.phases.get(key, 0.0)
            if med > 0 and v > _STRAGGLER_FACTOR * med and v - med > 0.005 and not r.verdict:
                r.verdict = f"straggler: {key} {v * 1e3:.0f} ms vs median {med * 1e3:.0f} ms"
    for r in rows:
        if not r.up:
            r.verdict = "DOWN: endpoint unreachable"
            continue
        r.seq_lag = top_seq - r.enqueued
        if stuck and r.seq_lag > 0:
            r.verdict = f"HUNG: {r.seq_lag:.0f} collectives behind, never entered"
    return rows


def _badness(r: RankRow) -> tuple:
    order = 0 if r.verdict.startswith("DOWN") else 1 if r.verdict.startswith("HUNG") else 2
    return (order if r.verdict else 3, -r.phases.get("compute", 0.0), r.rank)


def render(
    rows: list[RankRow], worst: int = 20, now: float | None = None, color: bool = False
) -> str:
    """Format the table, worst ranks first, at most ``worst`` rows."""
    now = time.time() if now is None else now
    head = (
        f"{'rank':>5} {'step ms':>8} {'data':>7} {'compute':>8} {'comm_wt':>8} {'optim':>7} "
        f"{'coll ms':>8} {'inflight/timeout':>17} {'seq lag':>7} {'hb age':>7} {'mem MiB':>8}  verdict"
    )
    lines = [head]
    shown = sorted(rows, key=_badness)[:worst]
    for r in shown:
        ph = r.phases
        hb = f"{now - r.heartbeat:6.1f}s" if r.heartbeat else "      -"
        line = (
            f"{r.rank if r.rank >= 0 else '?':>5} {r.step_time * 1e3:8.1f} "
            f"{ph.get('data', 0) * 1e3:7.1f} {ph.get('compute', 0) * 1e3:8.1f} "
            f"{ph.get('comm_wait', 0) * 1e3:8.1f} {ph.get('optimizer', 0) * 1e3:7.1f} "
            f"{r.coll_latency * 1e3:8.2f} {r.inflight_age:7.1f}/{r.timeout:<9.0f} "
            f"{r.seq_lag:7.0f} {hb:>7} {r.memory / 2**20:8.0f}  {r.verdict}"
        )
        if color and r.verdict:
            line = f"\x1b[1;31m{line}\x1b[0m"
        lines.append(line)
    if len(rows) > len(shown):
        lines.append(f"... {len(rows) - len(shown)} more ranks (healthiest hidden)")
    return "\n".join(lines)
