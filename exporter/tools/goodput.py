"""Print where a run's wall clock went: ``ddp-exporter goodput --prometheus URL --run RUN``.

The account is the one the run's monitoring rank publishes (``ddp_goodput_*``, carried across
its attempts) and writes next to its dumps (``<run>-goodput.json``): read from Prometheus (the
whole run, or ``--window`` the last hours, as the Goodput dashboard's records take them) or
from that file (``--file``). ``--compare A B`` sets two runs side by side and exits 1 when B's
ETTR is more than ``--max-drop`` below A's: a regression gate a CI job can call. Offline:
imports no torch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from .. import catalog
from ..mixin.promql import string
from ..sources.goodput.categories import CATEGORIES
from ..sources.goodput.summary import document, ettr, render, unplanned_ettr
from . import options
from .promapi import instant_query

__all__ = ["add_parser", "compare", "fetch_account", "load_account", "run"]

#: How far back a run's whole account is looked for in Prometheus by default.
LOOKBACK = "30d"


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add ``goodput`` to the ``ddp-exporter`` subcommands."""
    g = sub.add_parser(
        "goodput",
        help="print where a run's wall clock went: productive training and each badput",
        description="Print a run's goodput account (ETTR, seconds by category, the ranks that "
        "cost time, its episodes) from Prometheus or from the run's goodput file; or compare "
        "two runs. Exit 1 when --compare finds a regression or a run cannot be read.",
    )
    g.add_argument(
        "--prometheus",
        metavar="URL",
        type=options.prometheus_url,
        help="Prometheus to read the account from",
    )
    g.add_argument("--run", help="the run (its run label)")
    g.add_argument("--file", metavar="PATH", help="read the account from <run>-goodput.json")
    g.add_argument(
        "--window",
        metavar="DURATION",
        type=options.duration,
        help="only the last DURATION (e.g. 1h, 1d), as the dashboard's records "
        "(Prometheus; default: the whole run)",
    )
    g.add_argument(
        "--lookback",
        metavar="DURATION",
        type=options.duration,
        default=LOOKBACK,
        help=f"how far back the whole run is looked for (default {LOOKBACK})",
    )
    g.add_argument(
        "--compare",
        nargs=2,
        metavar=("A", "B"),
        help="compare run B with run A (run names with --prometheus, or goodput "
        "files); exit 1 when B's ETTR is more than --max-drop below A's",
    )
    g.add_argument(
        "--max-drop",
        type=options.share,
        default=0.02,
        help="ETTR points B may lose against A before --compare fails (default 0.02)",
    )
    g.add_argument("--json", action="store_true", help="print JSON instead of a table")
    g.set_defaults(tool=run, parser=g)
    return g


def _q(url: str, expr: str) -> list[dict[str, Any]]:
    return instant_query(url, expr, timeout=30.0)


def fetch_account(url: str, run: str, window: str = "", lookback: str = LOOKBACK) -> dict[str, Any]:
    """Return ``run``'s account from Prometheus (the whole run, or the last ``window``).

    Raises RuntimeError (an error Prometheus answered) or OSError (Prometheus unreachable),
    and LookupError when Prometheus holds no account of the run.
    """
    sel = f"run={string(run)}"
    seconds, blamed = catalog.GOODPUT.name, catalog.GOODPUT_BLAME.name
    if window:
        # The dashboard's records: one series per run and category, max over the targets.
        totals_q = f"increase((max by (category) ({seconds}{{{sel}}}))[{window}:15s])"
        blame_q = (
            f"increase((max by (category, culprit_rank, node) ({blamed}{{{sel}}}))[{window}:15s])"
        )
    else:
        totals_q = f"max by (category) (last_over_time({seconds}{{{sel}}}[{lookback}]))"
        blame_q = (
            f"max by (category, culprit_rank, node) (last_over_time({blamed}{{{sel}}}[{lookback}]))"
        )
    totals = {s["metric"]["category"]: float(s["value"][1]) for s in _q(url, totals_q)}
    if not totals:
        raise LookupError(f"Prometheus at {url} holds no goodput account of run {run!r}")
    blame = [
        (
            s["metric"]["category"],
            int(s["metric"]["culprit_rank"]),
            s["metric"].get("node", ""),
            float(s["value"][1]),
        )
        for s in _q(url, blame_q)
        if float(s["value"][1]) > 0
    ]
    started = _q(url, f"max(last_over_time({catalog.GOODPUT_STARTED.name}{{{sel}}}[{lookback}]))")
    state: dict[str, Any] = {"totals": {c: totals.get(c, 0.0) for c in CATEGORIES}}
    if started and not window:
        state["run_start_unix"] = float(started[0]["value"][1])
    doc = document(run=run, state=state, blame=sorted(blame, key=lambda b: -b[3]))
    doc["window"] = window or "the whole run"
    return doc


def load_account(path: str) -> dict[str, Any]:
    """Return the account a run's goodput file holds; raise OSError or ValueError."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    if not isinstance(doc, dict) or doc.get("ddp_exporter_goodput") != 1:
        raise ValueError(f"{path} is not a run's goodput file")
    # What reads an account is render() and compare(): one they cannot read is refused here,
    # naming the file, not later with a bare KeyError or a traceback.
    try:
        render(doc)
        compare(doc, doc, 0.0)
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        why = f"no field {exc.args[0]!r}" if isinstance(exc, KeyError) else str(exc)
        raise ValueError(f"{path} holds no readable goodput account: {why}") from None
    return doc


def _account(args: argparse.Namespace, which: str) -> dict[str, Any]:
    """Return the account named ``which``: a goodput file, or a run in Prometheus."""
    if os.path.isfile(which):
        return load_account(which)
    if not args.prometheus:
        raise ValueError(f"{which!r} is no goodput file; give --prometheus URL to read the run")
    return fetch_account(args.prometheus, which, args.window or "", args.lookback)


def compare(a: dict[str, Any], b: dict[str, Any], max_drop: float) -> dict[str, Any]:
    """Return B against A: ETTR of each, the drop, the shares by category, and the verdict."""

    def shares(doc: dict[str, Any]) -> dict[str, float]:
        totals = doc["totals"]
        wall = sum(totals.get(c, 0.0) for c in CATEGORIES) or 1.0
        return {c: totals.get(c, 0.0) / wall for c in CATEGORIES}

    sa, sb = shares(a), shares(b)
    ea, eb = ettr(a["totals"]) or 0.0, ettr(b["totals"]) or 0.0
    grew = sorted((c for c in CATEGORIES if c != "productive"), key=lambda c: sa[c] - sb[c])
    return {
        "a": a.get("run", "A"),
        "b": b.get("run", "B"),
        "ettr_a": round(ea, 4),
        "ettr_b": round(eb, 4),
        "unplanned_ettr_a": _r(unplanned_ettr(a["totals"])),
        "unplanned_ettr_b": _r(unplanned_ettr(b["totals"])),
        "drop": round(ea - eb, 4),
        "max_drop": max_drop,
        "regressed": ea - eb > max_drop,
        "shares": {c: {"a": round(sa[c], 4), "b": round(sb[c], 4)} for c in CATEGORIES},
        "grew_most": grew[0] if sb[grew[0]] > sa[grew[0]] else None,
    }


def _r(x: float | None) -> float | None:
    return round(x, 4) if x is not None else None


def render_comparison(found: dict[str, Any]) -> str:
    """Return a comparison as text: the shares side by side, then the verdict."""
    a, b = found["a"], found["b"]
    lines = [f"{'category':<14} {a[:12]:>12} {b[:12]:>12} {'change':>8}"]
    for cat, pair in found["shares"].items():
        delta = pair["b"] - pair["a"]
        lines.append(f"{cat:<14} {pair['a']:>12.1%} {pair['b']:>12.1%} {delta * 100:>+7.1f}p")
    lines.append("")
    verdict = "REGRESSED" if found["regressed"] else "ok"
    lines.append(
        f"ETTR {found['ettr_a']:.1%} -> {found['ettr_b']:.1%} (drop "
        f"{found['drop'] * 100:+.1f} points, allowed {found['max_drop'] * 100:.1f}): "
        f"{verdict}"
    )
    if found["grew_most"]:
        lines.append(f"grew most: {found['grew_most']}")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    """Print the account (or the comparison); return the exit status."""
    try:
        if args.compare:
            found = compare(*(_account(args, w) for w in args.compare), args.max_drop)
            print(json.dumps(found, indent=1) if args.json else render_comparison(found), end="")
            return 1 if found["regressed"] else 0
        if args.file:
            doc = load_account(args.file)
        elif args.prometheus and args.run:
            doc = fetch_account(args.prometheus, args.run, args.window or "", args.lookback)
        else:
            args.parser.error("give --prometheus URL --run RUN, --file PATH, or --compare A B")
    except (OSError, ValueError, RuntimeError, LookupError) as exc:
        print(f"ddp-exporter goodput: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(doc, indent=1) if args.json else render(doc), end="")
    return 0
