"""Run ``ddp-exporter run -- COMMAND``: watch a training command without editing it.

The command runs with :data:`exporter.autorun.BOOT_DIR` first on its ``PYTHONPATH`` and
``DDP_EXPORTER_AUTORUN=1``: every rank it starts (torchrun's, srun's, a framework launcher's)
is instrumented at its first ``optimizer.step()`` (:mod:`exporter.autorun`). Where Prometheus,
Alertmanager and the ``mixin`` extra are installed, a stack on loopback watches the job with
the generated rules and every alert is printed as it arrives; it stops with the job, on
Ctrl-C and on SIGTERM or SIGHUP, leaving nothing running. ``--top SECONDS`` also prints
``top``'s table of the ranks (read from their file_sd targets) every SECONDS. The command's exit
status is ``run``'s. This module imports no torch.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from .. import settings
from ..autorun import BOOT_DIR
from ..mixin.config import DEFAULT, FAST, MixinConfig
from ..web.client import HTTPClient, load_client
from . import options
from .localstack import LocalStack, add_stack_flags, stack_choice
from .reaper import Interrupted, become_subreaper, raise_on_signals, stop_adopted, stop_tree
from .receiver import alert_line
from .top import ReadHistory, fetch, render

__all__ = ["OPTIONS", "TopTable", "add_parser", "command_env", "file_sd_targets", "run"]

PREFIX = "ddp-exporter run:"
#: Seconds the command has to stop after a Ctrl-C (torchrun gives its workers 30).
CTRL_C_S = 60.0
#: Seconds a launcher has after SIGTERM, and what it leaves behind, before SIGKILL.
GRACE_S = 30.0

#: Option (its argparse dest) -> the variable it sets for the command.
OPTIONS: dict[str, str] = {
    "port": settings.PORT,
    "addr": settings.ADDR,
    "run_name": settings.RUN,
    "on_hang": settings.ON_HANG,
    "dump_dir": settings.DUMP_DIR,
}


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add ``run`` to the ``ddp-exporter`` subcommands."""
    d = sub.add_parser(
        "run",
        help="run a training command with every rank instrumented, no line edited",
        description="Run COMMAND (torchrun, srun, accelerate launch, python ...) with every rank "
        "instrumented at its first optimizer.step(): the model and optimizer the script "
        "made, and the DataLoader it iterates, with the same series, alerts and hang "
        "forensics as exporter.instrument(). Settings: the options below or the "
        "DDP_EXPORTER_* variables. Where Prometheus and Alertmanager are installed (and the "
        "mixin extra), they watch the job on loopback and each alert is printed as it arrives.",
        epilog="Example: ddp-exporter run --fast -- torchrun --nproc-per-node 4 train.py",
    )
    d.add_argument("--port", help="base port of the ranks' endpoints (rank: port + LOCAL_RANK)")
    d.add_argument("--addr", help="address the ranks' endpoints bind to")
    d.add_argument("--run", dest="run_name", help="the run label (default: the launcher's job id)")
    d.add_argument("--on-hang", choices=settings.ON_HANG_CHOICES, help="what a hang does")
    d.add_argument("--dump-dir", help="folder of the hang dumps")
    add_stack_flags(
        d, "watch the job with Prometheus + Alertmanager on loopback (default: when installed)"
    )
    d.add_argument(
        "--fast",
        action="store_true",
        help="the stack evaluates the FAST rules (short windows, for a first look) instead of "
        "the default windows",
    )
    d.add_argument(
        "--top",
        type=options.seconds_or_zero,
        default=0.0,
        metavar="SECONDS",
        help="also print the ranks' top table every SECONDS (0: never; default)",
    )
    d.add_argument(
        "--http-config",
        default=None,
        metavar="FILE",
        help="how the stack and the table read ranks served over TLS or with a password "
        "(DDP_EXPORTER_WEB_CONFIG), in the format of Prometheus's HTTP client configuration: "
        "tls_config, basic_auth with password_file, authorization",
    )
    d.add_argument("command", nargs=argparse.REMAINDER, help="-- then the training command")
    d.set_defaults(tool=run, parser=d)
    return d


def command_env(args: argparse.Namespace, environ: dict[str, str]) -> dict[str, str]:
    """Return the command's environment: ``environ``, the options' variables, the boot folder.

    Raises ValueError naming the option for a value its setting does not accept.
    """
    env = dict(environ)
    for dest, name in OPTIONS.items():
        value = getattr(args, dest, None)
        if value is None:
            continue
        setting = settings.SETTINGS[name]
        try:
            setting.check(setting.parse(str(value)))
        except (TypeError, ValueError):
            flag = "--" + ("run" if dest == "run_name" else dest.replace("_", "-"))
            raise ValueError(settings.setting_message(flag, value, setting)) from None
        env[name] = str(value)
    path = env.get("PYTHONPATH")
    env.update(
        {
            settings.AUTORUN: "1",
            "PYTHONPATH": str(BOOT_DIR) + (os.pathsep + path if path else ""),
        }
    )
    return env


#: Why ``run`` watches no job whose ranks serve a web configuration file, without a client file.
WEB_CONFIG_SERVED = (
    f"the ranks serve as {settings.WEB_CONFIG} says (TLS, passwords): give --http-config "
    "FILE (the CA, certificate and credentials to read them with) for run's own Prometheus "
    "and table"
)


def run(args: argparse.Namespace) -> int:
    """Run ``ddp-exporter run`` with parsed ``args``; return the command's exit status."""
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        args.parser.error("a command to run is needed: ddp-exporter run -- torchrun ... train.py")
    try:
        env = command_env(args, dict(os.environ))
    except ValueError as exc:
        args.parser.error(str(exc))
    client = None
    if args.http_config:
        try:
            client = load_client(args.http_config)
        except (ValueError, ImportError) as exc:
            args.parser.error(f"--http-config: {exc}")
    if settings.web_config_file(env) is not None and client is None:
        # Read over plain HTTP, every rank would look down, and page: neither starts.
        if args.stack or args.top:
            flag = "--stack" if args.stack else "--top"
            print(f"{PREFIX} {flag}: {WEB_CONFIG_SERVED}", file=sys.stderr)
            return 2
        print(f"{PREFIX} no alerts on this host: {WEB_CONFIG_SERVED}", file=sys.stderr)
        args.stack = False
    use_stack, missing, refused = stack_choice(args.stack, "run")
    if refused is not None:
        return refused
    if missing is not None:
        print(f"{PREFIX} no alerts on this host: {missing}", file=sys.stderr)
    # The variable as given: a folder that cannot be made is refused here, before the command
    # starts (the ranks themselves would report it and write no target).
    file_sd = settings.resolve(settings.FILE_SD, environ=env) or ""
    if file_sd and (use_stack or args.top):
        # Where the ranks write their targets for the stack and the table to read: it must be
        # a folder before the command starts, not a traceback once it has.
        try:
            options.make_folder(file_sd)
        except ValueError as exc:
            print(f"{PREFIX} {settings.FILE_SD}: {exc}", file=sys.stderr)
            return 2
    workdir: str | None = None
    stack: LocalStack | None = None
    proc: subprocess.Popen | None = None
    table: TopTable | None = None
    try:
        raise_on_signals()  # SIGTERM/SIGHUP clean up like Ctrl-C
        become_subreaper()  # a launcher that dies hands its workers to us, not to init
        workdir = tempfile.mkdtemp(prefix="ddp-exporter-run-")  # user-only (0700)
        if use_stack or args.top:
            # The ranks' own file_sd targets: what the stack scrapes and the table reads.
            file_sd = file_sd or os.path.join(workdir, "file_sd")
            os.makedirs(file_sd, exist_ok=True)
            env.update({settings.FILE_SD: file_sd})
        if use_stack:
            stack = _start_stack(args, workdir, file_sd, client)
            if stack is None and args.stack:
                return 1  # asked for: not trained without it
        try:
            proc = subprocess.Popen(command, env=env)
        except OSError as exc:
            print(f"{PREFIX} cannot run {command[0]}: {exc.strerror or exc}", file=sys.stderr)
            return 127 if isinstance(exc, FileNotFoundError) else 126
        if args.top:
            config = FAST if args.fast else DEFAULT
            table = TopTable(file_sd, args.top, config, client).start()
        code = proc.wait()
        return 128 - code if code < 0 else code
    except KeyboardInterrupt as exc:
        _ignore(signal.SIGTERM, signal.SIGHUP)
        signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
        print(f"\n{PREFIX} stopping the command and every process it started", file=sys.stderr)
        if proc is not None and signum == signal.SIGINT:
            _let_it_end(proc)
        return 128 + signum
    finally:
        _ignore(signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # nothing cuts the clean-up short
        if table is not None:
            table.close()
        if proc is not None:
            stop_tree(proc, grace=GRACE_S)
        if stack is not None:
            stack.close()
        stop_adopted(GRACE_S)  # what the command left running, adopted as subreaper
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)


def _ignore(*signums: int) -> None:
    for signum in signums:
        signal.signal(signum, signal.SIG_IGN)


def _let_it_end(proc: subprocess.Popen) -> None:
    """Give the command after a Ctrl-C the time it takes without ``run``; a second one ends it.

    A Ctrl-C at the terminal reaches the command as well (one foreground process group): a
    launcher such as torchrun then stops its workers its own way. A SIGINT sent to ``run``
    alone is passed on.
    """
    try:
        reached = os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp()
    except (OSError, ValueError):
        reached = False
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        if not reached:
            proc.send_signal(signal.SIGINT)
        print(
            f"{PREFIX} waiting up to {CTRL_C_S:.0f} s for the command to stop (Ctrl-C again: "
            "stop it now)",
            file=sys.stderr,
        )
        proc.wait(timeout=CTRL_C_S)
    except (subprocess.TimeoutExpired, KeyboardInterrupt, ProcessLookupError):
        pass


def _start_stack(
    args: argparse.Namespace, workdir: str, file_sd: str, client: HTTPClient | None
) -> LocalStack | None:
    """Start Prometheus and Alertmanager over the ranks' file_sd targets; None if they fail.

    ``client``: how to read ranks served over TLS or with a password.
    """
    config = FAST if args.fast else DEFAULT

    def show(alert: dict[str, Any]) -> None:
        print(f"{PREFIX} {alert_line(alert)}", flush=True)

    try:
        stack = LocalStack(
            os.path.join(workdir, "stack"),
            file_sd,
            on_alert=show,
            config=config,
            grafana=True,
            scrape=client.scrape if client is not None else None,
        )
    except (RuntimeError, OSError) as exc:
        without = "" if args.stack else "; the command runs without them"
        print(
            f"{PREFIX} could not start Prometheus and Alertmanager: {exc}{without}",
            file=sys.stderr,
        )
        return None
    windows = "FAST rules (short windows)" if args.fast else "the default rule windows"
    print(
        f"{PREFIX} Prometheus {stack.prometheus_url}, Alertmanager {stack.alertmanager_url}, "
        f"{windows}; alerts are printed as they arrive",
        flush=True,
    )
    if stack.grafana_url is not None:
        print(f"{PREFIX} dashboards at {stack.grafana_url}/d/ddp-overview", flush=True)
    elif stack.grafana_error is not None:
        print(f"{PREFIX} no dashboards: Grafana did not start: {stack.grafana_error}", flush=True)
    return stack


def file_sd_targets(folder: str) -> list[str]:
    """Return the ``host:port`` of every rank with a file_sd target file in ``folder``."""
    found: list[str] = []
    for path in sorted(Path(folder).glob("*.json")):
        try:
            groups = json.loads(path.read_text())
            found += [t for g in groups for t in g["targets"] if isinstance(t, str)]
        except (OSError, ValueError, TypeError, KeyError):
            continue  # a rank writing or removing its file right now: the next read has it
    return found


class TopTable:
    """Print ``top``'s table of the ranks listed in a file_sd folder every ``every`` seconds."""

    def __init__(
        self, folder: str, every: float, config: MixinConfig, client: HTTPClient | None = None
    ) -> None:
        self._folder, self._every, self._config = folder, every, config
        self._client = client
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ddp-exporter-run-top", daemon=True)

    def start(self) -> TopTable:
        """Start printing; return self."""
        self._thread.start()
        return self

    def _loop(self) -> None:
        # Each read judged against the one before it, a section's end remembered.
        history = ReadHistory(0.0, config=self._config)
        while not self._stop.wait(self._every):
            targets = file_sd_targets(self._folder)
            if not targets:
                continue
            try:
                rows = history.judge(fetch(targets, client=self._client))
            except Exception as exc:  # noqa: BLE001 - the table must not end run, nor repeat
                print(f"{PREFIX} no table: {exc!r}", file=sys.stderr, flush=True)
                return
            print(f"\n{render(rows)}", flush=True)

    def close(self) -> None:
        """Stop printing (the read under way ends within its timeout)."""
        self._stop.set()
        self._thread.join(timeout=5)
