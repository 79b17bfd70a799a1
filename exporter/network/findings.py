"""Name what the run-time reach probe exchanges and finds, as frozen, typed values.

While every rank of a run waits inside a collective, the monitoring rank publishes a *probe
request*; each rank it names tries its peers' probe listeners (:mod:`exporter.network.probe`)
and answers with a *probe result*, one :class:`PeerReach` per peer; the monitoring rank judges
them (:mod:`exporter.network.judge`) into a :class:`Network` finding: the links that carry no
traffic, the nodes nobody reaches. The hang protocol (:mod:`exporter.hangs.protocol`) carries
them, and its codec knows the keys they travel under.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["LinkFault", "Network", "NodeFault", "PeerReach", "ProbeRequest", "ProbeResult"]


@dataclass(frozen=True)
class PeerReach:
    """How one attempt to reach a peer's probe listener ended."""

    #: ``ok``, or how it failed (:data:`exporter.network.probe.KINDS`).
    kind: str
    #: Seconds the attempt took (connect and exchange when ``ok``).
    seconds: float


@dataclass(frozen=True)
class ProbeRequest:
    """The monitoring rank's request that the ranks it names try their peers: one round."""

    round: int
    pg: str
    seq: float
    #: The probe address (``ip:port``) of every rank that takes part.
    peers: Mapping[int, str] = field(default_factory=dict)
    #: The ranks each rank tries.
    plan: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    #: Seconds each attempt may take.
    timeout_s: float = 0.0
    requested_unix: float = 0.0


@dataclass(frozen=True)
class ProbeResult:
    """One rank's answer to a probe round: how each peer it tried answered."""

    round: int
    rank: int
    reached: Mapping[int, PeerReach] = field(default_factory=dict)
    #: Why this rank could not probe (``""``: it did).
    error: str = ""


@dataclass(frozen=True)
class LinkFault:
    """A link between two nodes that does not carry traffic, both ends reachable otherwise."""

    a: str
    b: str
    #: How the attempts across it failed (``dropped``, ``refused``, ``stalled``, ...).
    how: str


@dataclass(frozen=True)
class NodeFault:
    """A node its peers cannot reach on its backend address."""

    node: str
    how: str
    #: Peer nodes whose attempts to reach it failed.
    tried_by: int


@dataclass(frozen=True)
class Network:
    """What the run-time reach probe found while every rank waited in a collective."""

    pg: str
    seq: float
    probed_unix: float
    #: Nodes that took part, and pairs of nodes tried.
    nodes: int = 0
    pairs: int = 0
    links: tuple[LinkFault, ...] = ()
    down: tuple[NodeFault, ...] = ()
    #: Nodes whose probing rank gave no result in time.
    silent: tuple[str, ...] = ()
    #: The slowest pair that answered: ``(node, node, seconds)``.
    slowest: tuple[str, str, float] | None = None
    #: The median time a pair took to connect and exchange, seconds.
    median_s: float | None = None
    #: Why nothing was probed (one node, no listener), ``""`` when it was.
    note: str = ""

    @property
    def faulty(self) -> bool:
        """Say whether a link or a node was found broken."""
        return bool(self.links or self.down)
