"""Time how fast the doctor and the init watch name each network fault, against the timeouts.

Runs in the multi-node lab (tests/lab.py: network namespaces, root only): 3 nodes, one rank
each, each node with a second interface no other node routes to. For each of the seeds'
faults it starts ``ddp-exporter doctor`` on every node with its DEFAULT deadlines and times
until the output names the fault (the node, port or interface); for the faults the init watch
can see (it probes ``MASTER_ADDR:MASTER_PORT`` from every rank but 0), it times the watch's log
line too; and it runs the same ranks with plain ``init_process_group`` for ``--plain-s`` to show
that torch alone says nothing in that time (its default timeout is 30 minutes).

    sudo python benchmarks/netfaults.py
    sudo python benchmarks/netfaults.py --faults gloo-ports,ifname --plain-s 0
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "tests"))

from lab import Lab, available  # noqa: E402

MASTER_PORT = 29500
FAULTS = ("master-port", "gloo-ports", "ifname", "master-addr")
INIT = (
    "import sys, torch.distributed as dist\n"
    "if sys.argv[1] == 'watch':\n"
    "    import exporter; exporter.watch_init()\n"
    "dist.init_process_group('gloo')\n"
    "print('initialized', flush=True)\n"
)


def _apply(lab: Lab, fault: str) -> tuple[dict[int, dict[str, str]], str, int]:
    """Set ``fault`` up; return per-node env, the words that name it, the node that says them."""
    if fault == "master-port":
        lab.drop(0, f"tcp dport {MASTER_PORT}")
        return {}, "(connections dropped)", 1
    if fault == "gloo-ports":
        lab.drop_tcp_except(2, MASTER_PORT)
        return {}, "cannot connect to rank 2 on lab-node-2", 0
    if fault == "ifname":
        return {1: {"GLOO_SOCKET_IFNAME": "eth1"}}, "(GLOO_SOCKET_IFNAME=eth1) on lab-node-1", 0
    lab.resolve_as(1, lab.nodes[0].name, f"10.77.{lab.subnet}.200")
    return {}, "is unreachable from lab-node-1", 1


def _clear(lab: Lab, fault: str) -> None:
    for node in range(len(lab.nodes)):
        lab.open_firewall(node)
    lab.resolve_as(1, lab.nodes[0].name, lab.nodes[0].ip)


def _time_until(procs: list, node: int, words: str, limit: float) -> float | None:
    """Return seconds until node ``node``'s output has ``words`` (None: not within ``limit``)."""
    start = time.monotonic()
    while time.monotonic() - start < limit:
        if words in procs[node].text():
            return time.monotonic() - start
        if all(p.poll() is not None for p in procs) and words not in procs[node].text():
            return None
        time.sleep(0.05)
    return None


def _run(lab: Lab, env_of: dict, cmd: Callable[[int], list[str]]) -> list:
    base = {
        "OMP_NUM_THREADS": "1",
        "MASTER_ADDR": lab.nodes[0].name,
        "MASTER_PORT": str(MASTER_PORT),
        "WORLD_SIZE": str(len(lab.nodes)),
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
    }
    return [
        lab.process(
            n.index, cmd(n.index), {**base, "RANK": str(n.index), **env_of.get(n.index, {})}
        )
        for n in lab.nodes
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--faults", default=",".join(FAULTS))
    p.add_argument("--plain-s", type=float, default=30.0, help="watch plain torch this long")
    args = p.parse_args()
    reason = available()
    if reason:
        sys.exit(f"netfaults: {reason}")
    doctor = [sys.executable, "-m", "exporter.doctor"]
    rows = []
    with Lab(3, second_interface=True) as lab:
        for fault in args.faults.split(","):
            env_of, words, node = _apply(lab, fault)
            procs = _run(lab, env_of, lambda i: doctor)
            found = _time_until(procs, node, words, 60)
            for proc in procs:
                proc.stop()
            watch: float | None = None
            if fault in ("master-port", "master-addr"):
                procs = _run(lab, env_of, lambda i: [sys.executable, "-c", INIT, "watch"])
                watch = _time_until(procs, node, words, 60)
                for proc in procs:
                    proc.stop()
            plain = "-"
            if args.plain_s > 0:
                procs = _run(lab, env_of, lambda i: [sys.executable, "-c", INIT, "plain"])
                time.sleep(args.plain_s)
                said = [i for i, q in enumerate(procs) if q.poll() is not None]
                plain = (
                    f"ranks {said} ended within {args.plain_s:.0f} s"
                    if said
                    else f"no error in {args.plain_s:.0f} s"
                )
                for proc in procs:
                    proc.stop()
            _clear(lab, fault)
            rows.append((fault, found, watch, plain))
            print(f"{fault}: doctor {found}, init watch {watch}, plain torch {plain}", flush=True)
    print()
    print("| fault | doctor names it (default deadlines) | init watch names it | plain torch |")
    print("|---|---|---|---|")
    for fault, found, watch, plain in rows:
        d = f"{found:.1f} s" if found is not None else "not named"
        w = f"{watch:.1f} s" if watch is not None else "-"
        print(f"| {fault} | {d} | {w} | {plain} |")


if __name__ == "__main__":
    main()
