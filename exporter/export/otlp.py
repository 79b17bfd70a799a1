"""Push this rank's metrics over OTLP/HTTP, translated from the families Prometheus serves.

One aggregation feeds both paths: the hot path records into :mod:`exporter.sources.recorder`
only, and at each push a background thread reads the rank's registry (the very
:class:`~exporter.export.collector.DDPCollector` output that ``/metrics`` serves) and translates the
families into OpenTelemetry SDK metric data, which the SDK's OTLP/HTTP exporter encodes and
sends. No OpenTelemetry instrument or ``MeterProvider`` exists, so training does no per-event
work for OTLP; the SDK's own aggregation would be a second copy of every event, its readers
have no public hook for data that is already aggregated, and observable instruments cannot
carry histograms.

Names stay the Prometheus names of :mod:`exporter.catalog`, with UCUM units (``s``, ``By``)
whose words the names already end in, so an OpenTelemetry Collector's Prometheus exporter
(or Prometheus's OTLP receiver) gives back exactly the names ``/metrics`` serves. Everything
is cumulative, so a dropped push loses resolution, never counts. The endpoint, headers,
timeout, compression and TLS come from the standard ``OTEL_EXPORTER_OTLP_*`` variables (read by
the SDK's exporter), the resource from ``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SERVICE_NAME``,
the push period from ``OTEL_METRIC_EXPORT_INTERVAL``; see docs/otlp.md.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from .. import catalog, settings
from ..background import BackgroundLoop
from ..errors import ErrorCounter
from ..log import log
from ..version import __version__

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric as PromFamily
    from prometheus_client.registry import CollectorRegistry

__all__ = [
    "DEFAULT_INTERVAL_MS",
    "DEFAULT_TIMEOUT_MS",
    "FLUSH_TIMEOUT_S",
    "OTLPExportError",
    "OTLPPusher",
    "UNITS",
    "metrics_data",
    "start_push",
    "translate",
]

#: Push period when ``OTEL_METRIC_EXPORT_INTERVAL`` is unset (the SDK's default), ms.
DEFAULT_INTERVAL_MS = 60_000.0
#: Budget of one push when ``OTEL_METRIC_EXPORT_TIMEOUT`` is unset (the SDK's default), ms.
DEFAULT_TIMEOUT_MS = 30_000.0
#: Longest time :meth:`OTLPPusher.close` waits for the final push (capped by the timeout).
FLUSH_TIMEOUT_S = 5.0

#: Catalog unit -> UCUM unit of the OTLP metric; the translators map ``s`` back to ``seconds``,
#: ``By`` to ``bytes``, ``Hz`` to ``hertz``, ``Cel`` to ``celsius`` and ``W`` to ``watts``, which
#: every catalog name with a unit already ends in.
UNITS: dict[str, str] = {
    "seconds": "s",
    "bytes": "By",
    "hertz": "Hz",
    "celsius": "Cel",
    "watts": "W",
    "": "",
}

_CUMULATIVE = AggregationTemporality.CUMULATIVE
_SCOPE_NAME = "ddp-exporter"

# Loggers of the OTLP exporter stack that log every failed or retried export. Their records
# are dropped only on a thread that is pushing for us (see _QuietExport), so another user of
# OpenTelemetry in the same process keeps its logs.
_SDK_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.http",
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    "opentelemetry.exporter.otlp.proto.http._common",
    "opentelemetry.exporter.otlp.common.http",
    "opentelemetry.exporter.otlp.proto.common._internal",
    "opentelemetry.exporter.otlp.proto.common._internal.metrics_encoder",
    "urllib3.connectionpool",
)


class OTLPExportError(RuntimeError):
    """Signal that one push did not reach the OTLP endpoint (its data was dropped)."""


class _QuietExport(logging.Filter):
    """Drop the OTLP stack's log records on a pushing thread, keeping the last message."""

    def __init__(self) -> None:
        super().__init__("ddp-exporter-otlp")
        self._tls = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        """Return False (drop) for records emitted while this thread pushes."""
        if not getattr(self._tls, "active", False):
            return True
        try:
            self._tls.last = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string must not escape
            self._tls.last = str(record.msg)
        return False

    def begin(self) -> None:
        """Start dropping on the calling thread."""
        self._tls.active = True
        self._tls.last = None

    def end(self) -> str | None:
        """Stop dropping on the calling thread; return the last dropped message."""
        self._tls.active = False
        return getattr(self._tls, "last", None)


_quiet = _QuietExport()
_quiet_installed = False
_install_lock = threading.Lock()


def _install_quiet() -> None:
    global _quiet_installed
    with _install_lock:
        if _quiet_installed:
            return
        for name in _SDK_LOGGERS:
            logging.getLogger(name).addFilter(_quiet)
        _quiet_installed = True


def _metrics_url(endpoint: str) -> str:
    """Return the OTLP/HTTP metrics URL: a base URL gets ``/v1/metrics``, a path is kept."""
    parts = urlsplit(endpoint)
    if parts.path in ("", "/"):
        return endpoint.rstrip("/") + "/v1/metrics"
    return endpoint


# -- translation --------------------------------------------------------------------------------
_BY_FAMILY: dict[str, catalog.MetricDef] = {m.family: m for m in catalog.METRICS}


def _points(fam: PromFamily, suffix: str, start_ns: int, now_ns: int) -> list[NumberDataPoint]:
    name = fam.name + suffix
    return [
        NumberDataPoint(
            attributes=dict(s.labels),
            start_time_unix_nano=start_ns,
            time_unix_nano=now_ns,
            value=s.value,
        )
        for s in fam.samples
        if s.name == name
    ]


def _histogram_points(fam: PromFamily, start_ns: int, now_ns: int) -> list[HistogramDataPoint]:
    """Group a Prometheus histogram or summary by series; make cumulative buckets per-bucket."""
    series: dict[tuple, dict[str, Any]] = {}
    for s in fam.samples:
        labels = {k: v for k, v in s.labels.items() if k != "le"}
        key = tuple(sorted(labels.items()))
        entry = series.setdefault(key, {"labels": labels, "buckets": [], "count": 0, "sum": 0.0})
        if s.name == fam.name + "_bucket":
            entry["buckets"].append((float(s.labels["le"]), s.value))
        elif s.name == fam.name + "_count":
            entry["count"] = s.value
        elif s.name == fam.name + "_sum":
            entry["sum"] = s.value
    points = []
    for entry in series.values():
        count = int(entry["count"])
        bounds: list[float] = []
        counts: list[int] = []
        below = 0
        for le, cumulative in sorted(entry["buckets"]):
            cumulative = int(cumulative)
            if math.isinf(le):
                count = cumulative
                break
            bounds.append(le)
            counts.append(cumulative - below)
            below = cumulative
        counts.append(count - below)  # the +Inf bucket; a summary is all +Inf bucket
        points.append(
            HistogramDataPoint(
                attributes=entry["labels"],
                start_time_unix_nano=start_ns,
                time_unix_nano=now_ns,
                count=count,
                sum=entry["sum"],
                bucket_counts=counts,
                explicit_bounds=bounds,
                min=None,  # not kept by Prometheus histograms: left unset on the wire
                max=None,
            )
        )
    return points


def translate(families: Iterable[PromFamily], start_ns: int, now_ns: int) -> list[Metric]:
    """Translate prometheus_client families into cumulative OpenTelemetry metrics.

    Counters become monotonic Sums named with ``_total``; gauges and the info family Gauges;
    histograms Histograms with the same explicit bounds; the phase summary a bucketless
    Histogram, which a Prometheus exporter writes back as ``_sum`` and ``_count`` (plus one
    ``_bucket{le="+Inf"}``). Families unknown to the catalog keep unit ``""``.
    """
    out: list[Metric] = []
    for fam in families:
        mdef = _BY_FAMILY.get(fam.name)
        unit = UNITS.get(mdef.unit, "") if mdef is not None else ""
        if fam.type == "counter":
            name = fam.name + "_total"
            data: Any = Sum(_points(fam, "_total", start_ns, now_ns), _CUMULATIVE, True)
        elif fam.type in ("gauge", "unknown"):
            name = fam.name
            data = Gauge(_points(fam, "", start_ns, now_ns))
        elif fam.type == "info":
            name = fam.name + "_info"
            data = Gauge(_points(fam, "_info", start_ns, now_ns))
        elif fam.type in ("histogram", "summary"):
            name = fam.name
            data = Histogram(_histogram_points(fam, start_ns, now_ns), _CUMULATIVE)
        else:
            continue
        if data.data_points:
            out.append(Metric(name=name, description=fam.documentation, unit=unit, data=data))
    return out


def metrics_data(
    families: Iterable[PromFamily], resource: Resource, start_ns: int, now_ns: int | None = None
) -> MetricsData:
    """Wrap the translated families in one resource and the ``ddp-exporter`` scope."""
    now = time.time_ns() if now_ns is None else now_ns
    scope = InstrumentationScope(_SCOPE_NAME, __version__)
    return MetricsData(
        resource_metrics=[
            ResourceMetrics(
                resource=resource,
                scope_metrics=[
                    ScopeMetrics(
                        scope=scope,
                        metrics=translate(families, start_ns, now),
                        schema_url="",
                    )
                ],
                schema_url="",
            )
        ]
    )


# -- pushing ------------------------------------------------------------------------------------
class OTLPPusher:
    """Push a rank's families every interval on a daemon thread; flush once at close.

    A failed push is counted in ``ddp_exporter_errors_total{where="collect"}`` (the first one
    logged once) and the OTLP stack's own log lines about it are dropped. ``pushes`` and
    ``failures`` count attempts for tests and debugging.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        errors: ErrorCounter,
        exporter: MetricExporter,
        resource: Resource,
        *,
        interval_s: float,
        timeout_s: float,
        endpoint: str,
    ) -> None:
        self._registry = registry
        self._errors = errors
        self._exporter = exporter
        self.resource = resource
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.endpoint = endpoint
        self.start_ns = time.time_ns()
        self.pushes = 0
        self.failures = 0
        self._lock = threading.Lock()  # one export at a time (the SDK exporter's contract)
        self._closed = False
        # The final push runs on the loop's thread after close(): training's last steps are in.
        self._loop = BackgroundLoop(
            "ddp-exporter-otlp",
            self._tick,
            interval_s,
            errors=errors,
            where="collect",
            final=self.push,
        )

    def start(self) -> OTLPPusher:
        """Start the push thread and return self."""
        _install_quiet()
        self._loop.start()
        return self

    def collect(self) -> MetricsData:
        """Read every family from the rank's registry now and translate it."""
        return metrics_data(self._registry.collect(), self.resource, self.start_ns)

    def push(self) -> bool:
        """Collect and export once on the calling thread; return whether it was delivered."""
        with self._lock:
            self.pushes += 1
            _quiet.begin()
            reason: str | None = None
            try:
                data = self.collect()
                result = self._exporter.export(data, timeout_millis=self.timeout_s * 1e3)
                ok = result is MetricExportResult.SUCCESS
            except Exception as exc:  # noqa: BLE001 - never let a push escape
                ok, reason = False, repr(exc)
            finally:
                dropped = _quiet.end()
            if not ok:
                self.failures += 1
                self._errors.record(
                    "collect",
                    OTLPExportError(
                        f"OTLP push to {self.endpoint} failed and was dropped "
                        f"({reason or dropped or 'export failed'}); later pushes carry the "
                        "cumulative totals"
                    ),
                )
            return ok

    def _tick(self) -> None:
        self.push()

    def close(self, timeout_s: float | None = None) -> None:
        """Push once more (final flush) and shut the exporter down, waiting at most the budget.

        The budget is ``min(FLUSH_TIMEOUT_S, export timeout)`` unless given. A collector that is
        down or slow costs at most that long; the daemon thread is then abandoned.
        """
        if self._closed:
            return
        self._closed = True
        budget = min(FLUSH_TIMEOUT_S, self.timeout_s) if timeout_s is None else timeout_s
        deadline = time.monotonic() + budget
        if self._loop.started:
            self._loop.close(budget)
        else:  # never started: flush here, bounded by a thread
            flusher = threading.Thread(
                target=self.push, name="ddp-exporter-otlp-flush", daemon=True
            )
            flusher.start()
            flusher.join(budget)
        _quiet.begin()
        try:
            # Aborts a retry backoff still running on the abandoned thread.
            self._exporter.shutdown(timeout_millis=max(deadline - time.monotonic(), 0.0) * 1e3)
        except Exception as exc:  # noqa: BLE001
            self._errors.record("collect", exc)
        finally:
            _quiet.end()


class _NoPush:
    """Stand in for a pusher when ``OTEL_SDK_DISABLED`` is true."""

    def close(self) -> None:
        """Do nothing."""


def start_push(
    identity: settings.Identity,
    registry: CollectorRegistry,
    errors: ErrorCounter,
    endpoint: str | None,
) -> OTLPPusher | _NoPush:
    """Start pushing ``registry``'s metrics to ``endpoint`` (None: the ``OTEL_*`` variables).

    ``endpoint`` is a base URL (``http://collector:4318``, ``/v1/metrics`` is appended) or a
    full metrics URL with a path. ``run`` and ``rank`` are attributes of every data point (as
    Prometheus labels) and ``ddp.run``/``ddp.rank``/``ddp.world_size`` resource attributes.
    Returns the started pusher; its ``close()`` does the final flush.
    """
    if settings.otlp_disabled():
        log.info("ddp-exporter: %s=true; OTLP push not started", settings.OTEL_SDK_DISABLED)
        return _NoPush()
    interval_ms = settings.env_positive_ms(
        settings.OTEL_METRIC_EXPORT_INTERVAL, DEFAULT_INTERVAL_MS
    )
    timeout_ms = settings.env_positive_ms(settings.OTEL_METRIC_EXPORT_TIMEOUT, DEFAULT_TIMEOUT_MS)
    exporter = OTLPMetricExporter(endpoint=_metrics_url(endpoint) if endpoint else None)
    resource = Resource.create(
        {
            "ddp.run": identity.run,
            "ddp.rank": identity.rank,
            "ddp.world_size": identity.world_size,
        }
    )
    url = getattr(exporter, "_endpoint", None) or endpoint or "the OTLP endpoint"
    pusher = OTLPPusher(
        registry,
        errors,
        exporter,
        resource,
        interval_s=interval_ms / 1e3,
        timeout_s=timeout_ms / 1e3,
        endpoint=str(url),
    )
    log.info(
        "ddp-exporter: rank %s pushes OTLP metrics to %s every %gs",
        identity.rank,
        url,
        interval_ms / 1e3,
    )
    return pusher.start()
