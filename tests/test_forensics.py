"""Hang forensics on real gloo jobs: who is stuck where, dumped seconds after onset.

Two jobs cover the issue's scenarios: a torchrun job where rank 1 blocks in user code before a
collective and rank 2 is SIGSTOPped (culprit with file:line, waiting stacks, a rank that cannot
answer, the location metric), then both recover and rank 1 hangs again (a second episode), and one process per rank (env://, like srun) that first trains
healthily with a slow step (no dump) and then deadlocks on mismatched collectives.
"""

import glob
import io
import json
import os
import re
import signal
import socket
import stat
import threading
from contextlib import redirect_stdout

import pytest
from conftest import train_epoch
from harness import REPO, Job, Ranks, parse, scrape_text, value, verdict_folder, wait_for

import exporter
from exporter.hangs.capture import capture, innermost_user_frame, summarize
from exporter.hangs.protocol import DumpRequest
from exporter.tools import cli

WORKER = os.path.join("tests", "workers", "hang_worker.py")


def _line_of(marker: str) -> int:
    with open(os.path.join(REPO, WORKER)) as f:
        for n, line in enumerate(f, 1):
            if marker in line:
                return n
    raise AssertionError(marker)


def _pids(text: str) -> dict[int, int]:
    return {int(r): int(p) for r, p in re.findall(r"^pid (\d+) (\d+)$", text, re.M)}


def _all(job: Job) -> str:
    return job.text()  # Job.output() keeps only the tail; the pids come first


def _episodes(root: str) -> list[str]:
    return sorted(glob.glob(os.path.join(root, "*-hang-*")))


def _verdict(root: str, timeout: float, episode: int = 1) -> str:
    return wait_for(lambda: verdict_folder(root, episode), timeout, "the monitoring rank's verdict")


@pytest.mark.unit
def test_capture_reads_every_thread_training_thread_first():
    release = threading.Event()

    def busy() -> None:
        while not release.is_set():
            sum(range(1000))  # busy in Python: holds the GIL but for its switch interval

    blocked = threading.Thread(target=release.wait, name="blocked-in-c", daemon=True)
    spinning = threading.Thread(target=busy, name="busy-in-python", daemon=True)
    blocked.start()
    spinning.start()
    try:
        dump = capture()
    finally:
        release.set()
    names = [th["name"] for th in dump["threads"]]
    assert names[0] == "MainThread" and dump["threads"][0]["training"]
    assert {"blocked-in-c", "busy-in-python"} <= set(names)
    spin = next(th for th in dump["threads"] if th["name"] == "busy-in-python")
    assert spin["frames"][-1]["function"] == "busy"
    here = innermost_user_frame(dump["threads"][0]["frames"])
    assert here["function"] == "test_capture_reads_every_thread_training_thread_first"
    assert summarize(0, dump)["where"]["file"] == here["file"]


@pytest.mark.job
def test_torchrun_rank_behind_in_user_code_and_a_frozen_rank(tmp_path):
    root = str(tmp_path / "dumps")
    release = str(tmp_path / "release")
    env = {"OMP_NUM_THREADS": "1", "DDP_EXPORTER_DUMP_DIR": root, "HANG_WORKER_RELEASE": release}
    # Leaving the block stops torchrun and every rank, the SIGSTOPped one included.
    with Job(3, ["behind", "2"], env=env, module=WORKER) as job:
        urls = job.wait_urls()
        pids = wait_for(lambda: len(_pids(_all(job))) == 3 and _pids(_all(job)), 60, "pids")
        folder = _verdict(root, 120)
        with open(os.path.join(folder, "episode.json")) as f:
            episode = json.load(f)
        with open(os.path.join(folder, "verdict.txt")) as f:
            text = f.read()
        seq = int(episode["seq"])
        stuck = _line_of("# stuck here")
        assert episode["kind"] == "behind" and episode["behind"] == [1, 2], text
        assert episode["missing"] == [2], text
        culprit = (
            f"rank 1 (node {socket.gethostname()}) never entered all_reduce #{seq} (pg 0); it is at "
            f"hang_worker.py:{stuck} in load_batch"
        )
        assert culprit in text
        # Frozen before rank 1 stopped, rank 2 may have missed the collective before it too.
        assert re.search(
            rf"rank 2 \(node [^)]+\) never entered all_reduce (#\d+–)?#{seq} .*did not answer", text
        ), text
        assert text.index(culprit) < text.index("STACKS")
        # The monitoring rank logged the same verdict.
        wait_for(lambda: culprit in _all(job), 10, "the verdict in the log")

        # The waiting rank's stack shows the collective's call site, FR its op and seq.
        with open(os.path.join(folder, "rank-0.json")) as f:
            rank0 = json.load(f)
        main = rank0["threads"][0]
        assert main["training"]
        call_site = _line_of("# collective call site")
        assert any(
            fr["file"].endswith("hang_worker.py") and fr["line"] == call_site
            for fr in main["frames"]
        )
        inflight = rank0["flight_recorder"]["inflight"]
        assert [(e["op"], e["seq"]) for e in inflight] == [("all_reduce", seq)]
        assert inflight[0]["frames"], "Flight Recorder stack traces"
        assert not os.path.exists(os.path.join(folder, "rank-2.json"))  # frozen: no dump

        # User-only permissions: dumps reveal internals.
        for path in [root, folder, *glob.glob(os.path.join(folder, "*"))]:
            mode = stat.S_IMODE(os.stat(path).st_mode)
            assert mode == (0o700 if os.path.isdir(path) else 0o600), (path, oct(mode))

        # The culprit publishes where it is stuck; dumps are counted.
        s1 = parse(scrape_text(urls[1]))
        (labels, v), *_ = s1["ddp_hang_location_info"]
        assert (labels["file"].endswith("hang_worker.py"), labels["line"]) == (True, str(stuck))
        assert labels["function"] == "load_batch" and v == 1
        assert value(s1, "ddp_hang_dumps_total") == 1
        s0 = parse(scrape_text(urls[0]))
        assert "ddp_hang_location_info" not in s0
        assert value(s0, "ddp_hang_dumps_total") == 1

        # The CLI reads the folder: culprits first.
        out = io.StringIO()
        with redirect_stdout(out):
            assert cli.main(["hangs", root]) == 0
        printed = out.getvalue()
        assert culprit in printed and printed.index(culprit) < printed.index("STACKS")

        # Progress resumes (rank 2 thawed, rank 1 released), then rank 1 hangs again: a
        # new episode with a new dump, and still one dump per rank per episode.
        os.kill(pids[2], signal.SIGCONT)
        open(release, "w").close()
        wait_for(lambda: _all(job).count("recovered") >= 3, 60, "training to resume")
        folder2 = _verdict(root, 90, episode=2)
        with open(os.path.join(folder2, "episode.json")) as f:
            episode2 = json.load(f)
        assert episode2["behind"] == [1] and episode2["missing"] == [], episode2
        assert episode2["seq"] > seq
        with open(os.path.join(folder2, "verdict.txt")) as f:
            assert "; it is at hang_worker.py:" in f.read()
        assert len(_episodes(root)) == 2  # no dump storm
        for rank in (0, 1):
            assert value(parse(scrape_text(urls[rank])), "ddp_hang_dumps_total") == 2
        (labels, _), *_ = parse(scrape_text(urls[1]))["ddp_hang_location_info"]
        assert labels["function"] == "load_batch"


@pytest.mark.job
def test_one_process_per_rank_healthy_then_mismatched_collectives(tmp_path):
    root = str(tmp_path / "dumps")
    env = {
        "OMP_NUM_THREADS": "1",
        "HANG_WORKER_PG_TIMEOUT": "40",  # symmetric hang declared at 25% of it: 10 s
        "DDP_EXPORTER_DUMP_DIR": root,
        "DDP_EXPORTER_RUN": "mismatch",
    }
    with Ranks(2, [WORKER, "mismatch"], env=env) as ranks:
        wait_for(lambda: ranks.output().count("healthy done") == 2, 180, "the healthy phase")
        # Healthy training, a 3 s slow step included, must not dump.
        assert _episodes(root) == [], ranks.output()
        folder = _verdict(root, 90)
        with open(os.path.join(folder, "episode.json")) as f:
            episode = json.load(f)
        with open(os.path.join(folder, "verdict.txt")) as f:
            text = f.read()
        seq = int(episode["seq"])
        assert episode["kind"] == "symmetric" and episode["missing"] == [], text
        assert "COLLECTIVE MISMATCH" in text
        assert f"collective #{seq} (pg 0): rank 0 in all_reduce, rank 1 in broadcast" in text
        assert text.index("COLLECTIVE MISMATCH") < text.index("STACKS")


@pytest.mark.unit
def test_dump_in_process_files_metrics_and_flight_recorder_off(ddp, tmp_path):
    model, loader, opt = ddp
    with pytest.raises(TypeError, match="dump_dir"):
        exporter.instrument(model, port=0, dump_dir=123)
    root = str(tmp_path / "d")
    obs = exporter.instrument(
        model, optimizer=opt, port=0, addr="127.0.0.1", heartbeat_s=0.5, dump_dir=tmp_path / "d"
    )
    train_epoch(model, loader, opt)
    summary = obs.hangs.dump(7, DumpRequest(7, "0", "", 1, behind=(0,)))
    folder = glob.glob(os.path.join(root, "*-hang-7"))[0]
    with open(os.path.join(folder, "rank-0.json")) as f:
        dump = json.load(f)
    assert dump["flight_recorder"]["available"] and dump["step"] == 8
    assert summary.where is not None
    assert summary.where.function == "test_dump_in_process_files_metrics_and_flight_recorder_off"
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    s = parse(scrape_text(f"http://127.0.0.1:{obs.port}/metrics"))
    (labels, _), *_ = s["ddp_hang_location_info"]
    assert labels["function"] == summary.where.function
    assert value(s, "ddp_hang_dumps_total") == 1
    # The location goes once the rank progresses (the episode is over for it).
    train_epoch(model, loader, opt)
    wait_for(lambda: obs.hangs.location is None, 10, "the location to be withdrawn")

    obs.inflight.fail(RuntimeError("FR broke"))  # from now on: comm-hook bookkeeping only
    obs.hangs.dump(8, DumpRequest(8, "", "", 0))
    with open(glob.glob(os.path.join(root, "*-hang-8", "rank-0.json"))[0]) as f:
        assert not json.load(f)["flight_recorder"]["available"]
