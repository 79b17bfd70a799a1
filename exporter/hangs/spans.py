"""Name the collectives of a hang by sequence number, the same way in every place that says so.

DDP launches a bucket's all-reduce as soon as its gradients are ready, so several collectives of
one process group are in flight at once: with two buckets, the waiting ranks entered #699 and
#700 and wait in #699 (the oldest), while the rank behind last entered #698. The collective it
missed first is #699, not the group's highest number (#700). The verdict
(:mod:`exporter.hangs.verdict`), ``top`` and the dumps' text all say it with these helpers:
"never entered #699–#700"; "stuck in #837, #838 queued behind it".
"""

from __future__ import annotations

__all__ = ["first_missed", "missed", "number", "oldest", "queued", "stuck"]


def number(seq: float) -> str:
    """Return a sequence number as ``#N`` (an integer when it is one)."""
    value = float(seq)
    return f"#{int(value)}" if value.is_integer() else f"#{value:g}"


def _range(first: float, last: float) -> str:
    """Return ``#first`` or ``#first–#last``."""
    return number(first) if last <= first else f"{number(first)}–{number(last)}"


def first_missed(last_entered: float | None, top: float) -> float:
    """Return the first collective a rank that last entered ``last_entered`` missed (``top``: the
    highest any rank entered); ``top`` when its last is not known."""
    if last_entered is None or not last_entered < top:
        return float(top)
    return float(last_entered) + 1


def missed(last_entered: float | None, top: float) -> str:
    """Return the collectives a rank behind never entered: ``#699–#700``, or ``#700``."""
    return _range(first_missed(last_entered, top), float(top))


def oldest(last_completed: float | None, last_entered: float) -> float:
    """Return the collective a rank waits in: the oldest it entered and has not completed."""
    if last_completed is None or not last_completed < last_entered:
        return float(last_entered)
    return float(last_completed) + 1


def queued(last_completed: float | None, last_entered: float) -> str:
    """Return what is queued behind the oldest collective in flight (``""``: nothing):
    ``#838 queued behind it``, ``#838–#840 queued behind it``."""
    first = oldest(last_completed, last_entered)
    if first >= last_entered:
        return ""
    return f"{_range(first + 1, float(last_entered))} queued behind it"


def stuck(last_completed: float | None, last_entered: float) -> str:
    """Return the collective a rank waits in and those behind it: ``#837, #838 queued behind
    it``, or ``#837``."""
    first = number(oldest(last_completed, last_entered))
    behind = queued(last_completed, last_entered)
    return f"{first}, {behind}" if behind else first
