"""instrument() and the Observer handle in a real one-rank gloo process group."""

import logging
import socket

import pytest
import torch
from conftest import train_epoch
from harness import parse, scrape_text, value, wait_for

import exporter
import exporter.catalog
import exporter.settings
from exporter.sources.commhook import CommHookWrapper

pytestmark = pytest.mark.unit


def test_rejects_what_it_cannot_watch_in_one_error(world1):
    for bad in (object(), "model", lambda x: x):
        with pytest.raises(
            TypeError,
            match=r"instrument\(model\): expected a Distributed"
            r"DataParallel, FSDP2 .*torch.nn.Module, or None",
        ):
            exporter.instrument(bad)
    with pytest.raises(ValueError, match=r"comm_timing='hook'\) chooses how DDP"):
        exporter.instrument(torch.nn.Linear(2, 2), comm_timing="hook")
    assert exporter.active() is None


def test_a_plain_module_or_no_model_is_watched(world1):
    """Not DDP: the torch.distributed collectives are wrapped, and restored exactly on close."""
    import torch.distributed as dist

    # torch 2.13 renames all_gather_into_tensor all_gather_single; older releases lack the new name.
    gather = "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"
    before = (dist.all_reduce, getattr(dist, gather), dist.Work.wait, dist.Work.get_future)
    for model in (torch.nn.Linear(2, 2), None):
        obs = exporter.instrument(model, port=0, addr="127.0.0.1", heartbeat_s=0)
        assert obs.parallelism == ("module" if model is not None else "none")
        assert dist.all_reduce is not before[0] and dist.Work.wait is not before[2]
        with exporter.step():
            dist.all_reduce(torch.ones(4))
            getattr(dist, gather)(torch.empty(2), torch.ones(2), async_op=True).wait()
            # Consumed through its future: counted, untimed, not held until a wait.
            dist.all_reduce(torch.ones(2), async_op=True).get_future().wait()
        s = parse(scrape_text(obs.url))
        (labels,) = [lab for lab, _ in s["ddp_rank_info"]]
        assert labels["parallelism"] == obs.parallelism and labels["comm_timing"] == "collectives"
        assert value(s, "ddp_collective_bytes_total", op="allreduce", pg="0") == 24
        assert value(s, "ddp_collective_bytes_total", op="allgather", pg="0") == 8
        assert value(s, "ddp_collective_duration_seconds_count", op="allgather", pg="0") == 1
        assert value(s, "ddp_collective_duration_seconds_count", op="allreduce", pg="0") == 1
        assert value(s, "ddp_collective_untimed_total", op="allreduce", pg="0") == 1
        assert value(s, "ddp_collective_untimed_total", op="allgather", pg="0") == 0
        assert value(s, "ddp_steps_total") == 1
        # The documented budget: a histogram and bytes per (op, pg) pair timed, here two.
        lines = [x for x in scrape_text(obs.url).splitlines() if x and not x.startswith("#")]
        assert len(lines) == exporter.catalog.series_per_rank(
            process_groups=1, store_heartbeat=False, timed_collectives=2
        )
        obs.close()
        assert (
            dist.all_reduce,
            getattr(dist, gather),
            dist.Work.wait,
            dist.Work.get_future,
        ) == before


def test_rejects_bad_arguments_by_name(ddp):
    model, loader, opt = ddp
    with pytest.raises(TypeError, match="dataloader"):
        exporter.instrument(model, dataloader=[1, 2, 3])
    with pytest.raises(TypeError, match="optimizer"):
        exporter.instrument(model, optimizer=object())
    with pytest.raises(ValueError, match="port"):
        exporter.instrument(model, port=70000)
    with pytest.raises(TypeError, match="memory_source"):
        exporter.instrument(model, port=0, memory_source=5)
    with pytest.raises(ValueError, match="peer_series"):
        exporter.instrument(model, port=0, peer_series=-1)
    assert exporter.active() is None


def test_bad_environment_is_logged_and_training_goes_on(ddp, monkeypatch, caplog):
    monkeypatch.setenv("DDP_EXPORTER_PORT", "ninety")
    monkeypatch.setenv("DDP_EXPORTER_PEER_SERIES", "-5")
    monkeypatch.setenv("DDP_EXPORTER_NODE", "gpu node 7; rm")
    with caplog.at_level(logging.WARNING, logger="exporter"):
        obs = exporter.instrument(ddp[0], serve=False)
    assert exporter.active() is obs
    for name in ("DDP_EXPORTER_PORT", "DDP_EXPORTER_PEER_SERIES", "DDP_EXPORTER_NODE"):
        lines = [r.getMessage() for r in caplog.records if f"{name}: expected" in r.getMessage()]
        assert len(lines) == 1 and "using the default" in lines[0], caplog.text
        assert name in exporter.settings.invalid_settings()
    obs.close()


def test_node_label_from_the_environment(ddp, monkeypatch):
    monkeypatch.setenv("DDP_EXPORTER_NODE", "gpu-node-07.cluster")
    obs = exporter.instrument(ddp[0], port=0, addr="127.0.0.1", heartbeat_s=0)
    s = parse(scrape_text(obs.url))
    (labels,) = [lab for lab, _ in s["ddp_rank_info"]]
    assert labels["node"] == "gpu-node-07.cluster"
    obs.close()
    monkeypatch.delenv("DDP_EXPORTER_NODE")
    assert exporter.settings.node_name() == socket.gethostname()


def test_twice_warns_and_returns_the_same_handle(ddp):
    model, loader, opt = ddp
    obs = exporter.instrument(model, port=0, addr="127.0.0.1", heartbeat_s=0)
    with pytest.warns(RuntimeWarning, match="twice"):
        again = exporter.instrument(model, port=0)
    assert again is obs


def test_close_restores_what_was_patched_and_is_idempotent(ddp):
    model, loader, opt = ddp
    loader_class = type(loader)
    pre, post = dict(opt._optimizer_step_pre_hooks), dict(opt._optimizer_step_post_hooks)
    obs = exporter.instrument(
        model, dataloader=loader, optimizer=opt, port=0, addr="127.0.0.1", comm_timing="hook"
    )
    assert type(loader) is not loader_class and isinstance(loader, loader_class)
    assert "register_comm_hook" in model.__dict__
    obs.close()
    obs.close()
    assert type(loader) is loader_class
    assert dict(opt._optimizer_step_pre_hooks) == pre
    assert dict(opt._optimizer_step_post_hooks) == post
    assert "register_comm_hook" not in model.__dict__
    assert exporter.active() is None
    train_epoch(model, loader, opt)  # the disabled wrapper still reduces gradients


def test_reducer_timing_leaves_ddp_alone_and_gives_back_its_sample_rate(ddp):
    model, loader, opt = ddp
    obs = exporter.instrument(model, optimizer=opt, port=0, addr="127.0.0.1", heartbeat_s=0)
    assert obs.comm_timing == "reducer" and obs.hook is None
    assert "register_comm_hook" not in model.__dict__ and not model._comm_hooks
    for _ in range(2):  # past DDP's first 10 iterations, which it always times
        train_epoch(model, loader, opt)
    timed = model._get_ddp_logging_data()["iteration"]
    assert timed == 2 * len(loader)  # every iteration timed (sample rate 1)
    obs.close()
    obs.close()
    train_epoch(model, loader, opt)
    # Back at DDP's own rate (every 100th iteration): none of these 8 iterations was timed.
    assert model._get_ddp_logging_data()["iteration"] == timed


@pytest.mark.parametrize("timing", ["hook", None])
def test_serves_steps_phases_and_collectives_over_http(ddp, timing):
    model, loader, opt = ddp
    obs = exporter.instrument(
        model,
        dataloader=loader,
        optimizer=opt,
        port=0,
        addr="127.0.0.1",
        run="unit",
        comm_timing=timing,
    )
    train_epoch(model, loader, opt)
    url = f"http://127.0.0.1:{obs.port}/metrics"
    # Hook: one observation per bucket; the last bucket's completion callback may still be
    # running on gloo's thread. Reducer: one per iteration, read as each step closes.
    timed = len(loader)
    s = wait_for(
        lambda: (
            (x := parse(scrape_text(url)))
            and value(x, "ddp_collective_duration_seconds_count") >= timed
            and x
        ),
        10,
        "every bucket's completion to be recorded",
    )
    assert value(s, "ddp_steps_total", run="unit", rank="0") == len(loader)
    assert value(s, "ddp_step_phase_seconds_count", phase="data") == len(loader)
    assert value(s, "ddp_collective_duration_seconds_count", op="allreduce", pg="0") >= timed
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    assert value(s, "ddp_collective_bytes_total") == params * timed
    total = sum(value(s, "ddp_step_phase_seconds_sum", phase=p) for p in exporter.catalog.PHASES)
    assert total == pytest.approx(value(s, "ddp_step_duration_seconds_sum"), rel=1e-6)
    assert value(s, "ddp_step_phase_seconds_sum", phase="comm_wait") > 0
    info = [lab for lab, _ in s["ddp_rank_info"]][0]
    assert info["comm_timing"] == (timing or "reducer")
    info = [lab for lab, _ in s["ddp_rank_info"]][0]
    assert info["world_size"] == "1" and info["backend"] == "gloo" and info["device"] == "cpu"
    assert "ddp_gpu_memory_allocated_bytes" not in s
    assert value(s, "ddp_process_resident_memory_bytes") > 0


def test_explicit_steps_without_optimizer(ddp):
    model, loader, opt = ddp
    obs = exporter.instrument(model, port=0, addr="127.0.0.1", heartbeat_s=0)
    train_epoch(model, loader, opt, explicit=True)
    assert obs.recorder.snapshot().steps == len(loader)


def test_dataloader_marks_steps_when_no_optimizer(ddp):
    model, loader, opt = ddp
    obs = exporter.instrument(model, dataloader=loader, port=0, addr="127.0.0.1", heartbeat_s=0)
    train_epoch(model, loader, opt)
    # Each next() closes the previous step; the final StopIteration closes the last.
    assert obs.recorder.snapshot().steps == len(loader)


def test_evaluation_steps_between_training_leave_the_optimizer_closing_steps(ddp):
    """The first exporter.step() took the boundaries for good: every optimizer step after an
    evaluation of step() blocks folded into one (DDPTrainingStalled on a healthy job)."""
    model, loader, opt = ddp
    obs = exporter.instrument(
        model, dataloader=loader, optimizer=opt, port=0, addr="127.0.0.1", heartbeat_s=0
    )
    train_epoch(model, loader, opt)
    with torch.no_grad():
        for x, _ in list(loader)[:3]:  # evaluation batches, each a step of its own
            with exporter.step():
                model(x)
    train_epoch(model, loader, opt)
    assert obs.recorder.snapshot().steps == 2 * len(loader) + 3
    assert obs.recorder.mode == "optimizer"


def test_step_blocks_over_an_instrumented_dataloader_count_each_batch_once(ddp):
    model, loader, opt = ddp
    obs = exporter.instrument(model, dataloader=loader, port=0, addr="127.0.0.1", heartbeat_s=0)
    for _ in range(2):
        train_epoch(model, loader, opt, explicit=True)
    assert obs.recorder.snapshot().steps == 2 * len(loader)


def test_port_in_use_logs_one_line_and_training_goes_on(ddp, caplog):
    model, loader, opt = ddp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        with caplog.at_level(logging.ERROR, logger="exporter"):
            obs = exporter.instrument(model, optimizer=opt, port=taken, addr="127.0.0.1")
    assert obs.port is None and obs.url is None
    lines = [r for r in caplog.records if str(taken) in r.getMessage()]
    assert len(lines) == 1 and "DDP_EXPORTER_PORT" in lines[0].getMessage()
    train_epoch(model, loader, opt)
    assert obs.recorder.snapshot().steps == len(loader)


def test_a_web_config_that_cannot_be_served_has_no_url_until_it_is(ddp, tmp_path):
    model, _, opt = ddp
    config = tmp_path / "web.yml"  # not written yet: bound all the same, serving nothing
    obs = exporter.instrument(model, optimizer=opt, port=0, addr="127.0.0.1", web_config=config)
    assert obs.port is not None and obs.url is None
    config.write_text("{}\n")  # no TLS, no users: plain HTTP once it is read
    url = wait_for(lambda: obs.url, 10, "the URL once the file can be served")
    assert url == f"http://127.0.0.1:{obs.port}/metrics"
    assert "ddp_steps_total" in parse(scrape_text(url))


def test_an_address_not_of_this_host_names_the_address_setting(ddp, caplog):
    model, loader, opt = ddp
    with caplog.at_level(logging.ERROR, logger="exporter"):
        # TEST-NET-1 (RFC 5737): never one of this host's addresses, nothing is contacted.
        obs = exporter.instrument(model, optimizer=opt, port=0, addr="192.0.2.1", heartbeat_s=0)
    assert obs.port is None
    (line,) = [r.getMessage() for r in caplog.records if "cannot serve" in r.getMessage()]
    assert "192.0.2.1" in line and "DDP_EXPORTER_ADDR" in line and "DDP_EXPORTER_PORT" not in line
    train_epoch(model, loader, opt)
    assert obs.recorder.snapshot().steps == len(loader)


def test_user_hook_after_instrument_is_wrapped_and_only_once(ddp):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    model, loader, opt = ddp
    obs = exporter.instrument(
        model, optimizer=opt, port=0, addr="127.0.0.1", heartbeat_s=0, comm_timing="hook"
    )
    model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    assert (
        isinstance(obs.hook, CommHookWrapper) and obs.hook.inner is default_hooks.fp16_compress_hook
    )
    with pytest.raises(RuntimeError, match="only be called once"):
        model.register_comm_hook(None, default_hooks.allreduce_hook)
    train_epoch(model, loader, opt)
    # The last bucket's completion callback may still be running on gloo's thread.
    wait_for(
        lambda: obs.recorder.snapshot().collectives[0][4] >= len(loader),
        10,
        "every bucket's completion to be recorded",
    )


def test_builtin_hook_after_instrument_goes_under_the_wrapper(ddp):
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    model, loader, opt = ddp
    obs = exporter.instrument(
        model, optimizer=opt, port=0, addr="127.0.0.1", heartbeat_s=0, comm_timing="hook"
    )
    # DDP's own (private) name: without the shadow the reducer would refuse a second hook.
    model._register_builtin_comm_hook(dist.BuiltinCommHookType.FP16_COMPRESS)
    assert obs.hook.inner is default_hooks.fp16_compress_hook
    train_epoch(model, loader, opt)
    obs.close()
    assert "_register_builtin_comm_hook" not in model.__dict__


def test_injected_gpu_memory_source_is_read_at_scrape(ddp):
    from exporter.sources.memory import GPUMemory

    calls = []

    def fake_gpu():
        calls.append(1)
        return GPUMemory(allocated=1 << 20, reserved=2 << 20, peak=3 << 20, total=80 << 30)

    obs = exporter.instrument(ddp[0], port=0, addr="127.0.0.1", memory_source=fake_gpu)
    assert calls == []
    s = parse(scrape_text(f"http://127.0.0.1:{obs.port}/metrics"))
    assert calls == [1]
    assert value(s, "ddp_gpu_memory_allocated_bytes") == 1 << 20
    assert value(s, "ddp_gpu_memory_reserved_bytes") == 2 << 20
    assert value(s, "ddp_gpu_memory_peak_bytes") == 3 << 20
    assert value(s, "ddp_gpu_memory_total_bytes") == 80 << 30


def test_exporter_errors_are_counted_not_raised(ddp):
    def broken():
        raise RuntimeError("driver went away")

    obs = exporter.instrument(ddp[0], port=0, addr="127.0.0.1", memory_source=broken)
    for expected in (1, 2):
        s = parse(scrape_text(f"http://127.0.0.1:{obs.port}/metrics"))
        assert value(s, "ddp_exporter_errors_total", where="memory") == expected
        assert value(s, "ddp_steps_total") == 0  # the rest is still served


def test_flight_recorder_can_be_turned_off(ddp, monkeypatch):
    monkeypatch.setenv("DDP_EXPORTER_FLIGHT_RECORDER", "0")
    model, loader, opt = ddp
    obs = exporter.instrument(model, optimizer=opt, port=0, addr="127.0.0.1")
    train_epoch(model, loader, opt)
    url = f"http://127.0.0.1:{obs.port}/metrics"
    s = wait_for(
        lambda: (
            (x := parse(scrape_text(url)))
            and value(x, "ddp_collective_last_completed_seq", pg="0") == len(loader)
            and x
        ),
        10,
        "the last bucket's completion",
    )
    assert [lab for lab, _ in s["ddp_rank_info"]][0]["inflight_source"] == "comm_hook"
    assert value(s, "ddp_collective_last_enqueued_seq", pg="0") == len(loader)
    assert value(s, "ddp_collective_last_completed_seq", pg="0") == len(loader)
    assert value(s, "ddp_collective_inflight_age_seconds", pg="0") == 0.0
