"""Fault drills: a real job, a real Prometheus (1 s scrapes, FAST rules), a real Alertmanager
and a webhook receiver here. Each fault, on two different ranks, must page naming that rank,
and no alert may blame a healthy rank: on rank 1 of a DDP job and on rank 2 of an FSDP2 job
(``fully_shard``), side by side, which must get the same answers from the same rules.
``ddp-exporter top`` reads each job throughout, from the ranks' endpoints and from Prometheus,
and must agree: it names the faulty rank with the matching verdict and never accuses a healthy
one. Ranks are launched one process each (as a scheduler like srun does): under torchrun the
agent tears the whole job down when one rank is killed.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
from harness import Ranks, TopReader, wait_for
from promstack import local_stack

import exporter.tools.top as top
from exporter.tools.localstack import LocalStack

pytestmark = pytest.mark.stack

RANKS = 3
FAULT_AFTER = 8.0
PG_TIMEOUT = 40.0
#: Alerts that accuse a rank; job-wide symptoms (stalled training, throughput drop) and the
#: "waiting" side of a hang are not accusations.
CULPRIT = {"DDPRankStraggler", "DDPInputBound", "DDPRankDown"}
EXPECTED = {
    "straggler": ({"DDPRankStraggler"}, 150),
    "slow-data": ({"DDPRankStraggler", "DDPInputBound"}, 150),
    "hang": ({"DDPCollectiveTimeoutImminent", "DDPCollectiveStalled"}, 90),
    "kill": ({"DDPRankDown"}, 60),
    "freeze": ({"DDPRankDown"}, 60),
}
ACCELERATE_WORKER = os.path.join("tests", "workers", "accelerate_loop_worker.py")
#: The verdict ``top`` must give the faulty rank for each fault.
TOP_VERDICT = {
    "straggler": "straggler: compute",
    "slow-data": "straggler: data",
    "hang": "HUNG",
    "kill": "DOWN",
    "freeze": "DOWN",
}
TIMES: list[tuple[str, int, str, float]] = []


def accuses(alert: dict) -> bool:
    labels = alert["labels"]
    return labels["alertname"] in CULPRIT or labels.get("role") == "behind"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with local_stack(tmp_path_factory.mktemp("drills")) as (st, sd):
        yield st, sd
    if TIMES:
        print("\ntime to alert (s) from fault onset:")
        for fault, rank, alert, secs in TIMES:
            print(f"  {fault:10s} rank {rank}: {alert} after {secs:.1f}s")


def for_run(st: LocalStack, run: str) -> list[tuple[float, dict]]:
    return [(t, a) for t, a in st.alerts if a["labels"].get("run") == run]


#: The job's parallelism for a fault on each rank: both kinds see every fault.
PARALLEL = {1: "ddp", 2: "fsdp2"}


def start_ranks(run: str, sd, args: list[str]) -> Ranks:
    """Start the demo trainer one process per rank (env:// rendezvous, like srun)."""
    cmd = [
        "-m",
        "exporter.tools.trainer",
        "--duration",
        "0",
        "--port",
        "0",
        "--addr",
        "127.0.0.1",
        "--heartbeat",
        "1",
        "--file-sd",
        str(sd),
        "--run",
        run,
        "--timeout",
        str(PG_TIMEOUT),
        "--fault-after",
        str(FAULT_AFTER),
        *args,
    ]
    return Ranks(RANKS, cmd, env={"OMP_NUM_THREADS": "1"})


def stop_ranks(ranks: Ranks, sd, run: str) -> None:
    """Stop every rank (a frozen one too) and withdraw the run's file_sd targets."""
    ranks.stop()
    for f in sd.glob(f"*{run}-rank-*.json"):  # the trainer's and the exporter's own (ddp-...)
        f.unlink()


class TopWatch:
    """Read the run with ``top`` once a second in the background while a drill runs."""

    def __init__(self, st: LocalStack, ranks: Ranks, run: str) -> None:
        wait_for(lambda: len(ranks.urls) == RANKS, 180, "every rank's metrics URL")
        self.reader = TopReader([ranks.urls[r] for r in range(RANKS)], st.prometheus_url, run)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            try:
                self.reader.read()
            except OSError:
                pass  # Prometheus busy for a moment: the next read counts

    def named(self, rank: int, verdict: str) -> bool:
        """Say whether the latest table of each source gives ``rank`` this verdict."""
        tables = self.reader.tables
        return all(tables[m] and tables[m][-1].get(rank, "").startswith(verdict) for m in tables)

    def latest(self, rank: int, reads: int = 12) -> dict[str, list[str]]:
        """Return the verdicts of ``rank`` in each source's last ``reads`` tables."""
        return {
            m: [t.get(rank, "?")[:40] for t in ts[-reads:]] for m, ts in self.reader.tables.items()
        }

    def wrongly_accused(self, culprit: int | None) -> list[tuple[str, int, str]]:
        """Return every (source, rank, verdict) that blamed a rank other than ``culprit``."""
        return [
            (mode, rank, verdict)
            for mode, tables in self.reader.tables.items()
            for table in tables
            for rank, verdict in table.items()
            if rank != culprit and verdict.startswith(top.ACCUSATIONS)
        ]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def wait_alert(st: LocalStack, run: str, names: set[str], rank: int, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for t, a in for_run(st, run):
            if a["labels"]["alertname"] in names and a["labels"].get("rank") == str(rank):
                return t, a
        time.sleep(0.2)
    return None


def check_fault(st: LocalStack, fault: str, fault_rank: int, run: str, ranks: Ranks) -> None:
    """Wait for the fault's page naming ``fault_rank``; check that ``top`` agrees, nobody else blamed."""
    names, bound = EXPECTED[fault]
    watch = TopWatch(st, ranks, run)
    try:
        hit = wait_alert(st, run, names, fault_rank, FAULT_AFTER + 60 + bound)
        onset = ranks.seen("injecting fault")
        assert onset is not None, ranks.output()[-3000:]
        assert hit is not None, (
            f"no {names} for rank {fault_rank}; got {[a['labels'] for _, a in for_run(st, run)]}"
            f"\n{ranks.output()[-2000:]}"
        )
        t, alert = hit
        secs = t - onset
        TIMES.append((fault, fault_rank, alert["labels"]["alertname"], secs))
        assert secs <= bound, f"{fault}: alert after {secs:.1f}s > {bound}s"
        if fault == "straggler":
            assert alert["labels"].get("cause") == "compute"
        wrong = [
            a["labels"]
            for _, a in for_run(st, run)
            if accuses(a) and a["labels"].get("rank") != str(fault_rank)
        ]
        firing = st.query(f'ALERTS{{run="{run}", alertstate="firing"}}')
        wrong += [
            s["metric"]
            for s in firing
            if accuses({"labels": s["metric"]}) and s["metric"].get("rank") != str(fault_rank)
        ]
        assert not wrong, f"healthy ranks blamed: {wrong}"
        # top agrees with the alert: it names the same rank, for the same reason, and nobody else.
        # From Prometheus its suspicion must hold over a whole rate window, read after read, and
        # on a loaded host a read that misses a scrape starts that window again.
        verdict = TOP_VERDICT[fault]
        try:
            named = functools.partial(watch.named, fault_rank, verdict)
            wait_for(named, 60, f"top to give rank {fault_rank} {verdict!r}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; its last reads: {watch.latest(fault_rank)}") from None
        assert not watch.wrongly_accused(fault_rank), watch.wrongly_accused(fault_rank)
    finally:
        watch.stop()


# The two jobs of a fault run side by side, beside the suite's other tests: the trainer emulates
# compute with sleeps, so other jobs' CPU load slows every rank's small real work alike and makes
# no healthy rank a straggler (these drills also pass with a busy loop on every core). Nobody
# else may be accused, by an alert or by top's one-second tables.
@pytest.mark.parametrize("fault", list(EXPECTED))
def test_fault_pages_naming_the_faulty_rank(stack, fault):
    """The fault on rank 1 of a DDP job and on rank 2 of an FSDP2 job: each page names its rank."""
    st, sd = stack
    runs = {rank: f"drill-{fault}-{rank}" for rank in PARALLEL}
    jobs: dict[int, Ranks] = {}
    try:
        for rank, run in runs.items():
            jobs[rank] = start_ranks(
                run, sd, ["--fault", fault, "--fault-rank", str(rank), "--parallel", PARALLEL[rank]]
            )
        # Each job is checked on its own thread, as if it ran alone: a page or a verdict that
        # comes and goes is read while it is there, not after the other job's wait.
        with ThreadPoolExecutor(len(runs)) as pool:
            checks = [
                pool.submit(check_fault, st, fault, rank, run, jobs[rank])
                for rank, run in runs.items()
            ]
        for check in checks:
            check.result()
    finally:
        for rank, ranks in jobs.items():
            stop_ranks(ranks, sd, runs[rank])


#: A real H200's GPU health, recorded by scripts/gpu-check.sh: each rank's stand-in GPU.
GPU_RECORDING = os.path.join("tests", "recordings", "gpu-h200.json")


def test_a_throttled_gpu_and_an_xid_page_naming_rank_node_and_gpu(stack):
    """A straggler whose stand-in GPU throttles, and an Xid on another job's rank 2: each page
    names the rank, its node and its GPU; nobody else is accused."""
    st, sd = stack
    gpu = ["--gpu-recording", GPU_RECORDING]
    runs = {
        "drill-gpu-throttle": (1, ["--fault", "straggler", "--gpu-fault", "throttle"]),
        "drill-gpu-xid": (2, ["--gpu-fault", "xid"]),
    }
    jobs: dict[str, Ranks] = {}
    try:
        for run, (rank, args) in runs.items():
            jobs[run] = start_ranks(run, sd, [*gpu, *args, "--fault-rank", str(rank)])
        hit = wait_alert(st, "drill-gpu-throttle", {"DDPGPUThrottledStraggler"}, 1, 220)
        assert hit is not None, [a["labels"] for _, a in for_run(st, "drill-gpu-throttle")]
        labels = hit[1]["labels"]
        assert labels["reason"] == "hw_slowdown" and labels["gpu_index"] == "1", labels
        assert labels["gpu_uuid"].endswith("0001") and labels["node"], labels
        text = hit[1]["annotations"]["description"]
        assert "throttled: hw_slowdown, SM 1.089GHz vs the run's median 1.98GHz" in text, text
        hit = wait_alert(st, "drill-gpu-xid", {"DDPGPUError"}, 2, 90)
        assert hit is not None, [a["labels"] for _, a in for_run(st, "drill-gpu-xid")]
        labels = hit[1]["labels"]
        assert (labels["cause"], labels["xid"], labels["gpu_index"]) == ("xid", "79", "2"), labels
        assert "raised Xid 79" in hit[1]["annotations"]["description"], hit
        for run, (rank, _) in runs.items():
            wrong = [
                a["labels"]
                for _, a in for_run(st, run)
                if a["labels"].get("rank") not in (None, str(rank))
                and (accuses(a) or a["labels"]["alertname"].startswith("DDPGPU"))
            ]
            assert not wrong, f"healthy ranks blamed: {wrong}"
    finally:
        for run, ranks in jobs.items():
            stop_ranks(ranks, sd, run)


#: How long the healthy drill watches its jobs once every rank serves: past the longest window
#: of the FAST rules it would page on (goodput's minute) with room for a dip to show.
HEALTHY_SECONDS = float(os.environ.get("DDP_DRILL_HEALTHY_SECONDS", "80"))


def _last_minute(st: LocalStack, run: str) -> dict[str, float]:
    """Return the run's goodput over the last minute, by category (seconds), and the part
    each rank was blamed for (``category rank N``)."""
    spent = st.query(f'increase(ddp_goodput_seconds_total{{run="{run}"}}[1m]) > 0')
    out = {a["metric"].get("category"): round(float(a["value"][1]), 2) for a in spent}
    blamed = st.query(f'increase(ddp_goodput_blame_seconds_total{{run="{run}"}}[1m]) > 0')
    for a in blamed:
        key = f"{a['metric'].get('category')} rank {a['metric'].get('culprit_rank')}"
        out[key] = round(float(a["value"][1]), 2)
    return out


def _explain(st: LocalStack, run: str, pending: list[dict]) -> str:
    """Return the pending alerts' labels in full and the run's goodput over the last minute."""
    alerts = [" ".join(f"{k}={v}" for k, v in sorted(a["metric"].items())) for a in pending]
    return f"{alerts}; goodput over the last minute: {_last_minute(st, run)}"


def start_accelerate(run: str, sd) -> Ranks:
    """Start a plain Accelerate loop with the one ``instrument()`` line, one process per rank."""
    env = {"OMP_NUM_THREADS": "1", "DDP_EXPORTER_RUN": run, "DDP_EXPORTER_FILE_SD": str(sd)}
    cmd = [ACCELERATE_WORKER, "--seconds", str(HEALTHY_SECONDS + 120)]
    return Ranks(RANKS, cmd, env=env)


def healthy_drill(stack, starts: dict[str, tuple[str, Callable[[str], Ranks]]]) -> None:
    """Run each job (run label: parallelism reported, start) and require silence throughout.

    No alert, not even pending, for :data:`HEALTHY_SECONDS`; ``top`` reads each job from its
    ranks and from Prometheus at least every 4 s and gives no verdict at all.
    """
    st, sd = stack
    jobs: dict[str, Ranks] = {}
    watches: dict[str, TopWatch] = {}
    try:
        for run, (_, start) in starts.items():
            jobs[run] = start(run)
        for run in starts:
            watches[run] = TopWatch(st, jobs[run], run)
        deadline = time.monotonic() + HEALTHY_SECONDS
        while time.monotonic() < deadline:
            for run in starts:
                pending = st.query(f'ALERTS{{run="{run}"}}')
                assert not pending, _explain(st, run, pending)
                assert not for_run(st, run)
            time.sleep(1.0)
        for run, (parallelism, _) in starts.items():
            # It really was scraped all along: each rank answered most scrapes (on a busy host
            # a 1-s scrape may time out now and then, as DDPRankDown allows).
            window = f"{HEALTHY_SECONDS:.0f}s"
            up = st.query(f'avg_over_time(up{{run="{run}"}}[{window}]) > 0.8')
            assert len(up) == RANKS, st.query(f'avg_over_time(up{{run="{run}"}}[{window}])')
            # Every rank said what it trains. Over the last seconds, not at this instant: a
            # scrape that just timed out marks the rank's series stale until the next one (a
            # loaded CI-style run counted 2 of 3 ranks at the instant).
            info = st.query(
                f'count(count by (rank) (last_over_time(ddp_rank_info{{run="{run}", '
                f'parallelism="{parallelism}"}}[15s])))'
            )
            assert info and float(info[0]["value"][1]) == RANKS, info
            watch = watches[run]
            watch.stop()
            reads = {m: len(t) for m, t in watch.reader.tables.items()}
            assert min(reads.values()) >= HEALTHY_SECONDS / 4, reads
            verdicts = [
                (mode, f"read {i}", f"rank {rank}", verdict)
                for mode, tables in watch.reader.tables.items()
                for i, table in enumerate(tables)
                for rank, verdict in table.items()
                if verdict
            ]
            assert not verdicts, verdicts  # not even a job-wide STUCK
            print(f"\ntop ({run}): {reads} reads of the healthy run, no verdict")
            print(f"goodput ({run}) over the last minute: {_last_minute(st, run)}")
    finally:
        for watch in watches.values():
            watch.stop()
        for run, ranks in jobs.items():
            stop_ranks(ranks, sd, run)


# Not even a pending alert over 100 s, with 1 s scrapes and 20 s windows. Solo: the
# suite's other jobs keep four workers' ranks on two cores, far past a noisy neighbour (a
# heartbeat there can wait seconds for a core); the suite is rehearsed with a busy loop on
# every core too.
@pytest.mark.solo
def test_healthy_run_delivers_no_alert(stack):
    """DDP, FSDP2 and a plain Accelerate loop side by side: no alert, ``top`` names nobody."""
    sd = stack[1]

    def trainer(parallel: str) -> Callable[[str], Ranks]:
        return lambda run: start_ranks(run, sd, ["--fault", "none", "--parallel", parallel])

    jobs = {f"drill-healthy-{k}": (k, trainer(k)) for k in ("ddp", "fsdp2")}
    # The one instrument() line on what accelerator.prepare returned: DDP underneath. Without
    # the transformers extra the other two jobs still run.
    if importlib.util.find_spec("accelerate") is not None:
        jobs["drill-healthy-accelerate"] = ("ddp", functools.partial(start_accelerate, sd=sd))
    healthy_drill(stack, jobs)
