"""The run's goodput: where every second of its wall clock went, across restarts.

The categories are defined once, in :mod:`.categories`; :mod:`.peers` learns what the other
ranks did, :mod:`.account` keeps the account, :mod:`.ledger` keeps it on disk for the next
attempt, :mod:`.summary` writes it for people and :mod:`.tracker` runs it all on a background
thread.
"""

from __future__ import annotations

from .account import Account, Carried, Episode, StepTotals
from .categories import (
    BADPUT,
    BLAMED,
    CATEGORIES,
    CAUSES,
    PLANNED,
    STRAGGLER_SHARE,
    Work,
    section_category,
)
from .ledger import goodput_path, load_carried, summary_path
from .peers import Excess, PeerTally
from .summary import bottleneck, document, ettr, largest_badput, render, unplanned_ettr
from .tracker import GoodputTracker, HangFeed, SectionClock

__all__ = [
    "BADPUT",
    "BLAMED",
    "CATEGORIES",
    "CAUSES",
    "PLANNED",
    "STRAGGLER_SHARE",
    "Account",
    "Carried",
    "Episode",
    "Excess",
    "GoodputTracker",
    "HangFeed",
    "PeerTally",
    "SectionClock",
    "StepTotals",
    "Work",
    "bottleneck",
    "document",
    "ettr",
    "goodput_path",
    "largest_badput",
    "load_carried",
    "render",
    "section_category",
    "summary_path",
    "unplanned_ettr",
]
