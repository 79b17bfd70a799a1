"""State how each protocol value travels where it is not simply its fields, in order, by name.

A value travels as a JSON object of its fields under their names, in the order the class lists
them; a field reads with the class's default when absent, and a field without one is required.
:class:`Shape` names the exceptions, one class at a time: the format earlier versions wrote and
the leniency their readers had, each kept as it was (tests/test_hang_codec.py pins them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..protocol import (
    Ack,
    Action,
    DumpRequest,
    Episode,
    FlightEntry,
    Frame,
    InflightOp,
    LedgerEntry,
    LinkFault,
    Located,
    Network,
    NodeFault,
    PeerReach,
    PgReport,
    ProbeRequest,
    ProbeResult,
    RankDump,
    RankState,
    Report,
    ThreadStack,
)

__all__ = ["PLAIN", "SHAPES", "Shape"]


@dataclass(frozen=True)
class Shape:
    """How one class of the protocol differs from its fields in order by name."""

    #: The key a field travels under, where it is not the field's name.
    keys: Mapping[str, str] = field(default_factory=dict)
    #: The order fields are written in, where it is not the class's.
    order: tuple[str, ...] = ()
    #: Fields left out while empty: None where that is the default, else any false value.
    omit: frozenset[str] = frozenset()
    #: What an absent field reads as, in JSON, where the class has no default or another one.
    reads: Mapping[str, Any] = field(default_factory=dict)
    #: Fields that read a false value (null, ``""``, 0, ...) as absent.
    blank: frozenset[str] = frozenset()
    #: List fields that refuse null rather than read it as empty.
    strict: frozenset[str] = frozenset()
    #: Fields that read a value which is not a number as unknown (None).
    lenient: frozenset[str] = frozenset()
    #: Number fields written rounded to this many digits.
    rounded: Mapping[str, int] = field(default_factory=dict)
    #: A field whose keys are this value's own, first (a dump file is a state and more).
    merged: str = ""
    #: Travels as a list of its fields, an omitted one left off the end.
    listed: bool = False
    #: A listed value that refuses a longer list (else the elements past its fields are ignored).
    closed: bool = False


#: A class with no exception.
PLAIN = Shape()

#: Each class with an exception, and its exceptions.
SHAPES: dict[type[Any], Shape] = {
    # -- a rank's capture and its dump file; tools and tests hand-make them -------------------------
    Frame: Shape(
        omit=frozenset({"code"}),
        reads={"file": "", "line": None, "function": ""},
        lenient=frozenset({"line"}),
    ),
    ThreadStack: Shape(
        reads={
            "name": "",
            "ident": None,
            "daemon": None,
            "training": False,
            "exporter": False,
            "frames": [],
        }
    ),
    FlightEntry: Shape(reads={"op": "", "seq": -1, "pg": ""}),
    RankState: Shape(
        omit=frozenset({"step", "seqs"}),
        reads={"time_unix": 0.0, "errors": [], "threads": [], "flight_recorder": {}, "phase": None},
    ),
    RankDump: Shape(
        merged="state",
        omit=frozenset({"summary"}),
        reads={
            "episode": 0,
            "run": None,
            "world_size": None,
            "host": "",
            "node": "",
            "pid": 0,
            "request": {},
        },
        blank=frozenset({"request"}),
    ),
    # -- the store's messages -------------------------------------------------------------------------
    # A report travels every interval from every rank: short keys, process groups as lists.
    Report: Shape(
        keys={
            "tick": "n",
            "latency_s": "lat",
            "in_section": "sec",
            "finished": "fin",
            "steps": "st",
        },
        reads={
            "tick": 0,
            "pgs": [],
            "latency_s": None,
            "in_section": False,
            "finished": False,
            "steps": 0,
        },
        strict=frozenset({"pgs"}),
    ),
    # Older reports end before the last completed number.
    PgReport: Shape(
        listed=True,
        omit=frozenset({"last_completed"}),
        reads={"inflight_age_s": 0.0},
        blank=frozenset({"inflight_age_s"}),
    ),
    # Its episode last, as it was always written; a request without one is no real episode's.
    DumpRequest: Shape(
        order=(
            *("pg", "kind", "seq", "behind", "waiting", "age", "threshold", "requested_unix"),
            "episode",
        ),
        reads={"episode": -1, "pg": "", "kind": "", "seq": 0},
    ),
    InflightOp: Shape(
        omit=frozenset({"state"}),
        reads={"op": "", "seq": -1, "pg": ""},
        blank=frozenset({"pg_desc", "state"}),
    ),
    # The start ack (episode 0) has no summary; its node comes after the summary.
    Ack: Shape(
        order=("episode", "summary", "node", "probe"),
        omit=frozenset({"summary", "probe"}),
        reads={"episode": 0, "node": ""},
        blank=frozenset({"node", "probe"}),
    ),
    # Only the monitoring rank writes an action: every field is required but the last two.
    Action: Shape(omit=frozenset({"ledger", "network"}), strict=frozenset({"nodes"})),
    ProbeRequest: Shape(reads={"round": 0, "pg": "", "seq": 0}),
    # Round 0: the placeholder every rank sets at start.
    ProbeResult: Shape(
        omit=frozenset({"error"}),
        reads={"round": 0, "rank": -1},
        blank=frozenset({"error"}),
    ),
    PeerReach: Shape(listed=True, rounded={"seconds": 4}),
    # -- the monitoring rank's files ------------------------------------------------------------------
    # episode.json: the request's fields, then what was collected.
    Episode: Shape(
        merged="request",
        omit=frozenset({"summaries", "action", "attempt", "local_only", "network", "ras"}),
    ),
    Network: Shape(
        order=(
            *("pg", "seq", "probed_unix", "nodes", "pairs", "links", "down", "silent"),
            *("median_s", "slowest", "note"),
        ),
        omit=frozenset({"slowest", "note"}),
        reads={"pg": "", "seq": 0, "probed_unix": 0.0},
        blank=frozenset({"note"}),
    ),
    LinkFault: Shape(listed=True, closed=True),
    NodeFault: Shape(listed=True, closed=True),
    LedgerEntry: Shape(
        reads={
            "run": None,
            "attempt": -1,
            "episode": 0,
            "exit_code": None,
            "progress": False,
            "streak": 0,
            "steps": 0,
            "start_step": None,
            "culprits": [],
            "nodes": [],
            "folder": "",
            "decided_unix": 0.0,
        }
    ),
    Located: Shape(reads={"op": "", "seq": 0, "pg": ""}),
}
