"""Several machines on one host: a network namespace per node, on a bridge, each its hostname.

The lab the multi-node tests run on. Node ``i`` is a network namespace with an ``eth0`` at
``10.77.<k>.<i+1>/24`` (a veth pair whose other end sits on a bridge in the root namespace,
which has ``.254``), its own ``/etc/hosts`` naming every node (``ip netns exec`` mounts
``/etc/netns/<namespace>/hosts`` over ``/etc/hosts``) and a hostname of its own for every
process started in it (a UTS namespace of its own, ``unshare --uts``). The test, Prometheus and
Alertmanager stay in the root namespace and reach every node at its IP. With
``second_interface`` each node also has ``eth1``, with an address in a subnet of its own that no
other node has a route to.

Faults, each on one node: its link down (:meth:`Lab.link`), nftables rules that DROP a TCP port,
a port range or all traffic (:meth:`Lab.drop`), ``tc tbf`` rate limits both ways
(:meth:`Lab.rate_limit`; this kernel has no netem).

Everything the lab creates is named with :data:`PREFIX` and the pid of the process that made it,
so that what a killed earlier run left (SIGKILL skips every clean-up) is found and removed when
the next lab starts, while a lab another live process runs is left alone; a lab removes
everything it created (processes first, then namespaces, links, ``/etc/netns`` folders) when its
``with`` block ends, also on failure, and SIGTERM or SIGHUP during it become an exception so that
the block ends the same way. Only addresses inside the lab's own subnet are contacted.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

from harness import Job, Process, child_env

__all__ = ["PREFIX", "REQUIRED", "Lab", "Node", "available", "clean_leftovers", "ip", "lab"]

#: Set by .ci/run: where the lab cannot run, its tests fail instead of skipping.
REQUIRED = "DDP_EXPORTER_LAB_REQUIRED"

#: Every namespace, link and /etc/netns folder of a lab starts with this.
PREFIX = "ddpx"
NETNS_ETC = "/etc/netns"


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``ip ARGS`` in the root namespace; return what it printed."""
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def available() -> str | None:
    """Return why the lab cannot run here (a skip reason), or None when it can."""
    if os.geteuid() != 0:
        return "the multi-node lab needs root (network namespaces, veth pairs, a bridge)"
    for tool in ("ip", "unshare", "nft", "tc"):
        if shutil.which(tool) is None:
            return f"the multi-node lab needs {tool} (Debian: iproute2, util-linux, nftables)"
    probe = f"{PREFIX}probe{os.getpid()}"
    made = ip("netns", "add", probe, check=False)
    ip("netns", "del", probe, check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace here: {made.stderr.strip()}"
    return None


def _stale(name: str) -> bool:
    """Say whether ``name`` is a lab's whose process is gone (labs are named by their pid)."""
    if not name.startswith(PREFIX):
        return False
    digits = "".join(itertools.takewhile(str.isdigit, name[len(PREFIX) :]))
    if not digits:
        return True
    try:
        os.kill(int(digits), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def clean_leftovers() -> list[str]:
    """Remove every namespace, link and /etc/netns folder a lab whose process is gone left
    behind (a lab still running in another process is left alone); return their names."""
    removed = []
    for line in ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if _stale(name):
            for pid in ip("netns", "pids", name, check=False).stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            ip("netns", "del", name, check=False)
            removed.append(name)
    for line in ip("-o", "link", "show", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if _stale(name):
            ip("link", "del", name, check=False)
            removed.append(name)
    if os.path.isdir(NETNS_ETC):
        for name in os.listdir(NETNS_ETC):
            if _stale(name):
                shutil.rmtree(os.path.join(NETNS_ETC, name), ignore_errors=True)
                removed.append(f"{NETNS_ETC}/{name}")
    return removed


@dataclass(frozen=True)
class Node:
    """One machine of the lab."""

    index: int
    #: Its hostname (and the name the other nodes resolve).
    name: str
    namespace: str
    ip: str
    #: The root namespace's end of its veth pair (on the bridge).
    veth: str


def _raise_on_signal(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum} during a lab")


class Lab:
    """``nodes`` machines on one bridge; a context manager that removes all it made."""

    def __init__(self, nodes: int, *, second_interface: bool = False, tag: str = "") -> None:
        # Named by the pid that owns it, so that a lab left by a killed process is told from
        # one still running in another (tests and benchmarks may run labs side by side).
        if len(tag) > 2 or not all(ch.isalpha() for ch in tag):
            raise ValueError(f"tag must be at most 2 letters (a link name has 15), not {tag!r}")
        self.tag = f"{PREFIX}{os.getpid()}{tag}"
        used = ip("-4", "-o", "addr", "show").stdout
        self.subnet = next(  # the third octet: 10.77.<subnet>.0/24, one no other lab uses
            s
            for s in [*range(10 + os.getpid() % 200, 250), *range(10, 250)]
            if f"10.77.{s}." not in used
        )
        self.bridge = f"{self.tag}br"
        self.gateway = f"10.77.{self.subnet}.254"
        self.second_interface = second_interface
        self.nodes = [
            Node(
                i,
                f"lab-node-{i}",
                f"{self.tag}n{i}",
                f"10.77.{self.subnet}.{i + 1}",
                f"{self.tag}v{i}",
            )
            for i in range(nodes)
        ]
        self._procs: list[Process] = []
        self._old_handlers: dict[int, object] = {}

    # -- lifecycle -------------------------------------------------------------------------------
    def __enter__(self) -> Lab:
        clean_leftovers()
        for sig in (signal.SIGTERM, signal.SIGHUP):
            self._old_handlers[sig] = signal.signal(sig, _raise_on_signal)
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _create(self) -> None:
        ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        hosts = "127.0.0.1 localhost\n" + "".join(f"{n.ip} {n.name}\n" for n in self.nodes)
        for n in self.nodes:
            ip("netns", "add", n.namespace)
            ip("link", "add", n.veth, "type", "veth", "peer", "name", "eth0", "netns", n.namespace)
            ip("link", "set", n.veth, "master", self.bridge, "up")
            ip("-n", n.namespace, "addr", "add", f"{n.ip}/24", "dev", "eth0")
            ip("-n", n.namespace, "link", "set", "eth0", "up")
            ip("-n", n.namespace, "link", "set", "lo", "up")
            if self.second_interface:
                # An interface with an address, but no route to any peer: one end of a veth
                # pair whose other end stays in the node (this kernel has no dummy links).
                ip(
                    "-n",
                    n.namespace,
                    "link",
                    "add",
                    "eth1",
                    "type",
                    "veth",
                    "peer",
                    "name",
                    "eth1peer",
                )
                # Below the lab's 10.77: gloo's peers dial the lower address of a pair.
                ip(
                    "-n",
                    n.namespace,
                    "addr",
                    "add",
                    f"10.{10 + n.index}.{self.subnet}.1/24",
                    "dev",
                    "eth1",
                )
                for dev in ("eth1", "eth1peer"):
                    ip("-n", n.namespace, "link", "set", dev, "up")
            folder = os.path.join(NETNS_ETC, n.namespace)
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, "hosts"), "w") as f:
                f.write(hosts)

    def close(self) -> None:
        """Stop every process started in the lab, then remove every namespace and link."""
        for p in self._procs:
            with contextlib.suppress(Exception):
                p.stop()
        for n in self.nodes:
            for pid in ip("netns", "pids", n.namespace, check=False).stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            ip("netns", "del", n.namespace, check=False)
            ip("link", "del", n.veth, check=False)
            shutil.rmtree(os.path.join(NETNS_ETC, n.namespace), ignore_errors=True)
        ip("link", "del", self.bridge, check=False)
        for sig, old in self._old_handlers.items():
            signal.signal(sig, old)  # type: ignore[arg-type]
        self._old_handlers.clear()

    def leftovers(self) -> list[str]:
        """Return what of this lab still exists (namespaces and links): empty after close."""
        names = {n.namespace for n in self.nodes} | {n.veth for n in self.nodes} | {self.bridge}
        found = [line.split()[0] for line in ip("netns", "list").stdout.splitlines() if line]
        found += [
            line.split(":")[1].strip().split("@")[0]
            for line in ip("-o", "link", "show").stdout.splitlines()
            if ":" in line
        ]
        return sorted(names & set(found))

    # -- running things on a node ----------------------------------------------------------------
    def command(self, node: int, cmd: list[str]) -> list[str]:
        """Return ``cmd`` run on ``node``: in its namespace, with its hostname."""
        n = self.nodes[node]
        return [
            "ip",
            "netns",
            "exec",
            n.namespace,
            "unshare",
            "--uts",
            "--",
            "sh",
            "-c",
            'hostname "$0" && exec "$@"',
            n.name,
            *cmd,
        ]

    def process(self, node: int, cmd: list[str], env: dict[str, str] | None = None) -> Process:
        """Start ``cmd`` on ``node`` (stopped with the lab, or earlier with ``stop()``)."""
        p = Process(self.command(node, cmd), child_env(env), name=f"{self.nodes[node].name}")
        self._procs.append(p)
        return p

    def torchrun(
        self,
        node: int,
        nproc: int,
        args: list[str],
        *,
        module: str,
        env: dict[str, str] | None = None,
        master_port: int | None = None,
        extra: list[str] | None = None,
        rdzv: str = "static",
    ) -> Job:
        """Start torchrun on ``node``, one per node, meeting on node 0: ``static`` rendezvous
        (``--master-addr/--node-rank``) or ``c10d`` (``--rdzv-endpoint``, node ranks assigned)."""
        port = master_port or 29500
        if rdzv == "c10d":
            rendezvous = [
                "--nnodes",
                str(len(self.nodes)),
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"{self.nodes[0].name}:{port}",
                "--rdzv-id",
                self.tag,
            ]
        elif rdzv == "static":
            rendezvous = [
                "--nnodes",
                str(len(self.nodes)),
                "--node-rank",
                str(node),
                "--master-addr",
                self.nodes[0].name,
                "--master-port",
                str(port),
            ]
        else:
            raise ValueError(f"rdzv must be 'static' or 'c10d', not {rdzv!r}")
        job = Job(
            nproc,
            args,
            env=env,
            module=module,
            torchrun=[*rendezvous, *(extra or [])],
            wrap=lambda cmd: self.command(node, cmd),
        )
        self._procs.append(job)
        return job

    # -- faults ----------------------------------------------------------------------------------
    def _in(self, node: int, *cmd: str) -> None:
        subprocess.run(
            ["ip", "netns", "exec", self.nodes[node].namespace, *cmd],
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        )

    def link(self, node: int, up: bool) -> None:
        """Bring ``node``'s link to the bridge down (it falls off the network) or up again."""
        ip("link", "set", self.nodes[node].veth, "up" if up else "down")

    def firewall(self, node: int, rules: list[str]) -> None:
        """Apply nftables ``rules`` (match and verdict, in order) to ``node``'s eth0, both ways."""
        n = self.nodes[node]
        script = (
            "table inet ddpx {\n"
            " chain input { type filter hook input priority 0; policy accept; }\n"
            " chain output { type filter hook output priority 0; policy accept; }\n"
            "}\n"
        )
        for rule in rules:
            script += f"add rule inet ddpx input iifname eth0 {rule}\n"
            script += f"add rule inet ddpx output oifname eth0 {rule}\n"
        subprocess.run(
            ["ip", "netns", "exec", n.namespace, "nft", "-f", "-"],
            input=script,
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        )

    def open_firewall(self, node: int) -> None:
        """Remove every nftables rule :meth:`firewall` applied on ``node``."""
        subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                self.nodes[node].namespace,
                "nft",
                "delete",
                "table",
                "inet",
                "ddpx",
            ],
            capture_output=True,
            timeout=30,
        )

    def resolve_as(self, node: int, name: str, address: str) -> None:
        """Make ``name`` resolve to ``address`` on ``node`` (its /etc/hosts), as a stale DNS would."""
        path = os.path.join(NETNS_ETC, self.nodes[node].namespace, "hosts")
        with open(path) as f:
            lines = [line for line in f.read().splitlines() if name not in line.split()[1:]]
        with open(path, "w") as f:
            f.write("\n".join([*lines, f"{address} {name}"]) + "\n")

    def drop(self, node: int, match: str) -> None:
        """DROP what ``match`` matches on ``node`` (e.g. ``tcp dport 29500``; ``ip protocol
        != 255``: everything), both ways."""
        self.firewall(node, [f"{match} drop"])

    def drop_tcp_except(self, node: int, port: int) -> None:
        """DROP every TCP connection of ``node`` but those to or from ``port`` (its gloo ports)."""
        self.firewall(
            node, [f"tcp sport {port} accept", f"tcp dport {port} accept", "meta l4proto tcp drop"]
        )

    def rate_limit(self, node: int, mbit: float) -> None:
        """Limit ``node``'s link to ``mbit`` Mbit/s both ways (a degraded NIC or cable)."""
        tbf = ["tbf", "rate", f"{mbit:g}mbit", "burst", "32kbit", "latency", "400ms"]
        self._in(node, "tc", "qdisc", "replace", "dev", "eth0", "root", *tbf)
        subprocess.run(
            ["tc", "qdisc", "replace", "dev", self.nodes[node].veth, "root", *tbf],
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        )


@contextlib.contextmanager
def lab(nodes: int, **kwargs: object) -> Iterator[Lab]:
    """Yield a running lab of ``nodes`` machines; skip the test where a lab cannot run."""
    import pytest

    reason = available()
    if reason is not None:
        if os.environ.get(REQUIRED) == "1":
            pytest.fail(f"{REQUIRED}=1 but {reason}")
        pytest.skip(reason)
    with Lab(nodes, **kwargs) as the_lab:  # type: ignore[arg-type]
        yield the_lab
