"""Command line: ``ddp-exporter demo`` runs an instrumented job, ``ddp-exporter top`` watches one."""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

from . import top as topmod
from .core import DEFAULT_PORT
from .demo import FAULTS

__all__ = ["main"]


def _port_free(port: int, addr: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        try:
            s.bind((addr, port))
        except OSError:
            return False
    return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Children:
    """Processes started by the CLI, each in its own session, all killed on exit or Ctrl-C."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, cmd: list[str], **kw) -> subprocess.Popen:
        proc = subprocess.Popen(cmd, start_new_session=True, **kw)
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGCONT)  # a frozen (SIGSTOPped) rank too
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 5
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()


def _demo(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.ranks < 1:
        parser.error("--ranks must be at least 1")
    if args.fault != "none" and not 0 <= args.fault_rank < args.ranks:
        parser.error(f"--fault-rank {args.fault_rank} is out of range for --ranks {args.ranks}")
    if args.port:
        taken = [p for p in range(args.port, args.port + args.ranks) if not _port_free(p)]
        if taken:
            print(
                f"ddp-exporter demo: port(s) {', '.join(map(str, taken))} in use; choose another "
                f"base port with --port (ranks use --port .. --port+{args.ranks - 1}) or --port 0",
                file=sys.stderr,
            )
            return 2
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.ranks),
        "--master-addr", "127.0.0.1", "--master-port", str(_free_port()),
        "-m", "exporter.demo",
        "--duration", str(args.duration), "--fault", args.fault,
        "--fault-rank", str(args.fault_rank), "--fault-after", str(args.fault_after),
        "--port", str(args.port), "--addr", "127.0.0.1", "--heartbeat", "1",
    ]  # fmt: skip
    if args.file_sd:
        cmd += ["--file-sd", args.file_sd]
    children = _Children()
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    print(
        f"ddp-exporter demo: {args.ranks} ranks on gloo, fault={args.fault}"
        + (
            f" on rank {args.fault_rank} after {args.fault_after:g}s"
            if args.fault != "none"
            else ""
        )
        + (f", {args.duration:g}s" if args.duration else ", until Ctrl-C"),
        flush=True,
    )
    urls: dict[int, str] = {}
    try:
        job = children.start(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )

        def pump() -> None:
            assert job.stdout is not None
            for line in job.stdout:
                m = re.search(r"rank (\d+): metrics at (\S+)", line)
                if m:
                    urls[int(m.group(1))] = m.group(2)
                if m or "injecting fault" in line or "Error" in line or "error" in line:
                    print(line.rstrip(), flush=True)

        threading.Thread(target=pump, daemon=True).start()
        previous: dict[str, topmod.RankRow] = {}
        while job.poll() is None:
            time.sleep(args.refresh)
            if len(urls) < args.ranks or args.no_top:
                continue
            rows = topmod.diagnose(topmod.fetch([urls[r] for r in sorted(urls)]), previous)
            previous = {r.target: r for r in rows}
            tty = sys.stdout.isatty()
            print(("\x1b[2J\x1b[H" if tty else "\n") + topmod.render(rows, color=tty), flush=True)
        code = job.wait()
        print(f"ddp-exporter demo: training finished (exit {code})")
        return 0 if code == 0 or args.fault in ("kill", "hang", "freeze") else code
    except KeyboardInterrupt:
        print("\nddp-exporter demo: stopping every process it started", file=sys.stderr)
        return 130
    finally:
        children.stop()


def _top(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    targets = [t for t in args.targets.split(",") if t]
    if not targets:
        parser.error("give --targets host:port[,host:port...]")
    previous: dict[str, topmod.RankRow] = {}
    try:
        while True:
            rows = topmod.diagnose(topmod.fetch(targets), previous)
            previous = {r.target: r for r in rows}
            tty = sys.stdout.isatty()
            print(
                ("\x1b[2J\x1b[H" if tty else "") + topmod.render(rows, args.worst, color=tty),
                flush=True,
            )
            if args.once:
                return 0
            time.sleep(args.refresh)
    except KeyboardInterrupt:
        return 130


def build_parser() -> argparse.ArgumentParser:
    """Build the ``ddp-exporter`` argument parser."""
    p = argparse.ArgumentParser(prog="ddp-exporter", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="run a small instrumented multi-rank CPU training")
    d.add_argument("--ranks", type=int, default=3)
    d.add_argument("--fault", choices=FAULTS, default="none")
    d.add_argument("--fault-rank", type=int, default=1)
    d.add_argument("--fault-after", type=float, default=10.0)
    d.add_argument("--duration", type=float, default=60.0, help="seconds (0: until Ctrl-C)")
    d.add_argument("--port", type=int, default=DEFAULT_PORT, help="base port; 0 = free ports")
    d.add_argument("--file-sd", default=None, help="write Prometheus file_sd targets here")
    d.add_argument("--refresh", type=float, default=2.0, help="seconds between table refreshes")
    d.add_argument("--no-top", action="store_true", help="do not show the live table")
    t = sub.add_parser("top", help="live table of every rank of a run, from their endpoints")
    t.add_argument("--targets", required=True, help="comma-separated host:port or URLs")
    t.add_argument("--worst", type=int, default=20, help="show the worst N ranks")
    t.add_argument("--refresh", type=float, default=2.0)
    t.add_argument("--once", action="store_true", help="print one table and exit")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the ``ddp-exporter`` command."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "demo":
        return _demo(args, parser)
    return _top(args, parser)


if __name__ == "__main__":
    sys.exit(main())
