"""The slow link, in the multi-node lab (tests/lab.py): named at run time and by the doctor.

Node 2's link is rate-limited (``tc tbf``, both ways): every rank's step gets many times
slower, with the same exposed communication on every rank, so no rank's compute stands out.
The ranks behind the slow link are told apart by their c10d-store round trips (queued behind
the gradients on that link): DDPRankStraggler ``cause="link"`` names rank 2 and nobody else,
and so does ``ddp-exporter top``, with the node. ``ddp-exporter doctor --links`` passes every
pair while healthy and names the node from pairwise transfers once the link is slow, while the
job runs beside it.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from harness import wait_for
from lab import lab
from promstack import fast_config, firing, require, run_prometheus, sd_scrape

from exporter.mixin.config import FAST
from exporter.mixin.fleet import fleet_recorded
from exporter.tools import top

# Bandwidth over veth links is the CPU's: measured with no other job on the machine.
pytestmark = [pytest.mark.lab, pytest.mark.solo]

WORKER = os.path.join("tests", "workers", "link_worker.py")
PORT = 19400
MBIT = 20


def _sd(url: str) -> list[dict]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def _accused(prom, run: str) -> set[tuple[str, str, str]]:
    return {
        (a["alertname"], a.get("rank", ""), a.get("cause", ""))
        for a in firing(prom, run)
        if a.get("rank") and a.get("role") != "waiting"
    }


# Its own store port (the job's torchrun holds 29500); 1 MiB each way keeps a transfer over a
# link the job also saturates well inside the step timeout.
DOCTOR = [
    sys.executable,
    "-m",
    "exporter.doctor",
    "--links",
    "--links-mib",
    "1",
    "--timeout",
    "90",
    "--step-timeout",
    "30",
]


def _doctor_links(the_lab) -> list:
    """Start doctor --links on every node; return the processes."""
    base = {
        "OMP_NUM_THREADS": "1",
        "MASTER_ADDR": the_lab.nodes[0].name,
        "MASTER_PORT": "29600",
        "WORLD_SIZE": str(len(the_lab.nodes)),
        "LOCAL_RANK": "0",
    }
    return [the_lab.process(n.index, DOCTOR, {**base, "RANK": str(n.index)}) for n in the_lab.nodes]


def test_a_slow_link_is_named_at_run_time_and_by_the_doctor_and_no_healthy_node_is_blamed(
    tmp_path: Path,
):
    require("prometheus")
    env = {"OMP_NUM_THREADS": "1", "DDP_EXPORTER_RUN": "link", "DDP_EXPORTER_HEARTBEAT_S": "1"}
    args = ["--width", "512", "--port", str(PORT), "--addr", "0.0.0.0", "--every", "50"]
    with lab(3) as the_lab:
        jobs = [the_lab.torchrun(i, 1, args, module=WORKER, env=env) for i in range(3)]
        sd_url = f"http://{the_lab.nodes[0].ip}:{PORT}/sd"
        wait_for(lambda: len(_sd(sd_url)) == 3, 120, "3 targets in /sd")
        prom_dir = tmp_path / "prom"
        with run_prometheus(prom_dir, fast_config(prom_dir, sd_scrape(sd_url))) as prom:
            wait_for(lambda: len(prom.targets_up()) == 3, 60, "every rank scraped")
            # Healthy for longer than the alert's window and for: nobody is accused. Meanwhile
            # doctor --links (its own store port) passes every pair of nodes.
            healthy_until = time.monotonic() + 45
            doctors = _doctor_links(the_lab)
            while time.monotonic() < healthy_until or any(p.poll() is None for p in doctors):
                assert not _accused(prom, "link"), _accused(prom, "link")
                time.sleep(1)
            codes, text = [p.wait(5) for p in doctors], doctors[0].text()
            assert codes == [0, 0, 0], text
            assert "links (one rank per node, 1 MiB each way over gloo" in text, text
            assert len(re.findall(r"lab-node-\d <-> lab-node-\d", text)) == 3, text  # every pair
            the_lab.rate_limit(2, MBIT)
            slowed = time.monotonic()
            wait_for(
                lambda: ("DDPRankStraggler", "2", "link") in _accused(prom, "link"),
                120,
                "DDPRankStraggler cause=link for rank 2",
            )
            took = time.monotonic() - slowed
            assert _accused(prom, "link") == {("DDPRankStraggler", "2", "link")}
            # The fleet counts it against the node, by its real hostname, as cause link.
            blamed = fleet_recorded(FAST).blamed
            records = wait_for(lambda: prom.query(f'{blamed}{{run="link"}}'), 30, "fleet blame")
            assert {(s["metric"]["node"], s["metric"]["cause"]) for s in records} == {
                ("lab-node-2", "link")
            }, records
            # top, from the same Prometheus: two reads a window apart (as its first two), the
            # same verdict, the node named.
            url, window = prom.url, FAST.rate_window
            first = top.prometheus_baseline(url, "link", window, config=FAST)
            rows = top.diagnose(
                top.fetch_prometheus(url, "link", window=window), first, config=FAST
            )
            verdicts = {r.rank: r.verdict for r in rows}
            assert verdicts[2].startswith("straggler: link: store round trip"), verdicts
            assert verdicts[2].endswith("its node is slow (node lab-node-2)"), verdicts
            assert not verdicts[0] + verdicts[1], verdicts
            # doctor --links, on the same nodes while the job still runs, names the node too.
            doctors = _doctor_links(the_lab)
            codes, text = [p.wait(120) for p in doctors], doctors[0].text()
            assert codes == [1, 1, 1], text
            rows = {
                line.split()[1]: line.split()[-1]
                for line in text.splitlines()
                if re.match(r"\d\s+lab-node-", line)
            }
            assert rows == {"lab-node-0": "ok", "lab-node-1": "ok", "lab-node-2": "FAIL"}, text
            assert "FAIL rank 2 links: lab-node-2: its best link moves " in text, text
            assert "check lab-node-2's NIC" in text, text
            pairs = [line.split()[:3] for line in text.splitlines() if " <-> " in line]
            assert pairs[2] == ["lab-node-0", "<->", "lab-node-1"], pairs  # the fast one last
        assert all(j.poll() is None for j in jobs)
    steps = [line for line in jobs[0].text().splitlines() if "s/step" in line]
    assert steps, jobs[0].text()
    # The window (20 s) plus the for (30 s) of the FAST rules, and a margin for the queue.
    assert took < 120, took
    print(f"cause=link fired {took:.0f} s after the rate limit; {steps[-1]}", file=sys.stderr)
