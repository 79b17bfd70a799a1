"""Command line: ``ddp-exporter demo`` runs an instrumented job, ``ddp-exporter top`` watches one,
``ddp-exporter nodes`` ranks the fleet's nodes by evidence."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

from ..mixin.config import DEFAULT, duration_seconds, load_config
from ..settings import DEFAULT_PORT
from . import demo
from . import nodes as nodesmod
from . import top as topmod

__all__ = ["main"]


def _top(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    targets = [t for t in (args.targets or "").split(",") if t]
    if bool(targets) == bool(args.prometheus):
        parser.error("give either --targets host:port[,...] or --prometheus URL --run RUN")
    if args.prometheus and not args.run:
        parser.error("--prometheus needs --run (the run label to show)")
    if args.cluster and not args.prometheus:
        parser.error("--cluster goes with --prometheus (a rank's own page has no cluster)")
    if args.refresh <= 0:
        parser.error("--refresh must be positive")
    try:
        cfg = load_config(args.config) if args.config else DEFAULT
    except ValueError as exc:
        parser.error(f"--config: {exc}")
    window = args.window or cfg.rate_window
    try:
        duration_seconds(window)
    except ValueError as exc:
        parser.error(f"--window: {exc}")

    def read() -> list[topmod.RankRow]:
        if targets:
            return topmod.fetch(targets)
        return topmod.fetch_prometheus(
            args.prometheus, args.run, window=window, cluster=args.cluster, config=cfg
        )

    previous: dict[str, topmod.RankRow] | None = None
    try:
        while True:
            try:
                rows = topmod.diagnose(read(), previous, config=cfg)
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


def _nodes(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    try:
        cfg = load_config(args.config) if args.config else DEFAULT
    except ValueError as exc:
        parser.error(f"--config: {exc}")
    if args.worst < 1:
        parser.error("--worst must be at least 1")
    try:
        rows = nodesmod.fetch_nodes(args.prometheus, cfg, cluster=args.cluster)
    except (OSError, RuntimeError, ValueError) as exc:
        print(f"ddp-exporter nodes: cannot read {args.prometheus}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in rows[: args.worst]], indent=1))
    else:
        print(nodesmod.render_nodes(rows, cfg, args.worst))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """Build the ``ddp-exporter`` argument parser."""
    p = argparse.ArgumentParser(prog="ddp-exporter", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="run a small instrumented multi-rank CPU training")
    d.add_argument("--ranks", type=int, default=3)
    d.add_argument("--fault", choices=demo.FAULTS, default="none")
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
    t.add_argument("--cluster", default="",
                   help="with --prometheus: the run's cluster (needed where a run name repeats)")  # fmt: skip
    t.add_argument("--worst", type=int, default=20, help="show the worst N ranks")
    t.add_argument("--config", default=None,
                   help="the mixin config the rules were generated with (dashboards/mixin.json): "
                   "judge with their thresholds (default: the DEFAULT config)")  # fmt: skip
    t.add_argument("--window", default=None,
                   help="with --prometheus: rate window of the per-step figures (default: the "
                   f"alerts', {DEFAULT.rate_window} or the config's)")  # fmt: skip
    t.add_argument("--refresh", type=float, default=2.0, help="seconds between reads")
    t.add_argument("--once", action="store_true",
                   help="read twice, --refresh apart, print one table and exit")  # fmt: skip
    # Listed for --help only: main() hands "doctor ..." to exporter.doctor's own parser.
    sub.add_parser("doctor", help="preflight: check that the ranks of a job can meet")
    # Hang forensics (exporter.hangs.verdict): read one episode's dumps, print the verdict.
    h = sub.add_parser("hangs", help="print who is stuck where, from a hang dump folder")
    h.add_argument("dir", help="an episode folder, or the dump folder (its newest episode)")
    n = sub.add_parser("nodes", help="rank the fleet's nodes by how often runs blamed them")
    n.add_argument("--prometheus", required=True, help="Prometheus URL with the fleet rules")
    n.add_argument("--config", default=None,
                   help="the mixin config the rules were generated with (dashboards/mixin.json; "
                   "default: the DEFAULT config)")  # fmt: skip
    n.add_argument("--cluster", default="", help="only the nodes of this cluster")
    n.add_argument("--worst", type=int, default=20, help="show the N nodes with most evidence")
    n.add_argument("--json", action="store_true", help="print the rows as JSON")
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
        return demo.run(args, parser)
    if args.command == "nodes":
        return _nodes(args, parser)
    if args.command == "hangs":
        from ..hangs import verdict

        return verdict.main(args.dir)
    return _top(args, parser)


if __name__ == "__main__":
    sys.exit(main())
