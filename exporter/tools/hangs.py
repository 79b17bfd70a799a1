"""Print who is stuck where from a hang dump folder: ``ddp-exporter hangs DIR``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..hangs.verdict import find_episode, load_episode, render, verdict

__all__ = ["add_parser", "run"]

PREFIX = "ddp-exporter hangs:"


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add ``hangs`` to the ``ddp-exporter`` subcommands."""
    h = sub.add_parser(
        "hangs",
        help="print who is stuck where, from a hang dump folder",
        description="Read one hang episode's dumps and print the verdict: who is "
        "stuck where, and who waits for whom. A file of the episode that cannot be "
        "read is skipped with a note. Exit 1 when the folder holds no readable episode.",
    )
    h.add_argument("dir", help="an episode folder, or the dump folder (its newest episode)")
    h.set_defaults(tool=run, parser=h)
    return h


def run(args: argparse.Namespace) -> int:
    """Print the verdict of the episode at ``args.dir``; return its exit status."""
    skipped: list[str] = []
    try:
        folder = find_episode(args.dir)
        episode, summaries = load_episode(folder, skipped)
    except (OSError, ValueError) as exc:
        why = str(exc)
        if skipped:  # every file there is unreadable: say why for the first
            more = f" (and {len(skipped) - 1} more)" if len(skipped) > 1 else ""
            why = f"no readable episode in {folder}: {skipped[0]}{more}"
        print(f"{PREFIX} {why}", file=sys.stderr)
        return 1
    for note in skipped:  # the verdict stands on the other files
        print(f"{PREFIX} skipped {note}", file=sys.stderr)
    print(f"episode folder: {folder}")
    print(render(verdict(episode, summaries)), end="")
    return 0
