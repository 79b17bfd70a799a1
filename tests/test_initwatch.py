"""The init watch: endpoint before init_process_group, peer check-in, instrument() takeover."""

from __future__ import annotations

import json
import logging
import os
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from harness import REPO, Job, free_port, parse, scrape_text, value, wait_for
from torch.nn.parallel import DistributedDataParallel as DDP

import exporter
from exporter import catalog, initwatch, settings, storekeys
from exporter.initwatch import InitWatch

WORKER = os.path.join(REPO, "tests", "workers", "init_worker.py")
PHASE = catalog.INIT_PHASE.name
ARRIVED = catalog.INIT_PEER_ARRIVED.name


def _phase(samples: dict) -> str:
    ((labels, _),) = samples[PHASE]
    return labels["phase"]


def _arrivals(samples: dict) -> dict[int, float]:
    return {int(lab["peer_rank"]): v for lab, v in samples.get(ARRIVED, [])}


@pytest.fixture
def agent_env(monkeypatch):
    """Be rank 0 of 3 under a torchrun-like agent: a real TCPStore hosted by the test."""
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=30))
    for name, val in {
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "3",
    }.items():
        monkeypatch.setenv(name, val)
    yield store


def _watch(run: str, peer_series: int = 64) -> InitWatch:
    """Return rank 0's init watch as watch_init() builds it, blind to this process's group.

    The suite's session-wide process group may already exist here; a watch that saw it would
    be done before it started.
    """
    endpoint = settings.Endpoint(
        port=0, addr="127.0.0.1", heartbeat_s=0.2, monitor_rank=0, peer_series=peer_series
    )
    return InitWatch(settings.identity(run=run), endpoint, serve=True, initialized=lambda: False)


@pytest.mark.unit
def test_monitoring_rank_names_peers_that_have_not_checked_in(agent_env):
    watch = _watch("u")
    try:
        url = f"http://127.0.0.1:{watch.port}/metrics"
        s = wait_for(
            lambda: (s := parse(scrape_text(url))) and _arrivals(s) == {0: 1, 1: 0, 2: 0} and s,
            30,
            "rank 0 to check in and see ranks 1 and 2 missing",
        )
        assert _phase(s) == "process_group"
        assert value(s, catalog.INIT_STARTED.name, run="u", rank="0") <= time.time()
        # Rank 1 checks in through the same store, as its own watch would.
        agent_env.add(storekeys.for_init("u", "0").heartbeat(1), 1)
        wait_for(
            lambda: _arrivals(parse(scrape_text(url))) == {0: 1, 1: 1, 2: 0},
            30,
            "rank 1's arrival",
        )
        assert value(s, "ddp_exporter_errors_total", where="heartbeat") == 0
    finally:
        watch.close()
    with pytest.raises(OSError):
        scrape_text(url, timeout=2)


@pytest.mark.unit
def test_beyond_peer_series_only_missing_peers_are_published(agent_env):
    watch = _watch("b", peer_series=1)
    try:
        url = f"http://127.0.0.1:{watch.port}/metrics"
        # Live rank 0 is never published; one missing peer (of two) is, once it is late.
        arrivals = wait_for(
            lambda: _arrivals(parse(scrape_text(url))), 30, "a late peer to be published"
        )
        assert list(arrivals.values()) == [0] and set(arrivals) <= {1, 2}
        series = sum(len(v) for v in parse(scrape_text(url)).values())
        assert series == catalog.init_series_per_rank(monitor=True, world_size=3, peer_series=1)
    finally:
        watch.close()


@pytest.mark.unit
def test_unreachable_store_keeps_phase_store_and_says_so_once(agent_env, caplog, monkeypatch):
    monkeypatch.setattr(initwatch, "STORE_CONNECT_TIMEOUT_S", 0.2)
    monkeypatch.setattr(initwatch, "STORE_PROBE_S", 0.2)
    monkeypatch.setenv("MASTER_PORT", str(free_port()))  # nothing listens there: "blocked"
    caplog.set_level(logging.INFO, logger="exporter")
    watch = _watch("p")
    try:
        url = f"http://127.0.0.1:{watch.port}/metrics"
        wait_for(lambda: watch.store_attempts >= 3, 30, "three attempts to reach the store")
        s = parse(scrape_text(url))
        assert _phase(s) == "store" and ARRIVED not in s
        said = [r.getMessage() for r in caplog.records if "cannot reach" in r.getMessage()]
        assert len(said) == 1 and "MASTER_PORT" in said[0], said
        assert value(s, "ddp_exporter_errors_total", where="heartbeat") == 0
    finally:
        watch.close()


@pytest.mark.unit
def test_without_agent_store_a_lasting_refusal_of_master_port_is_said_once(
    agent_env, caplog, monkeypatch
):
    """srun-like rank 1: no launcher store; rank 0's MASTER_PORT refuses, past the deadline."""
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    monkeypatch.setattr(initwatch, "STORE_PROBE_S", 0.2)
    monkeypatch.setattr(initwatch, "STORE_CONNECT_TIMEOUT_S", 1.0)
    caplog.set_level(logging.INFO, logger="exporter")
    watch = _watch("q")
    try:
        said = wait_for(
            lambda: [r.getMessage() for r in caplog.records if "cannot reach" in r.getMessage()],
            30,
            "the refusal said",
        )
        # Said only after STORE_CONNECT_TIMEOUT_S: rank 0 may simply not have started yet.
        assert said[0].startswith("ddp-exporter: init watch on "), said
        assert "cannot reach rank 0's store: MASTER_ADDR:MASTER_PORT 127.0.0.1:" in said[0]
        assert "refused connections" in said[0] and "phase 'process_group'" in said[0], said
        assert "Fix: nothing listens there" in said[0], said
        assert watch.store_attempts == 0  # no TCPStore client: rank 0 will host the store
    finally:
        watch.close()


@pytest.mark.unit
def test_without_agent_store_phase_only_then_instrument_takes_over(request, caplog, monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    caplog.set_level(logging.INFO, logger="exporter")
    watch = exporter.watch_init(port=0, addr="127.0.0.1", run="t", heartbeat_s=0.2)
    obs = None
    try:
        url = f"http://127.0.0.1:{watch.port}/metrics"
        s = parse(scrape_text(url))
        assert _phase(s) == ("done" if dist.is_initialized() else "process_group")
        assert ARRIVED not in s and "ddp_steps_total" not in s
        said = [r.getMessage() for r in caplog.records if "no launcher store" in r.getMessage()]
        assert len(said) == 1 and "TORCHELASTIC_USE_AGENT_STORE" in said[0]

        request.getfixturevalue("world1")  # init_process_group, in this process
        wait_for(lambda: _phase(parse(scrape_text(url))) == "done", 10, "phase done")

        model = DDP(torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        obs = exporter.instrument(model, optimizer=opt, port=0)
        assert obs.port == watch.port and obs.registry is watch.registry
        assert obs.url == url
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
        s = parse(scrape_text(url))
        assert value(s, "ddp_steps_total", run="t", rank="0") == 3
        assert not [name for name in s if name.startswith("ddp_init_")]
        watch.close()  # handed over: does not stop the observer's endpoint
        assert parse(scrape_text(url))["ddp_steps_total"]
    finally:
        if obs is not None:
            obs.close()
        watch.close()
    with pytest.raises(OSError):
        scrape_text(url, timeout=2)


@pytest.mark.unit
def test_watch_init_rejects_bad_settings(monkeypatch):
    with pytest.raises(ValueError, match="peer_series"):
        exporter.watch_init(port=0, peer_series=-1)
    # A bad variable is logged and its default used (exporter.settings): never raised.
    bad = settings.endpoint("watch_init", environ={settings.HEARTBEAT_S: "soon"})
    assert bad.heartbeat_s == settings.DEFAULT_HEARTBEAT_S
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match=r"watch_init\(port=...\): .* LOCAL_RANK \(1\) <= 65535"):
        exporter.watch_init(port=65535, heartbeat_s=0)
    with pytest.raises(ValueError, match=r"watch_init\(monitor_rank=...\): expected a rank in"):
        exporter.watch_init(port=0, heartbeat_s=0, monitor_rank=2)
    with pytest.raises(ValueError, match=r"watch_init\(run=...\): expected a run name"):
        exporter.watch_init(port=0, heartbeat_s=0, run="")
    assert exporter.api.running_watch() is None


@pytest.mark.job
def test_torchrun_late_rank_is_named_and_instrument_takes_over(tmp_path: Path):
    go, stop = tmp_path / "go", tmp_path / "stop"
    env = {"OMP_NUM_THREADS": "1", "DDP_EXPORTER_HEARTBEAT_S": "0.5"}
    job = Job(3, ["2", str(go), str(stop)], env=env, module=WORKER)
    try:
        wait_for(lambda: {0, 1} <= set(job.urls), 180, f"ranks 0 and 1 to serve\n{job.output()}")
        assert 2 not in job.urls
        # While rank 2 has not started, ranks 0 and 1 serve, checked in and wait for it.
        s0 = wait_for(
            lambda: (s := job.scrape(0)) and _arrivals(s) == {0: 1, 1: 1, 2: 0} and s,
            60,
            "rank 0 to name rank 2 as not arrived",
        )
        s1 = job.scrape(1)
        for s, rank in ((s0, "0"), (s1, "1")):
            assert _phase(s) == "process_group", s
            started = value(s, catalog.INIT_STARTED.name, rank=rank)
            assert value(s, PHASE, rank=rank) >= started
            assert "ddp_steps_total" not in s
        assert ARRIVED not in s1  # only the monitoring rank publishes arrivals
        assert value(s0, "ddp_exporter_errors_total", where="heartbeat") == 0
        go.touch()
        # instrument() takes over the same endpoint: training series appear at the same URL.
        urls = wait_for(lambda: len(job.urls) == 3 and dict(job.urls), 120, "rank 2's URL")
        for rank in range(3):
            s = wait_for(
                lambda rank=rank: (
                    (s := job.scrape(rank)).get("ddp_steps_total")
                    and value(s, "ddp_steps_total", rank=str(rank)) > 0
                    and s
                ),
                120,
                f"training series on rank {rank}'s init-watch endpoint",
            )
            assert value(s, "ddp_steps_total", rank=str(rank)) > 0
            assert not [name for name in s if name.startswith("ddp_init_")]
            port = urls[rank].rsplit(":", 1)[1].split("/")[0]
            line = f"rank {rank}: instrument took over port {port} (watch port {port})"
            assert line in "".join(job.lines), job.output()
        # Discovery starts with the adopted endpoint: rank 0's /sd lists every rank.
        sd_url = urls[0].replace("/metrics", "/sd")
        groups = wait_for(
            lambda: len(g := json.loads(scrape_text(sd_url))) == 3 and g, 60, "/sd on rank 0"
        )
        assert sorted(g["labels"]["rank"] for g in groups) == ["0", "1", "2"], groups
        stop.touch()
        assert job.wait(60) == 0, job.output()
    finally:
        go.touch()
        stop.touch()
        job.kill()  # torchrun and every worker (stop_tree)
