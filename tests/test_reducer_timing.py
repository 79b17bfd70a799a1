"""Hook-free timing: DDP's reducer timers read once per step, in a real one-rank gloo group."""

import logging
from types import SimpleNamespace

import pytest
import torch
from conftest import train_epoch

import exporter
from exporter import settings
from exporter.errors import ErrorCounter
from exporter.settings import validate
from exporter.sources.commtiming import choose_timing
from exporter.sources.reducer import ReducerTiming, unsupported

pytestmark = pytest.mark.unit


def test_setting_parses_keyword_then_environment():
    assert settings.comm_timing("instrument") == "auto"
    assert settings.comm_timing("instrument", environ={settings.COMM_TIMING: " Hook "}) == "hook"
    assert settings.comm_timing("instrument", "reducer", {settings.COMM_TIMING: "hook"}) == (
        "reducer"
    )
    with pytest.raises(ValueError, match=r"instrument\(comm_timing=...\).*'fast'"):
        settings.comm_timing("instrument", "fast")
    # A bad variable is logged and the default used (exporter.settings): never raised.
    assert settings.comm_timing("instrument", environ={settings.COMM_TIMING: "bucket"}) == "auto"


def test_instrument_rejects_a_bad_timing_by_name(ddp, monkeypatch):
    model, loader, opt = ddp
    with pytest.raises(ValueError, match="comm_timing"):
        exporter.instrument(model, optimizer=opt, port=0, comm_timing="bucket")
    assert exporter.active() is None


class _ModelOn:
    """A stand-in with DDP's private timing methods and one parameter on ``device``."""

    require_backward_grad_sync = True

    def __init__(self, device: str) -> None:
        self._p = torch.empty(1, device=device, requires_grad=True)
        self.logger = SimpleNamespace(set_runtime_stats_and_log=lambda: None)

    def parameters(self):
        return iter([self._p])

    def _set_ddp_runtime_logging_sample_rate(self, rate):
        pass

    def _get_ddp_logging_data(self):
        return {}


def test_auto_picks_the_reducer_only_where_blame_stays_the_same(ddp):
    model = ddp[0]
    assert unsupported(model) is None
    assert choose_timing("auto", model, "flight_recorder", "optimizer") == "reducer"
    assert choose_timing("auto", model, "flight_recorder", "dataloader") == "reducer"
    # Only the end of the backward would close steps: the iteration marks close them there.
    assert choose_timing("auto", model, "flight_recorder", "comm_hook") == "events"
    # No Flight Recorder: only the hook's bookkeeping has the in-flight state.
    assert choose_timing("auto", model, "comm_hook", "optimizer") == "hook"
    assert choose_timing("hook", model, "flight_recorder", "optimizer") == "hook"
    assert choose_timing("events", model, "flight_recorder", "optimizer") == "events"
    # A GPU model: DDP's CUDA timer would synchronise the host every iteration; marks instead.
    gpu_like = _ModelOn("meta")
    assert "synchronise" in unsupported(gpu_like)
    assert choose_timing("auto", gpu_like, "flight_recorder", "optimizer") == "events"
    assert choose_timing("auto", gpu_like, "comm_hook", "optimizer") == "hook"
    with pytest.raises(ValueError, match="comm_timing='reducer'.*synchronise"):
        choose_timing("reducer", gpu_like, "flight_recorder", "optimizer")
    with pytest.raises(ValueError, match="comm_timing='events'.*not a DistributedDataParallel"):
        choose_timing("events", torch.nn.Linear(1, 1), "flight_recorder", "optimizer")


def test_a_timing_from_the_environment_that_cannot_work_is_logged_and_auto_chooses(
    caplog, monkeypatch
):
    monkeypatch.setattr(validate, "_logged", set())  # what earlier tests logged: forgotten
    monkeypatch.setattr(validate, "_invalid", {})
    monkeypatch.setenv(settings.COMM_TIMING, "Reducer")
    gpu_like = _ModelOn("meta")
    with caplog.at_level(logging.WARNING, logger="exporter"):
        mode = choose_timing("reducer", gpu_like, "flight_recorder", "optimizer", keyword=False)
    assert mode == "events"
    lines = [r.getMessage() for r in caplog.records if settings.COMM_TIMING in r.getMessage()]
    assert len(lines) == 1 and "synchronise" in lines[0] and "'auto'" in lines[0], lines
    assert "got 'Reducer'" in lines[0], lines
    assert settings.invalid_settings() == [settings.COMM_TIMING]  # published, as the value found


def test_instrument_without_optimizer_or_loader_marks_iterations(ddp):
    model, loader, opt = ddp
    obs = exporter.instrument(model, port=0, addr="127.0.0.1", heartbeat_s=0)
    assert obs.comm_timing == "events" and obs.hook is None


def test_flight_recorder_off_keeps_the_hook(ddp):
    model, loader, opt = ddp
    obs = exporter.instrument(
        model, optimizer=opt, port=0, addr="127.0.0.1", heartbeat_s=0, flight_recorder=False
    )
    assert obs.comm_timing == "hook" and obs.inflight.name == "comm_hook"


def test_reading_gives_each_iteration_once_with_its_buckets(ddp):
    model, loader, opt = ddp
    errors = ErrorCounter()
    timing = ReducerTiming(model, errors)
    assert timing.instrument() is True
    assert timing.read() is None  # nothing trained yet
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    readings = []
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        readings.append(timing.read())
    assert timing.read() is None  # no iteration since: nothing new
    # Each step's own iteration, read as it closes (DDP alone would convert it a forward later).
    assert all(r is not None for r in readings), readings
    for r in readings:
        assert r.nbytes == params
        assert 0.0 <= r.exposed_s <= r.comm_s < 5.0
    # Forwards with grad enabled but no backward (evaluation without no_grad) leave DDP's timer
    # holding the last training iteration: nothing new to read; training then reads as before.
    x, y = next(iter(loader))
    evals = []
    for _ in range(3):
        model(x)
        evals.append(timing.read())
    assert evals == [None, None, None], evals
    torch.nn.functional.mse_loss(model(x), y).backward()
    assert timing.read() is not None
    timing.uninstrument()
    timing.uninstrument()
    assert timing.read() is None
    assert errors.counts["comm_timing"] == 0


def test_an_unreadable_reducer_is_counted_once_and_training_goes_on(ddp, caplog):
    model, loader, opt = ddp

    class Broken(_ModelOn):
        def _get_ddp_logging_data(self):
            raise RuntimeError("reducer gone")

    errors = ErrorCounter()
    timing = ReducerTiming(Broken("cpu"), errors)
    timing.instrument()
    assert timing.read() is None and timing.read() is None
    assert errors.counts["comm_timing"] == 1
    timing.uninstrument()


def test_a_step_split_from_the_reducer_sums_to_the_step(ddp):
    model, loader, opt = ddp
    obs = exporter.instrument(
        model, dataloader=loader, optimizer=opt, port=0, addr="127.0.0.1", heartbeat_s=0
    )
    assert obs.comm_timing == "reducer"
    for _ in range(3):
        train_epoch(model, loader, opt)
    snap = obs.recorder.snapshot()
    assert snap.steps == 3 * len(loader)
    assert sum(snap.phase_sum) == pytest.approx(snap.step_sum, rel=1e-9)
    assert snap.phase_sum[2] > 0.0  # comm_wait: the allreduce after backward compute
    (op, pg, _, lat_sum, count, nbytes) = snap.collectives[0]
    assert (op, pg, count) == ("allreduce", "0", 3 * len(loader))
    assert lat_sum > 0.0 and nbytes > 0
