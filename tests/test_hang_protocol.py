"""The hang protocol: typed values, one codec that knows their keys, the wire format unchanged.

The codec writes what earlier versions wrote, byte for byte (ranks of one job run one version,
and dump folders stay readable by either's ``ddp-exporter hangs``), reads partial dicts with
their defaults, and is the only module of exporter/hangs/ that names a key. Three watchers in
this process, over one store, go from a hang to every rank leaving, through both roles.
"""

from __future__ import annotations

import ast
import json
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from harness import REPO, wait_for

from exporter.errors import ErrorCounter
from exporter.hangs import codec
from exporter.hangs.action import ActionPolicy
from exporter.hangs.definition import HangPolicy
from exporter.hangs.protocol import Ack, Frame, PgReport, Report, Summary
from exporter.hangs.watcher import HangWatcher
from exporter.settings import Identity
from exporter.sources.context import RankContext
from exporter.sources.flight import PGState

pytestmark = pytest.mark.unit

HANGS = Path(REPO) / "exporter" / "hangs"

# What the watcher of earlier versions put into the store, byte for byte.
REPORT = '{"n": 12, "pgs": [["0", 36, 10.1, 1800.0, 35]], "lat": 0.01, "sec": false, "fin": false, "st": 30}'
REQUEST = (
    '{"pg": "0", "kind": "behind", "seq": 36.0, "behind": [1], "waiting": [0], "age": 10.1, '
    '"threshold": 10.0, "requested_unix": 1700000012.1, "episode": 1}'
)
START_ACK = '{"episode": 0, "node": "n1"}'
SUMMARY = (
    '{"rank": 1, "step": 30, "phase": "compute", "frames": [{"file": "/job/train.py", "line": 10, '
    '"function": "main"}, {"file": "/job/train.py", "line": 42, "function": "load_batch"}], '
    '"where": {"file": "/job/train.py", "line": 42, "function": "load_batch"}, "inflight": [{"op": '
    '"allreduce", "seq": 36, "pg": "0", "pg_desc": "default_pg"}], "seqs": {"0": {"last_enqueued": '
    '35, "last_completed": 35}}, "errors": []}'
)
ACK = f'{{"episode": 1, "summary": {SUMMARY}, "node": "n1"}}'
ENTRY = (
    '{"run": "gold", "attempt": 1, "episode": 1, "decision": "abort", "exit_code": 75, '
    '"progress": true, "streak": 1, "furthest": 130, "steps": 30, "start_step": 100, "culprits": '
    '[1], "nodes": ["n1"], "folder": "/d/gold-attempt-1-hang-1", "decided_unix": 1700000022.0}'
)
ACTION = (
    '{"action": "abort", "decision": "abort", "episode": 1, "run": "gold", "attempt": "1", "pg": '
    '"0", "seq": 36.0, "kind": "behind", "culprits": [1], "nodes": ["n1"], "where": "train.py:42 '
    'in load_batch", "folder": "/d/gold-attempt-1-hang-1", "age_s": 20.0, "due_s": 20.0, '
    '"certain": true, "exit_code": 75, "streak": 1, "limit": 3, "decided_unix": 1700000022.0, '
    f'"ledger": [{ENTRY}]}}'
)


# -- the codec ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "decode", "encode"),
    [
        (REPORT, codec.decode_report, codec.encode_report),
        (REQUEST, codec.decode_request, codec.encode_request),
        (START_ACK, codec.decode_ack, codec.encode_ack),
        (ACK, codec.decode_ack, codec.encode_ack),
        (ACTION, codec.decode_action, codec.encode_action),
    ],
    ids=["report", "request", "start-ack", "ack", "action"],
)
def test_every_store_message_reads_and_writes_back_byte_for_byte(raw, decode, encode):
    value = decode(raw.encode())  # the store returns bytes
    assert encode(value) == raw


def test_the_values_are_typed_and_numbers_keep_their_type():
    report = codec.decode_report(REPORT)
    assert report == Report(12, (PgReport("0", 36, 10.1, 1800.0, 35),), 0.01, False, False, 30)
    assert isinstance(report.pgs[0].last_enqueued, int)  # 36 goes back out as 36, not 36.0
    ack = codec.decode_ack(ACK)
    assert ack.summary is not None and ack.summary.where == Frame("/job/train.py", 42, "load_batch")
    action = codec.decode_action(ACTION)
    assert action.culprits == (1,) and action.ledger is not None
    assert action.ledger[0].furthest == 130 and action.ledger[0].nodes == ("n1",)
    # A report of an older layout (no last completed number) still reads.
    old = codec.decode_report('{"n": 1, "pgs": [["0", 5, 0.0, null]], "st": 2}')
    assert old.pgs[0].last_completed is None and old.pgs[0].timeout_s is None
    assert '"pgs": [["0", 5, 0.0, null]]' in codec.encode_report(old)


def test_files_are_written_as_before():
    """episode.json, the ledger and a rank's dump: the old writers' dicts, dumped alike."""
    request = json.loads(REQUEST)
    summary = json.loads(SUMMARY)
    # exporter.hangs.watcher of earlier versions: dict(request, run=..., ...), then summaries,
    # then the action (exporter.hangs.action.record).
    old = dict(
        request,
        run="gold",
        world_size=3,
        answered=[0, 1, 2],
        missing=[],
        nodes={"1": "n1"},
        last_enqueued={"1": 35},
        complete_unix=1700000014.5,
    )
    old["summaries"] = {"0": None, "1": summary, "2": None}
    old["action"] = json.loads(ACTION)
    text = json.dumps(old, indent=1)
    assert codec.episode_json(codec.episode_from_dict(json.loads(text))) == text
    ledger = json.dumps({"attempts": [json.loads(ENTRY)]}, indent=1)
    assert codec.ledger_json(codec.ledger_from_json(ledger)) == ledger
    dump = {
        "time_unix": 1.5,
        "errors": [],
        "threads": [
            {
                "name": "MainThread",
                "ident": 7,
                "daemon": False,
                "training": True,
                "exporter": False,
                "frames": [
                    {
                        "file": "/job/train.py",
                        "line": 42,
                        "function": "load_batch",
                        "code": "x = q.get()",
                    }
                ],
            }
        ],
        "flight_recorder": {"available": False, "error": "Flight Recorder not in use"},
        "phase": "compute",
        "step": 30,
        "seqs": {"0": {"last_enqueued": 35, "last_completed": 35}},
        "episode": 1,
        "run": "gold",
        "rank": 1,
        "world_size": 3,
        "host": "h",
        "node": "n1",
        "pid": 42,
        "request": request,
        "summary": summary,
    }
    text = json.dumps(dump, indent=1, default=str)
    assert codec.dump_json(codec.dump_from_dict(json.loads(text))) == text


def test_partial_dicts_read_with_defaults_and_wrong_types_are_refused():
    request = codec.decode_request('{"episode": 8}')
    assert (request.episode, request.behind, request.threshold) == (8, (), 0.0)
    assert codec.decode_request("{}").episode == -1  # never matches a real episode
    assert codec.decode_ack('{"summary": {"rank": 3}}').summary == Summary(3)
    assert codec.decode_ack("{}") == Ack(0, "")
    with pytest.raises(KeyError):
        codec.decode_ack('{"summary": {"step": 1}}')  # whose summary?
    with pytest.raises((TypeError, ValueError)):
        codec.decode_request('{"episode": 1, "behind": [null]}')
    with pytest.raises(ValueError):
        codec.decode_report("[1, 2]")
    with pytest.raises(ValueError):
        codec.ledger_from_json('{"attempts": [{"run": "r"}]}')  # the watcher counts, goes on


# -- no key outside the codec ------------------------------------------------------------------------
def _keyed(tree: ast.AST) -> list[tuple[int, str]]:
    """Return ``(line, what)`` for every use of a string as a key in ``tree``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript):
            key = node.slice
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                found.append((node.lineno, f"[{key.value!r}]"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            args = node.args
            if (
                node.func.attr in ("get", "pop", "setdefault")
                and args
                and isinstance(args[0], ast.Constant)
                and isinstance(args[0].value, str)
            ):
                found.append((node.lineno, f".{node.func.attr}({args[0].value!r})"))
            if node.func.attr == "update" and node.keywords:
                found.append((node.lineno, ".update(key=...)"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "dict" and node.keywords:
                found.append((node.lineno, "dict(key=...)"))
        elif isinstance(node, ast.Dict):
            if any(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in node.keys):
                found.append((node.lineno, "{'key': ...}"))
    return found


def test_no_string_keyed_access_outside_the_codec():
    """Only exporter/hangs/codec/ names a key: everything else reads typed attributes."""
    offending = [
        f"exporter/hangs/{path.name}:{line}: {what}"
        for path in sorted(HANGS.rglob("*.py"))
        if path.parent.name != "codec"
        for line, what in _keyed(ast.parse(path.read_text(), str(path)))
    ]
    assert not offending, "string keys outside exporter/hangs/codec/:\n" + "\n".join(offending)
    # The check sees what it must: every way of naming a key, and the keys the codec spells (its
    # table's, the Flight Recorder report's, the ledger's; the rest are the fields' own names).
    ways = 'm["k"]; m.get("k"); m.pop("k"); m.setdefault("k"); m.update(k=1); dict(k=1); {"k": 1}'
    assert len(_keyed(ast.parse(ways))) == 7
    keys = [
        k for path in (HANGS / "codec").glob("*.py") for k in _keyed(ast.parse(path.read_text()))
    ]
    assert len(keys) > 10


# -- both roles, end to end --------------------------------------------------------------------------
class _Store:
    """An in-process c10d store: enough of one for three watchers on threads."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.cond = threading.Condition()

    def set(self, key: str, value: str) -> None:
        with self.cond:
            self.data[key] = value.encode()
            self.cond.notify_all()

    def get(self, key: str) -> bytes:
        with self.cond:
            return self.data[key]

    def add(self, key: str, amount: int) -> int:
        with self.cond:
            value = int(self.data.get(key, b"0")) + amount
            self.data[key] = str(value).encode()
            return value

    def check(self, keys: list[str]) -> bool:
        with self.cond:
            return all(k in self.data for k in keys)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        with self.cond:
            return [self.data[k] for k in keys]

    def wait(self, keys: list[str], timeout: timedelta) -> None:
        with self.cond:
            ok = self.cond.wait_for(
                lambda: all(k in self.data for k in keys), timeout.total_seconds()
            )
        if not ok:
            raise TimeoutError(keys)


class _InFlight:
    """Ranks 0 and 2 inside collective 36 since ``since``; rank 1 never entered it."""

    name = "hook"

    def __init__(self, rank: int, since: float) -> None:
        self.rank, self.since = rank, since

    def read(self) -> list[PGState]:
        if self.rank == 1:
            return [PGState("0", 35, 35, 0.0, 1800.0)]
        return [PGState("0", 36, 35, time.monotonic() - self.since, 1800.0)]


class _Recorder:
    steps = 30

    def collective_totals(self) -> tuple[float, int]:
        return (0.03, 30)


class _Sections:
    def busy(self, now_mono: float | None = None, grace_s: float = 0.0) -> str | None:
        return None


def _context(
    store: _Store, rank: int, run: str, node: str, dump_dir, local_rank: int | None = None
) -> RankContext:
    """Return rank ``rank`` of three watching over ``store`` every 0.2 s; rank 0 monitors.
    ``local_rank``: the rank's on its node (None: the rank, all on one node)."""
    local = rank if local_rank is None else local_rank
    identity = Identity(rank=rank, world_size=3, local_rank=local, run=run, node=node)
    return RankContext(
        identity=identity,
        store=store,
        recorder=_Recorder(),
        sections=_Sections(),
        interval_s=0.2,
        monitor=rank == 0,
        dump_dir=str(dump_dir),
        errors=ErrorCounter(),
    )


def test_three_ranks_dump_judge_and_leave_together(tmp_path):
    store, since, exits = _Store(), time.monotonic(), {}
    policy = HangPolicy(stall_min_seconds=0.4, symmetric_min_seconds=30.0)

    def leave(rank: int, code: int) -> None:
        # Instead of os._exit: the rank's watcher stops after this tick, as the process would.
        exits[rank] = code
        watchers[rank]._loop.stop()

    watchers = []
    for rank in range(3):
        w = HangWatcher(
            _context(store, rank, "proto", f"n{rank}", tmp_path),
            inflight=_InFlight(rank, since),
            policy=policy,
            action=ActionPolicy(after_s=1.0, publish_s=0.2),
            forget=lambda: None,
        )
        leaving = w._rank._leaving  # the process-wide steps of leaving, made harmless here
        leaving._exit, leaving._quiet = (lambda code, r=rank: leave(r, code)), (lambda: None)
        watchers.append(w)
    try:
        for w in watchers:
            w.start()
        wait_for(lambda: len(exits) == 3, 30, "every rank to leave")
    finally:
        for w in watchers:
            w.close()
    assert exits == {0: 75, 1: 75, 2: 75}
    assert {w.aborted[1:] for w in watchers} == {("1", "n1")}
    assert [w.dumps for w in watchers] == [1, 1, 1]
    (folder,) = tmp_path.glob("proto-hang-1")
    episode = codec.episode_from_dict(json.loads((folder / "episode.json").read_text()))
    assert (episode.request.kind, episode.request.behind, episode.answered) == (
        "behind",
        (1,),
        (0, 1, 2),
    )
    assert episode.action is not None and episode.action.culprits == (1,)
    assert episode.action.nodes == ("n1",) and episode.action.decision == "abort"
    assert "rank 1 (node n1) never entered collective #36" in (folder / "verdict.txt").read_text()
    (entry,) = codec.ledger_from_json((tmp_path / "proto-restarts.json").read_text())
    assert entry.culprits == (1,) and entry.streak == 1
    assert watchers[0].restarts is not None and watchers[0].restarts.streak == 1
    # What travelled is what the codec writes.
    raw = store.data[next(k for k in store.data if k.endswith("/fx/action"))].decode()
    assert codec.encode_action(codec.decode_action(raw)) == raw
