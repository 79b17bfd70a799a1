"""The hang codec's other formats, byte for byte, and what each field reads as when odd.

tests/test_hang_protocol.py holds the store's main messages; here are the probe's request and
result, an ``episode.json`` with what the probe found and the attempt it belongs to, a dump file
without summary and with the Flight Recorder's entries, a ledger entry of a first attempt and a
culprit's place as tools get it: golden strings, each also built as typed values. Then the reading
rules every field has had, each pinned on one odd input: what an absent, null or empty field
reads as, and which wrong values are refused (and how).
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from exporter.hangs import codec
from exporter.hangs.protocol import (
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
    PgSeqs,
    ProbeRequest,
    ProbeResult,
    RankDump,
    RankState,
    Report,
    Summary,
    ThreadStack,
)

pytestmark = pytest.mark.unit


def _same(a: object, b: object) -> None:
    """Assert two values are equal and hold numbers of the same types (36 is not 36.0 here)."""
    assert a == b
    assert repr(a) == repr(b)


# -- the probe ---------------------------------------------------------------------------------------
PROBE_REQUEST = (
    '{"round": 2, "pg": "0", "seq": 36.0, "peers": {"0": "10.0.0.1:5", "3": "10.0.0.2:6"}, '
    '"plan": {"0": [3], "3": [0, 5]}, "timeout_s": 6.0, "requested_unix": 1700000012.5}'
)
PROBE_START = '{"round": 0, "rank": 3, "reached": {}}'
PROBE_RESULT = '{"round": 2, "rank": 3, "reached": {"0": ["ok", 0.0012], "5": ["dropped", 3]}}'
PROBE_FAILED = '{"round": 2, "rank": 3, "reached": {}, "error": "no listener"}'


@pytest.mark.parametrize(
    ("raw", "typed", "decode", "encode"),
    [
        (
            PROBE_REQUEST,
            ProbeRequest(
                2,
                "0",
                36.0,
                {0: "10.0.0.1:5", 3: "10.0.0.2:6"},
                {0: (3,), 3: (0, 5)},
                6.0,
                1.7e9 + 12.5,
            ),
            codec.decode_probe_request,
            codec.encode_probe_request,
        ),
        (PROBE_START, ProbeResult(0, 3), codec.decode_probe_result, codec.encode_probe_result),
        (
            PROBE_RESULT,
            ProbeResult(2, 3, {0: PeerReach("ok", 0.0012), 5: PeerReach("dropped", 3)}),
            codec.decode_probe_result,
            codec.encode_probe_result,
        ),
        (
            PROBE_FAILED,
            ProbeResult(2, 3, error="no listener"),
            codec.decode_probe_result,
            codec.encode_probe_result,
        ),
    ],
    ids=["request", "start", "result", "failed"],
)
def test_probe_messages_read_typed_and_write_back_byte_for_byte(raw, typed, decode, encode):
    _same(decode(raw.encode()), typed)
    assert encode(typed) == raw


def test_a_probe_result_travels_with_its_seconds_rounded():
    result = ProbeResult(1, 0, {2: PeerReach("ok", 0.00123456), 3: PeerReach("stalled", 6)})
    assert codec.encode_probe_result(result) == (
        '{"round": 1, "rank": 0, "reached": {"2": ["ok", 0.0012], "3": ["stalled", 6]}}'
    )


# -- episode.json with the probe's finding ---------------------------------------------------------
NETWORK = Network(
    "0",
    36,
    1700000013.0,
    nodes=4,
    pairs=6,
    links=(LinkFault("n1", "n2", "dropped"),),
    down=(NodeFault("n3", "refused", 2),),
    silent=("n4",),
    slowest=("n1", "n3", 0.5),
    median_s=0.0012,
)
SUMMARY = Summary(
    2,
    step=None,
    phase="collective",
    frames=(Frame("/job/train.py", 60, "train_step"),),
    where=None,
    inflight=(InflightOp("all_reduce", 36, "0", "default_pg", "started"),),
    seqs={"0": PgSeqs(36, 35)},
    errors=("in-flight state: RuntimeError('x')",),
)
ACTION = Action(
    "abort",
    "abort",
    2,
    None,
    "2",
    "0",
    36,
    "symmetric",
    (),
    ("n1", "n2"),
    None,
    "/d/gold-attempt-2-hang-2",
    70.5,
    70.0,
    False,
    75,
    2,
    3,
    1700000022,
    network="link between node n1 and node n2 carries no traffic (dropped)",
)
EPISODE = Episode(
    DumpRequest(2, "0", "symmetric", 36, (), (0, 1, 2, 3), 70.5, 60.0, 1700000012.1),
    run="gold",
    world_size=4,
    answered=(0, 2),
    missing=(1, 3),
    nodes={1: "n1", 3: "n3"},
    last_enqueued={0: 36, 2: 36.0},
    complete_unix=None,
    summaries={0: None, 2: SUMMARY},
    action=ACTION,
    attempt="2",
    local_only=True,
    network=NETWORK,
    ras=("#1 process unresponsive: rank 3 on node n3",),
)


def test_an_episode_with_its_network_is_written_as_before():
    """The old writers' dict: the request (its episode last), then the episode, then the probe,
    then what NCCL's RAS said."""
    old = {
        "pg": "0",
        "kind": "symmetric",
        "seq": 36,
        "behind": [],
        "waiting": [0, 1, 2, 3],
        "age": 70.5,
        "threshold": 60.0,
        "requested_unix": 1700000012.1,
        "episode": 2,
        "run": "gold",
        "world_size": 4,
        "answered": [0, 2],
        "missing": [1, 3],
        "nodes": {"1": "n1", "3": "n3"},
        "last_enqueued": {"0": 36, "2": 36.0},
        "complete_unix": None,
        "summaries": {
            "0": None,
            "2": {
                "rank": 2,
                "step": None,
                "phase": "collective",
                "frames": [{"file": "/job/train.py", "line": 60, "function": "train_step"}],
                "where": None,
                "inflight": [
                    {
                        "op": "all_reduce",
                        "seq": 36,
                        "pg": "0",
                        "pg_desc": "default_pg",
                        "state": "started",
                    }
                ],
                "seqs": {"0": {"last_enqueued": 36, "last_completed": 35}},
                "errors": ["in-flight state: RuntimeError('x')"],
            },
        },
        "action": {
            "action": "abort",
            "decision": "abort",
            "episode": 2,
            "run": None,
            "attempt": "2",
            "pg": "0",
            "seq": 36,
            "kind": "symmetric",
            "culprits": [],
            "nodes": ["n1", "n2"],
            "where": None,
            "folder": "/d/gold-attempt-2-hang-2",
            "age_s": 70.5,
            "due_s": 70.0,
            "certain": False,
            "exit_code": 75,
            "streak": 2,
            "limit": 3,
            "decided_unix": 1700000022,
            "network": "link between node n1 and node n2 carries no traffic (dropped)",
        },
        "attempt": "2",
        "local_only": True,
        # The probe's finding: its median before the slowest pair.
        "network": {
            "pg": "0",
            "seq": 36,
            "probed_unix": 1700000013.0,
            "nodes": 4,
            "pairs": 6,
            "links": [["n1", "n2", "dropped"]],
            "down": [["n3", "refused", 2]],
            "silent": ["n4"],
            "median_s": 0.0012,
            "slowest": ["n1", "n3", 0.5],
        },
        "ras": ["#1 process unresponsive: rank 3 on node n3"],
    }
    text = json.dumps(old, indent=1)
    assert codec.episode_json(EPISODE) == text
    _same(codec.episode_from_dict(json.loads(text)), EPISODE)
    # Files written when RAS's lines sat inside the probe's finding still read.
    old["network"]["ras"] = old.pop("ras")
    _same(codec.episode_from_dict(old), dataclasses.replace(EPISODE, ras=()))


def test_a_probe_that_found_nothing_to_probe_says_why_and_no_more():
    nothing = Network("0", 36.0, 1.5, note="one node: nothing to probe")
    episode = Episode(DumpRequest(1, "0", "symmetric", 36.0), network=nothing)
    text = codec.episode_json(episode)
    assert json.loads(text)["network"] == {
        "pg": "0",
        "seq": 36.0,
        "probed_unix": 1.5,
        "nodes": 0,
        "pairs": 0,
        "links": [],
        "down": [],
        "silent": [],
        "median_s": None,
        "note": "one node: nothing to probe",
    }
    assert list(json.loads(text)) == [
        *("pg", "kind", "seq", "behind", "waiting", "age", "threshold", "requested_unix"),
        *("episode", "run", "world_size", "answered", "missing", "nodes", "last_enqueued"),
        *("complete_unix", "network"),
    ]
    _same(codec.episode_from_dict(json.loads(text)), episode)


# -- a dump file without summary, with the Flight Recorder's entries -----------------------------
class _Dtype:
    """What JSON cannot hold, as the Flight Recorder's entries may (a torch dtype)."""

    def __str__(self) -> str:
        return "torch.float32"


FLIGHT = {
    "available": True,
    "pg_status": {"0": {"last_enqueued_collective": 36}},
    "inflight": [
        {
            "op": "allreduce",
            "seq": 36,
            "pg": "0",
            "pg_desc": ["0", "default_pg"],
            "state": "scheduled",
            "input_sizes": [[4, 4]],
            "frames": [{"file": "/job/train.py", "line": "?", "function": None}],
        }
    ],
    "recent": None,
}


def test_a_dump_without_summary_is_written_as_before():
    state = RankState(
        1.5,
        (),
        (
            ThreadStack(
                "MainThread",
                None,
                None,
                True,
                False,
                (Frame("<frozen runpy>", 88, "_run_code", ""), Frame("/job/train.py", 42, "f")),
            ),
        ),
        FLIGHT,
        None,
    )
    dump = RankDump(state, 3, None, 2, None, "h", "n2", 42, DumpRequest(3, "1", "behind", 7))
    old = {
        "time_unix": 1.5,
        "errors": [],
        "threads": [
            {
                "name": "MainThread",
                "ident": None,
                "daemon": None,
                "training": True,
                "exporter": False,
                "frames": [
                    {"file": "<frozen runpy>", "line": 88, "function": "_run_code", "code": ""},
                    {"file": "/job/train.py", "line": 42, "function": "f"},
                ],
            }
        ],
        "flight_recorder": FLIGHT,
        "phase": None,
        "episode": 3,
        "run": None,
        "rank": 2,
        "world_size": None,
        "host": "h",
        "node": "n2",
        "pid": 42,
        "request": {
            "pg": "1",
            "kind": "behind",
            "seq": 7,
            "behind": [],
            "waiting": [],
            "age": 0.0,
            "threshold": 0.0,
            "requested_unix": 0.0,
            "episode": 3,
        },
    }
    text = json.dumps(old, indent=1)
    assert codec.dump_json(dump) == text
    _same(codec.dump_from_dict(json.loads(text)), dump)
    # What JSON cannot hold is written as its str(); the rest of the file as ever.
    odd = dataclasses.replace(
        dump, state=dataclasses.replace(state, flight_recorder={"t": _Dtype()})
    )
    written = json.loads(codec.dump_json(odd))
    assert written["flight_recorder"] == {"t": "torch.float32"}


def test_the_flight_recorders_entries_read_typed():
    (entry,) = codec.flight_entries(FLIGHT, "inflight")
    # A process group's description that is not a string reads as its str(), a frame line
    # that is not a number as unknown, an absent function name as str(None).
    _same(
        entry,
        FlightEntry(
            "allreduce",
            36,
            "0",
            "['0', 'default_pg']",
            "scheduled",
            [[4, 4]],
            (Frame("/job/train.py", None, "None"),),
        ),
    )
    assert codec.flight_entries(FLIGHT, "recent") == ()
    assert codec.flight_entries({}, "inflight") == ()
    assert codec.flight_entries({"inflight": [{}]}, "inflight") == (FlightEntry("", -1, ""),)
    assert codec.flight_available(FLIGHT) and codec.flight_error(FLIGHT) is None
    off = codec.flight_unavailable("Flight Recorder not in use")
    assert off == {"available": False, "error": "Flight Recorder not in use"}
    assert not codec.flight_available(off)
    assert codec.flight_error(off) == "Flight Recorder not in use"


def test_a_capture_reads_back_as_it_was_taken():
    state = RankState(
        2.0,
        ("python stacks: x",),
        (),
        codec.flight_unavailable("off"),
        "data",
        0,
        {},
    )
    as_dict = codec.state_to_dict(state)
    assert list(as_dict) == [
        *("time_unix", "errors", "threads", "flight_recorder", "phase", "step", "seqs")
    ]
    _same(codec.state_from_dict(as_dict), state)
    frame = Frame("/job/train.py", 42, "f", "x = 1")
    assert codec.frame_to_dict(frame) == {
        "file": "/job/train.py",
        "line": 42,
        "function": "f",
        "code": "x = 1",
    }
    _same(codec.frame_from_dict(codec.frame_to_dict(frame)), frame)
    assert codec.summary_to_dict(Summary(0)) == {
        "rank": 0,
        "step": None,
        "phase": None,
        "frames": [],
        "where": None,
        "inflight": [],
        "seqs": {},
        "errors": [],
    }


# -- the ledger, a culprit's place ----------------------------------------------------------------
def test_a_first_attempts_ledger_entry_is_written_as_before():
    entry = LedgerEntry(None, 0, 1, "decline", None, False, 1, 0, 0, None, (), ("",), "/d/x", 1.0)
    text = (
        '{\n "attempts": [\n  {\n   "run": null,\n   "attempt": 0,\n   "episode": 1,\n'
        '   "decision": "decline",\n   "exit_code": null,\n   "progress": false,\n'
        '   "streak": 1,\n   "furthest": 0,\n   "steps": 0,\n   "start_step": null,\n'
        '   "culprits": [],\n   "nodes": [\n    ""\n   ],\n   "folder": "/d/x",\n'
        '   "decided_unix": 1.0\n  }\n ]\n}'
    )
    assert codec.ledger_json([entry]) == text
    _same(codec.ledger_from_json(text), [entry])
    assert codec.ledger_json([]) == '{\n "attempts": []\n}'
    assert codec.ledger_from_json("{}") == []


def test_a_culprits_place_is_given_to_tools_in_its_fields_order():
    located = Located(1, "allreduce", 36.0, "0", "/job/train.py", None, "load_batch")
    assert json.dumps(codec.located_to_dict(located)) == (
        '{"rank": 1, "op": "allreduce", "seq": 36.0, "pg": "0", "file": "/job/train.py", '
        '"line": null, "function": "load_batch"}'
    )


# -- the reading rules, field by field ---------------------------------------------------------------
#: ``(decoder, raw, what it reads as)``: one odd input per rule the readers have always had.
READS = [
    # A report: the names that travel, its process groups as lists; an age that says nothing
    # is 0.0, a longer list than known is read as far as known, numbers keep their type.
    (codec.decode_report, "{}", Report(0, (), None, False, False, 0)),
    (
        codec.decode_report,
        '{"n": 3.0, "pgs": [["0", 5, null, 1800, 4, 9]], "lat": 1, "sec": 1, "fin": [], "st": "2"}',
        Report(3, (PgReport("0", 5, 0.0, 1800, 4),), 1, True, False, 2),
    ),
    (
        codec.decode_report,
        '{"pgs": [[0, "5", 0, null]]}',
        Report(0, (PgReport("0", 5.0, 0.0, None),), None, False, False, 0),
    ),
    # A request: absent fields are empty, the episode -1 (never a real one).
    (codec.decode_request, "{}", DumpRequest(-1, "", "", 0)),
    (
        codec.decode_request,
        '{"episode": 2.0, "pg": 0, "kind": null, "seq": "7", "behind": null, "waiting": "12"}',
        DumpRequest(2, "0", "None", 7.0, (), (1, 2)),
    ),
    # An ack: its node and address null or empty are "", an empty summary is none.
    (codec.decode_ack, "{}", Ack(0, "")),
    (codec.decode_ack, '{"node": null, "summary": {}, "probe": 0}', Ack(0, "", None, "")),
    (
        codec.decode_ack,
        '{"episode": 1, "node": "n1", "summary": {"rank": "4", "step": 2.0, "where": [], '
        '"frames": null, "inflight": [{"pg_desc": null, "state": false}, {"pg_desc": 7}], '
        '"seqs": null, "errors": [1]}}',
        Ack(
            1,
            "n1",
            Summary(
                4,
                2,
                inflight=(InflightOp("", -1, "", "", ""), InflightOp("", -1, "", "7")),
                errors=("1",),
            ),
        ),
    ),
    (
        codec.decode_ack,
        '{"summary": {"rank": 1, "where": {}, "frames": [{"line": "12"}, {"line": "x", "code": 5}]}}',
        Ack(0, "", Summary(1, frames=(Frame("", 12, ""), Frame("", None, "", "5")))),
    ),
    # The probe's request and result: everything has a default.
    (codec.decode_probe_request, "{}", ProbeRequest(0, "", 0)),
    (
        codec.decode_probe_request,
        '{"peers": null, "plan": {"1": null, "2": [3.0]}}',
        ProbeRequest(0, "", 0, {}, {1: (), 2: (3,)}),
    ),
    (codec.decode_probe_result, '{"reached": null, "error": null}', ProbeResult(0, -1)),
    (
        codec.decode_probe_result,
        '{"reached": {"1": ["ok", "0.5", "later"]}, "error": false}',
        ProbeResult(0, -1, {1: PeerReach("ok", 0.5)}),
    ),
]


@pytest.mark.parametrize(("decode", "raw", "value"), READS)
def test_odd_fields_read_as_they_always_did(decode, raw, value):
    _same(decode(raw), value)


#: ``(decoder, raw, what it raises)``: what is refused, and how.
REFUSED = [
    (codec.decode_report, "[]", ValueError),
    (codec.decode_report, '{"pgs": null}', TypeError),
    (codec.decode_report, '{"pgs": [["0", 5, 0.0]]}', ValueError),
    (codec.decode_report, '{"n": "x"}', ValueError),
    (codec.decode_report, '{"pgs": [["0", null, 0.0, null]]}', TypeError),
    (codec.decode_request, '{"behind": [null]}', TypeError),
    (codec.decode_request, '{"seq": null}', TypeError),
    (codec.decode_ack, '{"summary": {"step": 1}}', KeyError),
    (codec.decode_ack, '{"summary": {"rank": 1, "seqs": {"0": {"last_enqueued": 1}}}}', KeyError),
    (codec.decode_ack, '{"summary": {"rank": 1, "where": 5}}', AttributeError),
    (codec.decode_ack, '{"summary": {"rank": 1, "frames": [null]}}', AttributeError),
    (codec.decode_probe_result, '{"reached": {"x": ["ok", 1]}}', ValueError),
    (codec.decode_probe_request, '{"plan": {"1": [null]}}', TypeError),
]


@pytest.mark.parametrize(("decode", "raw", "error"), REFUSED)
def test_wrong_fields_are_refused_as_they_always_were(decode, raw, error):
    with pytest.raises(error):
        decode(raw)


def _action(**change: object) -> str:
    fields = json.loads(codec.encode_action(ACTION))
    return json.dumps({**fields, **change})


def test_an_action_is_read_strictly_but_for_its_ledger_and_network():
    """Only the monitoring rank writes one: every field is required, but the last two."""
    _same(codec.decode_action(_action()), ACTION)
    bare = json.loads(_action())
    del bare["network"]
    assert codec.decode_action(json.dumps(bare)) == Action(**{**vars(ACTION), "network": None})
    assert codec.decode_action(_action(ledger=[])).ledger == ()
    assert codec.decode_action(_action(ledger=None)).ledger is None
    assert codec.decode_action(_action(culprits=None)).culprits == ()
    _same(codec.decode_action(_action(certain=1, seq="36", attempt=2)).seq, 36.0)
    del bare["run"]
    with pytest.raises(KeyError):
        codec.decode_action(json.dumps(bare))
    with pytest.raises(TypeError):
        codec.decode_action(_action(nodes=None))  # unlike the culprits
    with pytest.raises(TypeError):
        codec.decode_action(_action(ledger=0))
    with pytest.raises(KeyError):
        codec.decode_action(_action(ledger=[{"furthest": 1}]))


def test_files_read_partial_and_refuse_what_they_cannot_be():
    # An episode.json of a request only; a summary that is empty reads as none.
    episode = codec.episode_from_dict(
        {"summaries": {"1": {}, "2": {"rank": 2}}, "action": {}, "network": {}, "local_only": 1}
    )
    _same(
        episode,
        Episode(DumpRequest(-1, "", "", 0), summaries={1: None, 2: Summary(2)}, local_only=True),
    )
    _same(
        codec.episode_from_dict({"network": {"links": None, "slowest": [], "note": None}}).network,
        Network("", 0, 0.0),
    )
    _same(
        codec.episode_from_dict({"network": {"slowest": ["a", 1, "2", "x"]}}).network,
        Network("", 0, 0.0, slowest=("a", "1", 2.0)),
    )
    with pytest.raises(ValueError):
        codec.episode_from_dict({"network": {"links": [["a", "b"]]}})
    with pytest.raises(ValueError):
        codec.episode_from_dict({"network": {"down": [["a", "b", 1, 2]]}})
    with pytest.raises(AttributeError):
        codec.episode_from_dict({"summaries": []})
    # A dump file needs its rank; its request, when absent or empty, is the empty one.
    dump = codec.dump_from_dict({"rank": "2", "request": {}, "summary": {}, "flight_recorder": []})
    _same(
        dump,
        RankDump(
            RankState(0.0, (), (), {}, None),
            0,
            None,
            2,
            None,
            "",
            "",
            0,
            DumpRequest(-1, "", "", 0),
        ),
    )
    assert codec.dump_from_dict({"rank": 0, "seqs": {}}).state.seqs == {}
    with pytest.raises(KeyError):
        codec.dump_from_dict({})
    with pytest.raises(AttributeError):
        codec.dump_from_dict({"rank": 0, "seqs": []})
    with pytest.raises(TypeError):
        codec.dump_from_dict({"rank": 0, "time_unix": None})
    # A state's thread, a ledger's entry: their defaults.
    state = codec.state_from_dict({"threads": [{}], "flight_recorder": None, "step": "3"})
    _same(
        state,
        RankState(0.0, (), (ThreadStack("", None, None, False, False, ()),), {}, None, 3),
    )
    (entry,) = codec.ledger_from_json('{"attempts": [{"decision": "abort", "furthest": "9"}]}')
    _same(entry, LedgerEntry(None, -1, 0, "abort", None, False, 0, 9, 0, None, (), (), "", 0.0))
    for bad in (
        '{"attempts": null}',
        '{"attempts": [[]]}',
        "[]",
        '{"attempts": [{"furthest": 1}]}',
    ):
        with pytest.raises(ValueError):
            codec.ledger_from_json(bad)
