"""Turn the hang protocol's values into the JSON that travels, and back: the one place with keys.

What ranks exchange through the c10d store (reports, dump requests, acks, actions, the probe's
messages) and what the hang watcher writes to disk (``rank-N.json``, ``episode.json``, the run's
ledger) is JSON; the rest of :mod:`exporter.hangs` works on the frozen values of
:mod:`exporter.hangs.protocol` and never names a key (``tests/test_hang_protocol.py`` checks
that mechanically).

One generic codec reads and writes them all from their fields' types (:mod:`.generic`);
:mod:`.shapes` states where a class does not travel as its fields in order by name. The format is
the one earlier versions wrote, byte for byte: every rank of a job runs the same version anyway,
and the files stay readable by ``ddp-exporter hangs`` of either. Reading is lenient where the
readers always were: an absent field takes its default (tests and hand-made files give partial
dicts), while a value of the wrong type raises ``ValueError`` or ``TypeError``, and an absent
field that has no default raises ``KeyError``. Numbers keep the type they were read with (a
sequence number read as ``36`` is written back as ``36``, not ``36.0``).

:func:`to_dict` / :func:`from_dict` give the JSON-ready forms (the files); :func:`encode` /
:func:`decode` the store's strings. The names below them are theirs for one class each.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any

from ..protocol import (
    Ack,
    Action,
    DumpRequest,
    Episode,
    FlightEntry,
    Frame,
    LedgerEntry,
    Located,
    ProbeRequest,
    ProbeResult,
    RankDump,
    RankState,
    Report,
    Summary,
)
from .generic import JSON, Raw, decode, encode, from_dict, load, to_dict

__all__ = [
    "JSON",
    "Raw",
    "decode",
    "decode_ack",
    "decode_action",
    "decode_probe_request",
    "decode_probe_result",
    "decode_report",
    "decode_request",
    "dump_from_dict",
    "dump_json",
    "encode",
    "encode_ack",
    "encode_action",
    "encode_probe_request",
    "encode_probe_result",
    "encode_report",
    "encode_request",
    "episode_from_dict",
    "episode_json",
    "flight_available",
    "flight_entries",
    "flight_error",
    "flight_unavailable",
    "frame_from_dict",
    "frame_to_dict",
    "from_dict",
    "ledger_from_json",
    "ledger_json",
    "located_to_dict",
    "state_from_dict",
    "state_to_dict",
    "summary_to_dict",
    "to_dict",
]

# -- the store's messages: each rank's report, ack and probe result; the monitor's request,
# probe request and action ------------------------------------------------------------------------
encode_report: Callable[[Report], str] = encode
decode_report: Callable[[Raw], Report] = partial(decode, Report)
encode_request: Callable[[DumpRequest], str] = encode
decode_request: Callable[[Raw], DumpRequest] = partial(decode, DumpRequest)
encode_ack: Callable[[Ack], str] = encode
decode_ack: Callable[[Raw], Ack] = partial(decode, Ack)
encode_action: Callable[[Action], str] = encode
decode_action: Callable[[Raw], Action] = partial(decode, Action)
encode_probe_request: Callable[[ProbeRequest], str] = encode
decode_probe_request: Callable[[Raw], ProbeRequest] = partial(decode, ProbeRequest)
encode_probe_result: Callable[[ProbeResult], str] = encode
decode_probe_result: Callable[[Raw], ProbeResult] = partial(decode, ProbeResult)

# -- the JSON-ready forms the capture, the verdict and the tools use --------------------------------
frame_to_dict: Callable[[Frame], JSON] = to_dict
frame_from_dict: Callable[[Mapping[str, Any]], Frame] = partial(from_dict, Frame)
state_to_dict: Callable[[RankState], JSON] = to_dict
state_from_dict: Callable[[Mapping[str, Any]], RankState] = partial(from_dict, RankState)
summary_to_dict: Callable[[Summary], JSON] = to_dict
located_to_dict: Callable[[Located], JSON] = to_dict
dump_from_dict: Callable[[Mapping[str, Any]], RankDump] = partial(from_dict, RankDump)
episode_from_dict: Callable[[Mapping[str, Any]], Episode] = partial(from_dict, Episode)


# -- the files ---------------------------------------------------------------------------------------
def dump_json(d: RankDump) -> str:
    """Return one rank's dump file (``rank-N.json``): its state's fields, then who it is."""
    # default=str: the Flight Recorder's entries may hold what JSON cannot (sizes, dtypes).
    return json.dumps(to_dict(d), indent=1, default=str)


def episode_json(e: Episode) -> str:
    """Return an episode's ``episode.json``: its request's fields, then what was collected."""
    return json.dumps(to_dict(e), indent=1)


def ledger_json(entries: Iterable[LedgerEntry]) -> str:
    """Return the run's ledger file."""
    return json.dumps({"attempts": [to_dict(e) for e in entries]}, indent=1)


def ledger_from_json(text: str) -> list[LedgerEntry]:
    """Read the run's ledger file (ValueError when it is not one)."""
    try:
        return [from_dict(LedgerEntry, e) for e in load(text).get("attempts", ())]
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a ledger of hang aborts: {exc!r}") from exc


# -- the Flight Recorder's report (exporter.sources.flight.entries_report): opaque but here -----------
def flight_unavailable(error: str) -> JSON:
    """Return the report of a Flight Recorder that is not read, saying why."""
    return {"available": False, "error": error}


def flight_available(fr: Mapping[str, Any]) -> bool:
    """Say whether the report holds the Flight Recorder's entries."""
    return bool(fr.get("available"))


def flight_error(fr: Mapping[str, Any]) -> str | None:
    """Return why the Flight Recorder could not be read (None when it could)."""
    error = fr.get("error")
    return None if error is None else str(error)


def flight_entries(fr: Mapping[str, Any], which: str) -> tuple[FlightEntry, ...]:
    """Return the report's ``inflight`` or ``recent`` entries."""
    return tuple(from_dict(FlightEntry, e) for e in fr.get(which) or ())
