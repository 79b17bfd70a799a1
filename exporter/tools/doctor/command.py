"""Run ``ddp-exporter doctor`` (``python -m exporter.doctor``): its parser and its exit status."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from typing import Any

from ...network import links
from .. import options
from .checks import ABANDONED, DEFAULT_STEP_TIMEOUT_S, DEFAULT_TIMEOUT_S
from .exchange import Exchange

__all__ = [
    "add_parser",
    "build_parser",
    "main",
    "run",
]

_DESCRIPTION = (
    "Check, before a job starts, that its ranks can meet: run it under the job's launcher "
    "(torchrun ... -m exporter.doctor, srun python -m exporter.doctor). Rank 0 prints the "
    "verdict; exit 0 when every check passed on every rank, 1 when one failed."
)


def build_parser(prog: str = "ddp-exporter doctor") -> argparse.ArgumentParser:
    """Build the doctor's argument parser (``python -m exporter.doctor``)."""
    return _arguments(argparse.ArgumentParser(prog=prog, description=_DESCRIPTION))


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add ``doctor`` to the ``ddp-exporter`` subcommands."""
    p = sub.add_parser(
        "doctor", help="preflight: check that the ranks of a job can meet", description=_DESCRIPTION
    )
    return _arguments(p)


def _arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.set_defaults(tool=run, parser=p)
    p.add_argument(
        "--timeout",
        type=options.seconds,
        default=DEFAULT_TIMEOUT_S,
        help="overall seconds; rank 0 prints the table by then (default %(default)s)",
    )
    p.add_argument(
        "--step-timeout",
        type=options.seconds,
        default=DEFAULT_STEP_TIMEOUT_S,
        help="seconds for each network step: store, collective; a rank waits for rank 0's "
        "MASTER_PORT as long as rank 0 waits for the ranks (default %(default)s)",
    )
    p.add_argument(
        "--links",
        action="store_true",
        help="also measure every pair of nodes over gloo and name a node whose link is slow "
        "(give --timeout room: a few seconds per round on a slow link)",
    )
    p.add_argument(
        "--links-mib",
        type=options.mebibytes,
        default=links.DEFAULT_MIB,
        help="MiB each way per pair of nodes with --links (default %(default)s)",
    )
    return p


def main(argv: list[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Run the doctor on this rank; return the exit status (0: every check passed everywhere)."""
    return run(build_parser().parse_args(argv), environ)


def run(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> int:
    """Run the doctor with parsed ``args``; return its exit status."""
    parser = args.parser
    environ = os.environ if environ is None else environ
    try:
        doctor = Exchange(
            environ, args.timeout, args.step_timeout, args.links_mib if args.links else 0.0
        )
    except ValueError as exc:
        parser.error(str(exc))
    try:
        code = doctor.run()
    except Exception as exc:  # noqa: BLE001 - a preflight reports, it never dies with a traceback
        print(f"ddp-exporter doctor: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        code = 1
    if ABANDONED and any(t.is_alive() for t in ABANDONED):
        # A step stuck in C++ (gloo, DNS) would keep the interpreter from exiting: leave now.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code
