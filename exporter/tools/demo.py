"""Run ``ddp-exporter demo``: a small instrumented job under torchrun, its table and alerts.

The driver starts the trainer (:mod:`exporter.tools.trainer`) under torchrun (one process per
rank for the ``kill`` fault, as srun would), optionally Prometheus and Alertmanager
(:mod:`exporter.tools.localstack`), prints the live ``top`` table, and stops every process it
started when it ends, on Ctrl-C, and on SIGTERM or SIGHUP. This module imports no torch: the
trainer does, in its own processes. The stack needs the ``mixin`` extra (PyYAML): without it the
demo runs without the stack and says how to get it.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from ..mixin.config import FAST
from ..settings import DEFAULT_PORT, dump_dir
from . import options
from . import top as topmod
from .localstack import LocalStack, add_stack_flags, free_port, stack_choice
from .reaper import Interrupted, become_subreaper, raise_on_signals, stop_adopted, stop_tree
from .receiver import alert_line

__all__ = ["FAULTS", "add_parser", "metrics_urls", "run", "say", "shown"]

FAULTS = ("none", "straggler", "slow-data", "hang", "kill", "freeze")
#: The demo job's process-group timeout: how long a hung job outlives its hang.
HUNG_JOB_TIMEOUT_S = 60

#: What the demo's trainer says of itself: its endpoint, a fault injected, a collective failed.
_ANNOUNCEMENT = re.compile(r"rank \d+: ")
_URL_LINE = re.compile(r"rank (\d+): metrics at (http\S*?/metrics)")


def metrics_urls(text: str) -> dict[int, str]:
    """Return ``{rank: url}`` for every "metrics at" announcement in ``text``.

    Searches the whole text rather than whole lines, so an announcement glued to
    another rank's output (two processes writing one pipe) is still found.
    """
    return {int(m.group(1)): m.group(2) for m in _URL_LINE.finditer(text)}


def say(line: str) -> None:
    """Print one line in a single write, so lines from ranks sharing a pipe never interleave."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _port_free(port: int, addr: str = "127.0.0.1") -> bool:
    """Say whether a rank could bind ``port`` now, as its server does (SO_REUSEADDR).

    The previous run's connections linger in TIME_WAIT for a minute; they do not stop a server
    that sets SO_REUSEADDR (every HTTP server does), so they must not stop the demo either.
    """
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((addr, port))
        except OSError:
            return False
    return True


class _Children:
    """Processes started by the CLI, each in its own session, all stopped on exit or signal."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []
        #: Set once the demo stops them: their output is no longer shown.
        self.stopping = threading.Event()

    def start(self, cmd: list[str], **kw) -> subprocess.Popen:
        proc = subprocess.Popen(cmd, start_new_session=True, **kw)
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        """Let each launcher stop its workers, then kill by pid whatever is left."""
        self.stopping.set()
        for p in self.procs:
            stop_tree(p)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add ``demo`` to the ``ddp-exporter`` subcommands."""
    d = sub.add_parser(
        "demo",
        help="run a small instrumented multi-rank CPU training",
        description="Run a small instrumented DDP training on gloo under torchrun "
        "with a live per-rank table, optionally a fault, and (when installed) "
        "Prometheus and Alertmanager printing the alerts as they arrive.",
    )
    d.add_argument("--ranks", type=options.count, default=3, help="training processes (ranks)")
    d.add_argument("--fault", choices=FAULTS, default="none", help="the fault to inject")
    d.add_argument("--fault-rank", type=int, default=1, help="the rank the fault hits")
    d.add_argument(
        "--fault-after",
        type=options.seconds_or_zero,
        default=10.0,
        help="seconds of healthy training before the fault",
    )
    d.add_argument(
        "--duration",
        type=options.seconds_or_zero,
        default=60.0,
        help=f"seconds (0: until Ctrl-C); a hung job ends {HUNG_JOB_TIMEOUT_S} s after its hang",
    )
    d.add_argument(
        "--port", type=options.port, default=DEFAULT_PORT, help="base port; 0 = free ports"
    )
    d.add_argument(
        "--file-sd", default=None, help="folder to write the ranks' Prometheus file_sd targets into"
    )
    d.add_argument(
        "--refresh", type=options.seconds, default=2.0, help="seconds between table refreshes"
    )
    d.add_argument("--no-top", action="store_true", help="do not show the live table")
    add_stack_flags(
        d, "also run Prometheus + Alertmanager (default: when installed; needs the mixin extra)"
    )
    d.set_defaults(tool=run, parser=d)
    return d


def run(args: argparse.Namespace) -> int:
    """Run ``ddp-exporter demo`` with parsed ``args``; return its exit status."""
    parser = args.parser
    if args.fault != "none" and not 0 <= args.fault_rank < args.ranks:
        parser.error(f"--fault-rank {args.fault_rank} is out of range for --ranks {args.ranks}")
    if args.port and args.port + args.ranks - 1 > 65535:
        last = args.port + args.ranks - 1
        parser.error(
            f"--port {args.port}: its ranks would serve on {args.port}..{last}, past 65535"
        )
    if args.file_sd:
        try:
            options.make_folder(args.file_sd)
        except ValueError as exc:
            parser.error(f"--file-sd: {exc}")
    if args.port:
        taken = [p for p in range(args.port, args.port + args.ranks) if not _port_free(p)]
        if taken:
            print(
                f"ddp-exporter demo: port(s) {', '.join(map(str, taken))} in use; choose another "
                f"base port with --port (ranks use --port .. --port+{args.ranks - 1}) or --port 0",
                file=sys.stderr,
            )
            return 2
    use_stack, missing, refused = stack_choice(args.stack, "demo")
    if refused is not None:
        return refused
    raise_on_signals()  # SIGTERM/SIGHUP clean up like Ctrl-C
    become_subreaper()  # a torchrun that dies hands its workers to us, not to init
    workdir = tempfile.mkdtemp(prefix="ddp-exporter-demo-")
    children = _Children()
    stacks: list[LocalStack] = []
    try:
        return _run_demo(args, use_stack, missing, workdir, children, stacks)
    except KeyboardInterrupt as exc:
        _ignore_signals()
        children.stopping.set()  # what torchrun prints while it dies is not news
        signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
        print("\nddp-exporter demo: stopping every process it started", file=sys.stderr)
        return 128 + signum
    finally:
        _ignore_signals()  # a second Ctrl-C must not cut the clean-up short
        children.stop()
        for st in stacks:
            st.close()
        stop_adopted()  # orphans adopted as subreaper: nothing outlives the demo
        shutil.rmtree(workdir, ignore_errors=True)


def _entries(folder: str) -> set[str]:
    try:
        return set(os.listdir(folder))
    except OSError:
        return set()


def shown(line: str) -> bool:
    """Say whether the demo shows a line its job printed: the trainer's announcements (``rank
    N: ...``), the exporter's own lines (the hang verdict), and an error that is not a line of
    torchrun's account of a failed worker, which a fault makes expected."""
    if _ANNOUNCEMENT.match(line) or "ddp-exporter" in line:
        return True
    if line[:1].isspace() or "ChildFailedError" in line:
        return False  # a traceback's or torchrun's failure summary's inner lines
    return "Error" in line or "error" in line


def _ignore_signals() -> None:
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)


def _commands(
    args: argparse.Namespace, file_sd: str | None, use_stack: bool
) -> list[tuple[list[str], dict[str, str]]]:
    """Return the command and environment of each process that runs the demo's job."""
    trainer = [
        "-m",
        "exporter.tools.trainer",
        "--duration",
        str(args.duration),
        "--fault",
        args.fault,
        "--fault-rank",
        str(args.fault_rank),
        "--fault-after",
        str(args.fault_after),
        "--addr",
        "127.0.0.1",
        "--heartbeat",
        "1",
    ]
    if file_sd:
        os.makedirs(file_sd, exist_ok=True)
        trainer += ["--file-sd", file_sd]
    if use_stack or args.duration:
        # A short process-group timeout: a hang pages before it fires, and a hung job ends a
        # minute after the hang, not after gloo's default 30 minutes (the duration cannot end
        # a rank that waits inside a collective).
        trainer += ["--timeout", str(HUNG_JOB_TIMEOUT_S)]
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    master_port = str(free_port())
    if args.fault == "kill":
        # torchrun's agent stops every rank when one dies; a scheduler that starts one process
        # per rank (srun, mpirun) leaves the survivors up, which shows the alert naming the dead.
        commands: list[tuple[list[str], dict[str, str]]] = []
        for r in range(args.ranks):
            port = "0" if args.port == 0 else str(args.port + r)
            commands.append(
                (
                    [sys.executable, *trainer, "--port", port],
                    dict(
                        env,
                        RANK=str(r),
                        LOCAL_RANK="0",
                        WORLD_SIZE=str(args.ranks),
                        MASTER_ADDR="127.0.0.1",
                        MASTER_PORT=master_port,
                    ),
                )
            )
    else:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            str(args.ranks),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            master_port,
            *trainer,
            "--port",
            str(args.port),
        ]
        commands = [(cmd, env)]
    return commands


def _run_demo(
    args: argparse.Namespace,
    use_stack: bool,
    missing: str | None,
    workdir: str,
    children: _Children,
    stacks: list[LocalStack],
) -> int:
    file_sd = args.file_sd or (os.path.join(workdir, "file_sd") if use_stack else None)
    commands = _commands(args, file_sd, use_stack)
    dumps = dump_dir(None)
    before = _entries(dumps)
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
            print(alert_line(alert), flush=True)

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
    elif missing is not None:  # not asked for with --no-stack
        print(f"(to also see alerts arrive: {missing})")
    urls: dict[int, str] = {}
    jobs = [
        children.start(c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=e)
        for c, e in commands
    ]

    def pump(job: subprocess.Popen) -> None:
        assert job.stdout is not None
        for line in job.stdout:
            if children.stopping.is_set():
                continue  # torchrun's traceback as the demo stops it
            found = metrics_urls(line)
            urls.update(found)
            if found or shown(line):
                say(line.rstrip())  # one write: several pump threads share stdout

    for job in jobs:
        threading.Thread(target=pump, args=(job,), daemon=True).start()
    # FAST: the thresholds of the rules the demo's Prometheus evaluates; each read judged
    # against the one before it.
    history = topmod.ReadHistory(0.0, config=FAST)
    rows: list[topmod.RankRow] = []
    while any(job.poll() is None for job in jobs):
        time.sleep(args.refresh)
        if len(urls) < args.ranks or args.no_top:
            continue
        rows = history.judge(topmod.fetch([urls[r] for r in sorted(urls)]))
        tty = sys.stdout.isatty()
        print(("\x1b[2J\x1b[H" if tty else "\n") + topmod.render(rows, color=tty), flush=True)
    code = max(abs(job.wait()) for job in jobs)
    if rows and not args.no_top:
        # The ranks are gone: those that ended cleanly say so (their last read showed it).
        last = history.judge(topmod.fetch([urls[r] for r in sorted(urls)]))
        print("\n" + topmod.render(last), flush=True)
    print(f"ddp-exporter demo: training finished (exit {code})")
    if _entries(dumps) - before:  # the ranks' files outlive the demo: say where they are
        print(
            f"ddp-exporter demo: the run's goodput account and any hang dumps are in {dumps} "
            "(ddp-exporter goodput --file FILE, ddp-exporter hangs FOLDER)"
        )
    return 0 if code == 0 or args.fault in ("kill", "hang", "freeze") else code
