"""A job that trains on a thread other than the main one, as Ray Train runs a training function.

The thread that calls ``exporter.instrument()`` is the training thread: its waits are comm_wait,
its declared sections pause its steps and its stack is the one a hang dump names.
"""

from __future__ import annotations

import glob
import inspect
import json
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from harness import Job, top_accuses, value, wait_for

import exporter
import exporter.tools.trainer as trainer
from exporter.hangs.capture import capture
from exporter.sources.ending import ThreadCrash
from exporter.sources.sections import REGISTRY


def _comm_wait(obs: exporter.Observer) -> float:
    return obs.recorder.snapshot().phase_sum[2]


@pytest.mark.unit
def test_the_thread_that_instruments_is_the_one_whose_waits_count(world1):
    dist = world1
    # One thread that stays alive throughout: a finished thread's identifier may be reused.
    with ThreadPoolExecutor(1, thread_name_prefix="train-worker") as worker:
        obs = worker.submit(exporter.instrument, None, serve=False, heartbeat_s=0).result()
        try:
            assert obs.training_thread != threading.get_ident()

            def step() -> float:
                with exporter.step():
                    dist.all_reduce(torch.ones(4))
                return _comm_wait(obs)

            trained = worker.submit(step).result()
            assert trained > 0.0
            # The main thread is not the training thread here: its wait is not the step's.
            assert step() == trained
            assert obs.recorder.steps == 2
        finally:
            obs.close()


def _step_seconds(obs: exporter.Observer) -> float:
    return sum(obs.recorder.snapshot().phase_sum)


@pytest.fixture
def sections():
    """Leave the process-wide section registry as it was found: empty."""
    yield
    REGISTRY.clear()


@pytest.mark.unit
def test_a_section_pauses_the_step_on_the_training_thread_only(world1, sections):
    def step_with_a_section() -> float:
        before = _step_seconds(obs)
        with exporter.step():
            with exporter.deadline("checkpoint", seconds=60):
                time.sleep(0.5)
        return _step_seconds(obs) - before

    with ThreadPoolExecutor(1, thread_name_prefix="train-worker") as worker:
        obs = worker.submit(exporter.instrument, None, serve=False, heartbeat_s=0).result()
        try:
            # On the training thread the section is out of the step: what is left is the rest.
            assert worker.submit(step_with_a_section).result() < 0.5
            # Another thread's section (a checkpoint writer's) does not interrupt training.
            assert step_with_a_section() >= 0.5
        finally:
            obs.close()


@pytest.mark.unit
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_training_thread_that_raises_is_no_clean_end_at_exit(world1):
    ends = {}
    for outcome in ("returns", "raises"):

        def train(outcome: str = outcome) -> None:
            obs = exporter.instrument(None, serve=False, heartbeat_s=0)
            ends[outcome] = obs
            if outcome == "raises":
                raise RuntimeError("the training function failed")

        thread = threading.Thread(target=train, name="train-worker")
        thread.start()
        thread.join(30)
        obs = ends[outcome]
        obs.close_at_exit()  # what the exporter's atexit handler does
        assert (obs.end.unix is not None) == (outcome == "returns"), outcome
    # Closed, each observer took its hook back.
    assert not isinstance(getattr(threading.excepthook, "__self__", None), ThreadCrash)


@pytest.mark.unit
def test_a_forward_on_another_thread_than_the_instrumenting_one_says_so(world1, caplog):
    model = torch.nn.Linear(4, 4)
    with ThreadPoolExecutor(1, thread_name_prefix="train-worker") as worker:
        obs = worker.submit(exporter.instrument, model, serve=False, heartbeat_s=0).result()
    try:
        with caplog.at_level(logging.WARNING, logger="exporter"):
            model(torch.ones(1, 4))
            model(torch.ones(1, 4))
        said = [r.getMessage() for r in caplog.records if "first forward" in r.getMessage()]
        assert len(said) == 1 and "call instrument() on the thread that trains" in said[0]
    finally:
        obs.close()


@pytest.mark.unit
def test_a_dump_puts_the_training_thread_first_and_marks_it():
    ready, release = threading.Event(), threading.Event()

    def train() -> None:
        ready.set()
        release.wait()

    worker = threading.Thread(target=train, name="train-worker", daemon=True)
    worker.start()
    assert ready.wait(10)
    try:
        dump = capture(training_ident=worker.ident)
    finally:
        release.set()
        worker.join(10)
    first, *rest = dump["threads"]
    assert (first["name"], first["training"]) == ("train-worker", True)
    assert not any(t["training"] for t in rest)
    assert any(t["name"] == "MainThread" for t in rest)


def _stuck_line() -> int:
    lines, first = inspect.getsourcelines(trainer._load_batch_that_never_returns)
    return first + next(i for i, line in enumerate(lines) if "time.sleep" in line)


@pytest.mark.job
def test_an_fsdp2_job_on_worker_threads_names_its_straggler_and_where_it_hangs(tmp_path):
    slow, dumps = 2, str(tmp_path / "dumps")
    args = [
        *("--parallel", "fsdp2", "--thread", "--fault", "straggler", "--fault-rank", str(slow)),
        *("--fault-after", "0", "--straggle", "0.12", "--step-time", "0.02"),
        *("--hang-after", "50", "--port", "0", "--addr", "127.0.0.1"),
    ]
    env = {"OMP_NUM_THREADS": "1", "DDP_EXPORTER_DUMP_DIR": dumps}
    with Job(3, args, env=env) as job:
        urls = job.wait_urls()
        # FSDP2's waits on the worker threads are comm_wait: the straggler's compute stands out.
        blamed = top_accuses([urls[r] for r in range(3)], slow, "straggler: compute")
        wait_for(blamed, 40, f"top to blame rank {slow} alone, by compute", interval=2.0)
        s = job.scrape(0)
        assert value(s, "ddp_step_phase_seconds_sum", phase="comm_wait") > 0
        # Then it stops entering collectives: the dump names where its worker thread is.
        folder = wait_for(
            lambda: glob.glob(os.path.join(dumps, "*-hang-*", "verdict.txt")), 150, "a verdict"
        )[0]
        with open(folder) as f:
            verdict = f.read()
        culprits = verdict.split("CULPRITS:")[1].split("WAITING:")[0].strip().splitlines()
        assert len(culprits) == 1 and culprits[0].startswith(f"rank {slow} "), verdict
        assert f"trainer.py:{_stuck_line()} in _load_batch_that_never_returns" in culprits[0]
        with open(os.path.join(os.path.dirname(folder), f"rank-{slow}.json")) as f:
            first = json.load(f)["threads"][0]
        assert (first["name"], first["training"]) == ("train-worker", True), first["name"]
