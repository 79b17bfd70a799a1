"""Say the numbers of generated prose in words: durations, factors and shares.

The rules' descriptions and the runbook state thresholds in sentences. Every such number comes
from the configuration or from the exporter's settings defaults, never from the text: a
configuration of one's own then reads its own numbers. These helpers give them the words a
sentence needs ("10 minutes", "twice", "half").
"""

from __future__ import annotations

from .config import duration_seconds

__all__ = ["number_word", "share", "spoken_duration", "times"]

_UNITS = (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1))
_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


def spoken_duration(text: str) -> str:
    """Return a Prometheus duration in words: ``10m`` is "10 minutes", ``1h30m`` "1 hour 30 minutes"."""
    left = duration_seconds(text)
    parts = []
    for unit, seconds in _UNITS:
        count, left = divmod(left, seconds)
        if count:
            parts.append(f"{count} {unit}{'' if count == 1 else 's'}")
    return " ".join(parts) or "0 seconds"


def times(factor: float) -> str:
    """Return a multiple in words: 2 is "twice", 3 is "3 times"."""
    return {1.0: "once", 2.0: "twice"}.get(float(factor), f"{factor:g} times")


def share(fraction: float) -> str:
    """Return a fraction of a whole in words, before "the ...": 0.5 is "half", 0.25 "25% of"."""
    return "half" if fraction == 0.5 else f"{fraction:.0%} of"


def number_word(count: int) -> str:
    """Return a small count in words ("three"), a larger one in digits."""
    return _WORDS[count] if 0 <= count < len(_WORDS) else str(count)
