"""Reaching the coordinator process that holds a node's session channel.

A session lives in the hub of the process its node's WebSocket reached. A tenant's
request for it may reach any process (several workers, several replicas behind a load
balancer); that process relays it here to the holder, found through the database
(`services.sessions.channels`), over the holder's relay address. `Peers` is what the
session rules need of that hop; `http.peer_client` speaks it over HTTP, and
`api.relay` answers it.
"""

from dataclasses import dataclass
from typing import Protocol

from gpu_share.protocol.sessions import OpenSession, SessionStatus

PURPOSE = "session-relay"  # what a relay request's token is sealed for, with its path
TOKEN_HEADER = "X-Relay-Token"  # noqa: S105 (a header name, not a secret)
ANSWER_FORMAT_HEADER = "X-Answer-Format"


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
    body: bytes


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
