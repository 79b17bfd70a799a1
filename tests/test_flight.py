"""In-flight state: the Flight Recorder on gloo, and the fallback when it is missing or fails."""

import json
import logging
import pickle
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
from harness import child_env, free_port, parse, scrape_text, value

import exporter
import exporter.sources.flight
from exporter.errors import ErrorCounter
from exporter.sources.backends import backend_name, backend_recorders, group_backends
from exporter.sources.flight import FlightRecorderSource, log_unrecorded


@pytest.mark.unit
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


@pytest.mark.unit
def test_missing_private_api_means_fallback():
    assert not FlightRecorderSource(ErrorCounter(), dump=None).available


@pytest.mark.unit
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


@pytest.mark.unit
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


def _recorder(status: dict, entries: list):
    """Return a fake dump function of one recorder (what torch's returns, pickled)."""

    def dump(includeCollectives, includeStackTraces, onlyActive):  # noqa: N803 - torch's names
        return pickle.dumps({"pg_status": status, "entries": entries if includeCollectives else []})

    return dump


def _entry(pg_id: int, name: str, seq: int, retired: bool, age_s: float = 0.0) -> dict:
    now = __import__("time").time_ns()
    return {
        "pg_id": pg_id,
        "process_group": (name, "d"),
        "collective_seq_id": seq,
        "retired": retired,
        "is_p2p": False,
        "state": "scheduled",
        "time_created_ns": now - int(age_s * 1e9),
        "timeout_ms": 60000,
    }


@pytest.mark.unit
def test_two_recorders_merge_under_group_names():
    # A CUDA build: NCCL's recorder numbers its groups itself, the generic one (gloo) too; on
    # this rank group "2" is the recorder's pg 1 (a rank outside some group sees other ids).
    nccl = _recorder(
        {
            "0": {"last_enqueued_collective": 5, "last_completed_collective": 5},
            "1": {"last_enqueued_collective": 3, "last_completed_collective": 2},
        },
        [_entry(0, "0", 5, True), _entry(1, "2", 2, True), _entry(1, "2", 3, False, age_s=4)],
    )
    gloo = _recorder(
        {"0": {"last_enqueued_collective": 7, "last_completed_collective": 7}},
        [_entry(0, "5", 7, True)],
    )
    src = FlightRecorderSource(ErrorCounter(), dump=[nccl, gloo])
    assert src.available
    states = {s.pg: s for s in src.read()}
    assert set(states) == {"0", "2", "5"}
    assert (states["2"].last_enqueued, states["2"].last_completed) == (3, 2)
    assert 3.9 < states["2"].inflight_age_s < 10
    assert states["0"].last_enqueued == 5 and states["0"].inflight_age_s == 0.0
    assert states["5"].last_enqueued == 7
    report = exporter.sources.flight.entries_report([nccl, gloo])
    assert report["available"] and set(report["pg_status"]) == {"0", "2", "5"}
    assert [(e["pg"], e["seq"]) for e in report["inflight"]] == [("2", 3)]


@pytest.mark.unit
def test_recorders_that_report_no_group_are_not_usable():
    # torch 2.8-2.10 with TORCH_FR_BUFFER_SIZE unset (0): the dump works, pg_status is empty.
    empty = _recorder({}, [])
    assert not FlightRecorderSource(ErrorCounter(), dump=[empty, empty]).available
    assert not FlightRecorderSource(ErrorCounter(), dump=()).available


_PROBATION = """
import time, torch, torch.distributed as dist, exporter
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=0, world_size=1)
obs = exporter.instrument(None, port=0, addr="127.0.0.1", heartbeat_s=0)
before = obs.inflight.name
with exporter.step():
    dist.all_reduce(torch.ones(2))
# The Flight Recorder marks a collective completed from torch's watchdog thread, a moment
# after the call returned: wait for it, with a deadline.
deadline = time.monotonic() + 30
(state,) = obs.inflight.read()
while state.last_completed < state.last_enqueued and time.monotonic() < deadline:
    time.sleep(0.05)
    (state,) = obs.inflight.read()
print(before, obs.inflight.name, state.pg, state.last_enqueued, state.last_completed)
obs.close()
dist.destroy_process_group()
"""


@pytest.mark.tool
@pytest.mark.parametrize("size, source", [("0", "comm_hook"), ("2000", "flight_recorder")])
def test_no_collective_yet_keeps_the_flight_recorder_on_probation(size, source):
    """Without DDP no collective runs before instrument(), so an empty Flight Recorder proves
    nothing yet: kept while it records (on by default), replaced by the exporter's own
    bookkeeping once a collective it did not record shows it is off (TORCH_FR_BUFFER_SIZE=0)."""
    env = dict(child_env(), TORCH_FR_BUFFER_SIZE=size)
    out = subprocess.run(
        [sys.executable, "-c", _PROBATION.format(port=free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["flight_recorder", source, "0", "1", "1"], out.stdout


def _nccl2_json(status: dict, entries: list):
    """Return a stand-in for torch's ``_dump_fr_trace_json`` holding an nccl2 recorder.

    The nccl2 backend cannot exist on a CPU build: its recorder is shaped as torch writes it,
    JSON with string sequence numbers, an in-flight entry ``scheduled`` (never ``started``).
    """

    def dump_json(includeCollectives=True, onlyActive=False, backend=None):  # noqa: N803
        if backend != "nccl2":
            raise ValueError(f"no Flight Recorder for backend {backend!r}")
        shown = [e for e in entries if not (onlyActive and e["retired"])]
        return json.dumps({"pg_status": status, "entries": shown if includeCollectives else []})

    return dump_json


@pytest.mark.unit
def test_an_nccl2_group_is_read_from_its_own_recorder_beside_gloo():
    # nccl2 keeps a recorder per backend (torch's Flight Recorder hook), which neither
    # _dump_nccl_trace nor the generic dump holds: without its own reader, a job on nccl2
    # would publish no in-flight collective.
    status = {"3": {"last_enqueued_collective": "8", "last_completed_collective": "7"}}
    entries = [_entry(3, "default_pg", 7, True), _entry(3, "default_pg", 8, False, age_s=5)]
    dump_json = _nccl2_json(status, entries)
    (nccl2,) = backend_recorders({"gloo", "nccl2"}, dump_json=dump_json)
    assert nccl2.backend == "nccl2"
    gloo = _recorder({"0": {"last_enqueued_collective": 4, "last_completed_collective": 4}}, [])
    src = FlightRecorderSource(ErrorCounter(), dump=[gloo, nccl2])
    assert src.available and src.backends == ("nccl2",)
    states = {s.pg: s for s in src.read()}
    assert (states["default_pg"].last_enqueued, states["default_pg"].last_completed) == (8, 7)
    assert 4.9 < states["default_pg"].inflight_age_s < 15
    report = exporter.sources.flight.entries_report([gloo, nccl2])
    assert [(e["pg"], e["seq"], e["state"]) for e in report["inflight"]] == [
        ("default_pg", 8, "scheduled")
    ]


@pytest.mark.unit
def test_a_torch_whose_json_dump_takes_no_backend_reads_no_backend_recorder():
    # torch 2.13's own _dump_fr_trace_json has no backend argument: feature-detected, not raised.
    real = torch._C._distributed_c10d._dump_fr_trace_json
    assert backend_recorders({"nccl2"}, dump_json=real) == ()
    assert backend_recorders({"gloo", "nccl"}, dump_json=_nccl2_json({}, [])) == ()


@pytest.mark.unit
def test_the_json_dump_reads_as_the_pickled_one(ddp):
    # The same gloo recorder through both of torch's encodings: JSON writes sequence numbers
    # as strings, and a backend's own recorder is read through JSON only.
    def as_backend(includeCollectives=True, onlyActive=False, backend=None):  # noqa: N803
        dump = torch._C._distributed_c10d._dump_fr_trace_json
        return dump(includeCollectives=includeCollectives, onlyActive=onlyActive)

    dist.all_reduce(torch.ones(3))
    pickled = FlightRecorderSource(ErrorCounter(), dump=torch._C._distributed_c10d._dump_fr_trace)
    (through_json,) = backend_recorders({"gloo-json"}, dump_json=as_backend)
    assert pickled.read() == FlightRecorderSource(ErrorCounter(), dump=through_json).read()


@pytest.mark.unit
def test_the_backend_is_named_by_its_implementation(ddp):
    model, _, _ = ddp
    assert backend_name() == "gloo"
    assert backend_name(model.process_group, torch.device("cpu")) == "gloo"
    assert group_backends()["0"] == ("gloo",)


@pytest.mark.unit
def test_a_group_no_readable_recorder_holds_is_said_in_one_line(caplog):
    caplog.set_level(logging.INFO, logger="exporter")
    groups = {"default_pg": ("nccl2",), "tp": ("gloo", "nccl2"), "dp": ("gloo",), "ep": ("ucc",)}
    status = {"3": {"last_enqueued_collective": "1", "last_completed_collective": "1"}}
    nccl2 = backend_recorders({"nccl2"}, dump_json=_nccl2_json(status, []))
    assert log_unrecorded(groups, FlightRecorderSource(ErrorCounter(), dump=nccl2)) == {"ep": "ucc"}
    assert "TORCH_FR_BUFFER_SIZE" not in caplog.records[0].getMessage()
    caplog.clear()
    # No reader of nccl2's own recorder; a recorder's entries name group "tp" (torch 2.14's
    # hook, attached by hand, records into the generic recorder).
    generic = _recorder({"0": {}}, [_entry(0, "tp", 1, True)])
    missing = log_unrecorded(groups, FlightRecorderSource(ErrorCounter(), dump=[generic]))
    assert missing == {"default_pg": "nccl2", "ep": "ucc"}
    (said,) = [r.getMessage() for r in caplog.records]
    assert "default_pg (nccl2), ep (ucc)" in said and "TORCH_FR_BUFFER_SIZE" in said, said
    caplog.clear()
    assert log_unrecorded({"0": ("gloo",)}, FlightRecorderSource(ErrorCounter(), dump=())) == {}
    assert not caplog.records
