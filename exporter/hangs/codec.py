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

``*_to_dict`` / ``*_from_dict`` give the JSON-ready forms (for the files, and for the entry
points that tools and tests call with dicts); ``encode_*`` / ``decode_*`` the store's strings.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar, cast

from .protocol import (
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

__all__ = [
    "action_from_dict",
    "action_to_dict",
    "as_action",
    "as_entry",
    "as_episode",
    "as_located",
    "as_request",
    "as_summary",
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

_T = TypeVar("_T")
Raw = str | bytes | bytearray
JSON = dict[str, Any]


# -- scalars: keep what was read, refuse what is not a number ---------------------------------
def _num(value: Any) -> float:
    """Return a JSON number as read (an int stays an int); refuse anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return float(value)  # a numeric string still reads; None or a list raises TypeError
    return value


def _opt_num(value: Any) -> float | None:
    return None if value is None else _num(value)


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _line(value: Any) -> int | None:
    """Return a frame's line number; one that is not a number reads as unknown."""
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def _ints(values: Iterable[Any] | None) -> tuple[int, ...]:
    return tuple(int(v) for v in values or ())


def _load(raw: Raw) -> JSON:
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    return data


def _as(
    value: _T | Mapping[str, Any], cls: type[_T], read: Callable[[Mapping[str, Any]], _T]
) -> _T:
    if isinstance(value, cls):
        return value
    return read(cast(Mapping[str, Any], value))


# -- frames and threads --------------------------------------------------------------------------
def frame_to_dict(f: Frame) -> JSON:
    """Return a frame as the dumps and summaries hold it (``code`` only where it was read)."""
    out: JSON = {"file": f.file, "line": f.line, "function": f.function}
    if f.code is not None:
        out["code"] = f.code
    return out


def frame_from_dict(m: Mapping[str, Any]) -> Frame:
    """Read a frame (a capture's, a summary's, or a Flight Recorder entry's)."""
    code = m.get("code")
    return Frame(str(m.get("file", "")), _line(m.get("line")), str(m.get("function", "")),
                 None if code is None else str(code))  # fmt: skip


def _frames(values: Iterable[Mapping[str, Any]] | None) -> tuple[Frame, ...]:
    return tuple(frame_from_dict(f) for f in values or ())


def _thread_to_dict(t: ThreadStack) -> JSON:
    return {"name": t.name, "ident": t.ident, "daemon": t.daemon, "training": t.training,
            "exporter": t.exporter, "frames": [frame_to_dict(f) for f in t.frames]}  # fmt: skip


def _thread_from_dict(m: Mapping[str, Any]) -> ThreadStack:
    daemon = m.get("daemon")
    return ThreadStack(str(m.get("name", "")), _opt_int(m.get("ident")),
                       None if daemon is None else bool(daemon), bool(m.get("training")),
                       bool(m.get("exporter")), _frames(m.get("frames")))  # fmt: skip


# -- the Flight Recorder's report (exporter.sources.flight.entries_report) ------------------------
def flight_unavailable(error: str) -> JSON:
    """Return the report of a Flight Recorder that is not read, saying why."""
    return {"available": False, "error": error}


def flight_available(fr: Mapping[str, Any]) -> bool:
    """Say whether the report holds the Flight Recorder's entries."""
    return bool(fr.get("available"))


def flight_error(fr: Mapping[str, Any]) -> str | None:
    """Return why the Flight Recorder could not be read (None when it could)."""
    return _opt_str(fr.get("error"))


def flight_entries(fr: Mapping[str, Any], which: str) -> tuple[FlightEntry, ...]:
    """Return the report's ``inflight`` or ``recent`` entries."""
    out = []
    for e in fr.get(which) or ():
        desc = e.get("pg_desc", "")
        out.append(FlightEntry(str(e.get("op", "")), int(e.get("seq", -1)), str(e.get("pg", "")),
                               desc if isinstance(desc, str) else str(desc),
                               str(e.get("state", "")), e.get("input_sizes"),
                               _frames(e.get("frames"))))  # fmt: skip
    return tuple(out)


# -- a rank's captured state and its dump file ----------------------------------------------------
def _seqs_to_dict(seqs: Mapping[str, PgSeqs]) -> JSON:
    return {pg: {"last_enqueued": s.last_enqueued, "last_completed": s.last_completed}
            for pg, s in seqs.items()}  # fmt: skip


def _seqs_from_dict(m: Mapping[str, Any]) -> dict[str, PgSeqs]:
    return {str(pg): PgSeqs(int(s["last_enqueued"]), int(s["last_completed"]))
            for pg, s in m.items()}  # fmt: skip


def state_to_dict(s: RankState) -> JSON:
    """Return a rank's captured state in the order of its dump file."""
    out: JSON = {"time_unix": s.time_unix, "errors": list(s.errors),
                 "threads": [_thread_to_dict(t) for t in s.threads],
                 "flight_recorder": s.flight_recorder, "phase": s.phase}  # fmt: skip
    if s.step is not None:
        out["step"] = s.step
    if s.seqs is not None:
        out["seqs"] = _seqs_to_dict(s.seqs)
    return out


def state_from_dict(m: Mapping[str, Any]) -> RankState:
    """Read a rank's captured state (a dump file, or :func:`state_to_dict`'s)."""
    seqs = m.get("seqs")
    return RankState(_num(m.get("time_unix", 0.0)), tuple(str(e) for e in m.get("errors") or ()),
                     tuple(_thread_from_dict(t) for t in m.get("threads") or ()),
                     m.get("flight_recorder") or {}, _opt_str(m.get("phase")),
                     _opt_int(m.get("step")), None if seqs is None else _seqs_from_dict(seqs))  # fmt: skip


def dump_json(d: RankDump) -> str:
    """Return one rank's dump file (``rank-N.json``)."""
    out = state_to_dict(d.state)
    out.update(episode=d.episode, run=d.run, rank=d.rank, world_size=d.world_size, host=d.host,
               node=d.node, pid=d.pid, request=request_to_dict(d.request))  # fmt: skip
    if d.summary is not None:
        out["summary"] = summary_to_dict(d.summary)
    # default=str: the Flight Recorder's entries may hold what JSON cannot (sizes, dtypes).
    return json.dumps(out, indent=1, default=str)


def dump_from_dict(m: Mapping[str, Any]) -> RankDump:
    """Read one rank's dump file (its ``rank`` is required)."""
    summary = m.get("summary")
    return RankDump(state_from_dict(m), int(m.get("episode", 0)), _opt_str(m.get("run")),
                    int(m["rank"]), _opt_int(m.get("world_size")), str(m.get("host", "")),
                    str(m.get("node", "")), int(m.get("pid", 0)),
                    request_from_dict(m.get("request") or {}),
                    summary_from_dict(summary) if summary else None)  # fmt: skip


# -- reports ----------------------------------------------------------------------------------------
def encode_report(r: Report) -> str:
    """Return a rank's report as it travels (process groups as positional lists: small)."""
    pgs = [[p.pg, p.last_enqueued, p.inflight_age_s, p.timeout_s]
           + ([] if p.last_completed is None else [p.last_completed]) for p in r.pgs]  # fmt: skip
    return json.dumps({"n": r.tick, "pgs": pgs, "lat": r.latency_s, "sec": r.in_section,
                       "fin": r.finished, "st": r.steps})  # fmt: skip


def decode_report(raw: Raw) -> Report:
    """Read a rank's report (a process group without its last completed number reads as None)."""
    m = _load(raw)
    pgs = []
    for pg, enq, age, tmo, *completed in m.get("pgs", ()):
        pgs.append(PgReport(str(pg), _num(enq), _num(age or 0.0), _opt_num(tmo),
                            _opt_num(completed[0]) if completed else None))  # fmt: skip
    return Report(int(m.get("n", 0)), tuple(pgs), _opt_num(m.get("lat")), bool(m.get("sec")),
                  bool(m.get("fin")), int(m.get("st", 0)))  # fmt: skip


# -- dump requests -------------------------------------------------------------------------------------
def request_to_dict(r: DumpRequest) -> JSON:
    """Return a dump request, its episode number last (the order it was always written in)."""
    return {"pg": r.pg, "kind": r.kind, "seq": r.seq, "behind": list(r.behind),
            "waiting": list(r.waiting), "age": r.age, "threshold": r.threshold,
            "requested_unix": r.requested_unix, "episode": r.episode}  # fmt: skip


def request_from_dict(m: Mapping[str, Any]) -> DumpRequest:
    """Read a dump request (also the head of an episode); a missing episode number is -1."""
    return DumpRequest(int(m.get("episode", -1)), str(m.get("pg", "")), str(m.get("kind", "")),
                       _num(m.get("seq", 0)), _ints(m.get("behind")), _ints(m.get("waiting")),
                       _num(m.get("age", 0.0)), _num(m.get("threshold", 0.0)),
                       _num(m.get("requested_unix", 0.0)))  # fmt: skip


def encode_request(r: DumpRequest) -> str:
    """Return a dump request as it travels."""
    return json.dumps(request_to_dict(r))


def decode_request(raw: Raw) -> DumpRequest:
    """Read a dump request from the store."""
    return request_from_dict(_load(raw))


def as_request(r: DumpRequest | Mapping[str, Any]) -> DumpRequest:
    """Return ``r`` as a request (read from its JSON form where it is one)."""
    return _as(r, DumpRequest, request_from_dict)


# -- summaries and acks ----------------------------------------------------------------------------
def _op_to_dict(e: InflightOp) -> JSON:
    out: JSON = {"op": e.op, "seq": e.seq, "pg": e.pg, "pg_desc": e.pg_desc}
    if e.state:
        out["state"] = e.state
    return out


def summary_to_dict(s: Summary) -> JSON:
    """Return a rank's summary as its ack and ``episode.json`` hold it."""
    return {"rank": s.rank, "step": s.step, "phase": s.phase,
            "frames": [frame_to_dict(f) for f in s.frames],
            "where": None if s.where is None else frame_to_dict(s.where),
            "inflight": [_op_to_dict(e) for e in s.inflight],
            "seqs": _seqs_to_dict(s.seqs), "errors": list(s.errors)}  # fmt: skip


def summary_from_dict(m: Mapping[str, Any]) -> Summary:
    """Read a rank's summary (its ``rank`` is required)."""
    where = m.get("where")
    inflight = tuple(InflightOp(str(e.get("op", "")), int(e.get("seq", -1)), str(e.get("pg", "")),
                                str(e.get("pg_desc") or ""), str(e.get("state") or ""))
                     for e in m.get("inflight") or ())  # fmt: skip
    return Summary(int(m["rank"]), _opt_int(m.get("step")), _opt_str(m.get("phase")),
                   _frames(m.get("frames")), frame_from_dict(where) if where else None, inflight,
                   _seqs_from_dict(m.get("seqs") or {}),
                   tuple(str(e) for e in m.get("errors") or ()))  # fmt: skip


def as_summary(s: Summary | Mapping[str, Any]) -> Summary:
    """Return ``s`` as a summary (read from its JSON form where it is one)."""
    return _as(s, Summary, summary_from_dict)


def encode_ack(a: Ack) -> str:
    """Return an ack as it travels (without a summary: the start ack, episode 0)."""
    out: JSON = {"episode": a.episode}
    if a.summary is not None:
        out["summary"] = summary_to_dict(a.summary)
    out["node"] = a.node
    if a.probe:
        out["probe"] = a.probe
    return json.dumps(out)


def decode_ack(raw: Raw) -> Ack:
    """Read an ack; an empty summary reads as none."""
    m = _load(raw)
    summary = m.get("summary")
    return Ack(int(m.get("episode", 0)), str(m.get("node") or ""),
               summary_from_dict(summary) if summary else None,
               str(m.get("probe") or ""))  # fmt: skip


# -- the ledger ---------------------------------------------------------------------------------------
def entry_to_dict(e: LedgerEntry) -> JSON:
    """Return one ledger entry as the ledger file and the action hold it."""
    return {"run": e.run, "attempt": e.attempt, "episode": e.episode, "decision": e.decision,
            "exit_code": e.exit_code, "progress": e.progress, "streak": e.streak,
            "furthest": e.furthest, "steps": e.steps, "start_step": e.start_step,
            "culprits": list(e.culprits), "nodes": list(e.nodes), "folder": e.folder,
            "decided_unix": e.decided_unix}  # fmt: skip


def entry_from_dict(m: Mapping[str, Any]) -> LedgerEntry:
    """Read one ledger entry (``furthest`` and ``decision`` are required)."""
    return LedgerEntry(_opt_str(m.get("run")), int(m.get("attempt", -1)), int(m.get("episode", 0)),
                       str(m["decision"]), _opt_int(m.get("exit_code")), bool(m.get("progress")),
                       int(m.get("streak", 0)), int(m["furthest"]), int(m.get("steps", 0)),
                       _opt_int(m.get("start_step")), _ints(m.get("culprits")),
                       tuple(str(n) for n in m.get("nodes") or ()), str(m.get("folder", "")),
                       _num(m.get("decided_unix", 0.0)))  # fmt: skip


def as_entry(e: LedgerEntry | Mapping[str, Any]) -> LedgerEntry:
    """Return ``e`` as a ledger entry (read from its JSON form where it is one)."""
    return _as(e, LedgerEntry, entry_from_dict)


def ledger_json(entries: Iterable[LedgerEntry]) -> str:
    """Return the run's ledger file."""
    return json.dumps({"attempts": [entry_to_dict(e) for e in entries]}, indent=1)


def ledger_from_json(text: str) -> list[LedgerEntry]:
    """Read the run's ledger file (ValueError when it is not one)."""
    try:
        return [entry_from_dict(e) for e in _load(text).get("attempts", ())]
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a ledger of hang aborts: {exc!r}") from exc


# -- actions ------------------------------------------------------------------------------------------
def action_to_dict(a: Action) -> JSON:
    """Return an action as it travels and as ``episode.json`` holds it (its ledger last)."""
    out: JSON = {"action": a.action, "decision": a.decision, "episode": a.episode, "run": a.run,
                 "attempt": a.attempt, "pg": a.pg, "seq": a.seq, "kind": a.kind,
                 "culprits": list(a.culprits), "nodes": list(a.nodes), "where": a.where,
                 "folder": a.folder, "age_s": a.age_s, "due_s": a.due_s, "certain": a.certain,
                 "exit_code": a.exit_code, "streak": a.streak, "limit": a.limit,
                 "decided_unix": a.decided_unix}  # fmt: skip
    if a.ledger is not None:
        out["ledger"] = [entry_to_dict(e) for e in a.ledger]
    if a.network is not None:
        out["network"] = a.network
    return out


def action_from_dict(m: Mapping[str, Any]) -> Action:
    """Read an action (every field but the ledger is required: only the monitor writes one)."""
    ledger = m.get("ledger")
    return Action(str(m["action"]), str(m["decision"]), int(m["episode"]), _opt_str(m["run"]),
                  str(m["attempt"]), str(m["pg"]), _num(m["seq"]), str(m["kind"]),
                  _ints(m["culprits"]), tuple(str(n) for n in m["nodes"]), _opt_str(m["where"]),
                  str(m["folder"]), _num(m["age_s"]), _num(m["due_s"]), bool(m["certain"]),
                  int(m["exit_code"]), int(m["streak"]), int(m["limit"]),
                  _num(m["decided_unix"]),
                  None if ledger is None else tuple(entry_from_dict(e) for e in ledger),
                  _opt_str(m.get("network")))  # fmt: skip


def as_action(a: Action | Mapping[str, Any]) -> Action:
    """Return ``a`` as an action (read from its JSON form where it is one)."""
    return _as(a, Action, action_from_dict)


def encode_action(a: Action) -> str:
    """Return an action as it travels."""
    return json.dumps(action_to_dict(a))


def decode_action(raw: Raw) -> Action:
    """Read an action from the store."""
    return action_from_dict(_load(raw))


# -- located culprits -------------------------------------------------------------------------------
def located_to_dict(loc: Located) -> JSON:
    """Return where a culprit is stuck, for tools."""
    return {"rank": loc.rank, "op": loc.op, "seq": loc.seq, "pg": loc.pg, "file": loc.file,
            "line": loc.line, "function": loc.function}  # fmt: skip


def located_from_dict(m: Mapping[str, Any]) -> Located:
    """Read where a culprit is stuck (``rank``, ``file``, ``line``, ``function`` required)."""
    return Located(int(m["rank"]), str(m.get("op", "")), _num(m.get("seq", 0)),
                   str(m.get("pg", "")), str(m["file"]), _opt_int(m["line"]),
                   str(m["function"]))  # fmt: skip


def as_located(loc: Located | Mapping[str, Any]) -> Located:
    """Return ``loc`` as a located culprit (read from its JSON form where it is one)."""
    return _as(loc, Located, located_from_dict)


# -- episodes -------------------------------------------------------------------------------------------
def episode_to_dict(e: Episode) -> JSON:
    """Return an episode as ``episode.json`` holds it: its request, then what was collected."""
    out = request_to_dict(e.request)
    out.update(run=e.run, world_size=e.world_size, answered=list(e.answered),
               missing=list(e.missing), nodes={str(r): n for r, n in e.nodes.items()},
               last_enqueued={str(r): v for r, v in e.last_enqueued.items()},
               complete_unix=e.complete_unix)  # fmt: skip
    if e.summaries is not None:
        out["summaries"] = {str(r): None if s is None else summary_to_dict(s)
                            for r, s in e.summaries.items()}  # fmt: skip
    if e.action is not None:
        out["action"] = action_to_dict(e.action)
    if e.attempt is not None:
        out["attempt"] = e.attempt
    if e.local_only:
        out["local_only"] = True
    if e.network is not None:
        out["network"] = network_to_dict(e.network)
    return out


def episode_from_dict(m: Mapping[str, Any]) -> Episode:
    """Read an episode (``episode.json``, or a request with what tests add to it)."""
    summaries, action = m.get("summaries"), m.get("action")
    return Episode(
        request_from_dict(m), _opt_str(m.get("run")), _opt_int(m.get("world_size")),
        _ints(m.get("answered")), _ints(m.get("missing")),
        {int(r): str(n) for r, n in (m.get("nodes") or {}).items()},
        {int(r): _num(v) for r, v in (m.get("last_enqueued") or {}).items()},
        _opt_num(m.get("complete_unix")),
        None if summaries is None else {int(r): summary_from_dict(s) if s else None
                                        for r, s in summaries.items()},
        action_from_dict(action) if action else None, _opt_str(m.get("attempt")),
        bool(m.get("local_only")),
        network_from_dict(m["network"]) if m.get("network") else None,
    )  # fmt: skip


def as_episode(e: Episode | Mapping[str, Any]) -> Episode:
    """Return ``e`` as an episode (read from its JSON form where it is one)."""
    return _as(e, Episode, episode_from_dict)


def episode_json(e: Episode) -> str:
    """Return an episode's ``episode.json``."""
    return json.dumps(episode_to_dict(e), indent=1)


# -- the run-time probe ----------------------------------------------------------------------------
def _reach_to_list(r: PeerReach) -> list[Any]:
    return [r.kind, round(r.seconds, 4)]


def encode_probe_request(r: ProbeRequest) -> str:
    """Return a probe request as it travels (its plan as lists: small)."""
    return json.dumps({"round": r.round, "pg": r.pg, "seq": r.seq,
                       "peers": {str(k): v for k, v in r.peers.items()},
                       "plan": {str(k): list(v) for k, v in r.plan.items()},
                       "timeout_s": r.timeout_s, "requested_unix": r.requested_unix})  # fmt: skip


def decode_probe_request(raw: Raw) -> ProbeRequest:
    """Read a probe request from the store."""
    m = _load(raw)
    return ProbeRequest(int(m.get("round", 0)), str(m.get("pg", "")), _num(m.get("seq", 0)),
                        {int(k): str(v) for k, v in (m.get("peers") or {}).items()},
                        {int(k): _ints(v) for k, v in (m.get("plan") or {}).items()},
                        _num(m.get("timeout_s", 0.0)), _num(m.get("requested_unix", 0.0)))  # fmt: skip


def encode_probe_result(r: ProbeResult) -> str:
    """Return one rank's probe result as it travels."""
    out: JSON = {"round": r.round, "rank": r.rank,
                 "reached": {str(k): _reach_to_list(v) for k, v in r.reached.items()}}  # fmt: skip
    if r.error:
        out["error"] = r.error
    return json.dumps(out)


def decode_probe_result(raw: Raw) -> ProbeResult:
    """Read one rank's probe result (round 0: the placeholder every rank sets at start)."""
    m = _load(raw)
    reached = {int(k): PeerReach(str(v[0]), _num(v[1]))
               for k, v in (m.get("reached") or {}).items()}  # fmt: skip
    return ProbeResult(int(m.get("round", 0)), int(m.get("rank", -1)), reached,
                       str(m.get("error") or ""))  # fmt: skip


def network_to_dict(n: Network) -> JSON:
    """Return what the probe found, as ``episode.json`` holds it."""
    out: JSON = {"pg": n.pg, "seq": n.seq, "probed_unix": n.probed_unix, "nodes": n.nodes,
                 "pairs": n.pairs, "links": [[f.a, f.b, f.how] for f in n.links],
                 "down": [[f.node, f.how, f.tried_by] for f in n.down],
                 "silent": list(n.silent), "median_s": n.median_s}  # fmt: skip
    if n.slowest is not None:
        out["slowest"] = list(n.slowest)
    if n.ras:
        out["ras"] = list(n.ras)
    if n.note:
        out["note"] = n.note
    return out


def network_from_dict(m: Mapping[str, Any]) -> Network:
    """Read what the probe found."""
    slowest = m.get("slowest")
    return Network(
        str(m.get("pg", "")), _num(m.get("seq", 0)), _num(m.get("probed_unix", 0.0)),
        int(m.get("nodes", 0)), int(m.get("pairs", 0)),
        tuple(LinkFault(str(a), str(b), str(how)) for a, b, how in m.get("links") or ()),
        tuple(NodeFault(str(n), str(how), int(k)) for n, how, k in m.get("down") or ()),
        tuple(str(n) for n in m.get("silent") or ()),
        None if not slowest else (str(slowest[0]), str(slowest[1]), _num(slowest[2])),
        _opt_num(m.get("median_s")), tuple(str(x) for x in m.get("ras") or ()),
        str(m.get("note") or ""),
    )  # fmt: skip
