"""Reaching the coordinator process that holds a node's session channel.

A session lives in the hub of the process its node's WebSocket reached. A tenant's
request for it may reach any process (several workers, several replicas behind a load
balancer); that process relays it here to the holder, found through the database
(`services.sessions.channels`), at the holder's relay address. `Peers` is what the
session rules need of that hop; `http.peer_client` speaks it over one kept link per
holder (`http.relay_frames`), and `api.relay` answers it.
"""

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpu_share.protocol.sessions import OpenSession, SessionStatus

PURPOSE = "session-relay"  # what a link's proof is sealed for, with the holder's nonce


class PeerUnreachable(Exception):
    """The holder did not answer. `gone`: nothing listens at its address any more (the
    process died or stopped), rather than a network that failed on the way."""

    def __init__(self, message: str, *, gone: bool = False) -> None:
        super().__init__(message)
        self.gone = gone


@dataclass(frozen=True)
class RelayedOpen:
    """A session placed by one process on a node whose channel another holds."""

    tenant_id: str
    node_id: str
    idle_timeout_sec: int
    message: OpenSession


@dataclass(frozen=True)
class PeerAnswer:
    format: str
    body: bytes = field(repr=False)


@dataclass(frozen=True)
class RelayCall:
    """One relayed request as the holder gets it: `open`, `forward` or `close` of a
    session, the action's fields, and a forward's payload."""

    action: str
    session_id: str
    fields: Mapping[str, Any]
    body: bytes = field(default=b"", repr=False)


RelayHandler = Callable[[RelayCall], Awaitable[PeerAnswer]]
"""What a holder does with a relayed request; a refusal is raised as an `ApiError`."""


class Peers(Protocol):
    """The hop to the process at `relay_url`. A refusal there is raised here as the same
    `ApiError`; no answer at all raises `PeerUnreachable`."""

    async def open(self, relay_url: str, opening: RelayedOpen) -> None: ...

    async def forward(
        self, relay_url: str, tenant_id: str, session_id: str, fmt: str, payload: bytes
    ) -> PeerAnswer: ...

    async def close(
        self, relay_url: str, session_id: str, reason: str, status: SessionStatus
    ) -> None: ...
