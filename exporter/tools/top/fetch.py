"""Read a run's ranks for ``top``: from their own endpoints, or from Prometheus.

From endpoints, a row holds the counters since the rank started (``diagnose`` differences two
reads); from Prometheus, the increases over a rate window, so each read stands on its own.
"""

from __future__ import annotations

import http.client
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from ... import catalog as c
from ...mixin.alerts.gpu import SLOWDOWN_REASONS
from ...mixin.alerts.liveness import silence_seconds
from ...mixin.cluster import cluster_matcher
from ...mixin.config import DEFAULT, MixinConfig, duration_seconds
from ...mixin.promql import string
from ...web.client import HTTPClient
from ..promapi import instant_query
from .diagnose import diagnose
from .rows import COUNTERS, RankRow

__all__ = ["fetch", "fetch_prometheus", "prometheus_baseline", "target_url"]


def target_url(target: str, tls: bool = False) -> str:
    """Return the URL a rank's target is read at: a URL as given, ``host:port``'s /metrics.

    Raises ValueError for a target that cannot be read at all: no http(s) URL, or no
    ``host:port`` with a port 1..65535 (a usage error, not a rank that is down).
    """
    url = target if "://" in target else f"{'https' if tls else 'http'}://{target}/metrics"
    refused = ValueError(f"expected host:port (a port 1..65535) or an http(s) URL, got {target!r}")
    try:
        split = urllib.parse.urlsplit(url)
        port = split.port  # a port out of range or no number raises
    except ValueError:
        raise refused from None
    if not split.hostname or split.scheme not in ("http", "https"):
        raise refused
    if "://" not in target and (not port or split.netloc != target):
        raise refused  # host:port needs its port, and nothing after it
    return url


def _read(target: str, timeout: float, client: HTTPClient | None) -> RankRow:
    row = RankRow(target)
    try:
        url = target_url(target, client is not None and client.tls)
        opened = (
            client.open(url, timeout) if client else urllib.request.urlopen(url, timeout=timeout)
        )
        with opened as resp:
            text = resp.read().decode()
    except (OSError, http.client.HTTPException, ValueError) as exc:
        # Down, not a failed tool: a rank's endpoint that does not answer, or not in HTTP (or,
        # from run's file_sd folder, a target no rank could have written).
        row.error = _why(exc)
        return row
    # Imported here: a command line that never reads an endpoint starts without it.
    from prometheus_client.parser import text_string_to_metric_families

    read = RankRow(target, up=True, read_at=time.time())
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                _apply(read, s.name, s.labels, s.value)
    except ValueError as exc:  # an HTTP server there, but no rank's metrics page
        row.error = f"not a metrics page ({exc})"
        return row
    return read


def _why(exc: Exception) -> str:
    """Return why a read failed in a few words (``connection refused``, ``timed out``)."""
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.reason}"
    reason = getattr(exc, "reason", None) or exc  # urllib wraps the socket's error
    return getattr(reason, "strerror", None) or str(reason) or type(reason).__name__


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
    elif n == c.LAST_COMPLETED_SEQ.name:
        row.pg_done[labels.get("pg", "")] = v
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
    elif n == c.SECTION_ENDED.name:
        row.section_ended = max(row.section_ended, v)
    elif n == c.FINISHED.name:
        row.finished = v
    elif n == c.GPU_SM_CLOCK.name:
        row.gpu_clock = v
    elif n == c.GPU_CLOCK_EVENT.name:
        reason = labels.get("reason", "")
        if v == 1.0 and reason in SLOWDOWN_REASONS and reason not in row.gpu_slowdown:
            row.gpu_slowdown.append(reason)
    elif n == c.GPU_INFO.name:
        row.gpu_index = labels.get("gpu_index", row.gpu_index)
    elif n == c.PEER_HEARTBEAT_AGE.name and labels.get("peer_rank", "").isdigit():
        row.peer_ages[int(labels["peer_rank"])] = v
    elif n == c.PEERS_ENDED.name:
        row.peers_ended = int(v)
    elif n == c.RANK_INFO.name:
        if labels.get("world_size", "").isdigit():
            row.world_size = int(labels["world_size"])
        row.attempt = labels.get("attempt", row.attempt)
        row.node = labels.get("node", row.node)
    elif n == c.HANG_ABORT_STREAK.name:
        row.abort_streak = v
    elif n == c.HANG_ABORT_LIMIT.name:
        row.abort_limit = v
    elif n == c.HANG_NETWORK.name:
        found = (labels.get("finding", ""), labels.get("node", ""), labels.get("peer_node", ""))
        if found not in row.network:
            row.network.append(found)
    elif n == c.HANG_ABORTED_ATTEMPT.name:
        row.aborted_attempts.append(
            (labels.get("attempt", ""), labels.get("culprit_rank", ""), labels.get("node", ""), v)
        )


_PROM_NAMES = (
    *COUNTERS,
    c.LAST_ENQUEUED_SEQ.name,
    c.LAST_COMPLETED_SEQ.name,
    c.INFLIGHT_AGE.name,
    c.COLLECTIVE_TIMEOUT.name,
    c.HEARTBEAT.name,
    c.GPU_MEM_ALLOCATED.name,
    c.HOST_MEM_RESIDENT.name,
    c.SECTION_DEADLINE.name,
    c.SECTION_STARTED.name,
    c.SECTION_ENDED.name,
    c.RANK_INFO.name,
    c.HANG_ABORT_STREAK.name,
    c.HANG_ABORT_LIMIT.name,
    c.HANG_ABORTED_ATTEMPT.name,
    c.HANG_NETWORK.name,
    c.GPU_SM_CLOCK.name,
    c.GPU_CLOCK_EVENT.name,
    c.GPU_INFO.name,
)


def fetch_prometheus(
    url: str,
    run: str,
    timeout: float = 5.0,
    window: str = DEFAULT.rate_window,
    *,
    cluster: str = "",
    config: MixinConfig = DEFAULT,
    at: float | None = None,
) -> list[RankRow]:
    """Read one run's ranks from Prometheus with six or seven queries (any number of ranks).

    Per-step figures come from the increase over ``window`` (the alerts' rate window by
    default), so each table stands on its own whatever the scrape and refresh intervals.
    ``cluster`` picks the run of that cluster (``config.cluster_label``); a run name found in
    several clusters without it is an error, never two runs merged. ``at``: read the run as
    it was at that Unix time (default now).
    """
    at = time.time() if at is None else at
    window_s = duration_seconds(window)

    def query(expr: str) -> list[dict]:
        return instant_query(url, expr, timeout, at=at)

    run_sel = ", ".join(m for m in (f"run={string(run)}", cluster_matcher(config, cluster)) if m)
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
        row = rows.setdefault(key, RankRow(key, up=True, window={}, read_at=at, window_s=window_s))
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
        for n in COUNTERS
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
    # Up where it answered any scrape within DDPRankDown's silence: on a busy host one scrape
    # in a row can time out (the latest sample alone would make two reads a second apart DOWN).
    # Where no sample is that recent (slower scrapes than the config says) the last decides.
    recent = f"{round(1000 * silence_seconds(config))}ms"
    up = f"up{{{run_sel}}}"
    for s in query(f"max_over_time({up}[{recent}]) or last_over_time({up}[{window}])"):
        row_of(s["metric"]).up = float(s["value"][1]) == 1.0
    # A rank that went down has no fresh series: its node from its last info over the window.
    for s in query(f"last_over_time({c.RANK_INFO.name}{{{run_sel}}}[{window}])"):
        row = row_of(s["metric"])
        row.node = row.node or s["metric"].get("node", "")
    # A clean end is in the rank's final scrapes only: look back over the window.
    for s in query(f"last_over_time({c.FINISHED.name}{{{run_sel}}}[{window}])"):
        row_of(s["metric"]).finished = float(s["value"][1])
    return sorted(rows.values(), key=lambda r: r.rank)


def prometheus_baseline(
    url: str,
    run: str,
    window: str = DEFAULT.rate_window,
    *,
    cluster: str = "",
    config: MixinConfig = DEFAULT,
) -> dict[str, RankRow]:
    """Return the run read and judged one ``window`` ago, by target: the previous read of the
    first one shown, so that a lasting straggler is judged over two windows that do not overlap.
    """
    back = time.time() - duration_seconds(window)
    rows = fetch_prometheus(url, run, window=window, cluster=cluster, config=config, at=back)
    return {r.target: r for r in diagnose(rows, config=config, now=back)}


def fetch(
    targets: list[str], timeout: float = 2.0, *, client: HTTPClient | None = None
) -> list[RankRow]:
    """Read every target concurrently; an unreachable one comes back with ``up=False``.

    ``client`` (:func:`exporter.web.client.load_client`) reads ranks served over TLS or with
    credentials.
    """
    with ThreadPoolExecutor(max_workers=min(32, max(1, len(targets)))) as pool:
        return list(pool.map(lambda t: _read(t, timeout, client), targets))
