"""The live side of sessions: which agents are connected to this replica, and the
forwards in flight over their WebSockets.

A session is pinned to the replica whose WebSocket reaches its node: this is the
only coordinator state kept in memory (DESIGN.md). The database row says what a
session is; the hub says whether this replica can talk to it right now.
"""

import asyncio
import contextlib
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from gpu_share.coordinator.core.clock import Clock
from gpu_share.protocol.errors import ErrorCode
from gpu_share.protocol.sessions import (
    CloseSession,
    ForwardHeader,
    OpenSession,
    SessionError,
    SessionStatus,
    pack,
)


class AgentChannel(Protocol):
    """What the hub needs of an agent's connection (a WebSocket, in production)."""

    async def send_text(self, data: str) -> None: ...

    async def send_bytes(self, data: bytes) -> None: ...


class ForwardFailed(Exception):
    def __init__(self, error: SessionError, *, status: int) -> None:
        super().__init__(error.message)
        self.error = error
        self.status = status


@dataclass
class LiveSession:
    id: str
    tenant_id: str
    node_id: str
    idle_timeout_sec: int
    last_used: datetime
    status: SessionStatus = SessionStatus.STARTING
    settled: asyncio.Event = field(default_factory=asyncio.Event)  # ready, failed or closed
    error: SessionError | None = None
    unflushed_forwards: int = 0
    used_since_flush: bool = False
    inflight: dict[int, "asyncio.Future[tuple[ForwardHeader, bytes]]"] = field(default_factory=dict)

    def end(self, status: SessionStatus, error: SessionError | None, http_status: int) -> None:
        self.status = status
        self.error = error
        self.settled.set()
        failure = error or SessionError(
            code=ErrorCode.SESSION_CLOSED, message=f"the session is {status}"
        )
        for future in self.inflight.values():
            if not future.done():
                future.set_exception(ForwardFailed(failure, status=http_status))
        self.inflight.clear()


class _Link:
    def __init__(self, channel: AgentChannel) -> None:
        self.channel = channel
        self.lock = asyncio.Lock()

    async def text(self, data: str) -> None:
        async with self.lock:
            await self.channel.send_text(data)

    async def frame(self, data: bytes) -> None:
        async with self.lock:
            await self.channel.send_bytes(data)


class SessionHub:
    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._links: dict[str, _Link] = {}
        self._attached = asyncio.Event()
        self._sessions: dict[str, LiveSession] = {}
        self._request_ids = itertools.count(1)

    def get(self, session_id: str) -> LiveSession | None:
        return self._sessions.get(session_id)

    def held(self) -> list[LiveSession]:
        """The sessions this replica holds now (a copy: safe to iterate while they change)."""
        return list(self._sessions.values())

    # agents

    def attach(self, node_id: str, channel: AgentChannel) -> None:
        self._links[node_id] = _Link(channel)
        attached, self._attached = self._attached, asyncio.Event()
        attached.set()

    async def wait_for_attach(self, timeout: float) -> None:
        """Until another agent connects (or `timeout`): a node that just came online."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._attached.wait(), timeout)

    def detach(self, node_id: str, channel: AgentChannel) -> list[LiveSession]:
        """Forget the node's connection; returns its sessions, now failed.

        They stay in the hub (answering forwards with their error) until `forget`,
        which the caller runs once the failure is recorded in the database.
        """
        link = self._links.get(node_id)
        if link is None or link.channel is not channel:
            return []  # a newer connection of the same node replaced it
        del self._links[node_id]
        lost = [s for s in self._sessions.values() if s.node_id == node_id]
        error = SessionError(
            code=ErrorCode.NODE_LOST,
            message="the node holding this session lost its connection",
        )
        for live in lost:
            live.end(SessionStatus.FAILED, error, 410)
        return lost

    def forget(self, session_ids: list[str]) -> None:
        for session_id in session_ids:
            self._sessions.pop(session_id, None)

    def connected(self, node_id: str) -> bool:
        return node_id in self._links

    def connected_nodes(self) -> set[str]:
        return set(self._links)

    # sessions

    async def open(self, live: LiveSession, message: OpenSession) -> None:
        self._sessions[live.id] = live
        await self._links[live.node_id].text(message.model_dump_json())

    def settle(
        self, session_id: str, status: SessionStatus, error: SessionError | None = None
    ) -> LiveSession | None:
        live = self._sessions.get(session_id)
        if live is None:
            return None
        if status is SessionStatus.READY:
            live.status = status
            live.settled.set()
        else:
            live.end(status, error, 410)
            del self._sessions[session_id]
        return live

    async def close(
        self,
        session_id: str,
        reason: str,
        *,
        status: SessionStatus,
        error: SessionError | None = None,
    ) -> None:
        """End a session held here and tell its agent to stop it. Its forwards in flight
        are answered as closed under them (409), or, with `error`, as failed (410 with
        that error: a process that stops answers them as for a lost node)."""
        live = self._sessions.pop(session_id, None)
        if live is None:
            return
        if error is None:
            live.end(status, SessionError(code="SESSION_CLOSED", message=reason), 409)
        else:
            live.end(status, error, 410)
        link = self._links.get(live.node_id)
        if link is not None:
            await link.text(CloseSession(session_id=session_id, reason=reason).model_dump_json())

    async def forward(
        self, live: LiveSession, fmt: str, payload: bytes, timeout: float
    ) -> tuple[ForwardHeader, bytes]:
        link = self._links.get(live.node_id)
        if link is None:
            raise ForwardFailed(
                SessionError(
                    code=ErrorCode.NODE_LOST, message="the session's node is not connected"
                ),
                status=410,
            )
        request_id = next(self._request_ids)
        future: asyncio.Future[tuple[ForwardHeader, bytes]] = (
            asyncio.get_running_loop().create_future()
        )
        live.inflight[request_id] = future
        live.last_used = self._clock.now()
        live.used_since_flush = True
        live.unflushed_forwards += 1
        header = ForwardHeader(
            type="forward",
            request_id=request_id,
            session_id=live.id,
            format=fmt,
        )
        try:
            await link.frame(pack(header, payload))
            return await asyncio.wait_for(future, timeout)
        except TimeoutError as exc:
            raise ForwardFailed(
                SessionError(
                    code=ErrorCode.TIMEOUT, message=f"no answer from the node in {timeout:g} s"
                ),
                status=504,
            ) from exc
        finally:
            live.inflight.pop(request_id, None)
            live.last_used = self._clock.now()

    def answer(self, channel: AgentChannel, header: ForwardHeader, payload: bytes) -> bool:
        """Deliver a forward's answer; only the channel the session was placed on may.

        Returns False (and delivers nothing) for an answer from any other channel: another
        node, or an older connection of the same node.
        """
        live = self._sessions.get(header.session_id)
        if live is None:
            return False
        link = self._links.get(live.node_id)
        if link is None or link.channel is not channel:
            return False
        future = live.inflight.get(header.request_id)
        if future is not None and not future.done():
            future.set_result((header, payload))
        return True

    def idle(self) -> Iterator[LiveSession]:
        now = self._clock.now()
        for live in list(self._sessions.values()):
            idle_for = (now - live.last_used).total_seconds()
            if live.status.open and not live.inflight and idle_for > live.idle_timeout_sec:
                yield live

    async def close_all(self, reason: str, error: SessionError) -> None:
        """This process stops: every session held here fails with `error`."""
        for session_id in list(self._sessions):
            await self.close(session_id, reason, status=SessionStatus.FAILED, error=error)
