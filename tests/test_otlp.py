"""The OTLP push path: a real OTLP/HTTP receiver in the test process, real gloo jobs."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytest.importorskip(
    "opentelemetry.sdk.metrics",
    reason="OTLP push needs the otlp extra: pip install opentelemetry-sdk "
    "opentelemetry-exporter-otlp-proto-http",
)
pytest.importorskip("opentelemetry.exporter.otlp.proto.http.metric_exporter")
from conftest import train_epoch  # noqa: E402
from harness import Job, free_port, parse, scrape_text, wait_for  # noqa: E402
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (  # noqa: E402
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

import exporter  # noqa: E402
from exporter import catalog  # noqa: E402
from exporter.export.otlp import UNITS  # noqa: E402


class Receiver:
    """An OTLP/HTTP metrics receiver on loopback: decodes every POST /v1/metrics.

    ``delay`` makes it a slow collector: each request sleeps that long before answering.
    """

    def __init__(self, delay: float = 0.0) -> None:
        self.requests: list[ExportMetricsServiceRequest] = []
        self.delay = delay
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if receiver.delay:
                    time.sleep(receiver.delay)
                if self.path != "/v1/metrics":
                    self.send_error(404)
                    return
                req = ExportMetricsServiceRequest()
                req.ParseFromString(body)
                with receiver._lock:
                    receiver.requests.append(req)
                out = ExportMetricsServiceResponse().SerializeToString()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/x-protobuf")
                    self.send_header("Content-Length", str(len(out)))
                    self.end_headers()
                    self.wfile.write(out)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # a slow collector's client gave up waiting, as the exporter should

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def points(self) -> list[tuple[dict, dict, str, object]]:
        """Return every data point received: (resource attrs, point attrs, metric name, point)."""
        with self._lock:
            reqs = list(self.requests)
        out = []
        for req in reqs:
            for rm in req.resource_metrics:
                res = {a.key: _any(a.value) for a in rm.resource.attributes}
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        data = getattr(m, m.WhichOneof("data"))
                        for p in data.data_points:
                            attrs = {a.key: _any(a.value) for a in p.attributes}
                            out.append((res, attrs, m.name, p))
        return out

    def latest(self, name: str, **attrs: str) -> object | None:
        """Return the last received point of ``name`` whose attributes include ``attrs``."""
        hits = [
            p
            for _, a, n, p in self.points()
            if n == name and all(a.get(k) == v for k, v in attrs.items())
        ]
        return hits[-1] if hits else None

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _any(v) -> object:
    return getattr(v, v.WhichOneof("value")) if v.WhichOneof("value") else None


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def _sum_value(p) -> float:
    return p.as_int if p.WhichOneof("value") == "as_int" else p.as_double


# -- in one process: the OTLP data equals the scrape ------------------------------------------
def _prom_name(name: str, unit: str, kind: str) -> str:
    """Name an OTLP metric the way the Prometheus translators do (suffixes on, escaping on).

    Tokens of [a-zA-Z0-9:]; the unit word appended unless a token already is it; counters
    get ``total`` moved last; unit ``1`` gauges get ``ratio``.
    """
    words = {"s": "seconds", "By": "bytes", "Hz": "hertz", "Cel": "celsius", "W": "watts"}
    words = {**words, "1": "", "": ""}[unit]
    tokens = [t for t in re.split(r"[^a-zA-Z0-9:]+", name) if t]
    if words and words not in tokens:
        tokens.append(words)
    if kind == "sum":
        tokens = [t for t in tokens if t != "total"] + ["total"]
    if unit == "1" and kind == "gauge":
        tokens = [t for t in tokens if t != "ratio"] + ["ratio"]
    return "_".join(tokens)


@pytest.mark.unit
def test_push_carries_the_scraped_series_under_the_same_names(receiver, ddp):
    model, loader, opt = ddp
    obs = exporter.instrument(
        model,
        dataloader=loader,
        optimizer=opt,
        port=0,
        addr="127.0.0.1",
        run="unit",
        heartbeat_s=0,
        otlp=receiver.url,  # a base URL: /v1/metrics is appended
    )
    assert obs.otlp is not None and obs.otlp.endpoint == receiver.url + "/v1/metrics"
    train_epoch(model, loader, opt)
    scraped = parse(scrape_text(f"http://127.0.0.1:{obs.port}/metrics"))
    assert obs.otlp.push()
    req = receiver.requests[-1]
    (rm,) = req.resource_metrics
    res = {a.key: _any(a.value) for a in rm.resource.attributes}
    assert res["ddp.run"] == "unit" and res["ddp.rank"] == 0 and res["ddp.world_size"] == 1
    (sm,) = rm.scope_metrics
    assert sm.scope.name == "ddp-exporter"
    units = {m.name: UNITS[m.unit] for m in catalog.METRICS}
    pushed: dict[str, list] = {}
    for m in sm.metrics:
        kind = m.WhichOneof("data")
        assert _prom_name(m.name, m.unit, kind) == m.name, (m.name, m.unit)
        assert m.unit == units[m.name]
        data = getattr(m, kind)
        if kind in ("sum", "histogram"):
            assert data.aggregation_temporality == 2  # CUMULATIVE
        if kind == "sum":
            assert data.is_monotonic and m.name.endswith("_total")
        for p in data.data_points:
            labels = {a.key: _any(a.value) for a in p.attributes}
            assert labels["run"] == "unit" and labels["rank"] == "0"
            if kind == "histogram":
                bounds = list(p.explicit_bounds) + [float("inf")]
                cum = 0
                for le, n in zip(bounds, p.bucket_counts):
                    cum += n
                    le_s = "+Inf" if le == float("inf") else repr(le)
                    pushed.setdefault(m.name + "_bucket", []).append(({**labels, "le": le_s}, cum))
                pushed.setdefault(m.name + "_count", []).append((labels, p.count))
                pushed.setdefault(m.name + "_sum", []).append((labels, p.sum))
            else:
                pushed.setdefault(m.name, []).append((labels, _sum_value(p)))

    def norm(samples):
        return sorted((tuple(sorted(lab.items())), v) for lab, v in samples)

    # Every scraped series arrives with the same name, labels and (for counters) value; the
    # summary comes as a bucketless histogram, i.e. one extra _bucket{le="+Inf"} series.
    volatile = {
        "ddp_process_resident_memory_bytes",
        "ddp_heartbeat_timestamp_seconds",
        "ddp_collective_inflight_age_seconds",
    }
    for name, samples in scraped.items():
        assert name in pushed, name
        if name in volatile:
            assert [lab for lab, _ in norm(samples)] == [lab for lab, _ in norm(pushed[name])]
        else:
            want, got = norm(samples), norm(pushed[name])
            # pytest >= 9.2's approx takes no nested data: labels exactly, values approximately.
            assert [lab for lab, _ in want] == [lab for lab, _ in got], name
            assert [v for _, v in want] == pytest.approx([v for _, v in got]), name
    extra = set(pushed) - set(scraped)
    assert extra == {"ddp_step_phase_seconds_bucket"}
    assert all(lab["le"] == "+Inf" for lab, _ in pushed["ddp_step_phase_seconds_bucket"])
    n = len(receiver.requests)
    t0 = time.monotonic()
    obs.close()  # the final flush reaches the receiver
    assert len(receiver.requests) == n + 1 and time.monotonic() - t0 < 5


@pytest.mark.unit
def test_failed_push_is_counted_not_raised_and_the_sdk_stays_quiet(ddp, caplog, monkeypatch):
    model, loader, opt = ddp
    caplog.set_level("DEBUG")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "1")  # read by the SDK's exporter
    dead = f"http://127.0.0.1:{free_port()}"
    obs = exporter.instrument(
        model, optimizer=opt, port=0, addr="127.0.0.1", heartbeat_s=0, otlp=dead
    )
    t0 = time.monotonic()
    assert obs.otlp.push() is False
    assert obs.otlp.push() is False
    assert time.monotonic() - t0 < 10
    assert obs.errors.snapshot()["collect"] == 2
    otel = [r for r in caplog.records if r.name.startswith(("opentelemetry", "urllib3"))]
    assert otel == [], [r.getMessage() for r in otel]
    ours = [r for r in caplog.records if "OTLP push" in r.getMessage()]
    assert len(ours) == 1 and "dropped" in ours[0].getMessage()


@pytest.mark.unit
def test_docs_map_every_catalog_metric():
    doc = (Path(__file__).resolve().parent.parent / "docs" / "otlp.md").read_text()
    rows = dict(re.findall(r"^\| `(ddp_\w+)` \|[^|]*\| `?([^|`]*?)`? \|", doc, re.M))
    assert set(rows) == {m.name for m in catalog.METRICS}
    for m in catalog.METRICS:
        assert rows[m.name] == (UNITS[m.unit] or "(none)"), m.name


# -- real two-rank jobs --------------------------------------------------------------------------
def _demo(*extra: str) -> list[str]:
    return ["--port", "0", "--addr", "127.0.0.1", "--heartbeat", "0.5", *extra]


def _env(endpoint: str, interval_ms: int, **more: str) -> dict[str, str]:
    # The run label comes from the environment: torchrun takes "--run" for its "--run-path".
    return {
        "DDP_EXPORTER_RUN": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_METRIC_EXPORT_INTERVAL": str(interval_ms),
        **more,
    }


@pytest.mark.job
def test_two_rank_job_pushes_both_ranks(receiver):
    env = _env(receiver.url, 500)
    with Job(2, _demo("--duration", "60", "--step-time", "0.01"), env=env) as job:
        job.wait_urls()

        def progressed() -> bool:
            return all(
                (p := receiver.latest("ddp_steps_total", rank=str(r), run="otlp")) is not None
                and _sum_value(p) > 0
                for r in (0, 1)
            )

        wait_for(progressed, 30, "ddp_steps_total > 0 from both ranks over OTLP")
        got = {(a["rank"], n) for _, a, n, _ in receiver.points() if "rank" in a}
        for rank in ("0", "1"):
            for name in (
                "ddp_rank_info",
                "ddp_steps_total",
                "ddp_step_duration_seconds",
                "ddp_step_phase_seconds",
                "ddp_collective_duration_seconds",
                "ddp_collective_bytes_total",
                "ddp_collective_last_completed_seq",
                "ddp_exporter_errors_total",
            ):
                assert (rank, name) in got, (rank, name)
        # rank 0 monitors the store heartbeats of both ranks
        assert receiver.latest("ddp_peer_heartbeat_age_seconds", rank="0", peer_rank="1")
        ranks = {res["ddp.rank"] for res, _, _, _ in receiver.points()}
        assert ranks == {0, 1}
        hist = receiver.latest("ddp_step_duration_seconds", rank="1")
        assert list(hist.explicit_bounds) == list(catalog.STEP_BUCKETS)
        assert sum(hist.bucket_counts) == hist.count > 0


@pytest.mark.job
def test_final_flush_delivers_the_last_step_count(receiver):
    env = _env(receiver.url, 60000)
    # The bound only ends a stuck job: two torch processes start in seconds alone, and in
    # minutes on two cores that the suite's other jobs keep busy.
    with Job(2, _demo("--duration", "0", "--steps", "30", "--step-time", "0"), env=env) as job:
        assert job.wait(240) == 0, job.output()
    for rank in ("0", "1"):
        p = receiver.latest("ddp_steps_total", rank=rank, run="otlp")
        assert p is not None and _sum_value(p) == 30, (rank, p, job.output())
    # one push per rank: the periodic one never came within 60 s
    assert len(receiver.requests) == 2


@pytest.mark.job
@pytest.mark.parametrize("collector", ["dead", "slow"])
def test_unreachable_collector_does_not_slow_or_break_training(collector):
    slow = Receiver(delay=30.0) if collector == "slow" else None
    url = slow.url if slow else f"http://127.0.0.1:{free_port()}"
    env = _env(url, 200)
    if collector == "dead":  # fail fast so that the failure is counted while the job runs
        env["OTEL_EXPORTER_OTLP_TIMEOUT"] = "1"
    # 40 steps of 50 ms: 2 s of training. Had a push blocked the training thread, the 10 s
    # request timeout of every 200 ms push would make that minutes.
    args = _demo("--duration", "0", "--steps", "40", "--step-time", "0.05")
    try:
        with Job(2, args, env=env) as job:
            urls = job.wait_urls()

            def errors_counted() -> bool:
                s = parse(scrape_text(urls[0]))
                return (
                    any(
                        lab.get("where") == "collect" and v > 0
                        for lab, v in s.get("ddp_exporter_errors_total", [])
                    )
                    or job.proc.poll() is not None
                )

            t0 = time.monotonic()
            if collector == "dead":
                wait_for(errors_counted, 30, "a failed push counted in ddp_exporter_errors_total")
            # then at most FLUSH_TIMEOUT_S (5 s) of final flush per rank, in parallel
            assert job.wait(60) == 0, job.output()
            elapsed = time.monotonic() - t0
        out = job.output()
        assert elapsed < 30, (elapsed, out)
        assert "Traceback" not in out, out
        # one report per rank from the exporter's ErrorCounter, nothing from the OTel SDK
        assert len(re.findall(r"error in collect", out)) <= 2, out
        sdk_lines = [
            line
            for line in out.splitlines()
            if ("Transient error" in line or "Failed to export" in line)
            and "OTLPExportError" not in line
        ]
        assert sdk_lines == [], out
    finally:
        if slow:
            slow.close()
