"""Write a list of ranks for people: the one formatter of verdicts, tables and doctor reports."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["format_ranks"]


def format_ranks(
    ranks: Iterable[int | None],
    *,
    ranges: bool = False,
    most: int | None = None,
    noun: bool = False,
) -> str:
    """Return ``ranks`` sorted and comma-separated; None entries (unknown ranks) are left out.

    ``ranges`` writes consecutive ranks as ``0-2`` (``[0, 1, 2, 5]`` -> ``0-2,5``); ``most``
    shows the first ``most`` entries and then ``,... (N)`` with the total; ``noun`` puts
    ``rank``/``ranks`` in front.
    """
    shown = sorted(r for r in ranks if r is not None)
    total = len(shown)
    parts: list[str] = []
    if ranges:
        i = 0
        while i < len(shown):
            j = i
            while j + 1 < len(shown) and shown[j + 1] == shown[j] + 1:
                j += 1
            parts.append(str(shown[i]) if i == j else f"{shown[i]}-{shown[j]}")
            i = j + 1
    else:
        parts = [str(r) for r in shown]
    text = ",".join(parts if most is None else parts[:most])
    if most is not None and len(parts) > most:
        text += f",... ({total})"
    if noun:
        text = f"{'rank' if total == 1 else 'ranks'} {text}"
    return text
