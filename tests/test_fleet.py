"""Fleet drill: several real jobs over five simulated nodes; only the bad node becomes suspect.

Five gloo jobs of three ranks (one process per rank, as srun starts them) run at once, each rank
on a node named through ``DDP_EXPORTER_NODE``, watched by a real Prometheus (FAST rules, fleet
group included) and Alertmanager. The ``bad`` node's rank is throttled in every job it lands on,
at a different rank each time (jobs a, b, c); node ``n3`` is slow once (job d); job e is slow
on every rank (a job-wide slowdown). Every job ends cleanly. DDPSuspectNode must name ``bad``
and no other node, and ``ddp-exporter nodes`` must rank it first with its evidence.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from harness import Ranks, child_env, wait_for
from promstack import local_stack

from exporter.mixin.config import FAST
from exporter.mixin.fleet import fleet_recorded

pytestmark = pytest.mark.stack

#: job: (node of each rank, the slow rank or None, extra trainer arguments)
JOBS = {
    "fleet-a": (["bad", "n1", "n2"], 0, []),
    "fleet-b": (["n3", "bad", "n4"], 1, []),
    "fleet-c": (["n1", "n2", "bad"], 2, []),
    "fleet-d": (["n2", "n3", "n4"], 1, []),  # a different node, slow once
    "fleet-e": (["n4", "n1", "n3"], None, ["--step-time", "0.3"]),  # every rank slower
}
#: Long enough for the straggler alert (FAST: 20 s rate window, 30 s for) with 30 s to spare.
DURATION = 90


def _start(run: str, nodes: list[str], slow: int | None, extra: list[str], sd) -> Ranks:
    fault = (
        [
            "--fault",
            "straggler",
            "--fault-rank",
            str(slow),
            "--fault-after",
            "0",
            "--straggle",
            "0.15",
        ]
        if slow is not None
        else []
    )
    cmd = [
        "-m",
        "exporter.tools.trainer",
        "--duration",
        str(DURATION),
        "--port",
        "0",
        "--addr",
        "127.0.0.1",
        "--heartbeat",
        "1",
        "--run",
        run,
        "--timeout",
        "120",
        "--step-time",
        "0.1",
        *fault,
        *extra,
    ]
    return Ranks(
        len(nodes),
        cmd,
        env={"OMP_NUM_THREADS": "1", "DDP_EXPORTER_FILE_SD": str(sd)},
        per_rank={r: {"DDP_EXPORTER_NODE": node} for r, node in enumerate(nodes)},
    )


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with local_stack(tmp_path_factory.mktemp("fleet")) as (st, sd):
        yield st, sd


# Which node is slow, and which runs each node was seen in before its run ended, are timing
# claims: another job's CPU load would slow a healthy node, or a short run's start, for real.
@pytest.mark.solo
def test_fleet_drill_names_the_bad_node_and_no_other(stack):
    st, sd = stack
    f = fleet_recorded(FAST)
    jobs: list[Ranks] = []
    try:
        for run, (nodes, slow, extra) in JOBS.items():
            jobs.append(_start(run, nodes, slow, extra, sd))
        for ranks in jobs:
            codes = ranks.wait(timeout=DURATION + 180)
            assert set(codes.values()) == {0}, ranks.output()[-3000:]
    finally:
        for ranks in jobs:
            ranks.stop()

    def suspects() -> set[str]:
        got = st.query('ALERTS{alertname="DDPSuspectNode", alertstate="firing"}')
        return {a["metric"]["node"] for a in got}

    wait_for(lambda: suspects() == {"bad"}, 60, "DDPSuspectNode for the bad node")
    blamed = {
        (s["metric"]["node"], s["metric"]["run"], s["metric"]["cause"])
        for s in st.query(f"{f.blamed}\nand on (node, run)\n{f.blamed_alone}")
    }
    # The throttled node in each job it landed on, the once-slow node once; nobody in the job
    # that was slower everywhere.
    assert {b for b in blamed if b[0] == "bad"} == {
        ("bad", "fleet-a", "compute"),
        ("bad", "fleet-b", "compute"),
        ("bad", "fleet-c", "compute"),
    }, blamed
    assert {b for b in blamed if b[0] != "bad"} == {("n3", "fleet-d", "compute")}, blamed
    seen = {s["metric"]["node"]: float(s["value"][1]) for s in st.query(f.runs_seen)}
    assert seen == {"bad": 3, "n1": 3, "n2": 3, "n3": 3, "n4": 3}, seen

    # Nothing else was ever delivered for another node, nor any page about a healthy edge.
    def delivered_suspects() -> set[str]:
        return {
            a["labels"]["node"]
            for _, a in st.alerts
            if a["labels"]["alertname"] == "DDPSuspectNode"
        }

    wait_for(lambda: "bad" in delivered_suspects(), 30, "Alertmanager to deliver DDPSuspectNode")
    delivered = [a["labels"] for _, a in st.alerts]
    assert {a["node"] for a in delivered if a["alertname"] == "DDPSuspectNode"} == {"bad"}
    assert not [a for a in delivered if a["alertname"] in ("DDPRankDown", "DDPJobKilled")]
    assert not [a for a in delivered if a.get("run") == "fleet-e" and "rank" in a], delivered

    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "exporter.tools.cli",
            "nodes",
            "--prometheus",
            st.prometheus_url,
            "--config",
            _fast_config(sd),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env(),
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    first = lines[2].split()
    assert first[0] == "bad" and lines[2].endswith("SUSPECT"), out.stdout
    assert (first[1], first[2], first[3]) == ("3", "3", "3"), out.stdout
    assert all(f"run fleet-{j}: compute" in out.stdout for j in "abc"), out.stdout
    assert out.stdout.count("SUSPECT") == 1, out.stdout


def _fast_config(directory) -> str:
    """Write the FAST config as ``top``/``nodes`` read it (what the stack's rules were made of)."""
    from exporter.mixin.config import config_json

    path = directory.parent / "mixin.json"
    path.write_text(config_json(FAST))
    return str(path)
