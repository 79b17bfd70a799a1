"""Every CUDA path of the exporter on one real GPU (every test skipped, with why, without one).

- One NCCL rank, the whole ``instrument()`` path: each iteration marked with CUDA events
  resolved off the training thread (and the hook mode's CUDA-event pairs per bucket), the step
  split, the GPU memory series against ``torch.cuda``'s own figures, the Flight Recorder as
  in-flight source on NCCL, ``/metrics``; and no host-device synchronisation added, checked
  with ``torch.cuda.set_sync_debug_mode("error")``.
- Several ranks sharing the GPU over gloo with CUDA tensors (NCCL refuses two ranks on one
  device): the straggler blamed by compute, a hang named with its forensics verdict, gradients
  bit-identical with and without the exporter (DDP; FSDP2 and tensor parallelism on one NCCL
  rank). DDP's reducer timers synchronise the host on CUDA (``comm_timing="reducer"`` is refused
  there), so the reducer mode is tested on CPU only (tests/test_gradients.py,
  tests/test_reducer_timing.py).
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import time

import pytest
import torch
import torch.distributed as dist
from harness import REPO, Job, top_accuses, value, wait_for

from exporter.sources.flight import dump_functions

# No conftest.py here: a second module named "conftest" would shadow tests/conftest.py, whose
# helpers other test modules import by that name.
pytestmark = [
    pytest.mark.job,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason=(
            f"no CUDA device (torch {torch.__version__}, CUDA build: "
            f"{torch.version.cuda or 'none'}); run scripts/gpu-check.sh on a GPU machine"
        ),
    ),
]

WORKER = os.path.join("tests", "gpu", "nccl_worker.py")
TRAINER = os.path.join(REPO, "exporter", "tools", "trainer.py")
TORCH = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
#: Steps of the worker's hook-mode model (nccl_worker.WARMUP_STEPS).
WARMUP_HOOK_STEPS = 20


def _trainer_args(fault: str, rank: int, after: float, *extra: str) -> list[str]:
    return [
        "--device",
        "cuda",
        "--fault",
        fault,
        "--fault-rank",
        str(rank),
        "--fault-after",
        str(after),
        "--port",
        "0",
        "--addr",
        "127.0.0.1",
        *extra,
    ]


def _one(samples: dict, name: str, **labels: str) -> dict:
    """Return the labels of the only sample ``name`` (with ``labels``) of a parsed scrape."""
    found = [lab for lab, _ in samples.get(name, []) if labels.items() <= lab.items()]
    assert len(found) == 1, (name, samples.get(name))
    return found[0]


@pytest.fixture(scope="module")
def nccl_report(tmp_path_factory):
    if not dist.is_nccl_available():
        pytest.skip("this torch build has no NCCL")
    out = tmp_path_factory.mktemp("nccl") / "report.json"
    # The Flight Recorder is on by default from torch 2.11 only; older releases need the size
    # (TORCH_NCCL_TRACE_BUFFER_SIZE before 2.8).
    env = {
        "OMP_NUM_THREADS": "1",
        "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
    }
    with Job(1, [str(out)], env=env, module=WORKER) as job:
        assert job.wait(timeout=240) == 0, job.output()
    return json.loads(out.read_text())


def _marks_expected() -> str:
    """Return the mode ``auto`` picks on CUDA: the marks where a Flight Recorder gives the
    in-flight state (torch >= 2.5 on NCCL), else the hook."""
    return "events" if TORCH >= (2, 5) else "hook"


def test_nccl_rank_marks_each_iteration_with_cuda_events(nccl_report):
    r = nccl_report
    assert r["backend"] == "nccl" and r["world_size"] == 1
    # On CUDA DDP's reducer timers would synchronise the host: refused with a reason, and the
    # refusal leaves nothing instrumented. auto marks each iteration with CUDA events instead.
    assert r["comm_timing"] == _marks_expected()
    assert "synchronise the host" in r["reducer_on_cuda"], r["reducer_on_cuda"]
    assert r["active_after_refusal"] is False
    assert r["recorder"]["steps"] == r["expected_steps"], r["recorder"]
    ((op, pg, _, latency_sum, count, nbytes),) = r["recorder"]["collectives"]
    # One observation per iteration (first bucket to last), every one resolved.
    expected = r["expected_steps"] if r["comm_timing"] == "events" else r["expected_buckets"]
    assert count == expected, (count, r["expected_steps"], r["expected_buckets"])
    ((_, enqueued, completed, _),) = r["bookkeeping"]
    assert enqueued == completed == count, r["bookkeeping"]
    assert nbytes > 0
    # GPU time between events: NCCL makes a one-rank allreduce a copy, so this is the backward
    # from its first gradient on, never negative and far below a second.
    assert 0.0 <= latency_sum / count < 1.0, (latency_sum, count)
    assert not any(r["errors"].values()), r["errors"]


def test_nccl_hook_mode_times_every_bucket_with_cuda_events(nccl_report):
    h = nccl_report["hook"]
    assert h["comm_timing"] == "hook", h
    ((op, pg, _, latency_sum, count, nbytes),) = h["collectives"]
    # Several 1 MiB buckets per backward, each one timed by its CUDA-event pair: as many as a
    # counting hook sees on the same model over the same steps (DDP's first iteration, before
    # it rebuilds its buckets, may reduce in fewer).
    assert count == h["expected_buckets"] > WARMUP_HOOK_STEPS, (count, h["expected_buckets"])
    ((_, enqueued, completed, _),) = h["bookkeeping"]
    assert enqueued == completed == count, h["bookkeeping"]
    assert 0.0 <= latency_sum / count < 1.0 and nbytes > 0, (latency_sum, count, nbytes)
    assert not any(h["errors"].values()), h["errors"]


def test_nccl_metrics_step_split_and_gpu_memory(nccl_report):
    r, s = nccl_report, nccl_report["metrics"]
    steps = r["expected_steps"]
    assert value(s, "ddp_steps_total") == steps
    phases = {lab["phase"]: v for lab, v in s["ddp_step_phase_seconds_sum"]}
    assert set(phases) >= {"data", "compute", "comm_wait", "optimizer"}, phases
    assert all(v >= 0.0 for v in phases.values()), phases
    assert phases["compute"] > 0.0
    count = r["recorder"]["collectives"][0][4]
    assert value(s, "ddp_collective_duration_seconds_count", op="allreduce") == count
    mem = r["torch_memory"]
    for series, key in (
        ("allocated", "allocated"),
        ("reserved", "reserved"),
        ("peak", "peak"),
        ("total", "total"),
    ):
        assert value(s, f"ddp_gpu_memory_{series}_bytes") == mem[key], (series, mem)
    assert 0 < mem["allocated"] <= mem["reserved"] <= mem["total"]
    info = _one(s, "ddp_rank_info")
    # torch's "nccl" builds the legacy backend or nccl2 (TORCH_DIST_USE_NCCL2): the label says.
    assert info["backend"] in ("nccl", "nccl2") and info["device"] == "cuda", info
    assert info["cuda_version"] != "none" and info["nccl_version"] != "none", info
    assert info["comm_timing"] == r["comm_timing"], info
    try:
        import pynvml  # noqa: F401
    except ImportError:
        return  # the gpu extra is not installed: no GPU health series
    # The GPU health of this rank's GPU, served by the instrumented rank over HTTP.
    gpu = _one(s, "ddp_rank_gpu_info")
    uuid = subprocess.run(
        ["nvidia-smi", "--id=0", "--query-gpu=uuid", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout.strip()
    assert gpu["gpu_uuid"] == uuid, (gpu, uuid)
    assert value(s, "ddp_gpu_sm_clock_max_hertz") > 0
    assert value(s, "ddp_exporter_errors_total", where="gpu") == 0


def test_nccl_flight_recorder_is_the_inflight_source(nccl_report):
    r, s = nccl_report, nccl_report["metrics"]
    if TORCH < (2, 5):
        # NCCL's recorder has no pg_status before 2.5: the comm-hook bookkeeping instead.
        assert r["inflight_source"] == "comm_hook"
        pytest.skip(f"torch {torch.__version__}: no Flight Recorder pg_status; fallback used")
    assert dump_functions(), "torch >= 2.5 with CUDA has _dump_nccl_trace"
    assert r["inflight_source"] == "flight_recorder"
    info = _one(s, "ddp_rank_info")
    assert info["inflight_source"] == "flight_recorder", info
    pgs = {lab["pg"] for lab, _ in s["ddp_collective_last_enqueued_seq"]}
    assert pgs, s.get("ddp_collective_last_enqueued_seq")
    # Idle: every collective enqueued has completed, and DDP's buckets are among them.
    count = r["recorder"]["collectives"][0][4]
    total = 0.0
    for pg in pgs:
        enq = value(s, "ddp_collective_last_enqueued_seq", pg=pg)
        assert value(s, "ddp_collective_last_completed_seq", pg=pg) == enq, pg
        assert value(s, "ddp_collective_inflight_age_seconds", pg=pg) == 0.0
        total += enq
    assert total >= count, (total, count)


def test_nccl_training_adds_no_host_device_synchronisation(nccl_report):
    sync = nccl_report["sync_debug"]
    assert sync["bites"], "set_sync_debug_mode('error') did not raise on .item(): no proof"
    assert sync["plain"] is None, f"plain DDP synchronises by itself here:\n{sync['plain']}"
    assert sync["instrumented"] is None, f"the exporter synchronised:\n{sync['instrumented']}"


def test_shared_gpu_straggler_blamed_by_compute():
    args = _trainer_args("straggler", 1, 0, "--straggle", "0.12", "--step-time", "0.02")
    with Job(3, args, env={"OMP_NUM_THREADS": "1"}) as job:
        urls = job.wait_urls()
        targets = [urls[r] for r in range(3)]
        wait_for(
            lambda: all(value(job.scrape(r), "ddp_steps_total") >= 25 for r in range(3)),
            120,
            "25 steps on every rank",
        )
        info = _one(job.scrape(0), "ddp_rank_info")
        assert info["device"] == "cuda" and info["backend"] == "gloo", info
        marks = info["inflight_source"] == "flight_recorder"
        assert info["comm_timing"] == ("events" if marks else "hook"), info
        blamed = top_accuses(targets, 1, "straggler: compute")
        wait_for(blamed, 60, "top to blame rank 1 alone, by compute", interval=2.0)
        s = {r: job.scrape(r) for r in range(3)}

    def per_step(r: int, name: str, **labels: str) -> float:
        return value(s[r], name + "_sum", **labels) / max(value(s[r], name + "_count", **labels), 1)

    compute = {r: per_step(r, "ddp_step_phase_seconds", phase="compute") for r in s}
    coll = {r: per_step(r, "ddp_collective_duration_seconds") for r in s}
    assert max(compute, key=compute.get) == 1, compute
    # The straggler shows the shortest collective latency: the others wait for it.
    assert min(coll, key=coll.get) == 1, coll


def _line_in(path: str, function: str, marker: str) -> int:
    with open(path) as f:
        lines = f.read().splitlines()
    start = next(n for n, line in enumerate(lines) if f"def {function}(" in line)
    return next(n for n, line in enumerate(lines[start:], start + 1) if marker in line)


def test_shared_gpu_hang_named_with_its_forensics(tmp_path):
    root = str(tmp_path / "dumps")
    env = {"OMP_NUM_THREADS": "1", "DDP_EXPORTER_DUMP_DIR": root}
    args = _trainer_args("hang", 1, 5, "--heartbeat", "0.5", "--timeout", "300")
    with Job(3, args, env=env) as job:
        job.wait_urls()
        wait_for(lambda: "injecting fault hang" in job.output(), 90, "the hang to start")
        t0 = time.monotonic()

        def verdict():
            found = glob.glob(os.path.join(root, "*-hang-1", "verdict.txt"))
            return found[0] if found else None

        path = wait_for(verdict, 120, "the monitoring rank's verdict")
        took = time.monotonic() - t0
        with open(path) as f:
            text = f.read()
        with open(os.path.join(os.path.dirname(path), "episode.json")) as f:
            episode = json.load(f)
        s0 = job.scrape(0)
    assert episode["kind"] == "behind" and episode["behind"] == [1], text
    line = _line_in(TRAINER, "_load_batch_that_never_returns", "time.sleep(1)")
    seq = int(episode["seq"])
    assert re.search(rf"rank 1 \(node [^)]+\) never entered all_reduce #{seq} ", text), text
    assert f"trainer.py:{line} in _load_batch_that_never_returns" in text, text
    assert value(s0, "ddp_collective_inflight_age_seconds", pg="0") > 1.0
    assert took < 120, took


def test_shared_gpu_gradients_bit_identical(tmp_path):
    out = tmp_path / "verdict.json"
    grad_worker = os.path.join("tests", "workers", "grad_worker.py")
    args = [str(out), "cuda", "gloo", "ddp"]
    with Job(2, args, env={"OMP_NUM_THREADS": "1"}, module=grad_worker) as job:
        assert job.wait(timeout=240) == 0, job.output()
    for rank, per_rank in enumerate(json.loads(out.read_text())):
        for name, r in per_rank.items():
            assert r["grads"] and r["params"], f"rank {rank} {name}: differ on CUDA"
            assert r["steps"] == 6 and r["settled"], (rank, name, r)
        # On CUDA "auto" marks every iteration (a Flight Recorder for gloo: torch >= 2.8),
        # whatever hook the user registered, before or after; else the hook times every bucket
        # it wraps, and none of a hook registered before instrument().
        if per_rank["builtin/auto"]["inflight"] == "flight_recorder":
            for name in ("builtin", "fp16_after", "fp16_before"):
                r = per_rank[f"{name}/auto"]
                assert r["timing"] == "events" and r["buckets"] == 6, (rank, name, r)
        else:
            assert per_rank["builtin/auto"]["timing"] == "hook"
            assert per_rank["builtin/auto"]["buckets"] > 6
            assert per_rank["fp16_before/auto"]["timing"] == "none"


def test_nccl_sharded_gradients_bit_identical(tmp_path):
    """FSDP2, classic FSDP and tensor parallelism on NCCL, one rank (NCCL takes one rank per
    GPU): with the exporter's collective wrappers in place, loss, gradients and parameters stay
    the same bit for bit, and nothing is left in flight. (On one rank the exporter counts none of
    their collectives, which torch may skip on a group of one; counting them on NCCL needs a
    machine with several GPUs.) Every step's waits are timed on the device with CUDA events: no
    error."""
    if not dist.is_nccl_available():
        pytest.skip("this torch build has no NCCL")
    out = tmp_path / "verdict.json"
    grad_worker = os.path.join("tests", "workers", "grad_worker.py")
    args = [str(out), "cuda", "nccl", "sharded"]
    env = {"OMP_NUM_THREADS": "1", "DDP_EXPORTER_DEVICE_WAIT_EVERY": "1"}
    with Job(1, args, env=env, module=grad_worker) as job:
        assert job.wait(timeout=240) == 0, job.output()
    (per_rank,) = json.loads(out.read_text())
    print("sharded on NCCL:", json.dumps(per_rank))  # the ops counted, for the report
    for name in ("fsdp2/collectives", "fsdp/collectives", "tp/collectives"):
        r = per_rank[name]
        assert r["grads"] and r["params"] and r["losses"], (name, r)
        assert r["steps"] == 6 and r["timing"] == "collectives", (name, r)
        assert r["comm_timing_errors"] == 0, (name, r)
        # On CUDA a collective's latency is not observed (an NCCL call returns once enqueued):
        # counted untimed, and marked complete, so that nothing looks in flight forever.
        assert r["ops"] == [] and r["settled"], (name, r)


@pytest.fixture(scope="module")
def durations_report(tmp_path_factory):
    if not dist.is_nccl_available():
        pytest.skip("this torch build has no NCCL")
    out = tmp_path_factory.mktemp("durations") / "durations.json"
    env = {
        "OMP_NUM_THREADS": "1",
        "TORCH_NCCL_ENABLE_TIMING": "1",
        "TORCH_FR_BUFFER_SIZE": "2000",
        "DDP_EXPORTER_DEVICE_WAIT_EVERY": "1",
    }
    worker = os.path.join("tests", "gpu", "durations_worker.py")
    with Job(1, [str(out)], env=env, module=worker) as job:
        assert job.wait(timeout=240) == 0, job.output()
    r = json.loads(out.read_text())
    print("device durations:", json.dumps(r))  # the figures, for the report
    return r


def test_nccl_collectives_outside_ddp_timed_from_the_flight_recorder(durations_report):
    """A loop of NCCL collectives without DDP, ``TORCH_NCCL_ENABLE_TIMING=1``, each queued
    behind GPU work: every collective timed from the Flight Recorder's durations (none
    untimed), their sum within 10 % of the device time torch's profiler measured for them
    (NCCL's kernels, and the copies NCCL makes instead on one rank), wherever that is long
    enough to compare. Every collective the compute stream waits for, in ``Work.wait()`` or in
    a synchronous call, is marked on the device too, and resolved without error."""
    r = durations_report
    assert r["comm_timing"] == "collectives" and not any(r["errors"].values()), r
    assert r["device_waits"] == sum(r["expected"].values()), r
    for op, n in r["expected"].items():
        timed, _total, untimed = r["exporter"][op]
        assert (timed, untimed) == (n, 0), (op, r)
    total = sum(r["exporter"][op][1] for op in r["expected"])
    assert total > 0, r
    if r["profiler_s"] < 1e-3:
        pytest.skip(
            f"the profiler saw {r['profiler_s'] * 1e3:.3f} ms of work: too little to compare"
        )
    assert total == pytest.approx(r["profiler_s"], rel=0.10), r


def test_nccl_ddp_steps_own_synchronous_collective_is_timed_on_the_device(durations_report):
    """A DDP step that all-reduces its loss synchronously: NCCL runs that collective on the
    compute stream and returns no Work to wait for, and the exporter marks it on the device
    all the same, once per step, without error."""
    r = durations_report["ddp"]
    assert r["steps"] == r["expected"] and not any(r["errors"].values()), r
    assert r["device_waits"] == r["expected"], r


def test_nccl2_names_its_backend_and_keeps_or_says_it_lost_the_in_flight_state():
    """torch's nccl2 backend (``"nccl"`` builds it with ``TORCH_DIST_USE_NCCL2=1``): the rank
    says ``backend="nccl2"``, and its in-flight state comes from nccl2's own Flight Recorder
    or one line names the group no recorder holds. (torch before 2.14 has no nccl2.)"""
    if not hasattr(torch._C._distributed_c10d, "ProcessGroupNCCL2"):
        pytest.skip(f"torch {torch.__version__} has no nccl2 backend")
    args = _trainer_args("none", 0, 0, "--backend", "nccl")
    env = {"OMP_NUM_THREADS": "1", "TORCH_DIST_USE_NCCL2": "1", "TORCH_FR_BUFFER_SIZE": "2000"}
    with Job(1, args, env=env) as job:
        urls = job.wait_urls()
        wait_for(lambda: value(job.scrape(0), "ddp_steps_total") >= 5, 120, "5 steps")
        info = _one(job.scrape(0), "ddp_rank_info")
        output = job.output()
    print("nccl2:", json.dumps(info))  # for the report
    assert urls and info["backend"] == "nccl2", info
    said = "no Flight Recorder the exporter can read records process group" in output
    assert info["inflight_source"] == "flight_recorder" or said, (info, output[-2000:])


def test_device_wait_events_land_on_the_current_stream():
    """The exporter finds the current stream through torch's private calls (a fraction of
    ``torch.cuda.current_stream()``'s host time): it agrees with the public calls on the default
    stream and on a side stream, and the events a device wait records land on the stream that
    was current, not on the default one."""
    from exporter.sources.cudastreams import StreamLookup
    from exporter.sources.devicewaits import CudaEvents

    torch.cuda.set_device(0)
    lookup, events = StreamLookup(0), CudaEvents(0)
    assert lookup.on_default() and events.on_default_stream()
    assert lookup.current() == torch.cuda.current_stream() == torch.cuda.default_stream()
    side = torch.cuda.Stream()  # torch's streams do not synchronise with the default one
    with torch.cuda.stream(side):
        assert not lookup.on_default() and not events.on_default_stream()
        assert lookup.current() == side
        torch.cuda._sleep(400_000_000)  # a fraction of a second of work on the side stream only
        behind = events.record()
    on_default = events.record()
    on_default.synchronize()  # the default stream is idle: at once
    assert on_default.query() and not behind.query(), (
        "the event was not recorded on the side stream"
    )
    torch.cuda.synchronize()
    assert behind.query() and lookup.current() == torch.cuda.default_stream()
