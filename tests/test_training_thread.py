"""A job that trains on a thread other than the main one, as Ray Train runs a training function.

The thread that calls ``exporter.instrument()`` is the training thread: its waits are comm_wait,
its declared sections pause its steps and its stack is the one a hang dump names.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from harness import (
    Job,
    top_accuses,
    trainer_stuck_at,
    value,
    verdict_culprits,
    verdict_folder,
    wait_for,
)

import exporter
from exporter.hangs.capture import capture
from exporter.sources.ending import ThreadCrash
from exporter.sources.sections import REGISTRY


@contextlib.contextmanager
def instrumented_on_a_worker(
    model: torch.nn.Module | None = None,
) -> Iterator[tuple[ThreadPoolExecutor, exporter.Observer]]:
    """Yield a one-thread pool and the handle its thread instrumented; close both after.

    The thread stays alive throughout: a finished thread's identifier may be reused.
    """
    with ThreadPoolExecutor(1, thread_name_prefix="train-worker") as worker:
        obs = worker.submit(exporter.instrument, model, serve=False, heartbeat_s=0).result()
        try:
            yield worker, obs
        finally:
            obs.close()


def _comm_wait(obs: exporter.Observer) -> float:
    return obs.recorder.snapshot().phase_sum[2]


@pytest.mark.unit
def test_the_thread_that_instruments_is_the_one_whose_waits_count(world1):
    dist = world1
    with instrumented_on_a_worker() as (worker, obs):
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

    with instrumented_on_a_worker() as (worker, obs):
        # On the training thread the section is out of the step: what is left is the rest.
        assert worker.submit(step_with_a_section).result() < 0.5
        # Another thread's section (a checkpoint writer's) does not interrupt training.
        assert step_with_a_section() >= 0.5


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
    with instrumented_on_a_worker(model), caplog.at_level(logging.WARNING, logger="exporter"):
        model(torch.ones(1, 4))
        model(torch.ones(1, 4))
    said = [r.getMessage() for r in caplog.records if "first forward" in r.getMessage()]
    assert len(said) == 1 and "call instrument() on the thread that trains" in said[0]


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
        folder = wait_for(lambda: verdict_folder(dumps), 150, "a verdict")
        with open(os.path.join(folder, "verdict.txt")) as f:
            verdict = f.read()
        culprits = verdict_culprits(verdict)
        assert len(culprits) == 1 and culprits[0].startswith(f"rank {slow} "), verdict
        assert trainer_stuck_at() in culprits[0]
        with open(os.path.join(folder, f"rank-{slow}.json")) as f:
            first = json.load(f)["threads"][0]
        assert (first["name"], first["training"]) == ("train-worker", True), first["name"]
