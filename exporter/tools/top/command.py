"""Run ``ddp-exporter top``: its parser and its read, judge and print loop."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from ...hangs.heldup import HeldUp
from ...mixin.config import DEFAULT, load_config
from ...web.client import load_client
from .. import options
from .diagnose import ENDPOINT_HOLD_S, diagnose, holding
from .fetch import fetch, fetch_prometheus, prometheus_baseline, target_url
from .history import ReadHistory
from .render import render
from .rows import RankRow

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add ``top`` to the ``ddp-exporter`` subcommands."""
    t = sub.add_parser(
        "top",
        help="live table of every rank of a run, from their endpoints",
        description="Show every rank of a run in one table, the outlier first "
        "with its reason, from the ranks' endpoints or from Prometheus. Exit 1 "
        "when Prometheus cannot be read or, with --once, when no rank can be read (a rank "
        "that cannot be read while others can is DOWN in the table); exit 2 for a target "
        "that is no host:port or http(s) URL.",
    )
    t.add_argument("--targets", help="comma-separated host:port or http(s) URLs of the ranks")
    t.add_argument(
        "--http-config",
        default=None,
        metavar="FILE",
        help="with --targets: how to read ranks served over TLS or with a password, in the "
        "format of Prometheus's HTTP client configuration (tls_config, basic_auth with "
        "password_file, authorization); with its tls_config a host:port is read over https",
    )
    t.add_argument(
        "--prometheus", type=options.prometheus_url, help="read from this Prometheus URL instead"
    )
    t.add_argument("--run", help="with --prometheus: the run label to show")
    t.add_argument(
        "--cluster",
        default="",
        help="with --prometheus: the run's cluster (needed where a run name repeats)",
    )
    t.add_argument("--worst", type=options.count, default=20, help="show the worst N ranks")
    t.add_argument(
        "--config",
        default=None,
        help="the mixin config the rules were generated with (dashboards/mixin.json): "
        "judge with their thresholds (default: the DEFAULT config)",
    )
    t.add_argument(
        "--window",
        type=options.duration,
        default=None,
        help="with --prometheus: rate window of the per-step figures (default: the "
        f"alerts', {DEFAULT.rate_window} or the config's)",
    )
    t.add_argument("--refresh", type=options.seconds, default=2.0, help="seconds between reads")
    t.add_argument(
        "--once",
        action="store_true",
        help="judge two intervals, --refresh apart (from Prometheus, after a read one rate "
        "window back that is not shown; from the ranks, as long as a suspected straggler "
        f"needs to hold, up to {ENDPOINT_HOLD_S:g} s more), print one table and exit",
    )
    t.set_defaults(tool=run, parser=t)
    return t


def run(args: argparse.Namespace) -> int:
    """Run ``ddp-exporter top`` with parsed ``args``; return its exit status."""
    parser = args.parser
    targets = [t for t in (args.targets or "").split(",") if t]
    if bool(targets) == bool(args.prometheus):
        parser.error("give either --targets host:port[,...] or --prometheus URL --run RUN")
    if args.prometheus and not args.run:
        parser.error("--prometheus needs --run (the run label to show)")
    if args.cluster and not args.prometheus:
        parser.error("--cluster goes with --prometheus (a rank's own page has no cluster)")
    for target in targets:
        try:
            target_url(target)
        except ValueError as exc:
            parser.error(f"--targets: {exc}")
    try:
        cfg = load_config(args.config) if args.config else DEFAULT
    except ValueError as exc:
        parser.error(f"--config: {exc}")
    client = None
    if args.http_config:
        if not targets:
            parser.error("--http-config goes with --targets (how to read the ranks)")
        try:
            client = load_client(args.http_config)
        except (ValueError, ImportError) as exc:
            parser.error(f"--http-config: {exc}")
    window = args.window or cfg.rate_window

    def read() -> list[RankRow]:
        if targets:
            return fetch(targets, client=client)
        return fetch_prometheus(
            args.prometheus, args.run, window=window, cluster=args.cluster, config=cfg
        )

    # A verdict needs a suspicion in two consecutive judged reads, like an alert's "for"; a
    # straggler's, in two intervals that do not overlap. A rank's endpoint gives counters since
    # its start: its first read only sets the baseline of the intervals that follow (judged
    # alone, a straggler that began mid-run would be averaged away). Prometheus gives each read
    # its own rate window; a read one window back, never shown, is the baseline of the first,
    # so a lasting straggler is judged over two windows from the start. So --once judges what
    # the streaming view judges by its third read from endpoints, by its second from Prometheus.
    # From endpoints a straggler must also hold for ENDPOINT_HOLD_S: --once reads on while one
    # is suspected and not yet named, as the streaming view would, and no longer than that.
    reads_before_once = 2 if targets else 1
    previous: dict[str, RankRow] | None = None
    history = ReadHistory(config=cfg)  # from endpoints: figures over a window, as Prometheus's
    held = HeldUp()  # from Prometheus: the groups a declared section held up, read to read
    reads = 0
    hold_ends: float | None = None
    try:
        while True:
            try:
                if targets:
                    rows = history.judge(read())
                else:
                    if previous is None:
                        previous = prometheus_baseline(
                            args.prometheus, args.run, window, cluster=args.cluster, config=cfg
                        )
                    rows = diagnose(read(), previous, config=cfg, held=held)
            except (OSError, RuntimeError) as exc:
                print(f"ddp-exporter top: {exc}", file=sys.stderr)
                return 1
            previous, reads = {r.target: r for r in rows}, reads + 1
            if args.once and reads == reads_before_once:
                hold_ends = time.monotonic() + ENDPOINT_HOLD_S + args.refresh
            if args.once and (reads <= reads_before_once or _holds(targets, rows, hold_ends)):
                time.sleep(args.refresh)
                continue
            if args.once and targets and not any(r.up for r in rows):
                print(f"ddp-exporter top: {_unread(rows)}", file=sys.stderr)
                return 1
            tty = sys.stdout.isatty()
            print(
                ("\x1b[2J\x1b[H" if tty else "") + render(rows, args.worst, color=tty), flush=True
            )
            if args.once:
                return 0
            time.sleep(args.refresh)
    except KeyboardInterrupt:
        return 130


def _holds(targets: list[str], rows: list[RankRow], ends: float | None) -> bool:
    """Say whether ``--once`` reads on: a straggler read from endpoints still holding."""
    return bool(targets) and ends is not None and time.monotonic() < ends and holding(rows)


def _unread(rows: list[RankRow]) -> str:
    """Say in one line that no rank could be read, and why for the first few."""
    why = [f"{r.target} ({r.error or 'unreachable'})" for r in rows[:3]]
    more = f" and {len(rows) - 3} more" if len(rows) > 3 else ""
    return f"no rank could be read: {', '.join(why)}{more}"
