"""NCCL with one rank per GPU: the drills for the first machine with several GPUs.

Each drill runs the demo trainer (``exporter.tools.trainer --backend nccl``) under torchrun (the
killed rank's drill one process per rank) on every GPU of the machine, at most four: a
straggler named by compute, a rank stuck in user code named with its file and line, a killed
rank, a rank whose GPU stalls (the stuck-collective verdict, with what NCCL's RAS says), FSDP2's
collectives counted. FSDP2's, classic FSDP's, tensor parallelism's and a loop's collectives are
timed against torch's profiler (tests/gpu/parallel_worker.py). With fewer than two GPUs every
test is skipped, and says why (scripts/gpu-check.sh reports it).
"""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.distributed as dist
from harness import Job, Ranks, top_accuses, value, verdict_folder, wait_for

from exporter.sources import ras

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


def _verdict(root: str, episode: int = 1) -> tuple[str, dict] | None:
    """Return the text and episode.json of the monitoring rank's verdict, once written."""
    folder = verdict_folder(root, episode)
    if folder is None:
        return None
    with open(os.path.join(folder, "verdict.txt")) as f:
        text = f.read()
    with open(os.path.join(folder, "episode.json")) as f:
        return text, json.load(f)


def _has_ras() -> bool:
    """Say whether this NCCL runs RAS (2.24 and later, unless NCCL_RAS_ENABLE=0)."""
    return torch.cuda.nccl.version() >= (2, 24) and ras.ras_address() is not None


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

        text, episode = wait_for(lambda: _verdict(root), 120, "the monitoring rank's verdict")
    assert episode["kind"] == "behind" and episode["behind"] == [1], text
    assert "trainer.py:" in text and "in _load_batch_that_never_returns" in text, text


def test_nccl_killed_rank_is_named_down_and_its_peers_are_not(tmp_path):
    """The killed rank is DOWN in top and the culprit of the hang its peers are left in; what
    NCCL's RAS reported then is printed for the report (which RAS process answers, if the
    killed rank's was the one listening, is NCCL's choice). One process per rank, as srun
    starts them: torchrun's agent would stop the survivors as soon as one worker died."""
    root = str(tmp_path / "dumps")
    args = _args("kill", 1, 5, "--heartbeat", "0.5", "--timeout", "300")
    cmd = ["-m", "exporter.tools.trainer", *args]
    with Ranks(RANKS, cmd, env=_env(DDP_EXPORTER_DUMP_DIR=root)) as ranks:
        wait_for(lambda: len(ranks.urls) == RANKS, 180, "every rank's metrics URL")
        targets = [ranks.urls[r] for r in range(RANKS)]
        wait_for(lambda: "injecting fault kill" in ranks.output(), 90, "the kill")
        down = top_accuses(targets, 1, "DOWN")
        wait_for(down, 90, "top to name rank 1 down, and only rank 1", interval=2.0)
        text, episode = wait_for(lambda: _verdict(root), 120, "the hang's verdict")
        raw = ras.report(ras.ras_address()) if _has_ras() else "(no RAS in this NCCL)"
    print(f"killed rank: RAS reported\n{raw}\nverdict:\n{text}")  # for the report
    assert episode["kind"] == "behind" and episode["behind"] == [1], text
    assert text.split("CULPRITS:\n")[1].startswith("  rank 1 "), text


def test_nccl_stalled_gpu_is_suspected_in_the_stuck_collective_verdict(tmp_path):
    """The last rank's GPU stream stalls behind a kernel that does not end: every rank enters
    the collective on the host and none completes, a symmetric hang. NCCL's start events
    (``TORCH_NCCL_ENABLE_TIMING=1``) show its collective never started on the device while the
    others' did, and the verdict suspects its device. Where NCCL has RAS, it answers the client
    protocol (every process is alive); its report and the verdict are printed for the report."""
    stalled = RANKS - 1
    root = str(tmp_path / "dumps")
    env = _env(DDP_EXPORTER_DUMP_DIR=root, TORCH_NCCL_ENABLE_TIMING="1")
    # The process group's timeout sets the symmetric threshold: a quarter of it, 30 s.
    args = _args("stall", stalled, 5, "--heartbeat", "0.5", "--timeout", "120")
    with Job(RANKS, args, env=env) as job:
        job.wait_urls()
        wait_for(lambda: "injecting fault stall" in job.output(), 90, "the stall")
        text, episode = wait_for(lambda: _verdict(root), 120, "the stuck collective's verdict")
        raw = ras.report(ras.ras_address()) if _has_ras() else None
    print(f"stalled GPU: RAS reported\n{raw}\nverdict:\n{text}")  # for the report
    assert episode["kind"] == "symmetric" and episode["behind"] == [], text
    assert f"suspect the device of rank {stalled}: its collective never started" in text, text
    if raw is not None:  # the client protocol is NCCL's, not a stable API: proven here
        assert raw.strip(), "this NCCL has RAS, and it did not answer the client protocol"


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


@pytest.mark.parametrize("parallel", ["fsdp2", "fsdp", "tp", "loop"])
def test_nccl_parallel_collectives_are_timed_on_the_device(tmp_path, parallel):
    """FSDP2's and classic FSDP's all-gathers and reduce-scatters, tensor parallelism's
    all-reduces, a hand-written loop's all-reduce of each gradient (no DDP): on every rank, each
    one timed from the Flight Recorder's durations (none untimed), their sum within 10 % of the
    NCCL kernels' device time in torch's profiler; the step split's comm_wait (the compute
    stream's waits, timed on the device every step here) within 10 % of the profiler's exposed
    communication (NCCL kernel time no other kernel overlapped). No rank holds a context on
    another rank's GPU (the exporter's threads query events with their own GPU current)."""
    out = tmp_path / "timing"
    env = _env(TORCH_NCCL_ENABLE_TIMING="1", DDP_EXPORTER_DEVICE_WAIT_EVERY="1")
    worker = os.path.join("tests", "gpu", "parallel_worker.py")
    with Job(RANKS, [str(out), parallel], env=env, module=worker) as job:
        assert job.wait(timeout=130) == 0, job.output()
    reports = [json.loads((tmp_path / f"timing.{r}").read_text()) for r in range(RANKS)]
    print(f"{parallel} device timing:", json.dumps(reports))  # the figures, for the report
    waits = []
    for r in reports:
        assert r["comm_timing"] == "collectives" and not any(r["errors"].values()), r
        # nvidia-smi's view (empty where it cannot see this container's processes).
        uuid = r["own_gpu"] if r["own_gpu"].startswith("GPU-") else f"GPU-{r['own_gpu']}"
        assert r["contexts"] in ([], [uuid]), r
        assert r["exporter"] and r["profiler_s"] > 1e-3, r
        for op, (timed, _total, untimed) in r["exporter"].items():
            assert timed > 0 and untimed == 0, (op, r)
        total = sum(t for _n, t, _u in r["exporter"].values())
        assert total == pytest.approx(r["profiler_s"], rel=0.10), r
        waits.append((r["comm_wait_s"], r["profiler_exposed_s"]))
    assert all(w == pytest.approx(e, rel=0.10, abs=1e-3) for w, e in waits), waits
