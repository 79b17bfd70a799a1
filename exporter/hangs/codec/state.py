"""Encode what a rank tells the others: its state and dump, reports, requests, summaries, acks."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from ..protocol import (
    Ack,
    DumpRequest,
    FlightEntry,
    Frame,
    InflightOp,
    PgReport,
    PgSeqs,
    RankDump,
    RankState,
    Report,
    Summary,
    ThreadStack,
)
from .fields import JSON, Raw, ints, line, load, num, opt_int, opt_num, opt_str

__all__ = [
    "decode_ack",
    "decode_report",
    "decode_request",
    "dump_from_dict",
    "dump_json",
    "encode_ack",
    "encode_report",
    "encode_request",
    "flight_available",
    "flight_entries",
    "flight_error",
    "flight_unavailable",
    "frame_from_dict",
    "frame_to_dict",
    "request_from_dict",
    "request_to_dict",
    "state_from_dict",
    "state_to_dict",
    "summary_from_dict",
    "summary_to_dict",
]


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
    return Frame(
        str(m.get("file", "")),
        line(m.get("line")),
        str(m.get("function", "")),
        None if code is None else str(code),
    )


def _frames(values: Iterable[Mapping[str, Any]] | None) -> tuple[Frame, ...]:
    return tuple(frame_from_dict(f) for f in values or ())


def _thread_to_dict(t: ThreadStack) -> JSON:
    return {
        "name": t.name,
        "ident": t.ident,
        "daemon": t.daemon,
        "training": t.training,
        "exporter": t.exporter,
        "frames": [frame_to_dict(f) for f in t.frames],
    }


def _thread_from_dict(m: Mapping[str, Any]) -> ThreadStack:
    daemon = m.get("daemon")
    return ThreadStack(
        str(m.get("name", "")),
        opt_int(m.get("ident")),
        None if daemon is None else bool(daemon),
        bool(m.get("training")),
        bool(m.get("exporter")),
        _frames(m.get("frames")),
    )


# -- the Flight Recorder's report (exporter.sources.flight.entries_report) ------------------------
def flight_unavailable(error: str) -> JSON:
    """Return the report of a Flight Recorder that is not read, saying why."""
    return {"available": False, "error": error}


def flight_available(fr: Mapping[str, Any]) -> bool:
    """Say whether the report holds the Flight Recorder's entries."""
    return bool(fr.get("available"))


def flight_error(fr: Mapping[str, Any]) -> str | None:
    """Return why the Flight Recorder could not be read (None when it could)."""
    return opt_str(fr.get("error"))


def flight_entries(fr: Mapping[str, Any], which: str) -> tuple[FlightEntry, ...]:
    """Return the report's ``inflight`` or ``recent`` entries."""
    out = []
    for e in fr.get(which) or ():
        desc = e.get("pg_desc", "")
        out.append(
            FlightEntry(
                str(e.get("op", "")),
                int(e.get("seq", -1)),
                str(e.get("pg", "")),
                desc if isinstance(desc, str) else str(desc),
                str(e.get("state", "")),
                e.get("input_sizes"),
                _frames(e.get("frames")),
            )
        )
    return tuple(out)


# -- a rank's captured state and its dump file ----------------------------------------------------
def _seqs_to_dict(seqs: Mapping[str, PgSeqs]) -> JSON:
    return {
        pg: {"last_enqueued": s.last_enqueued, "last_completed": s.last_completed}
        for pg, s in seqs.items()
    }


def _seqs_from_dict(m: Mapping[str, Any]) -> dict[str, PgSeqs]:
    return {
        str(pg): PgSeqs(int(s["last_enqueued"]), int(s["last_completed"])) for pg, s in m.items()
    }


def state_to_dict(s: RankState) -> JSON:
    """Return a rank's captured state in the order of its dump file."""
    out: JSON = {
        "time_unix": s.time_unix,
        "errors": list(s.errors),
        "threads": [_thread_to_dict(t) for t in s.threads],
        "flight_recorder": s.flight_recorder,
        "phase": s.phase,
    }
    if s.step is not None:
        out["step"] = s.step
    if s.seqs is not None:
        out["seqs"] = _seqs_to_dict(s.seqs)
    return out


def state_from_dict(m: Mapping[str, Any]) -> RankState:
    """Read a rank's captured state (a dump file, or :func:`state_to_dict`'s)."""
    seqs = m.get("seqs")
    return RankState(
        num(m.get("time_unix", 0.0)),
        tuple(str(e) for e in m.get("errors") or ()),
        tuple(_thread_from_dict(t) for t in m.get("threads") or ()),
        m.get("flight_recorder") or {},
        opt_str(m.get("phase")),
        opt_int(m.get("step")),
        None if seqs is None else _seqs_from_dict(seqs),
    )


def dump_json(d: RankDump) -> str:
    """Return one rank's dump file (``rank-N.json``)."""
    out = state_to_dict(d.state)
    out.update(
        episode=d.episode,
        run=d.run,
        rank=d.rank,
        world_size=d.world_size,
        host=d.host,
        node=d.node,
        pid=d.pid,
        request=request_to_dict(d.request),
    )
    if d.summary is not None:
        out["summary"] = summary_to_dict(d.summary)
    # default=str: the Flight Recorder's entries may hold what JSON cannot (sizes, dtypes).
    return json.dumps(out, indent=1, default=str)


def dump_from_dict(m: Mapping[str, Any]) -> RankDump:
    """Read one rank's dump file (its ``rank`` is required)."""
    summary = m.get("summary")
    return RankDump(
        state_from_dict(m),
        int(m.get("episode", 0)),
        opt_str(m.get("run")),
        int(m["rank"]),
        opt_int(m.get("world_size")),
        str(m.get("host", "")),
        str(m.get("node", "")),
        int(m.get("pid", 0)),
        request_from_dict(m.get("request") or {}),
        summary_from_dict(summary) if summary else None,
    )


# -- reports ----------------------------------------------------------------------------------------
def encode_report(r: Report) -> str:
    """Return a rank's report as it travels (process groups as positional lists: small)."""
    pgs = [
        [p.pg, p.last_enqueued, p.inflight_age_s, p.timeout_s]
        + ([] if p.last_completed is None else [p.last_completed])
        for p in r.pgs
    ]
    return json.dumps(
        {
            "n": r.tick,
            "pgs": pgs,
            "lat": r.latency_s,
            "sec": r.in_section,
            "fin": r.finished,
            "st": r.steps,
        }
    )


def decode_report(raw: Raw) -> Report:
    """Read a rank's report (a process group without its last completed number reads as None)."""
    m = load(raw)
    pgs = []
    for pg, enq, age, tmo, *completed in m.get("pgs", ()):
        pgs.append(
            PgReport(
                str(pg),
                num(enq),
                num(age or 0.0),
                opt_num(tmo),
                opt_num(completed[0]) if completed else None,
            )
        )
    return Report(
        int(m.get("n", 0)),
        tuple(pgs),
        opt_num(m.get("lat")),
        bool(m.get("sec")),
        bool(m.get("fin")),
        int(m.get("st", 0)),
    )


# -- dump requests -------------------------------------------------------------------------------------
def request_to_dict(r: DumpRequest) -> JSON:
    """Return a dump request, its episode number last (the order it was always written in)."""
    return {
        "pg": r.pg,
        "kind": r.kind,
        "seq": r.seq,
        "behind": list(r.behind),
        "waiting": list(r.waiting),
        "age": r.age,
        "threshold": r.threshold,
        "requested_unix": r.requested_unix,
        "episode": r.episode,
    }


def request_from_dict(m: Mapping[str, Any]) -> DumpRequest:
    """Read a dump request (also the head of an episode); a missing episode number is -1."""
    return DumpRequest(
        int(m.get("episode", -1)),
        str(m.get("pg", "")),
        str(m.get("kind", "")),
        num(m.get("seq", 0)),
        ints(m.get("behind")),
        ints(m.get("waiting")),
        num(m.get("age", 0.0)),
        num(m.get("threshold", 0.0)),
        num(m.get("requested_unix", 0.0)),
    )


def encode_request(r: DumpRequest) -> str:
    """Return a dump request as it travels."""
    return json.dumps(request_to_dict(r))


def decode_request(raw: Raw) -> DumpRequest:
    """Read a dump request from the store."""
    return request_from_dict(load(raw))


# -- summaries and acks ----------------------------------------------------------------------------
def _op_to_dict(e: InflightOp) -> JSON:
    out: JSON = {"op": e.op, "seq": e.seq, "pg": e.pg, "pg_desc": e.pg_desc}
    if e.state:
        out["state"] = e.state
    return out


def summary_to_dict(s: Summary) -> JSON:
    """Return a rank's summary as its ack and ``episode.json`` hold it."""
    return {
        "rank": s.rank,
        "step": s.step,
        "phase": s.phase,
        "frames": [frame_to_dict(f) for f in s.frames],
        "where": None if s.where is None else frame_to_dict(s.where),
        "inflight": [_op_to_dict(e) for e in s.inflight],
        "seqs": _seqs_to_dict(s.seqs),
        "errors": list(s.errors),
    }


def summary_from_dict(m: Mapping[str, Any]) -> Summary:
    """Read a rank's summary (its ``rank`` is required)."""
    where = m.get("where")
    inflight = tuple(
        InflightOp(
            str(e.get("op", "")),
            int(e.get("seq", -1)),
            str(e.get("pg", "")),
            str(e.get("pg_desc") or ""),
            str(e.get("state") or ""),
        )
        for e in m.get("inflight") or ()
    )
    return Summary(
        int(m["rank"]),
        opt_int(m.get("step")),
        opt_str(m.get("phase")),
        _frames(m.get("frames")),
        frame_from_dict(where) if where else None,
        inflight,
        _seqs_from_dict(m.get("seqs") or {}),
        tuple(str(e) for e in m.get("errors") or ()),
    )


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
    m = load(raw)
    summary = m.get("summary")
    return Ack(
        int(m.get("episode", 0)),
        str(m.get("node") or ""),
        summary_from_dict(summary) if summary else None,
        str(m.get("probe") or ""),
    )
