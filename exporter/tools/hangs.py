"""Print who is stuck where from a hang dump folder: ``ddp-exporter hangs DIR``."""

from __future__ import annotations

import argparse
from typing import Any

from ..hangs.verdict import find_episode, load_episode, render, verdict

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add ``hangs`` to the ``ddp-exporter`` subcommands."""
    h = sub.add_parser(
        "hangs",
        help="print who is stuck where, from a hang dump folder",
        description="Read one hang episode's dumps and print the verdict: who is "
        "stuck where, and who waits for whom. Exit 1 when the folder holds no "
        "readable episode.",
    )
    h.add_argument("dir", help="an episode folder, or the dump folder (its newest episode)")
    h.set_defaults(tool=run, parser=h)
    return h


def run(args: argparse.Namespace) -> int:
    """Print the verdict of the episode at ``args.dir``; return its exit status."""
    try:
        folder = find_episode(args.dir)
        episode, summaries = load_episode(folder)
    except (OSError, ValueError, KeyError) as exc:
        print(f"ddp-exporter hangs: {exc}")
        return 1
    print(f"episode folder: {folder}")
    print(render(verdict(episode, summaries)), end="")
    return 0
