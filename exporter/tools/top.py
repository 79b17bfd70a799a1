"""Show every rank of a run in one terminal table, the outlier highlighted with its reason.

Reads the ranks' own endpoints (no Prometheus or Grafana needed: useful over ssh during an
incident), or one run's series from a Prometheus server. Per-step figures cover the interval
since the previous read (from endpoints) or the last rate window (from Prometheus). Sorts by
badness and shows the worst N, so thousands of ranks fit.

Verdicts follow the same definitions as the generated alerts: a straggler by compute or data
time per step (:class:`~exporter.mixin.config.MixinConfig` thresholds: pass the config the rules
were generated with), a hang by :mod:`exporter.hangs.definition`. Every accusation (DOWN, HUNG,
straggler) must hold in two consecutive reads, as an alert must hold for its ``for`` duration:
one slow scrape or one odd interval accuses nobody.

The job's edges accuse nobody either: a rank inside a declared section within its deadline
(``exporter.deadline``) and the ranks waiting for it get a note, not a verdict; a rank that
ended cleanly (``ddp_finished_timestamp_seconds`` in its last read) is ``finished``, not DOWN.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .. import catalog as c
from ..hangs.definition import SeqState, find_hangs
from ..mixin.cluster import cluster_matcher
from ..mixin.config import DEFAULT, MixinConfig, duration_seconds, load_config
from ..ranklist import format_ranks
from .promapi import instant_query

__all__ = [
    "ACCUSATIONS",
    "RankRow",
    "accuses",
    "add_parser",
    "diagnose",
    "fetch",
    "fetch_prometheus",
    "render",
    "restart_line",
    "run",
]


@dataclass
class RankRow:
    """What one rank says, reduced to the figures ``top`` shows."""

    target: str
    rank: int = -1
    up: bool = False
    # Totals since the rank started (counters as read).
    steps: float = 0.0
    step_sum: float = 0.0
    phase_sum: dict[str, float] = field(default_factory=dict)
    coll_sum: float = 0.0
    coll_count: float = 0.0
    # Per process group: last enqueued sequence number, oldest in-flight age, timeout.
    pg_seq: dict[str, float] = field(default_factory=dict)
    pg_age: dict[str, float] = field(default_factory=dict)
    pg_timeout: dict[str, float] = field(default_factory=dict)
    heartbeat: float = 0.0
    #: The last store heartbeat's round trip, seconds (-1: not published).
    store_rtt: float = -1.0
    #: The machine the rank runs on (``ddp_rank_info``'s node).
    node: str = ""
    memory: float = 0.0
    #: Declared sections running on the rank: name -> (Unix start, deadline seconds).
    sections: dict[str, tuple[float, float]] = field(default_factory=dict)
    section_deadline: dict[str, float] = field(default_factory=dict)
    #: Unix time the rank ended cleanly (0: it has not).
    finished: float = 0.0
    #: Which attempt of the run the rank is (torchrun's restart, Slurm's requeue count).
    attempt: str = ""
    #: Monitoring rank with on_hang="abort": aborts in a row without progress, their limit
    #: (-1: not published) and the aborted attempts ``(attempt, culprit rank, node, step)``.
    abort_streak: float = -1.0
    abort_limit: float = -1.0
    aborted_attempts: list[tuple[str, str, str, float]] = field(default_factory=list)
    #: Increases over a window, when the source computed them (Prometheus); None: diagnose()
    #: takes the difference to the previous read.
    window: dict[str, float] | None = None
    # Derived by diagnose():
    step_time: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)
    coll_latency: float = 0.0
    seq_lag: float = 0.0
    #: What this read alone suggests ("down", "behind", "stuck", "straggler:<phase>"); an
    #: accusation needs the same suspicion in the previous read too.
    suspect: str = ""
    verdict: str = ""
    note: str = ""

    def in_section(self, now: float) -> str:
        """Return a declared section the rank runs within its deadline at ``now``, else ""."""
        for name, (started, deadline) in sorted(self.sections.items()):
            if now - started <= deadline:
                return name
        return ""

    @property
    def enqueued(self) -> float:
        """Return the highest last-enqueued sequence number over process groups."""
        return max(self.pg_seq.values(), default=0.0)

    @property
    def inflight_age(self) -> float:
        """Return the oldest in-flight age over process groups."""
        return max(self.pg_age.values(), default=0.0)

    @property
    def timeout(self) -> float:
        """Return the largest collective timeout over process groups."""
        return max(self.pg_timeout.values(), default=0.0)


def _read(target: str, timeout: float) -> RankRow:
    row = RankRow(target)
    url = target if "://" in target else f"http://{target}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            text = resp.read().decode()
    except OSError:
        return row
    row.up = True
    # Imported here: a command line that never reads an endpoint starts without it.
    from prometheus_client.parser import text_string_to_metric_families

    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            _apply(row, s.name, s.labels, s.value)
    return row


#: Cumulative samples whose increase gives the per-step figures.
_COUNTERS = (
    c.STEPS.name,
    c.STEP_DURATION.name + "_sum",
    c.STEP_PHASE.name + "_sum",
    c.COLLECTIVE_DURATION.name + "_sum",
    c.COLLECTIVE_DURATION.name + "_count",
)


def _counter_key(n: str, labels: dict[str, str]) -> str:
    return f"{n}:{labels['phase']}" if n == c.STEP_PHASE.name + "_sum" else n


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
        row.pg_seq[labels.get("pg", "")] = v
    elif n == c.INFLIGHT_AGE.name:
        row.pg_age[labels.get("pg", "")] = v
    elif n == c.COLLECTIVE_TIMEOUT.name:
        row.pg_timeout[labels.get("pg", "")] = v
    elif n == c.HEARTBEAT.name:
        row.heartbeat = v
    elif n == c.STORE_ROUND_TRIP.name:
        row.store_rtt = v
    elif n == c.GPU_MEM_ALLOCATED.name or (n == c.HOST_MEM_RESIDENT.name and not row.memory):
        row.memory = v
    elif n == c.SECTION_STARTED.name:
        name = labels.get("section", "")
        row.sections[name] = (v, row.section_deadline.get(name, float("inf")))
    elif n == c.SECTION_DEADLINE.name:
        name = labels.get("section", "")
        row.section_deadline[name] = v
        if name in row.sections:
            row.sections[name] = (row.sections[name][0], v)
    elif n == c.FINISHED.name:
        row.finished = v
    elif n == c.RANK_INFO.name:
        row.attempt = labels.get("attempt", row.attempt)
        row.node = labels.get("node", row.node)
    elif n == c.HANG_ABORT_STREAK.name:
        row.abort_streak = v
    elif n == c.HANG_ABORT_LIMIT.name:
        row.abort_limit = v
    elif n == c.HANG_ABORTED_ATTEMPT.name:
        row.aborted_attempts.append(
            (labels.get("attempt", ""), labels.get("culprit_rank", ""), labels.get("node", ""), v)
        )


_PROM_NAMES = (
    *_COUNTERS,
    c.LAST_ENQUEUED_SEQ.name,
    c.INFLIGHT_AGE.name,
    c.COLLECTIVE_TIMEOUT.name,
    c.HEARTBEAT.name,
    c.GPU_MEM_ALLOCATED.name,
    c.HOST_MEM_RESIDENT.name,
    c.SECTION_DEADLINE.name,
    c.SECTION_STARTED.name,
    c.RANK_INFO.name,
    c.HANG_ABORT_STREAK.name,
    c.HANG_ABORT_LIMIT.name,
    c.HANG_ABORTED_ATTEMPT.name,
)


def fetch_prometheus(
    url: str,
    run: str,
    timeout: float = 5.0,
    window: str = DEFAULT.rate_window,
    *,
    cluster: str = "",
    config: MixinConfig = DEFAULT,
) -> list[RankRow]:
    """Read one run's ranks from Prometheus with six or seven queries (any number of ranks).

    Per-step figures come from the increase over ``window`` (the alerts' rate window by
    default), so each table stands on its own whatever the scrape and refresh intervals.
    ``cluster`` picks the run of that cluster (``config.cluster_label``); a run name found in
    several clusters without it is an error, never two runs merged.
    """

    def query(expr: str) -> list[dict]:
        return instant_query(url, expr, timeout)

    quoted = run.replace("\\", "\\\\").replace('"', '\\"')
    run_sel = ", ".join(m for m in (f'run="{quoted}"', cluster_matcher(config, cluster)) if m)
    if config.cluster_label and not cluster:
        label = config.cluster_label
        found = query(f"count by ({label}) ({c.RANK_INFO.name}{{{run_sel}}})")
        clusters = sorted(s["metric"].get(label, "") for s in found)
        if len(clusters) > 1:
            raise RuntimeError(
                f"run {run!r} is in {len(clusters)} clusters ({', '.join(clusters)}): "
                f"choose one with --cluster"
            )
    rows: dict[str, RankRow] = {}

    def row_of(lab: dict[str, str]) -> RankRow:
        key = f"rank {lab.get('rank', '?')}"
        row = rows.setdefault(key, RankRow(key, up=True, window={}))
        if lab.get("rank", "").isdigit():
            row.rank = int(lab["rank"])
        return row

    for s in query(f'{{__name__=~"{"|".join(_PROM_NAMES)}", {run_sel}}}'):
        lab = s["metric"]
        _apply(row_of(lab), lab["__name__"], lab, float(s["value"][1]))
    # increase() drops the metric name: carry it over in a label of its own.
    increases = " or ".join(
        f"label_replace(sum by (rank, phase) (increase({n}{{{run_sel}}}[{window}])), "
        f'"counter", "{n}", "", "")'
        for n in _COUNTERS
    )
    for s in query(increases):
        lab = s["metric"]
        window_row = row_of(lab).window
        assert window_row is not None
        key = _counter_key(lab["counter"], lab)
        window_row[key] = float(s["value"][1])
    # The store round trip's median over the window, as the rules take it: one beat is noisy.
    trip = f"{c.STORE_ROUND_TRIP.name}{{{run_sel}}}"
    for s in query(f"max by (rank) (quantile_over_time(0.5, {trip}[{window}]))"):
        row_of(s["metric"]).store_rtt = float(s["value"][1])
    for s in query(f"up{{{run_sel}}}"):
        row_of(s["metric"]).up = float(s["value"][1]) == 1.0
    # A rank that went down has no fresh series: its node from its last info over the window.
    for s in query(f"last_over_time({c.RANK_INFO.name}{{{run_sel}}}[{window}])"):
        row = row_of(s["metric"])
        row.node = row.node or s["metric"].get("node", "")
    # A clean end is in the rank's final scrapes only: look back over the window.
    for s in query(f"last_over_time({c.FINISHED.name}{{{run_sel}}}[{window}])"):
        row_of(s["metric"]).finished = float(s["value"][1])
    return sorted(rows.values(), key=lambda r: r.rank)


def fetch(targets: list[str], timeout: float = 2.0) -> list[RankRow]:
    """Read every target concurrently; an unreachable one comes back with ``up=False``."""
    with ThreadPoolExecutor(max_workers=min(32, max(1, len(targets)))) as pool:
        return list(pool.map(lambda t: _read(t, timeout), targets))


def _increases(r: RankRow, p: RankRow | None) -> dict[str, float]:
    """Return the counters' increases since ``p`` (or over the source's window)."""
    if r.window is not None:
        return r.window
    now = {c.STEPS.name: r.steps, _COUNTERS[1]: r.step_sum, _COUNTERS[3]: r.coll_sum,
           _COUNTERS[4]: r.coll_count}  # fmt: skip
    for phase, v in r.phase_sum.items():
        now[f"{_COUNTERS[2]}:{phase}"] = v
    if p is None or not p.up:
        return now
    before = _increases(p, None)
    return {k: v - before.get(k, 0.0) for k, v in now.items()}


def _normal_latency(rows: list[RankRow]) -> float | None:
    """Return the run's mean collective latency since the ranks started (None: none yet)."""
    total = sum(r.coll_sum for r in rows)
    count = sum(r.coll_count for r in rows)
    return total / count if count > 0 else None


def diagnose(
    rows: list[RankRow],
    previous: dict[str, RankRow] | None = None,
    *,
    config: MixinConfig = DEFAULT,
    now: float | None = None,
) -> list[RankRow]:
    """Fill in per-step figures and each verdict; ``previous`` is the last read, by target.

    A suspicion becomes a verdict only when the previous read held the same suspicion.
    Strongest first: DOWN, HUNG (behind in a stalled collective), straggler; a weaker
    signal never replaces a stronger one. ``STUCK`` (every rank inside a stalled collective,
    nobody behind) and "waiting" notes describe the job and accuse no rank; nor do a declared
    section within its deadline (on the rank or on the ranks it holds up) and a clean end
    (``finished``).
    """
    previous = previous or {}
    now = time.time() if now is None else now
    straggler_ratio = config.straggler_ratio
    straggler_min_excess = config.straggler_min_excess_seconds
    policy = config.hang_policy
    for r in rows:
        p = previous.get(r.target)
        if r.rank < 0 and p is not None:
            r.rank = p.rank  # a rank that went down keeps its number
        if not r.node and p is not None:
            r.node = p.node  # a rank that went down keeps its node
        if not r.finished and p is not None and p.finished:
            r.finished = p.finished  # its clean end was in its last read before it left
        inc = _increases(r, p)
        steps = inc.get(c.STEPS.name, 0.0)
        if steps > 0:
            r.step_time = inc.get(_COUNTERS[1], 0.0) / steps
            prefix = _COUNTERS[2] + ":"
            r.phases = {k[len(prefix) :]: v / steps for k, v in inc.items() if k.startswith(prefix)}
        n = inc.get(_COUNTERS[4], 0.0)
        if n > 0:
            r.coll_latency = inc.get(_COUNTERS[3], 0.0) / n
    live = [r for r in rows if r.up and not r.finished]

    # Hangs, by the one definition shared with the alert rules and the hang watcher.
    states = [
        SeqState(
            r.rank, pg, seq, r.pg_age.get(pg, 0.0), r.pg_timeout.get(pg), bool(r.in_section(now))
        )
        for r in live
        for pg, seq in r.pg_seq.items()
    ]
    findings = find_hangs(states, _normal_latency(live), policy)
    by_rank = {r.rank: r for r in live}
    # A group stalled with nobody behind while another has a rank behind is held up by that
    # hang (a 2-D mesh): its ranks wait, they are not a job-wide STUCK of their own.
    culprit_pgs = sorted({f.pg for f in findings if f.kind == "behind"})
    for f in findings:
        for rank in f.behind:
            by_rank[rank].suspect = "behind"
            by_rank[rank].note = (
                f"{f.seq - by_rank[rank].pg_seq.get(f.pg, 0.0):.0f} collectives behind in pg "
                f"{f.pg}: never entered #{f.seq:.0f}, which ranks {_ranks(f.waiting)} "
                f"wait in for {f.age:.0f} s"
            )
        for rank in f.excused:
            r = by_rank[rank]
            name = r.in_section(now)
            started, deadline = r.sections.get(name, (now, 0.0))
            r.note = f"in section {name} for {now - started:.0f} s of {deadline:.0f} s"
        for rank in f.waiting:
            r = by_rank[rank]
            if f.kind == "behind":
                r.note = f"waiting for rank(s) {_ranks(f.behind)} in pg {f.pg} for {f.age:.0f} s"
            elif f.kind == "section":
                if rank not in f.excused:
                    r.note = (
                        f"waiting for rank(s) {_ranks(f.excused)} in a declared section, pg "
                        f"{f.pg}, {f.age:.0f} s"
                    )
            elif f.kind == "waiting" and culprit_pgs:
                r.note = r.note or (
                    f"waiting in pg {f.pg} for {f.age:.0f} s, held up by the hang in pg "
                    f"{', '.join(culprit_pgs)}"
                )
            else:
                r.suspect = r.suspect or "stuck"
                r.note = (
                    f"inside collective #{f.seq:.0f} of pg {f.pg} for {f.age:.0f} s, no rank behind"
                )

    # Stragglers, by compute and data time per step (never by collective latency).
    for key in ("compute", "data"):
        values = [r.phases.get(key, 0.0) for r in live if r.phases]
        med = statistics.median(values) if values else 0.0
        for r in live:
            v = r.phases.get(key, 0.0)
            if med > 0 and v > straggler_ratio * med and v - med > straggler_min_excess:
                if not r.suspect:
                    r.suspect = f"straggler:{key}"
                    r.note = f"{key} {v * 1e3:.0f} ms vs median {med * 1e3:.0f} ms"

    # A slow link slows every rank alike; the store round trips of the ranks behind it stand
    # out (the same test as DDPRankStraggler cause=link, on this read's last heartbeat).
    trips = [r.store_rtt for r in live if r.store_rtt >= 0]
    med = statistics.median(trips) if trips else 0.0
    for r in live:
        total = sum(r.phases.values())
        waits = total > 0 and r.phases.get("comm_wait", 0.0) / total > config.link_comm_share
        rtt = r.store_rtt
        if (
            med > 0 and waits and not r.suspect and rtt > config.link_rtt_ratio * med
            and rtt > config.link_min_rtt_seconds
        ):  # fmt: skip
            r.suspect = "straggler:link"
            r.note = (
                f"link: store round trip {rtt * 1e3:.0f} ms vs median {med * 1e3:.1f} ms: the "
                "network link of its node is slow"
            )

    top_seq = {}
    for s in states:
        top_seq[s.pg] = max(top_seq.get(s.pg, s.last_enqueued), s.last_enqueued)
    for r in rows:
        if r.finished:
            r.suspect = ""
            r.note = time.strftime("ended cleanly at %H:%M:%S", time.localtime(r.finished))
            r.verdict = f"finished: {r.note}"
            continue
        if not r.up:
            r.suspect, r.note = "down", "endpoint unreachable"
        else:
            r.seq_lag = max((top_seq[pg] - seq for pg, seq in r.pg_seq.items()), default=0.0)
        p = previous.get(r.target)
        confirmed = bool(r.suspect) and p is not None and p.suspect == r.suspect
        if not confirmed:
            if r.suspect == "down":
                r.note = "unreachable in this read"
            continue
        if r.suspect == "down":
            r.verdict = "DOWN: endpoint unreachable"
        elif r.suspect == "behind":
            r.verdict = f"HUNG: {r.note}"
        elif r.suspect == "stuck":
            r.verdict = f"STUCK: {r.note}"
        else:
            r.verdict = f"straggler: {r.note}"
        if r.node and accuses(r):
            r.verdict += f" (node {r.node})"
    return rows


def _ranks(ranks: tuple[int, ...]) -> str:
    return format_ranks(ranks, most=8)


#: Verdict prefixes that blame a rank, strongest first (STUCK describes the whole job).
ACCUSATIONS = ("DOWN", "HUNG", "straggler")


def accuses(row: RankRow) -> bool:
    """Say whether the row's verdict blames this rank (DOWN, HUNG or straggler)."""
    return row.verdict.startswith(ACCUSATIONS)


def _badness(r: RankRow) -> tuple:
    order = {"DOWN": 0, "HUNG": 1, "STUCK": 2, "straggler": 3, "finished": 6}
    rank = next((o for prefix, o in order.items() if r.verdict.startswith(prefix)), 4)
    return (rank if r.verdict else 5 - bool(r.note), -r.phases.get("compute", 0.0), r.rank)


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
            f"{r.seq_lag:7.0f} {hb:>7} {r.memory / 2**20:8.0f}  "
            + (r.verdict or (f"({r.note})" if r.note else ""))
        )
        if color and r.verdict:
            line = f"\x1b[1;31m{line}\x1b[0m"
        lines.append(line)
    if len(rows) > len(shown):
        lines.append(f"... {len(rows) - len(shown)} more ranks (healthiest hidden)")
    restarts = restart_line(rows)
    if restarts:
        lines.append(restarts)
    return "\n".join(lines)


def restart_line(rows: list[RankRow]) -> str:
    """Return the run's restart state in one line (attempt, hang aborts), "" when unremarkable."""
    attempts = sorted({r.attempt for r in rows if r.attempt}, key=lambda a: (len(a), a))
    monitor = next((r for r in rows if r.abort_limit >= 0), None)
    current = attempts[-1] if attempts else "0"
    if monitor is None and current == "0":
        return ""
    parts = [f"restarts: attempt {current}"]
    if monitor is not None:
        streak, limit = int(monitor.abort_streak), int(monitor.abort_limit)
        parts.append(
            f"hang aborts without progress {streak} of {limit}" if limit else
            f"hang aborts without progress {streak} (no limit)"
        )  # fmt: skip
        earlier = [
            f"attempt {a}: "
            + (f"rank {cr} on {node or '?'}" if cr else "every rank stuck")
            + f", step {step:.0f}"
            for a, cr, node, step in sorted(
                monitor.aborted_attempts, key=lambda x: (len(x[0]), x[0])
            )
        ]
        if earlier:
            parts.append("aborted " + "; ".join(earlier))
        if 0 < limit <= streak:
            parts.append("RESTART LOOP: the hang action stopped")
    return "; ".join(parts)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add ``top`` to the ``ddp-exporter`` subcommands."""
    t = sub.add_parser("top", help="live table of every rank of a run, from their endpoints",
                       description="Show every rank of a run in one table, the outlier first "
                       "with its reason, from the ranks' endpoints or from Prometheus. Exit 1 "
                       "when the ranks or Prometheus cannot be read.")  # fmt: skip
    t.add_argument("--targets", help="comma-separated host:port or URLs of the ranks")
    t.add_argument("--prometheus", help="read from this Prometheus URL instead")
    t.add_argument("--run", help="with --prometheus: the run label to show")
    t.add_argument("--cluster", default="",
                   help="with --prometheus: the run's cluster (needed where a run name repeats)")  # fmt: skip
    t.add_argument("--worst", type=int, default=20, help="show the worst N ranks")
    t.add_argument("--config", default=None,
                   help="the mixin config the rules were generated with (dashboards/mixin.json): "
                   "judge with their thresholds (default: the DEFAULT config)")  # fmt: skip
    t.add_argument("--window", default=None,
                   help="with --prometheus: rate window of the per-step figures (default: the "
                   f"alerts', {DEFAULT.rate_window} or the config's)")  # fmt: skip
    t.add_argument("--refresh", type=float, default=2.0, help="seconds between reads")
    t.add_argument("--once", action="store_true",
                   help="judge two intervals, --refresh apart, print one table and exit")  # fmt: skip
    t.set_defaults(tool=run, parser=t)
    return t


def run(args: argparse.Namespace) -> int:
    """Run ``ddp-exporter top`` with parsed ``args``; return its exit status."""
    parser = args.parser
    targets = [t for t in (args.targets or "").split(",") if t]
    if bool(targets) == bool(args.prometheus):
        parser.error("give either --targets host:port[,...] or --prometheus URL --run RUN")
    if args.prometheus and not args.run:
        parser.error("--prometheus needs --run (the run label to show)")
    if args.cluster and not args.prometheus:
        parser.error("--cluster goes with --prometheus (a rank's own page has no cluster)")
    if args.refresh <= 0:
        parser.error("--refresh must be positive")
    try:
        cfg = load_config(args.config) if args.config else DEFAULT
    except ValueError as exc:
        parser.error(f"--config: {exc}")
    window = args.window or cfg.rate_window
    try:
        duration_seconds(window)
    except ValueError as exc:
        parser.error(f"--window: {exc}")

    def read() -> list[RankRow]:
        if targets:
            return fetch(targets)
        return fetch_prometheus(
            args.prometheus, args.run, window=window, cluster=args.cluster, config=cfg
        )

    # A verdict needs a suspicion in two consecutive judged reads, like an alert's "for". A
    # rank's endpoint gives counters since its start: its first read only sets the baseline of
    # the intervals that follow (judged alone, a straggler that began mid-run would be
    # averaged away). Prometheus gives each read its own rate window. So --once judges what the
    # streaming view judges by its third read from endpoints, by its second from Prometheus.
    reads_before_once = 2 if targets else 1
    previous: dict[str, RankRow] | None = None
    reads = 0
    try:
        while True:
            try:
                rows = diagnose(read(), previous, config=cfg)
            except (OSError, RuntimeError) as exc:
                print(f"ddp-exporter top: {exc}", file=sys.stderr)
                return 1
            previous, reads = {r.target: r for r in rows}, reads + 1
            if args.once and reads <= reads_before_once:
                time.sleep(args.refresh)
                continue
            tty = sys.stdout.isatty()
            print(("\x1b[2J\x1b[H" if tty else "") + render(rows, args.worst, color=tty), flush=True)
            if args.once:
                return 0
            time.sleep(args.refresh)
    except KeyboardInterrupt:
        return 130
