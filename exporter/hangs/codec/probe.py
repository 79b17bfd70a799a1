"""Encode the run-time probe of a stuck collective: its request, each rank's result, the verdict."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..protocol import LinkFault, Network, NodeFault, PeerReach, ProbeRequest, ProbeResult
from .fields import JSON, Raw, ints, load, num, opt_num

__all__ = [
    "decode_probe_request",
    "decode_probe_result",
    "encode_probe_request",
    "encode_probe_result",
    "network_from_dict",
    "network_to_dict",
]


# -- the run-time probe ----------------------------------------------------------------------------
def _reach_to_list(r: PeerReach) -> list[Any]:
    return [r.kind, round(r.seconds, 4)]


def encode_probe_request(r: ProbeRequest) -> str:
    """Return a probe request as it travels (its plan as lists: small)."""
    return json.dumps(
        {
            "round": r.round,
            "pg": r.pg,
            "seq": r.seq,
            "peers": {str(k): v for k, v in r.peers.items()},
            "plan": {str(k): list(v) for k, v in r.plan.items()},
            "timeout_s": r.timeout_s,
            "requested_unix": r.requested_unix,
        }
    )


def decode_probe_request(raw: Raw) -> ProbeRequest:
    """Read a probe request from the store."""
    m = load(raw)
    return ProbeRequest(
        int(m.get("round", 0)),
        str(m.get("pg", "")),
        num(m.get("seq", 0)),
        {int(k): str(v) for k, v in (m.get("peers") or {}).items()},
        {int(k): ints(v) for k, v in (m.get("plan") or {}).items()},
        num(m.get("timeout_s", 0.0)),
        num(m.get("requested_unix", 0.0)),
    )


def encode_probe_result(r: ProbeResult) -> str:
    """Return one rank's probe result as it travels."""
    out: JSON = {
        "round": r.round,
        "rank": r.rank,
        "reached": {str(k): _reach_to_list(v) for k, v in r.reached.items()},
    }
    if r.error:
        out["error"] = r.error
    return json.dumps(out)


def decode_probe_result(raw: Raw) -> ProbeResult:
    """Read one rank's probe result (round 0: the placeholder every rank sets at start)."""
    m = load(raw)
    reached = {int(k): PeerReach(str(v[0]), num(v[1])) for k, v in (m.get("reached") or {}).items()}
    return ProbeResult(
        int(m.get("round", 0)), int(m.get("rank", -1)), reached, str(m.get("error") or "")
    )


def network_to_dict(n: Network) -> JSON:
    """Return what the probe found, as ``episode.json`` holds it."""
    out: JSON = {
        "pg": n.pg,
        "seq": n.seq,
        "probed_unix": n.probed_unix,
        "nodes": n.nodes,
        "pairs": n.pairs,
        "links": [[f.a, f.b, f.how] for f in n.links],
        "down": [[f.node, f.how, f.tried_by] for f in n.down],
        "silent": list(n.silent),
        "median_s": n.median_s,
    }
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
        str(m.get("pg", "")),
        num(m.get("seq", 0)),
        num(m.get("probed_unix", 0.0)),
        int(m.get("nodes", 0)),
        int(m.get("pairs", 0)),
        tuple(LinkFault(str(a), str(b), str(how)) for a, b, how in m.get("links") or ()),
        tuple(NodeFault(str(n), str(how), int(k)) for n, how, k in m.get("down") or ()),
        tuple(str(n) for n in m.get("silent") or ()),
        None if not slowest else (str(slowest[0]), str(slowest[1]), num(slowest[2])),
        opt_num(m.get("median_s")),
        tuple(str(x) for x in m.get("ras") or ()),
        str(m.get("note") or ""),
    )
