"""The ``ddp-exporter`` command: one front door to every tool.

Each tool module owns its parser (``add_parser(subparsers)``, setting ``tool`` to its
``run(args) -> int``); this module only dispatches. Every module imported here imports no torch
and no optional library at import time, so ``ddp-exporter --help`` and every subcommand's
``--help`` work on a base install; a command that needs an extra exits 2 with one line saying
what to install.

Exit status: 0 success; 1 a finding or a failed read (a doctor check failed, top or nodes
could not read their source, hangs found no episode, mixin check found stale files); 2 a usage
or set-up error (bad arguments, a missing extra or binary, a port in use); 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ..generate import command as mixin
from ..version import __version__
from . import demo, doctor, goodput, hangs, nodes, receiver, runner, top

__all__ = ["EXTRAS", "TOOLS", "build_parser", "main"]

#: The tools, in the order ``--help`` lists them.
TOOLS = (demo, runner, top, hangs, goodput, doctor, nodes, mixin, receiver)

#: Optional top-level modules and the extra that provides each.
EXTRAS: dict[str, str] = {
    **dict.fromkeys(mixin.MIXIN_MODULES, "mixin"),
    "opentelemetry": "otlp",
}


def build_parser() -> argparse.ArgumentParser:
    """Build the ``ddp-exporter`` argument parser: one subcommand per tool."""
    p = argparse.ArgumentParser(
        prog="ddp-exporter",
        description="Per-rank Prometheus metrics for PyTorch DDP and FSDP2 jobs that name the "
        "straggling, hung or dead rank: the tools around a training job.",
        epilog="Exit status: 0 success; 1 a finding or a failed read; 2 a usage or set-up "
        "error (bad arguments, a missing extra or binary); 130 interrupted.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for tool in TOOLS:
        tool.add_parser(sub)
    # The generator documents this very parser (docs/reference/cli.md) but sits below the tools
    # in the import order: it is handed the builder instead of importing it.
    p.set_defaults(build_parser=build_parser)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``ddp-exporter`` command; return its exit status."""
    args = build_parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    try:
        return args.tool(args)
    except ModuleNotFoundError as exc:
        extra = EXTRAS.get((exc.name or "").partition(".")[0])
        if extra is None:
            raise
        # One line, never a traceback: the command needs an extra that is not installed.
        print(
            f"ddp-exporter {args.command}: needs the {extra} extra ({exc}): "
            f"pip install 'ddp-exporter[{extra}]'",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
