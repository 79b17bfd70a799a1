"""Write a run's account for people: the summary at the end, the table the CLI prints.

One renderer for both (``close()``'s ``<run>-goodput.txt`` and ``ddp-exporter goodput``), so
what the end of a run says and what the command says of it read the same. A run's episodes are
listed one by one with their own cost: a straggler that doubled the step time for ten minutes of
a ten-hour run is an episode of ten minutes, not a 2 % average.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from .categories import BADPUT, CATEGORIES, PLANNED

__all__ = [
    "BOTTLENECKS",
    "bottleneck",
    "document",
    "end_words",
    "ettr",
    "largest_badput",
    "render",
    "unplanned_ettr",
]

#: The bottleneck classes of a run: what its steps' time went to most.
BOTTLENECKS: tuple[str, ...] = ("input-bound", "compute-bound", "communication-bound")


#: How a run's account ended (its file's ``ended``), in the words the summary and the log use.
_END_WORDS: dict[str, str] = {
    "clean": "ended cleanly",
    "aborted": "aborted by the hang action",
    "ended": "ended not cleanly (an exception or Ctrl-C)",
}


def end_words(how: str) -> str:
    """Return how a run ended, in words, from its account's ``ended`` (a kind it does not know
    is named as it is)."""
    return _END_WORDS.get(how, f"ended ({how})")


def ettr(totals: Mapping[str, float]) -> float | None:
    """Return the effective training time ratio: productive over the wall clock."""
    wall = sum(totals.get(c, 0.0) for c in CATEGORIES)
    return totals.get("productive", 0.0) / wall if wall > 0 else None


def unplanned_ettr(totals: Mapping[str, float]) -> float | None:
    """Return productive over the wall clock less planned time (what DDPGoodputLow judges)."""
    wall = sum(totals.get(c, 0.0) for c in CATEGORIES if c not in PLANNED)
    return totals.get("productive", 0.0) / wall if wall > 0 else None


def largest_badput(totals: Mapping[str, float], planned: bool = True) -> str | None:
    """Return the badput category with the most seconds (planned ones too unless told not)."""
    cats = [c for c in BADPUT if planned or c not in PLANNED]
    best = max(cats, key=lambda c: totals.get(c, 0.0))
    return best if totals.get(best, 0.0) > 0 else None


def bottleneck(split: Mapping[str, float]) -> str | None:
    """Return what the steps' time went to most: input, compute or communication."""
    parts = {
        "input-bound": split.get("input", 0.0),
        "compute-bound": split.get("compute", 0.0),
        "communication-bound": split.get("communication", 0.0),
    }
    best = max(parts, key=lambda k: parts[k])
    return best if parts[best] > 0 else None


def document(
    *,
    run: str,
    state: Mapping[str, Any],
    blame: Sequence[tuple[str, int, str, float]],
    world_size: int | None = None,
) -> dict[str, Any]:
    """Return a run's account as its goodput file holds it: ETTR, bottleneck, blame, episodes.

    ``state`` holds at least ``totals`` (seconds by category); the account's own state adds
    the run's start and end, attempts, the steps' split and the episodes.
    """
    totals = state["totals"]
    doc: dict[str, Any] = {"ddp_exporter_goodput": 1, "run": run}
    if world_size is not None:
        doc["world_size"] = world_size
    doc.update(state)
    doc.update(
        {
            "wall_s": round(sum(totals.values()), 3),
            "ettr": _round(ettr(totals)),
            "unplanned_ettr": _round(unplanned_ettr(totals)),
            "largest_badput": largest_badput(totals),
            "bottleneck": bottleneck(state.get("split", {})),
            "blame": [
                {"category": c, "culprit_rank": r, "node": n, "seconds": round(s, 3)}
                for c, r, n, s in blame
            ],
        }
    )
    return doc


def _round(x: float | None) -> float | None:
    return round(x, 4) if x is not None else None


def _when(unix: Any) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(unix)))


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.1f} s"


def _who(rank: Any, node: Any) -> str:
    if rank is None or rank == "":
        return "every rank"
    return f"rank {rank}" + (f" (node {node})" if node else "")


def render(doc: Mapping[str, Any]) -> str:
    """Return a run's account as text: the table, ETTR, the bottleneck, blame and episodes."""
    totals = doc["totals"]
    wall = sum(totals.get(c, 0.0) for c in CATEGORIES)
    lines = [f"ddp-exporter goodput: run {doc.get('run', '?')}"]
    head = f"wall clock {_duration(wall)}"
    if doc.get("run_start_unix"):
        head += f" from {_when(doc['run_start_unix'])}"
        if doc.get("until_unix"):
            head += f" to {_when(doc['until_unix'])}"
    attempts = doc.get("attempts") or []
    if attempts:
        head += f", {len(attempts)} attempt{'s' if len(attempts) != 1 else ''}"
    if doc.get("ended"):
        head += f", {end_words(str(doc['ended']))}"
    lines.append(head)
    share = ettr(totals)
    if share is not None:
        unplanned = unplanned_ettr(totals)  # None while every second was planned
        rest = f"{unplanned:.1%}" if unplanned is not None else "-"
        lines.append(
            f"ETTR {share:.1%} (productive over the wall clock); without planned time "
            f"(startup, declared sections) {rest}"
        )
    lines += ["", f"{'category':<14} {'seconds':>10} {'share':>7}"]
    for cat in CATEGORIES:
        seconds = totals.get(cat, 0.0)
        pct = f"{seconds / wall:.1%}" if wall > 0 else "-"
        lines.append(f"{cat:<14} {seconds:>10.1f} {pct:>7}")
    lines.append(f"{'total':<14} {wall:>10.1f}")
    lines += _findings(doc)
    return "\n".join(lines) + "\n"


def _findings(doc: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    largest = largest_badput(doc["totals"])
    if largest:
        out += ["", f"largest badput: {largest}"]
    if doc.get("bottleneck"):
        split = doc.get("split", {})
        steps = sum(split.values()) or 1.0
        shares = ", ".join(f"{k} {v / steps:.0%}" for k, v in split.items())
        out.append(f"bottleneck: {doc['bottleneck']} (of the steps' time: {shares})")
    for item in doc.get("blame", ()):
        out.append(
            f"blamed: {item['category']} {_duration(float(item['seconds']))} on "
            f"{_who(item['culprit_rank'], item.get('node'))}"
        )
    for ep in doc.get("stragglers", ()):
        out.append(
            f"straggler episode: {_who(ep['culprit_rank'], ep.get('node'))}, "
            f"{ep['cause']}, cost {_duration(float(ep['seconds']))} from "
            f"{_when(ep['start_unix'])} to {_when(ep['end_unix'])}"
        )
    for ep in doc.get("hangs", ()):
        out.append(
            f"hang episode: {_who(ep.get('culprit_rank'), ep.get('node'))}, "
            f"{_duration(float(ep['seconds']))} from {_when(ep['onset_unix'])}, "
            f"{ep['how']} (attempt {ep.get('attempt', '?')})"
        )
    return out
