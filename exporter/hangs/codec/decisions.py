"""Encode what the monitoring rank decides and keeps: the ledger, actions, culprits, episodes."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from ..protocol import Action, Episode, LedgerEntry, Located
from .fields import JSON, Raw, ints, load, num, opt_int, opt_num, opt_str
from .probe import network_from_dict, network_to_dict
from .state import request_from_dict, request_to_dict, summary_from_dict, summary_to_dict

__all__ = [
    "action_from_dict",
    "action_to_dict",
    "decode_action",
    "encode_action",
    "entry_from_dict",
    "entry_to_dict",
    "episode_from_dict",
    "episode_json",
    "episode_to_dict",
    "ledger_from_json",
    "ledger_json",
    "located_from_dict",
    "located_to_dict",
]


# -- the ledger ---------------------------------------------------------------------------------------
def entry_to_dict(e: LedgerEntry) -> JSON:
    """Return one ledger entry as the ledger file and the action hold it."""
    return {
        "run": e.run,
        "attempt": e.attempt,
        "episode": e.episode,
        "decision": e.decision,
        "exit_code": e.exit_code,
        "progress": e.progress,
        "streak": e.streak,
        "furthest": e.furthest,
        "steps": e.steps,
        "start_step": e.start_step,
        "culprits": list(e.culprits),
        "nodes": list(e.nodes),
        "folder": e.folder,
        "decided_unix": e.decided_unix,
    }


def entry_from_dict(m: Mapping[str, Any]) -> LedgerEntry:
    """Read one ledger entry (``furthest`` and ``decision`` are required)."""
    return LedgerEntry(
        opt_str(m.get("run")),
        int(m.get("attempt", -1)),
        int(m.get("episode", 0)),
        str(m["decision"]),
        opt_int(m.get("exit_code")),
        bool(m.get("progress")),
        int(m.get("streak", 0)),
        int(m["furthest"]),
        int(m.get("steps", 0)),
        opt_int(m.get("start_step")),
        ints(m.get("culprits")),
        tuple(str(n) for n in m.get("nodes") or ()),
        str(m.get("folder", "")),
        num(m.get("decided_unix", 0.0)),
    )


def ledger_json(entries: Iterable[LedgerEntry]) -> str:
    """Return the run's ledger file."""
    return json.dumps({"attempts": [entry_to_dict(e) for e in entries]}, indent=1)


def ledger_from_json(text: str) -> list[LedgerEntry]:
    """Read the run's ledger file (ValueError when it is not one)."""
    try:
        return [entry_from_dict(e) for e in load(text).get("attempts", ())]
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a ledger of hang aborts: {exc!r}") from exc


# -- actions ------------------------------------------------------------------------------------------
def action_to_dict(a: Action) -> JSON:
    """Return an action as it travels and as ``episode.json`` holds it (its ledger last)."""
    out: JSON = {
        "action": a.action,
        "decision": a.decision,
        "episode": a.episode,
        "run": a.run,
        "attempt": a.attempt,
        "pg": a.pg,
        "seq": a.seq,
        "kind": a.kind,
        "culprits": list(a.culprits),
        "nodes": list(a.nodes),
        "where": a.where,
        "folder": a.folder,
        "age_s": a.age_s,
        "due_s": a.due_s,
        "certain": a.certain,
        "exit_code": a.exit_code,
        "streak": a.streak,
        "limit": a.limit,
        "decided_unix": a.decided_unix,
    }
    if a.ledger is not None:
        out["ledger"] = [entry_to_dict(e) for e in a.ledger]
    if a.network is not None:
        out["network"] = a.network
    return out


def action_from_dict(m: Mapping[str, Any]) -> Action:
    """Read an action (every field but the ledger is required: only the monitor writes one)."""
    ledger = m.get("ledger")
    return Action(
        str(m["action"]),
        str(m["decision"]),
        int(m["episode"]),
        opt_str(m["run"]),
        str(m["attempt"]),
        str(m["pg"]),
        num(m["seq"]),
        str(m["kind"]),
        ints(m["culprits"]),
        tuple(str(n) for n in m["nodes"]),
        opt_str(m["where"]),
        str(m["folder"]),
        num(m["age_s"]),
        num(m["due_s"]),
        bool(m["certain"]),
        int(m["exit_code"]),
        int(m["streak"]),
        int(m["limit"]),
        num(m["decided_unix"]),
        None if ledger is None else tuple(entry_from_dict(e) for e in ledger),
        opt_str(m.get("network")),
    )


def encode_action(a: Action) -> str:
    """Return an action as it travels."""
    return json.dumps(action_to_dict(a))


def decode_action(raw: Raw) -> Action:
    """Read an action from the store."""
    return action_from_dict(load(raw))


# -- located culprits -------------------------------------------------------------------------------
def located_to_dict(loc: Located) -> JSON:
    """Return where a culprit is stuck, for tools."""
    return {
        "rank": loc.rank,
        "op": loc.op,
        "seq": loc.seq,
        "pg": loc.pg,
        "file": loc.file,
        "line": loc.line,
        "function": loc.function,
    }


def located_from_dict(m: Mapping[str, Any]) -> Located:
    """Read where a culprit is stuck (``rank``, ``file``, ``line``, ``function`` required)."""
    return Located(
        int(m["rank"]),
        str(m.get("op", "")),
        num(m.get("seq", 0)),
        str(m.get("pg", "")),
        str(m["file"]),
        opt_int(m["line"]),
        str(m["function"]),
    )


# -- episodes -------------------------------------------------------------------------------------------
def episode_to_dict(e: Episode) -> JSON:
    """Return an episode as ``episode.json`` holds it: its request, then what was collected."""
    out = request_to_dict(e.request)
    out.update(
        run=e.run,
        world_size=e.world_size,
        answered=list(e.answered),
        missing=list(e.missing),
        nodes={str(r): n for r, n in e.nodes.items()},
        last_enqueued={str(r): v for r, v in e.last_enqueued.items()},
        complete_unix=e.complete_unix,
    )
    if e.summaries is not None:
        out["summaries"] = {
            str(r): None if s is None else summary_to_dict(s) for r, s in e.summaries.items()
        }
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
        request_from_dict(m),
        opt_str(m.get("run")),
        opt_int(m.get("world_size")),
        ints(m.get("answered")),
        ints(m.get("missing")),
        {int(r): str(n) for r, n in (m.get("nodes") or {}).items()},
        {int(r): num(v) for r, v in (m.get("last_enqueued") or {}).items()},
        opt_num(m.get("complete_unix")),
        None
        if summaries is None
        else {int(r): summary_from_dict(s) if s else None for r, s in summaries.items()},
        action_from_dict(action) if action else None,
        opt_str(m.get("attempt")),
        bool(m.get("local_only")),
        network_from_dict(m["network"]) if m.get("network") else None,
    )


def episode_json(e: Episode) -> str:
    """Return an episode's ``episode.json``."""
    return json.dumps(episode_to_dict(e), indent=1)
