"""NCCL with one rank per GPU under torchrun: the drills for the first machine with several GPUs.

Each drill runs the demo trainer (``exporter.tools.trainer --backend nccl``) on every GPU of the
machine, at most four: a straggler named by compute, a rank stuck in user code named with its
file and line, a killed rank, FSDP2's collectives counted. FSDP2's and tensor parallelism's
collectives are timed against torch's profiler (tests/gpu/parallel_worker.py). With fewer than
two GPUs every test is skipped, and says why (scripts/gpu-check.sh reports it).
"""

from __future__ import annotations

import glob
import json
import os

import pytest
import torch
import torch.distributed as dist
from harness import Job, top_accuses, value, wait_for

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
#: Ranks of each drill: one per GPU, at most four.
RANKS = min(GPUS, 4)

pytestmark = [
    pytest.mark.job,
    pytest.mark.skipif(
        GPUS < 2,
        reason=f"{GPUS} GPU(s) here: the NCCL drills need one rank per GPU on 2 or more",
    ),
]


@pytest.fixture(autouse=True)
def _nccl() -> None:
    if not dist.is_nccl_available():
        pytest.skip("this torch build has no NCCL")


def _args(fault: str, rank: int, after: float, *extra: str) -> list[str]:
    return [
        *("--device", "cuda", "--backend", "nccl", "--fault", fault),
        *("--fault-rank", str(rank), "--fault-after", str(after)),
        *("--port", "0", "--addr", "127.0.0.1", *extra),
    ]


def _env(**more: str) -> dict[str, str]:
    return {"OMP_NUM_THREADS": "1", "TORCH_FR_BUFFER_SIZE": "2000", **more}


def test_nccl_straggler_is_named_by_compute_on_its_own_gpu():
    slow = RANKS - 1
    args = _args("straggler", slow, 0, "--straggle", "0.12", "--step-time", "0.02")
    with Job(RANKS, args, env=_env()) as job:
        urls = job.wait_urls()
        targets = [urls[r] for r in range(RANKS)]
        info = {r: job.scrape(r) for r in range(RANKS)}
        for s in info.values():
            ((labels, _),) = s["ddp_rank_info"]
            assert labels["backend"] in ("nccl", "nccl2"), labels
            assert labels["device"] == "cuda", labels
        blamed = top_accuses(targets, slow, "straggler: compute")
        wait_for(blamed, 120, f"top to blame rank {slow} alone, by compute", interval=2.0)
        if "ddp_rank_gpu_info" in info[0]:  # the gpu extra: each rank on a GPU of its own
            uuids = {lab["gpu_uuid"] for r in info for lab, _ in info[r]["ddp_rank_gpu_info"]}
            assert len(uuids) == RANKS, uuids


def test_nccl_rank_stuck_in_user_code_is_named_with_file_and_line(tmp_path):
    root = str(tmp_path / "dumps")
    env = _env(DDP_EXPORTER_DUMP_DIR=root)
    args = _args("hang", 1, 5, "--heartbeat", "0.5", "--timeout", "300")
    with Job(RANKS, args, env=env) as job:
        job.wait_urls()
        wait_for(lambda: "injecting fault hang" in job.output(), 90, "the hang to start")

        def verdict():
            found = glob.glob(os.path.join(root, "*-hang-1", "verdict.txt"))
            return found[0] if found else None

        path = wait_for(verdict, 120, "the monitoring rank's verdict")
        with open(path) as f:
            text = f.read()
        with open(os.path.join(os.path.dirname(path), "episode.json")) as f:
            episode = json.load(f)
    assert episode["kind"] == "behind" and episode["behind"] == [1], text
    assert "trainer.py:" in text and "in _load_batch_that_never_returns" in text, text


def test_nccl_killed_rank_is_named_down_and_its_peers_are_not():
    args = _args("kill", 1, 5, "--heartbeat", "0.5")
    with Job(RANKS, args, env=_env()) as job:
        urls = job.wait_urls()
        targets = [urls[r] for r in range(RANKS)]
        wait_for(lambda: "injecting fault kill" in job.output(), 90, "the kill")
        down = top_accuses(targets, 1, "DOWN")
        wait_for(down, 90, "top to name rank 1 down, and only rank 1", interval=2.0)


def test_nccl_fsdp2_collectives_are_counted():
    args = _args("none", 0, 0, "--parallel", "fsdp2", "--step-time", "0.01")
    with Job(RANKS, args, env=_env()) as job:
        job.wait_urls()
        wait_for(
            lambda: all(value(job.scrape(r), "ddp_steps_total") >= 20 for r in range(RANKS)),
            120,
            "20 steps on every rank",
        )
        s = job.scrape(0)
    ops = {lab["op"] for lab, _ in s.get("ddp_collective_bytes_total", [])}
    assert {"allgather", "reduce_scatter"} <= ops, ops
    assert value(s, "ddp_collective_bytes_total", op="allgather") > 0


@pytest.mark.parametrize("parallel", ["fsdp2", "tp"])
def test_nccl_parallel_collectives_are_timed_on_the_device(tmp_path, parallel):
    """FSDP2's all-gathers and reduce-scatters, tensor parallelism's all-reduces: on every rank,
    each one timed from the Flight Recorder's durations (none untimed), their sum within 10 % of
    the NCCL kernels' device time in torch's profiler. The step split's comm_wait against the
    profiler's exposed communication is reported, and an expected failure where it is off by more
    than 10 %: the exporter does not observe the device's wait for these collectives yet."""
    out = tmp_path / "timing"
    env = _env(TORCH_NCCL_ENABLE_TIMING="1")
    worker = os.path.join("tests", "gpu", "parallel_worker.py")
    with Job(RANKS, [str(out), parallel], env=env, module=worker) as job:
        assert job.wait(timeout=130) == 0, job.output()
    reports = [json.loads((tmp_path / f"timing.{r}").read_text()) for r in range(RANKS)]
    print(f"{parallel} device timing:", json.dumps(reports))  # the figures, for the report
    waits = []
    for r in reports:
        assert r["comm_timing"] == "collectives" and not any(r["errors"].values()), r
        assert r["exporter"] and r["profiler_s"] > 1e-3, r
        for op, (timed, _total, untimed) in r["exporter"].items():
            assert timed > 0 and untimed == 0, (op, r)
        total = sum(t for _n, t, _u in r["exporter"].values())
        assert total == pytest.approx(r["profiler_s"], rel=0.10), r
        waits.append((r["comm_wait_s"], r["profiler_exposed_s"]))
    if any(w != pytest.approx(e, rel=0.10, abs=1e-3) for w, e in waits):
        pytest.xfail(f"comm_wait vs the profiler's exposed communication, per rank: {waits}")
