"""Build every metric family from the catalog at scrape time.

Nothing is formatted on the training path: :meth:`DDPCollector.collect` snapshots the
recorder, asks the in-flight source, the heartbeat and the memory sources, and turns the
numbers into families named by :mod:`exporter.catalog`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

from . import catalog as c
from .deadline import REGISTRY as SECTIONS
from .memory import host_resident_bytes

if TYPE_CHECKING:
    from .core import Observer

__all__ = ["DDPCollector"]


def _family(m: c.MetricDef) -> Metric:
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
    """Collect one rank's metrics from its :class:`~exporter.core.Observer`."""

    def __init__(self, observer: Observer) -> None:
        self._obs = observer

    def describe(self) -> list[Metric]:
        """Describe nothing, so registering does not call collect()."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Yield every family; a failing part is counted and the rest is still served."""
        obs = self._obs
        base = [obs.run, str(obs.rank)]
        fams = {m.name: _family(m) for m in c.METRICS}
        for part in (
            self._static,
            self._steps,
            self._inflight,
            self._liveness,
            self._memory,
            self._forensics,
            self._sections,
            self._job_clock,
        ):
            try:
                part(fams, base)
            except Exception as exc:  # noqa: BLE001 - serve what we can
                obs.errors.record("collect", exc)
        errors = fams[c.EXPORTER_ERRORS.name]
        counts = obs.errors.snapshot()
        for where, n in SECTIONS.errors.snapshot().items():
            counts[where] = counts.get(where, 0) + n  # exporter.deadline works without instrument()
        for where, n in counts.items():
            errors.add_metric(base + [where], n)
        for m in c.METRICS:
            fam = fams[m.name]
            if fam.samples:
                yield fam

    def _static(self, fams: dict, base: list[str]) -> None:
        fams[c.RANK_INFO.name].add_metric(base, self._obs.info_labels())

    def _steps(self, fams: dict, base: list[str]) -> None:
        snap = self._obs.recorder.snapshot()
        fams[c.STEPS.name].add_metric(base, snap.steps)
        fams[c.STEP_DURATION.name].add_metric(base, snap.step_hist, snap.step_sum)
        phase = fams[c.STEP_PHASE.name]
        for name, total in zip(c.PHASES, snap.phase_sum):
            phase.add_metric(base + [name], snap.steps, total)
        for op, pg, buckets, total, _count, nbytes in snap.collectives:
            fams[c.COLLECTIVE_DURATION.name].add_metric(base + [op, pg], buckets, total)
            fams[c.COLLECTIVE_BYTES.name].add_metric(base + [op, pg], nbytes)
        if snap.steps or snap.collectives:
            fams[c.HEARTBEAT.name].add_metric(base, snap.last_progress_unix)

    def _inflight(self, fams: dict, base: list[str]) -> None:
        try:
            states = self._obs.inflight_source.read()
        except Exception as exc:  # noqa: BLE001
            self._obs.inflight_failed(exc)
            states = self._obs.inflight_source.read()
        for s in states:
            labels = base + [s.pg]
            fams[c.LAST_ENQUEUED_SEQ.name].add_metric(labels, s.last_enqueued)
            fams[c.LAST_COMPLETED_SEQ.name].add_metric(labels, s.last_completed)
            fams[c.INFLIGHT_AGE.name].add_metric(labels, s.inflight_age_s)
            if s.timeout_s is not None:
                fams[c.COLLECTIVE_TIMEOUT.name].add_metric(labels, s.timeout_s)

    def _liveness(self, fams: dict, base: list[str]) -> None:
        hb = self._obs.heartbeat
        if hb is None or not hb.monitor:
            return
        fam = fams[c.PEER_HEARTBEAT_AGE.name]
        for peer, age in hb.published_ages():
            fam.add_metric(base + [str(peer)], age)

    def _memory(self, fams: dict, base: list[str]) -> None:
        source = self._obs.memory_source
        gpu = None
        if source is not None:
            try:
                gpu = source()
            except Exception as exc:  # noqa: BLE001
                self._obs.errors.record("memory", exc)
        if gpu is not None:
            fams[c.GPU_MEM_ALLOCATED.name].add_metric(base, gpu.allocated)
            fams[c.GPU_MEM_RESERVED.name].add_metric(base, gpu.reserved)
            fams[c.GPU_MEM_PEAK.name].add_metric(base, gpu.peak)
            fams[c.GPU_MEM_TOTAL.name].add_metric(base, gpu.total)
        rss = host_resident_bytes()
        if rss is not None:
            fams[c.HOST_MEM_RESIDENT.name].add_metric(base, rss)

    def _forensics(self, fams: dict, base: list[str]) -> None:
        fx = getattr(self._obs, "forensics", None)
        # Always served (0 without forensics), so the series count does not depend on it.
        fams[c.HANG_DUMPS.name].add_metric(base, fx.dumps if fx is not None else 0)
        if fx is None:
            return
        where = fx.location  # one read: the forensics thread swaps the tuple atomically
        if where is not None:
            labels = dict(zip(c.HANG_LOCATION.labels, where))
            fams[c.HANG_LOCATION.name].add_metric(base, labels)

    def _sections(self, fams: dict, base: list[str]) -> None:
        for s in SECTIONS.snapshot():
            labels = base + [s.name]
            fams[c.SECTION_DEADLINE.name].add_metric(labels, s.deadline_s)
            fams[c.SECTION_RUNS.name].add_metric(labels, s.runs)
            if s.last_duration_s is not None:
                fams[c.SECTION_LAST_DURATION.name].add_metric(labels, s.last_duration_s)
            if s.started_unix is not None:
                fams[c.SECTION_STARTED.name].add_metric(labels, s.started_unix)

    def _job_clock(self, fams: dict, base: list[str]) -> None:
        clock = self._obs.job_clock
        if clock.deadline_unix is not None:
            fams[c.JOB_DEADLINE.name].add_metric(base, clock.deadline_unix)
        if clock.total_steps is not None:
            fams[c.JOB_TOTAL_STEPS.name].add_metric(base, clock.total_steps)
