"""Give every domain of the mixin's configuration one shape: a title, its fields, its checks.

A domain is a frozen dataclass of the fields one part of the monitoring reads (its windows, its
thresholds, its deployment), with the defaults and the checks of those fields beside them;
:class:`~exporter.mixin.config.MixinConfig` is assembled from the domains. The reference page
(docs/reference/mixin-config.md) lists each domain's fields under its :attr:`Domain.TITLE`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

from ...settings import duration_seconds

__all__ = ["Domain", "check_durations", "check_number"]


# A dataclass without fields, so that a domain's type says it is a dataclass (fields(), replace()).
@dataclass(frozen=True)
class Domain:
    """Validate a domain's fields as soon as its dataclass is made."""

    #: The heading its fields stand under on the reference page, in lower case (the page
    #: capitalises its first letter).
    TITLE: ClassVar[str] = ""

    def __post_init__(self) -> None:
        """Refuse a value that cannot work when the config is made, not when rules render."""
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the first of this domain's fields that cannot work."""


def check_durations(cfg: object, names: Iterable[str], *, positive: bool = False) -> None:
    """Raise ValueError when a field in ``names`` is no duration (or, ``positive``, not > 0)."""
    for name in names:
        seconds = duration_seconds(getattr(cfg, name))
        if positive and seconds <= 0:
            raise ValueError(f"{name} must be positive")


def check_number(
    cfg: object,
    name: str,
    low: float,
    high: float = math.inf,
    *,
    above: bool = False,
    below: bool = False,
) -> None:
    """Raise ValueError unless field ``name`` is a finite number from ``low`` to ``high``.

    ``above``: more than ``low``, not equal; ``below``: less than ``high``. A rule compares with
    the number as written: ``> nan`` never fires, ``> inf`` neither, a ratio below 1 always.
    """
    value = getattr(cfg, name)
    fits = (low < value if above else low <= value) and (value < high if below else value <= high)
    if not (math.isfinite(value) and fits):
        interval = (
            f"{'(' if above else '['}{low:g}, {high:g}{')' if below or high == math.inf else ']'}"
        )
        raise ValueError(f"{name} must be in {interval}: {value!r}")
