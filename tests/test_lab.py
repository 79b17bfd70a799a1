"""Real machines, as far as one host allows: jobs across network namespaces (tests/lab.py).

Each node of the lab has its own hostname, IP and ``eth0``; a torchrun per node (static
rendezvous on node 0); Prometheus in the root namespace scrapes across the bridge. What only
exists across machines is asserted there: ``/sd`` lists each node's IP (never a loopback
address), ``node`` is the node's real hostname, a node that falls off the network (its link
down) gives DDPRankDown for its rank only, and the hang action restarts a job of 3 torchruns.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import time
import urllib.request
from pathlib import Path

import pytest
from harness import wait_for
from lab import PREFIX, Lab, available, clean_leftovers, ip, lab
from promstack import fast_config, firing, require, run_prometheus, sd_scrape

pytestmark = pytest.mark.lab

WORKER = os.path.join("tests", "workers", "restart_worker.py")
PORT = 19400


def _sd(url: str) -> list[dict]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def test_a_lab_removes_all_it_made_and_what_a_killed_one_left():
    reason = available()
    if reason is not None:
        with lab(1):  # skips (or fails where the lab is required) with the reason
            pass
    # What a SIGKILLed earlier run leaves: a namespace and a link with the lab's prefix.
    stale_ns, stale_link = f"{PREFIX}stale0", f"{PREFIX}stalebr"
    ip("netns", "add", stale_ns)
    ip("link", "add", stale_link, "type", "bridge")
    with Lab(2, second_interface=True) as the_lab:
        names = ip("netns", "list").stdout
        assert stale_ns not in names and stale_link not in ip("link").stdout
        assert sorted(the_lab.leftovers()) == sorted(
            [n.namespace for n in the_lab.nodes]
            + [n.veth for n in the_lab.nodes]
            + [the_lab.bridge]
        )
        # Each node: its hostname, its address, and no route from eth1 to the others.
        out = the_lab.process(1, ["sh", "-c", "hostname; ip -4 -o addr show"])
        assert out.wait(30) == 0
        text = out.text()
        assert text.splitlines()[0] == "lab-node-1", text
        assert the_lab.nodes[1].ip in text and "eth1" in text, text
    assert the_lab.leftovers() == []
    assert not [n for n in clean_leftovers() if n.startswith(PREFIX)]


def test_discovery_node_names_and_a_dead_node_across_machines(tmp_path: Path):
    """3 nodes x 1 rank; Prometheus discovers them through rank 0's /sd; node 2 falls off."""
    require("prometheus")
    env = {
        "OMP_NUM_THREADS": "1",
        "DDP_EXPORTER_RUN": "lab",
        "DDP_EXPORTER_HEARTBEAT_S": "1",
        "DDP_EXPORTER_DUMP_DIR": str(tmp_path / "dumps"),
    }
    args = [str(tmp_path), "--steps", "100000", "--port", str(PORT), "--addr", "0.0.0.0"]
    with lab(3) as the_lab:
        jobs = [the_lab.torchrun(i, 1, args, module=WORKER, env=env) for i in range(3)]
        sd_url = f"http://{the_lab.nodes[0].ip}:{PORT}/sd"
        groups = wait_for(lambda: len(_sd(sd_url)) == 3 and _sd(sd_url), 120, "3 targets in /sd")
        by_rank = {g["labels"]["rank"]: g for g in groups}
        for n in the_lab.nodes:
            group = by_rank[str(n.index)]
            assert group["targets"] == [f"{n.ip}:{PORT}"], groups  # the node's IP, not loopback
            assert group["labels"]["node"] == n.name, groups  # the node's real hostname
            assert not ipaddress.ip_address(n.ip).is_loopback
        prom_dir = tmp_path / "prom"
        with run_prometheus(prom_dir, fast_config(prom_dir, sd_scrape(sd_url))) as prom:
            wait_for(lambda: len(prom.targets_up()) == 3, 60, "every rank scraped across nodes")
            nodes = {
                s["metric"]["rank"]: s["metric"]["node"]
                for s in prom.query('ddp_rank_info{run="lab"}')
            }
            assert nodes == {str(n.index): n.name for n in the_lab.nodes}, nodes
            # Node 2 falls off the network: its rank is down, nobody else is accused.
            the_lab.link(2, up=False)
            fell = time.monotonic()
            down = wait_for(
                lambda: [a for a in firing(prom, "lab") if a["alertname"] == "DDPRankDown"],
                90,
                "DDPRankDown",
            )
            took = time.monotonic() - fell
            assert {a.get("rank") for a in down} == {"2"}, down
            accused = {
                (a["alertname"], a.get("rank"))
                for a in firing(prom, "lab")
                if a.get("rank") and a.get("role") != "waiting"
            }
            assert accused <= {
                ("DDPRankDown", "2"),
                ("DDPCollectiveStalled", "2"),
                ("DDPCollectiveTimeoutImminent", "2"),
            }, accused
            assert all(j.poll() is None for j in jobs[:2])  # the reachable nodes wait
    assert took < 90, took
    assert re.search(r"rank 0: metrics at http://", jobs[0].text()), jobs[0].text()


def test_the_hang_action_restarts_a_job_of_three_torchruns(tmp_path: Path):
    """Rank 2 on node 2 stuck at step 40: every node's ranks leave, the job resumes and ends."""
    env = {"OMP_NUM_THREADS": "1", "DDP_EXPORTER_ON_HANG": "abort", "DDP_EXPORTER_HEARTBEAT_S": "1"}
    args = [str(tmp_path), "--stuck", "2:40", "--steps", "100"]
    with lab(3) as the_lab:
        jobs = []
        for i in range(3):
            node_env = dict(env, DDP_EXPORTER_DUMP_DIR=str(tmp_path / f"dumps-{i}"))
            jobs.append(
                the_lab.torchrun(
                    i, 1, args, module=WORKER, env=node_env, extra=["--max-restarts", "1"]
                )
            )
        codes = [job.wait(240) for job in jobs]
    text = "".join(job.text() for job in jobs)
    assert codes == [0, 0, 0], text
    lines = [line for line in text.splitlines() if "ddp-exporter: aborting run" in line]
    assert len(lines) == 3, text
    assert all("rank 2 (node lab-node-2) never entered" in line for line in lines), lines
    assert re.findall(r"attempt 1 resumed at step (\d+)", text) == ["40"] * 3, text
    assert text.count("finished at step 100") == 3, text
    # Node 0 (the monitoring rank's) has the launcher's line: the culprit's node by its name.
    (line,) = (tmp_path / "dumps-0").glob("*-abort.txt")
    assert "culprit_ranks=2 culprit_nodes=lab-node-2 " in line.read_text(), line.read_text()
