"""In-flight state: the Flight Recorder on gloo, and the fallback when it is missing or fails."""

import pickle

from harness import parse, scrape_text, value

import exporter
from exporter.errors import ErrorCounter
from exporter.sources.flight import FlightRecorderSource


def test_reads_every_collective_not_only_ddps(ddp):
    model, loader, opt = ddp
    src = FlightRecorderSource(ErrorCounter())
    assert src.available
    before = {s.pg: s for s in src.read()}["0"].last_enqueued
    t = __import__("torch").ones(3)
    for _ in range(3):
        __import__("torch.distributed").distributed.all_reduce(t)
    __import__("torch.distributed").distributed.barrier()
    after = {s.pg: s for s in src.read()}["0"]
    assert after.last_enqueued >= before + 4
    assert after.timeout_s == 60.0


def test_missing_private_api_means_fallback():
    assert not FlightRecorderSource(ErrorCounter(), dump=None).available


def test_failing_flight_recorder_falls_back_once_and_counts(ddp):
    model, loader, opt = ddp
    obs = exporter.instrument(model, optimizer=opt, port=0, addr="127.0.0.1", heartbeat_s=0)

    def broken(**kwargs):
        raise RuntimeError("FR dump failed")

    obs.inflight.use(FlightRecorderSource(obs.errors, dump=broken))
    s = parse(scrape_text(f"http://127.0.0.1:{obs.port}/metrics"))
    assert value(s, "ddp_exporter_errors_total", where="flight_recorder") == 1
    assert obs.inflight.name == "comm_hook"
    assert "ddp_collective_last_enqueued_seq" in s


def test_decodes_an_in_flight_entry():
    now = __import__("time").time_ns()
    dump = {
        "pg_status": {"0": {"last_enqueued_collective": 9, "last_completed_collective": 8}},
        "entries": [
            {
                "process_group": ("0", "default_pg"),
                "retired": False,
                "is_p2p": False,
                "time_created_ns": now - 4_000_000_000,
                "timeout_ms": 600000,
            },
        ],
    }
    src = FlightRecorderSource(ErrorCounter(), dump=lambda **kw: pickle.dumps(dump))
    (state,) = src.read()
    assert (state.last_enqueued, state.last_completed, state.timeout_s) == (9, 8, 600.0)
    assert 3.9 < state.inflight_age_s < 10
