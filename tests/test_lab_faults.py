"""The seeds' network faults for real, in the multi-node lab (tests/lab.py), and who is named.

One lab of 3 nodes (each with a second interface no other node routes to); ``ddp-exporter
doctor`` runs once per node, as a user would before a job, first healthy, then under each
fault: the master port DROPPED by node 0's firewall, node 2's firewall dropping every port
but MASTER_PORT (gloo's), node 2's hostname resolving to loopback (gloo then advertises
127.0.1.1), ``GLOO_SOCKET_IFNAME`` naming node 1's unrouted interface, and
``MASTER_ADDR`` resolving on node 1 to an address nobody answers. The init watch of ranks
launched one process per rank names the two it can see (it probes ``MASTER_ADDR:MASTER_PORT``),
and a node that loses all its traffic mid-training is named by the alerts while the reachable
ranks' stacks are dumped. Each drill asserts the node, the port or interface and the fix named,
and that no healthy node is blamed. How fast (against the default timeouts) is measured by
benchmarks/netfaults.py, not here.
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
from lab import Lab, lab
from promstack import fast_config, firing, require, run_prometheus, sd_scrape

from exporter.mixin.config import FAST
from exporter.mixin.fleet import fleet_recorded
from exporter.tools import top

pytestmark = pytest.mark.lab

MASTER_PORT = 29500
WORKER = os.path.join("tests", "workers", "restart_worker.py")
PORT = 19400
# The others wait for rank 0's store until 50 s: on a loaded machine node 0's doctor may start
# its store many seconds after theirs (a suite's run on two cores once took over 30 s).
DOCTOR = [sys.executable, "-m", "exporter.doctor", "--timeout", "60", "--step-timeout", "8"]


def _doctor(the_lab: Lab, env_of: dict[int, dict[str, str]] | None = None) -> tuple[list, str]:
    """Run the doctor on every node at once; return the exit codes and node 0's output."""
    base = {
        "OMP_NUM_THREADS": "1",
        "MASTER_ADDR": the_lab.nodes[0].name,
        "MASTER_PORT": str(MASTER_PORT),
        "WORLD_SIZE": str(len(the_lab.nodes)),
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
    }
    procs = [
        the_lab.process(
            n.index, DOCTOR, {**base, "RANK": str(n.index), **(env_of or {}).get(n.index, {})}
        )
        for n in the_lab.nodes
    ]
    codes = [p.wait(90) for p in procs]
    return codes, "\n".join(f"== node {i}\n{p.text()}" for i, p in enumerate(procs))


def _row(text: str, rank: int) -> dict[str, str]:
    """Return rank ``rank``'s row of node 0's table as {column: value}."""
    lines = text.splitlines()
    header = next((line for line in lines if line.startswith("rank ")), None)
    row = next((line for line in lines if re.match(rf"{rank}\s+lab-node-", line)), None)
    assert header is not None and row is not None, f"no row of rank {rank} in:\n{text}"
    return dict(zip(header.split(), row.split(), strict=True))


def test_the_doctor_names_each_network_fault_and_no_healthy_node():
    with lab(3, second_interface=True) as the_lab:
        # Healthy first: every check passes on every node (a false FAIL would send users
        # chasing firewalls that are fine).
        codes, text = _doctor(the_lab)
        assert codes == [0, 0, 0], text
        for rank in range(3):
            assert _row(text, rank)["reach"] == "ok" and _row(text, rank)["gloo"] == "ok", text

        # Node 2's firewall drops everything but MASTER_PORT: gloo's ports.
        the_lab.drop_tcp_except(2, MASTER_PORT)
        codes, text = _doctor(the_lab)
        the_lab.open_firewall(2)
        assert codes[0] == 1, text
        assert [_row(text, r)["reach"] for r in range(3)] == ["ok", "ok", "FAIL"], text
        assert "the other ranks cannot connect to rank 2 on lab-node-2" in text, text
        assert "FAIL rank 2 reach:" in text and "from ranks 0,1 (dropped)" in text, text
        assert "lab-node-2 drops connections on ports other than MASTER_PORT" in text, text
        assert "FAIL rank 0" not in text and "FAIL rank 1" not in text, text

        # Node 2's hostname resolves to loopback (Debian's 127.0.1.1): gloo advertises it.
        the_lab.resolve_as(2, "lab-node-2", "127.0.1.1")
        codes, text = _doctor(the_lab)
        the_lab.resolve_as(2, "lab-node-2", the_lab.nodes[2].ip)
        assert codes[0] == 1, text
        assert [_row(text, r)["reach"] for r in range(3)] == ["ok", "ok", "FAIL"], text
        assert "its gloo address 127.0.1.1:" in text and "(the hostname lab-node-2)" in text
        assert "gloo on lab-node-2 advertises a loopback address" in text, text

        # GLOO_SOCKET_IFNAME on node 1 names eth1, which no other node has a route to.
        codes, text = _doctor(the_lab, {1: {"GLOO_SOCKET_IFNAME": "eth1"}})
        assert codes[0] == 1, text
        assert [_row(text, r)["reach"] for r in range(3)] == ["ok", "FAIL", "ok"], text
        assert re.search(
            r"FAIL rank 1 reach: its gloo address 10\.11\.\d+\.1:\d+ "
            r"\(GLOO_SOCKET_IFNAME=eth1\) on lab-node-1",
            text,
        ), text
        assert "set GLOO_SOCKET_IFNAME on lab-node-1 to the interface the nodes share" in text
        assert "FAIL rank 0" not in text and "FAIL rank 2" not in text, text

        # Node 0's firewall drops MASTER_PORT: the other nodes name it from where they stand.
        the_lab.drop(0, f"tcp dport {MASTER_PORT}")
        codes, text = _doctor(the_lab)
        the_lab.open_firewall(0)
        assert codes[1] == 1 and codes[2] == 1, text
        for node in (1, 2):
            assert (
                f"MASTER_ADDR:MASTER_PORT lab-node-0:{MASTER_PORT} "
                f"({the_lab.nodes[0].ip}): no answer within"
            ) in text, text
            assert f"from lab-node-{node} (connections dropped)" in text, text
        assert f"open TCP port {MASTER_PORT} on lab-node-0 to the other nodes" in text, text

        # MASTER_ADDR resolves, on node 1 only, to an address in the lab nobody answers.
        stale = f"10.77.{the_lab.subnet}.200"
        the_lab.resolve_as(1, the_lab.nodes[0].name, stale)
        codes, text = _doctor(the_lab)
        assert codes[1] == 1, text
        assert "is unreachable from lab-node-1" in text, text
        assert f"MASTER_ADDR resolves to {stale} here" in text, text
        assert "/etc/hosts on lab-node-1" in text, text
        assert "unreachable from lab-node-2" not in text, text


# One process per rank (srun-like: no launcher store): rank 0 hosts the store inside
# init_process_group, the others' init watch probes MASTER_ADDR:MASTER_PORT meanwhile.
INIT = (
    "import exporter, torch.distributed as dist\n"
    "exporter.watch_init()\n"
    "dist.init_process_group('gloo')\n"
    "print('initialized', flush=True)\n"
)


def test_the_init_watch_names_a_dropped_master_port_and_a_stale_master_address():
    base = {
        "OMP_NUM_THREADS": "1",
        "MASTER_PORT": str(MASTER_PORT),
        "WORLD_SIZE": "3",
        "LOCAL_RANK": "0",
        "DDP_EXPORTER_HEARTBEAT_S": "1",
    }
    with lab(3) as the_lab:
        base["MASTER_ADDR"] = the_lab.nodes[0].name
        env = {n.index: {**base, "RANK": str(n.index)} for n in the_lab.nodes}
        # Node 0's firewall drops MASTER_PORT: nodes 1 and 2 say so within the probe's 5 s.
        the_lab.drop(0, f"tcp dport {MASTER_PORT}")
        procs = [the_lab.process(i, [sys.executable, "-c", INIT], env[i]) for i in range(3)]
        for node in (1, 2):
            line = wait_for(
                lambda node=node: [
                    x for x in procs[node].text().splitlines() if "cannot reach" in x
                ],
                60,
                f"node {node}'s init watch naming the dropped port",
            )[0]
            assert f"init watch on lab-node-{node} cannot reach rank 0's store" in line, line
            assert (
                f"lab-node-0:{MASTER_PORT} ({the_lab.nodes[0].ip}): no answer within 5 s "
                f"from lab-node-{node} (connections dropped)"
            ) in line, line
            assert f"Fix: open TCP port {MASTER_PORT} on lab-node-0" in line, line
        assert "cannot reach" not in procs[0].text(), procs[0].text()  # rank 0 hosts the store
        for p in procs:
            p.stop()
        # The firewall opens; MASTER_ADDR resolves on node 1 to an address nobody answers.
        the_lab.open_firewall(0)
        stale = f"10.77.{the_lab.subnet}.200"
        the_lab.resolve_as(1, the_lab.nodes[0].name, stale)
        procs = [the_lab.process(i, [sys.executable, "-c", INIT], env[i]) for i in range(3)]
        line = wait_for(
            lambda: [x for x in procs[1].text().splitlines() if "cannot reach" in x],
            60,
            "node 1's init watch naming the stale address",
        )[0]
        assert "is unreachable from lab-node-1" in line and f"resolves to {stale} here" in line
        assert "/etc/hosts on lab-node-1" in line, line
        # Node 2 resolves it right: by the time node 1 said so, its probe had succeeded.
        assert "cannot reach" not in procs[2].text(), procs[2].text()


def _sd(url: str) -> list[dict]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def _sd_url(the_lab: Lab) -> str | None:
    """Return the /sd URL of whichever node runs rank 0 (the others answer 404), or None."""
    for n in the_lab.nodes:
        url = f"http://{n.ip}:{PORT}/sd"
        try:
            _sd(url)
            return url
        except OSError:
            continue
    return None


def test_a_node_partitioned_mid_training_is_named_and_the_others_dump(tmp_path: Path):
    """Node 2 loses all traffic while training: rank 2 is named, ranks 0 and 1 dump, nobody
    else is blamed."""
    require("prometheus")
    dumps = tmp_path / "dumps"  # one shared folder, as on a shared file system
    env = {
        "OMP_NUM_THREADS": "1",
        "DDP_EXPORTER_RUN": "part",
        "DDP_EXPORTER_HEARTBEAT_S": "1",
        "DDP_EXPORTER_DUMP_DIR": str(dumps),
    }
    args = [str(tmp_path), "--steps", "100000", "--port", str(PORT), "--addr", "0.0.0.0"]
    with lab(3) as the_lab:
        # c10d rendezvous: torchrun assigns the node ranks; the monitoring rank (0) and its
        # /sd may land on any node.
        jobs = [the_lab.torchrun(i, 1, args, module=WORKER, env=env, rdzv="c10d") for i in range(3)]
        sd_url = wait_for(lambda: _sd_url(the_lab), 120, "the monitoring rank's /sd")
        wait_for(lambda: len(_sd(sd_url)) == 3, 120, "3 targets in /sd")
        prom_dir = tmp_path / "prom"
        with run_prometheus(prom_dir, fast_config(prom_dir, sd_scrape(sd_url))) as prom:
            wait_for(lambda: len(prom.targets_up()) == 3, 60, "every rank scraped")
            wait_for(
                lambda: len(prom.query('ddp_steps_total{run="part"} > 20')) == 3,
                60,
                "every rank training",
            )
            # Cut off a node that hosts neither rank 0 (the monitoring rank) nor the store.
            node_of = {
                int(s["metric"]["rank"]): s["metric"]["node"]
                for s in prom.query('ddp_rank_info{run="part"}')
            }
            cut_rank = next(
                r for r, n in sorted(node_of.items()) if r != 0 and n != the_lab.nodes[0].name
            )
            cut_node = node_of[cut_rank]
            live = sorted(set(node_of) - {cut_rank})
            the_lab.drop(int(cut_node.rsplit("-", 1)[1]), "meta l4proto != 255")  # all, both ways
            cut = time.monotonic()
            down = wait_for(
                lambda: [a for a in firing(prom, "part") if a["alertname"] == "DDPRankDown"],
                90,
                "DDPRankDown",
            )
            named = time.monotonic() - cut
            assert {a.get("rank") for a in down} == {str(cut_rank)}, down
            # The reachable ranks wait in the allreduce: a hang episode, their stacks dumped.
            verdict = wait_for(
                lambda: sorted(dumps.glob("part-hang-*/verdict.txt")), 90, "the episode's verdict"
            )[0]
            folder = verdict.parent
            assert all((folder / f"rank-{r}.json").exists() for r in live), list(folder.iterdir())
            assert not (folder / f"rank-{cut_rank}.json").exists()
            text = verdict.read_text()
            accused = {
                (a["alertname"], a.get("rank"))
                for a in firing(prom, "part")
                if a.get("rank") and a.get("role") != "waiting"
            }
            assert {rank for _, rank in accused} <= {str(cut_rank)}, accused
            # The fleet counts it against that node only, by its real hostname.
            blamed = fleet_recorded(FAST).blamed
            records = wait_for(lambda: prom.query(f'{blamed}{{run="part"}}'), 30, "fleet blame")
            assert {s["metric"]["node"] for s in records} == {cut_node}, records
            # top, from the same Prometheus, says DOWN with the node.
            first = top.diagnose(top.fetch_prometheus(prom.url, "part", window=FAST.rate_window))
            rows = top.diagnose(
                top.fetch_prometheus(prom.url, "part", window=FAST.rate_window),
                {r.target: r for r in first},
            )
            verdicts = {r.rank: r.verdict for r in rows}
            assert verdicts[cut_rank].startswith("DOWN"), verdicts
            assert verdicts[cut_rank].endswith(f"(node {cut_node})"), verdicts
            # The reachable nodes wait for the collective timeout; nobody gives up early.
            assert all(j.poll() is None for n, j in zip(the_lab.nodes, jobs) if n.name != cut_node)
    # The silent rank is named with its node, and being cut off is among the reasons given.
    assert f"rank {cut_rank} (node {cut_node}) " in text and "cut off from the store's" in text
    assert not any(f"rank {r} (node" in text for r in live), text
    assert named < 90, named
