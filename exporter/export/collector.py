"""Build every metric family from the catalog at scrape time.

Nothing is formatted on the training path: :meth:`DDPCollector.collect` snapshots the
recorder, asks the in-flight source, the heartbeat and the memory sources, and turns the
numbers into families named by :mod:`exporter.catalog`. The collector is handed what it reads,
a :class:`RankSources`, as prometheus_client's own collectors are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

from .. import catalog as c
from .. import settings
from ..errors import ErrorCounter
from ..sources.flight import InFlight
from ..sources.gpu.health import HealthSource
from ..sources.memory import MemorySource, host_resident_bytes
from ..sources.recorder import Recorder
from ..sources.sections import REGISTRY, SectionRegistry
from ..sources.walltime import JobClock
from .gpu import add_gpu_health

__all__ = [
    "DDPCollector",
    "GoodputView",
    "HangStatus",
    "RankSources",
    "RestartView",
    "add_invalid_settings",
    "family",
]


class RestartView(Protocol):
    """What the collector reads of a run's restart ledger (exporter.hangs.restarts)."""

    #: Aborts in a row without progress.
    streak: int

    @property
    def limit(self) -> int:
        """Return the aborts in a row without progress after which the action stops."""
        ...

    def attempts(self) -> list[tuple[str, str, str, int]]:
        """Return ``(attempt, culprit rank, node, furthest step)`` of recent aborted attempts."""
        ...


class HangStatus(Protocol):
    """What the collector reads of the hang watcher."""

    #: Dumps this rank wrote (``ddp_hang_dumps_total``).
    dumps: int
    #: ``(file, line, function)`` while this rank is the culprit of an open episode, else None.
    location: tuple[str, str, str] | None
    #: ``(unix time, culprit rank label, its node)`` once the hang action decided to end the run.
    aborted: tuple[float, str, str] | None
    #: The run's restart ledger (monitoring rank with the action on), else None.
    restarts: RestartView | None
    #: ``(finding, node, peer_node)`` of the hang probe (monitoring rank, during a hang).
    network: tuple[tuple[str, str, str], ...]


class GoodputView(Protocol):
    """What the collector reads of the run's goodput account (exporter.sources.goodput)."""

    def snapshot(
        self,
    ) -> tuple[dict[str, float], list[tuple[str, int, str, float]], float] | None:
        """Return ``(seconds by category, blame, the run's start)``; None off the monitor."""
        ...


@dataclass
class RankSources:
    """What one rank's collector reads at scrape time; None where a part does not run."""

    run: str
    rank: int
    errors: ErrorCounter
    #: Returns the labels of ``ddp_rank_info`` (read at each scrape: the in-flight source can
    #: change when the Flight Recorder fails).
    info: Callable[[], dict[str, str]]
    recorder: Recorder
    inflight: InFlight
    job_clock: JobClock
    #: The monitoring rank's ``(peer, heartbeat age)`` pairs to publish.
    peer_ages: Callable[[], list[tuple[int, float]]] | None = None
    #: Returns how many of the run's ranks ended cleanly (the monitoring rank's heartbeat).
    peers_ended: Callable[[], int] | None = None
    #: Returns the last store heartbeat's round trip in seconds (None before the first).
    store_round_trip: Callable[[], float | None] | None = None
    memory: MemorySource | None = None
    #: Returns the health of the rank's GPU (exporter.sources.gpu), None without one.
    gpu: HealthSource | None = None
    hangs: HangStatus | None = None
    sections: SectionRegistry = field(default=REGISTRY)
    #: Returns the Unix time the rank ended cleanly, None while it trains.
    finished: Callable[[], float | None] | None = None
    #: The run's goodput account (its monitoring rank publishes it), else None.
    goodput: GoodputView | None = None
    #: Bring the recorder up to date with what the device timed, before its snapshot: the
    #: collectives' device times the Flight Recorder holds (exporter.sources.durations), the
    #: compute stream's waits (exporter.sources.devicewaits); CUDA without DDP.
    settle: tuple[Callable[[], Any], ...] = ()


def add_invalid_settings(fam: Metric, base: list[str]) -> None:
    """Add one ``ddp_exporter_invalid_setting_info`` sample per variable found invalid."""
    for name in settings.invalid_settings():
        fam.add_metric(base, {"variable": name})


def family(m: c.MetricDef) -> Metric:
    """Return an empty prometheus_client family for the catalog entry ``m``."""
    labels = list(m.all_labels)
    if m.type == "gauge":
        return GaugeMetricFamily(m.name, m.help, labels=labels, unit="")
    if m.type == "counter":
        return CounterMetricFamily(m.family, m.help, labels=labels)
    if m.type == "histogram":
        return HistogramMetricFamily(m.name, m.help, labels=labels)
    if m.type == "summary":
        return SummaryMetricFamily(m.name, m.help, labels=labels)
    if m.type == "info":
        return InfoMetricFamily(m.family, m.help, labels=list(c.BASE_LABELS))
    raise ValueError(f"unknown metric type {m.type!r} for {m.name}")


class DDPCollector(Collector):
    """Collect one rank's metrics from its :class:`RankSources`."""

    def __init__(self, sources: RankSources) -> None:
        self._src = sources

    def describe(self) -> list[Metric]:
        """Describe nothing, so registering does not call collect()."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Yield every family; a failing part is counted and the rest is still served."""
        src = self._src
        base = [src.run, str(src.rank)]
        fams = {m.name: family(m) for m in c.METRICS}
        for part in (
            self._static,
            self._steps,
            self._inflight,
            self._liveness,
            self._memory,
            self._gpu,
            self._forensics,
            self._sections,
            self._job_clock,
            self._end,
            self._goodput,
        ):
            try:
                part(fams, base)
            except Exception as exc:  # noqa: BLE001 - serve what we can
                src.errors.record("collect", exc)
        add_invalid_settings(fams[c.INVALID_SETTING.name], base)
        errors = fams[c.EXPORTER_ERRORS.name]
        counts = src.errors.snapshot()
        for where, n in src.sections.errors.snapshot().items():
            counts[where] = counts.get(where, 0) + n  # exporter.deadline works without instrument()
        for where, n in counts.items():
            errors.add_metric(base + [where], n)
        for m in c.METRICS:
            fam = fams[m.name]
            if fam.samples:
                yield fam

    def _static(self, fams: dict, base: list[str]) -> None:
        fams[c.RANK_INFO.name].add_metric(base, self._src.info())

    def _steps(self, fams: dict, base: list[str]) -> None:
        for settle in self._src.settle:
            settle()
        snap = self._src.recorder.snapshot()
        fams[c.STEPS.name].add_metric(base, snap.steps)
        fams[c.STEP_DURATION.name].add_metric(base, snap.step_hist, snap.step_sum)
        phase = fams[c.STEP_PHASE.name]
        for name, total in zip(c.PHASES, snap.phase_sum):
            phase.add_metric(base + [name], snap.steps, total)
        for op, pg, buckets, total, _count, nbytes in snap.collectives:
            fams[c.COLLECTIVE_DURATION.name].add_metric(base + [op, pg], buckets, total)
            fams[c.COLLECTIVE_BYTES.name].add_metric(base + [op, pg], nbytes)
        for op, pg, n in snap.untimed:
            fams[c.COLLECTIVE_UNTIMED.name].add_metric(base + [op, pg], n)
        if snap.steps or snap.collectives:
            fams[c.HEARTBEAT.name].add_metric(base, snap.last_progress_unix)

    def _inflight(self, fams: dict, base: list[str]) -> None:
        for s in self._src.inflight.read():
            labels = base + [s.pg]
            fams[c.LAST_ENQUEUED_SEQ.name].add_metric(labels, s.last_enqueued)
            fams[c.LAST_COMPLETED_SEQ.name].add_metric(labels, s.last_completed)
            fams[c.INFLIGHT_AGE.name].add_metric(labels, s.inflight_age_s)
            if s.timeout_s is not None:
                fams[c.COLLECTIVE_TIMEOUT.name].add_metric(labels, s.timeout_s)

    def _liveness(self, fams: dict, base: list[str]) -> None:
        trip = self._src.store_round_trip() if self._src.store_round_trip else None
        if trip is not None:
            fams[c.STORE_ROUND_TRIP.name].add_metric(base, trip)
        ended = self._src.peers_ended
        if ended is not None:
            fams[c.PEERS_ENDED.name].add_metric(base, ended())
        ages = self._src.peer_ages
        if ages is None:
            return
        fam = fams[c.PEER_HEARTBEAT_AGE.name]
        for peer, age in ages():
            fam.add_metric(base + [str(peer)], age)

    def _memory(self, fams: dict, base: list[str]) -> None:
        source = self._src.memory
        gpu = None
        if source is not None:
            try:
                gpu = source()
            except Exception as exc:  # noqa: BLE001
                self._src.errors.record("memory", exc)
        if gpu is not None:
            fams[c.GPU_MEM_ALLOCATED.name].add_metric(base, gpu.allocated)
            fams[c.GPU_MEM_RESERVED.name].add_metric(base, gpu.reserved)
            fams[c.GPU_MEM_PEAK.name].add_metric(base, gpu.peak)
            fams[c.GPU_MEM_TOTAL.name].add_metric(base, gpu.total)
        rss = host_resident_bytes()
        if rss is not None:
            fams[c.HOST_MEM_RESIDENT.name].add_metric(base, rss)

    def _gpu(self, fams: dict, base: list[str]) -> None:
        source = self._src.gpu
        if source is None:
            return
        try:
            health = source()
        except Exception as exc:  # noqa: BLE001 - a GPU NVML cannot read is served without
            self._src.errors.record("gpu", exc)
            return
        if health is not None:
            add_gpu_health(fams, base, health)

    def _forensics(self, fams: dict, base: list[str]) -> None:
        fx = self._src.hangs
        # Always served (0 without a hang watcher), so the series count does not depend on it.
        fams[c.HANG_DUMPS.name].add_metric(base, fx.dumps if fx is not None else 0)
        if fx is None:
            return
        where = fx.location  # one read: the watcher thread swaps the tuple atomically
        if where is not None:
            labels = dict(zip(c.HANG_LOCATION.labels, where))
            fams[c.HANG_LOCATION.name].add_metric(base, labels)
        for finding in fx.network:  # one read: the watcher thread swaps the tuple atomically
            fams[c.HANG_NETWORK.name].add_metric(base, dict(zip(c.HANG_NETWORK.labels, finding)))
        aborted = fx.aborted
        if aborted is not None:
            fams[c.HANG_ABORT.name].add_metric(base + [aborted[1], aborted[2]], aborted[0])
        restarts = fx.restarts
        if restarts is not None:
            fams[c.HANG_ABORT_STREAK.name].add_metric(base, restarts.streak)
            fams[c.HANG_ABORT_LIMIT.name].add_metric(base, restarts.limit)
            for attempt, culprit, node, furthest in restarts.attempts():
                labels = base + [attempt, culprit, node]
                fams[c.HANG_ABORTED_ATTEMPT.name].add_metric(labels, furthest)

    def _sections(self, fams: dict, base: list[str]) -> None:
        for s in self._src.sections.snapshot():
            labels = base + [s.name]
            fams[c.SECTION_DEADLINE.name].add_metric(labels, s.deadline_s)
            fams[c.SECTION_RUNS.name].add_metric(labels, s.runs)
            if s.last_duration_s is not None:
                fams[c.SECTION_LAST_DURATION.name].add_metric(labels, s.last_duration_s)
            if s.started_unix is not None:
                fams[c.SECTION_STARTED.name].add_metric(labels, s.started_unix)
            if s.ended_unix is not None:
                fams[c.SECTION_ENDED.name].add_metric(labels, s.ended_unix)

    def _job_clock(self, fams: dict, base: list[str]) -> None:
        clock = self._src.job_clock
        if clock.deadline_unix is not None:
            fams[c.JOB_DEADLINE.name].add_metric(base, clock.deadline_unix)
        if clock.total_steps is not None:
            fams[c.JOB_TOTAL_STEPS.name].add_metric(base, clock.total_steps)

    def _end(self, fams: dict, base: list[str]) -> None:
        finished = self._src.finished() if self._src.finished is not None else None
        if finished is not None:
            fams[c.FINISHED.name].add_metric(base, finished)

    def _goodput(self, fams: dict, base: list[str]) -> None:
        view = self._src.goodput
        found = view.snapshot() if view is not None else None
        if found is None:
            return
        totals, blame, started = found
        fam = fams[c.GOODPUT.name]
        for category in c.GOODPUT_CATEGORIES:
            fam.add_metric(base + [category], totals.get(category, 0.0))
        for category, culprit, node, seconds in blame:
            fams[c.GOODPUT_BLAME.name].add_metric(base + [category, str(culprit), node], seconds)
        fams[c.GOODPUT_STARTED.name].add_metric(base, started)
