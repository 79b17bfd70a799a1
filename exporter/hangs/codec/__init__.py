"""Turn the hang protocol's values into the JSON that travels, and back: the one place with keys.

What ranks exchange through the c10d store (reports, dump requests, acks, actions) and what the
hang watcher writes to disk (``rank-N.json``, ``episode.json``, the run's ledger) is JSON; the
rest of :mod:`exporter.hangs` works on the frozen values of :mod:`exporter.hangs.protocol` and
never names a key (``tests/test_hang_protocol.py`` checks that mechanically).

The format is the one earlier versions wrote, byte for byte: every rank of a job runs the same
version anyway, and the files stay readable by ``ddp-exporter hangs`` of either. Reading is
lenient where the readers always were: an absent field takes its default (tests and hand-made
files give partial dicts), while a value of the wrong type raises ``ValueError`` or
``TypeError``, and an absent field that has no default raises ``KeyError``. Numbers keep the type
they were read with (a sequence number read as ``36`` is written back as ``36``, not ``36.0``).

``*_to_dict`` / ``*_from_dict`` give the JSON-ready forms (the files); ``encode_*`` /
``decode_*`` the store's strings. Everything past them takes the typed values only.
"""

from __future__ import annotations

from .decisions import (
    action_from_dict,
    action_to_dict,
    decode_action,
    encode_action,
    entry_from_dict,
    entry_to_dict,
    episode_from_dict,
    episode_json,
    episode_to_dict,
    ledger_from_json,
    ledger_json,
    located_from_dict,
    located_to_dict,
)
from .probe import (
    decode_probe_request,
    decode_probe_result,
    encode_probe_request,
    encode_probe_result,
    network_from_dict,
    network_to_dict,
)
from .state import (
    decode_ack,
    decode_report,
    decode_request,
    dump_from_dict,
    dump_json,
    encode_ack,
    encode_report,
    encode_request,
    flight_available,
    flight_entries,
    flight_error,
    flight_unavailable,
    frame_from_dict,
    frame_to_dict,
    request_from_dict,
    request_to_dict,
    state_from_dict,
    state_to_dict,
    summary_from_dict,
    summary_to_dict,
)

__all__ = [
    "action_from_dict",
    "action_to_dict",
    "decode_ack",
    "decode_action",
    "decode_probe_request",
    "decode_probe_result",
    "decode_report",
    "decode_request",
    "dump_from_dict",
    "dump_json",
    "encode_ack",
    "encode_action",
    "encode_probe_request",
    "encode_probe_result",
    "encode_report",
    "encode_request",
    "entry_from_dict",
    "entry_to_dict",
    "episode_from_dict",
    "episode_json",
    "episode_to_dict",
    "flight_available",
    "flight_entries",
    "flight_error",
    "flight_unavailable",
    "frame_from_dict",
    "frame_to_dict",
    "ledger_from_json",
    "ledger_json",
    "located_from_dict",
    "located_to_dict",
    "network_from_dict",
    "network_to_dict",
    "request_from_dict",
    "request_to_dict",
    "state_from_dict",
    "state_to_dict",
    "summary_from_dict",
    "summary_to_dict",
]
