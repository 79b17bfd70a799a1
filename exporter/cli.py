"""Command line: ``ddp-exporter demo`` runs an instrumented job, ``ddp-exporter top`` watches one."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from . import top as topmod
from .core import DEFAULT_PORT
from .demo import FAULTS, metrics_urls, say
from .localstack import LocalStack, MissingBinaryError, find_binaries, free_port
from .mixin.config import DEFAULT, duration_seconds
from .reaper import Interrupted, become_subreaper, descendants, raise_on_signals, stop_tree

__all__ = ["main"]


def _port_free(port: int, addr: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        try:
            s.bind((addr, port))
        except OSError:
            return False
    return True


class _Children:
    """Processes started by the CLI, each in its own session, all stopped on exit or signal."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, cmd: list[str], **kw) -> subprocess.Popen:
        proc = subprocess.Popen(cmd, start_new_session=True, **kw)
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        """Let each launcher stop its workers, then kill by pid whatever is left."""
        for p in self.procs:
            stop_tree(p)


def _sweep_adopted() -> None:
    """Kill any orphan this (subreaper) process adopted: nothing outlives the demo."""
    for p in descendants(os.getpid()):
        p.signal(signal.SIGCONT)
        p.signal(signal.SIGKILL)


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
    if args.stack is not False:
        try:
            find_binaries()
            use_stack = True
        except MissingBinaryError as exc:
            if args.stack:
                print(f"ddp-exporter demo: --stack: {exc}", file=sys.stderr)
                return 2
            use_stack = False
    else:
        use_stack = False
    raise_on_signals()  # SIGTERM/SIGHUP clean up like Ctrl-C
    become_subreaper()  # a torchrun that dies hands its workers to us, not to init
    workdir = tempfile.mkdtemp(prefix="ddp-exporter-demo-")
    children = _Children()
    stacks: list[LocalStack] = []
    try:
        return _run_demo(args, use_stack, workdir, children, stacks)
    except KeyboardInterrupt as exc:
        _ignore_signals()
        signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
        print("\nddp-exporter demo: stopping every process it started", file=sys.stderr)
        return 128 + signum
    finally:
        _ignore_signals()  # a second Ctrl-C must not cut the clean-up short
        children.stop()
        for st in stacks:
            st.close()
        _sweep_adopted()
        shutil.rmtree(workdir, ignore_errors=True)


def _ignore_signals() -> None:
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)


def _run_demo(
    args: argparse.Namespace,
    use_stack: bool,
    workdir: str,
    children: _Children,
    stacks: list[LocalStack],
) -> int:
    file_sd = args.file_sd or (os.path.join(workdir, "file_sd") if use_stack else None)
    trainer = [
        "-m", "exporter.demo",
        "--duration", str(args.duration), "--fault", args.fault,
        "--fault-rank", str(args.fault_rank), "--fault-after", str(args.fault_after),
        "--addr", "127.0.0.1", "--heartbeat", "1",
    ]  # fmt: skip
    if file_sd:
        os.makedirs(file_sd, exist_ok=True)
        trainer += ["--file-sd", file_sd]
    if use_stack:
        # A hang must page before the demo's watchdog fires: a short process-group timeout.
        trainer += ["--timeout", "60"]
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    master_port = str(free_port())
    if args.fault == "kill":
        # torchrun's agent stops every rank when one dies; a scheduler that starts one process
        # per rank (srun, mpirun) leaves the survivors up, which shows the alert naming the dead.
        commands = []
        for r in range(args.ranks):
            port = "0" if args.port == 0 else str(args.port + r)
            commands.append(([sys.executable, *trainer, "--port", port], dict(
                env, RANK=str(r), LOCAL_RANK="0", WORLD_SIZE=str(args.ranks),
                MASTER_ADDR="127.0.0.1", MASTER_PORT=master_port)))  # fmt: skip
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
               str(args.ranks), "--master-addr", "127.0.0.1", "--master-port", master_port,
               *trainer, "--port", str(args.port)]  # fmt: skip
        commands = [(cmd, env)]
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
    if use_stack:

        def show(alert: dict) -> None:
            lab = alert["labels"]
            extra = " ".join(f"{k}={lab[k]}" for k in ("cause", "role", "pg") if k in lab)
            print(
                f"ALERT {lab.get('alertname')} severity={lab.get('severity')} "
                f"rank={lab.get('rank', '-')} {extra} run={lab.get('run')}: "
                f"{alert.get('annotations', {}).get('summary', '')}",
                flush=True,
            )

        try:
            stack = LocalStack(os.path.join(workdir, "stack"), file_sd, on_alert=show)
            stacks.append(stack)
        except RuntimeError as exc:
            print(f"ddp-exporter demo: could not start the stack: {exc}", file=sys.stderr)
            return 1
        print(
            f"Prometheus: {stack.prometheus_url}  Alertmanager: {stack.alertmanager_url} "
            "(FAST rules; alerts are printed as they arrive)",
            flush=True,
        )
    elif args.stack is None:
        print("(install prometheus and prometheus-alertmanager to also see alerts arrive)")
    urls: dict[int, str] = {}
    jobs = [
        children.start(c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=e)
        for c, e in commands
    ]

    def pump(job: subprocess.Popen) -> None:
        assert job.stdout is not None
        for line in job.stdout:
            found = metrics_urls(line)
            urls.update(found)
            # "ddp-exporter hang": the forensics' detection line and verdict (rank 0 logs).
            shown = found or "injecting fault" in line or "ddp-exporter hang" in line
            if shown or "Error" in line or "error" in line:
                say(line.rstrip())  # one write: several pump threads share stdout

    for job in jobs:
        threading.Thread(target=pump, args=(job,), daemon=True).start()
    previous: dict[str, topmod.RankRow] = {}
    while any(job.poll() is None for job in jobs):
        time.sleep(args.refresh)
        if len(urls) < args.ranks or args.no_top:
            continue
        rows = topmod.diagnose(topmod.fetch([urls[r] for r in sorted(urls)]), previous)
        previous = {r.target: r for r in rows}
        tty = sys.stdout.isatty()
        print(("\x1b[2J\x1b[H" if tty else "\n") + topmod.render(rows, color=tty), flush=True)
    code = max(abs(job.wait()) for job in jobs)
    print(f"ddp-exporter demo: training finished (exit {code})")
    return 0 if code == 0 or args.fault in ("kill", "hang", "freeze") else code


def _top(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    targets = [t for t in (args.targets or "").split(",") if t]
    if bool(targets) == bool(args.prometheus):
        parser.error("give either --targets host:port[,...] or --prometheus URL --run RUN")
    if args.prometheus and not args.run:
        parser.error("--prometheus needs --run (the run label to show)")
    if args.refresh <= 0:
        parser.error("--refresh must be positive")
    try:
        duration_seconds(args.window)
    except ValueError as exc:
        parser.error(f"--window: {exc}")

    def read() -> list[topmod.RankRow]:
        if targets:
            return topmod.fetch(targets)
        return topmod.fetch_prometheus(args.prometheus, args.run, window=args.window)

    previous: dict[str, topmod.RankRow] | None = None
    try:
        while True:
            try:
                rows = topmod.diagnose(read(), previous)
            except (OSError, RuntimeError) as exc:
                print(f"ddp-exporter top: {exc}", file=sys.stderr)
                return 1
            first, previous = previous is None, {r.target: r for r in rows}
            if first and args.once:
                # A verdict needs two reads (like an alert's "for"): take the second one.
                time.sleep(args.refresh)
                continue
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
    g = d.add_mutually_exclusive_group()
    g.add_argument(
        "--stack",
        dest="stack",
        action="store_true",
        default=None,
        help="also run Prometheus + Alertmanager (default: when installed)",
    )
    g.add_argument("--no-stack", dest="stack", action="store_false")
    t = sub.add_parser("top", help="live table of every rank of a run, from their endpoints")
    t.add_argument("--targets", help="comma-separated host:port or URLs of the ranks")
    t.add_argument("--prometheus", help="read from this Prometheus URL instead")
    t.add_argument("--run", help="with --prometheus: the run label to show")
    t.add_argument("--worst", type=int, default=20, help="show the worst N ranks")
    t.add_argument("--window", default=DEFAULT.rate_window,
                   help="with --prometheus: rate window of the per-step figures (default: the "
                   "alerts' %(default)s)")  # fmt: skip
    t.add_argument("--refresh", type=float, default=2.0, help="seconds between reads")
    t.add_argument("--once", action="store_true",
                   help="read twice, --refresh apart, print one table and exit")  # fmt: skip
    # Listed for --help only: main() hands "doctor ..." to exporter.doctor's own parser.
    sub.add_parser("doctor", help="preflight: check that the ranks of a job can meet")
    # Hang forensics (exporter.hangs): read one episode's dumps and print the verdict.
    h = sub.add_parser("hangs", help="print who is stuck where, from a hang dump folder")
    h.add_argument("dir", help="an episode folder, or the dump folder (its newest episode)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the ``ddp-exporter`` command."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["doctor"]:
        from . import doctor

        return doctor.main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "demo":
        return _demo(args, parser)
    if args.command == "hangs":
        from . import hangs

        return hangs.main(args.dir)
    return _top(args, parser)


if __name__ == "__main__":
    sys.exit(main())
