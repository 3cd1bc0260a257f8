"""Sessions (SPEC §1.7): place a model on a node, relay forwards, close when idle.

The row in `gpu_sessions` is the record (status, node, metering); the `SessionHub`
of the process holding the node's WebSocket carries the live traffic. Forwards do
not touch the database: counters and last use are flushed by `upkeep`.

A request that reaches another process (several workers or replicas) is relayed to
the holder (`replica.peers`, found through `channels`): a session may be opened on any
node whose channel a live process holds, and its forwards and close reach it from
anywhere. The holder's counters show in `get` once flushed (`upkeep`, every few
seconds).
"""

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core import metrics
from gpu_share.coordinator.core.clock import Clock
from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.core.errors import (
    ApiError,
    Conflict,
    Gone,
    NotFound,
    PayloadTooLarge,
    Unavailable,
)
from gpu_share.coordinator.core.ids import new_id
from gpu_share.coordinator.core.orm import NodeRow, SessionRow
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.core.statuses import OPEN_SESSION_VALUES
from gpu_share.coordinator.replica.peers import Peers, PeerUnreachable, RelayedOpen
from gpu_share.coordinator.replica.session_hub import ForwardFailed, LiveSession, SessionHub
from gpu_share.coordinator.replica.session_routes import Route, SessionRoutes
from gpu_share.coordinator.services.money import billing, session_billing, spending_limits
from gpu_share.coordinator.services.nodes import nodes, ranking
from gpu_share.coordinator.services.nodes.placement import (
    Requirements,
    requirements_of,
    serves,
)
from gpu_share.coordinator.services.sessions import channels, closing, gpus, upkeep
from gpu_share.coordinator.services.webhooks import events
from gpu_share.coordinator.services.work import (
    artifact_refs,
    gpu_assignment,
    memory_fit,
    reservation_holds,
)
from gpu_share.coordinator.services.work.invokes import no_capacity, resolve_url
from gpu_share.protocol.errors import ErrorCode
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.protocol.sessions import (
    OpenSession,
    Session,
    SessionCreate,
    SessionError,
    SessionStatus,
)

log = logging.getLogger(__name__)

CREATE_WAIT_SEC = 2.0  # answer `ready` at once when the model loads that fast
START_WAIT_SEC = 300.0  # a forward to a starting session waits this long for it
FORWARD_TIMEOUT_SEC = 300.0
CONNECT_GRACE_SEC = 5.0  # a node just online connects its channel right after


def to_wire(row: SessionRow, live: LiveSession | None = None) -> Session:
    status = live.status if live is not None else SessionStatus(row.status)
    last_used = row.last_used_at or row.ready_at
    error = None
    if row.error_code:
        error = SessionError(code=row.error_code, message=row.error_message or "")
    elif live is not None and live.error is not None:
        error = live.error
    return Session(
        id=row.id,
        status=status,
        runtime=RuntimeName(row.runtime),
        model_url=row.model_url,
        node_id=row.node_id,
        idle_timeout_sec=row.idle_timeout_sec,
        max_batch=row.max_batch,
        created_at=row.created_at,
        ready_at=row.ready_at,
        last_used_at=row.last_used_at,
        closed_at=row.closed_at,
        expires_at=(last_used + timedelta(seconds=row.idle_timeout_sec))
        if status.open and last_used
        else None,
        forward_count=row.forward_count + (live.unflushed_forwards if live else 0),
        device=row.device,
        inputs=row.inputs,
        error=error,
        gpus=row.gpus,
        gpu_indices=row.gpu_indices,
        rate_per_hour=billing.cost_text(row.rate_micro_per_hour),
        cost=billing.cost_text(row.cost_micro),
        webhook_url=row.webhook_url,
    )


class NotConnectedYet(Exception):
    """A node that serves the session is online but its channel has not connected yet."""


@dataclass(frozen=True)
class ForwardAnswer:
    format: str
    body: bytes


async def _owned(session: AsyncSession, tenant_id: str, session_id: str) -> SessionRow:
    row = await session.get(SessionRow, session_id)
    if row is None or row.tenant_id != tenant_id:
        raise NotFound(f"session {session_id} does not exist")
    return row


def ended(session_id: str, status: SessionStatus, error: SessionError | None) -> ApiError:
    """The answer to a forward sent to a session that is over: 410 SESSION_CLOSED."""
    reason = f": {error.message}" if error is not None else ""
    return Gone(
        f"session {session_id} is {status.value}{reason}; create a new session",
        code=ErrorCode.SESSION_CLOSED,
        details={"status": status.value, "reason": error.code if error else None},
    )


def _forward_error(exc: ForwardFailed) -> ApiError:
    if exc.status == 409:
        return Conflict(exc.error.message, details={"code": exc.error.code})
    if exc.status == 504:
        return Unavailable(exc.error.message, details={"code": exc.error.code})
    return Gone(
        exc.error.message, code=ErrorCode.SESSION_CLOSED, details={"reason": exc.error.code}
    )


class Parts(Protocol):
    """What sessions are built from: a running process's own (`Replica` has them)."""

    db: Database
    hub: SessionHub
    clock: Clock
    settings: Settings
    id: str
    peers: Peers | None
    routes: SessionRoutes | None


class Sessions:
    """The session rules over one process's hub; built per use from what it needs.
    `peers`: the hop to the other processes' hubs (None: sessions stay where they are)."""

    @classmethod
    def of(cls, parts: Parts) -> "Sessions":
        return cls(
            parts.db,
            parts.hub,
            parts.clock,
            parts.settings,
            replica_id=parts.id,
            peers=parts.peers,
            routes=parts.routes,
        )

    def __init__(
        self,
        db: Database,
        hub: SessionHub,
        clock: Clock,
        settings: Settings,
        *,
        replica_id: str = "",
        peers: Peers | None = None,
        routes: SessionRoutes | None = None,
    ) -> None:
        self.db = db
        self.hub = hub
        self.clock = clock
        self.settings = settings
        self.replica_id = replica_id
        self.peers = peers
        self.routes = routes

    async def _reachable(
        self, session: AsyncSession, now: datetime, node_ids: list[str] | None = None
    ) -> dict[str, str | None]:
        """The nodes (of `node_ids`, or all) a session can be opened on now: those whose
        channel this process holds (None), and with peers, those another live process
        holds (its relay address)."""
        reachable: dict[str, str | None] = {}
        if self.peers is not None:
            for node_id, holder in (await channels.holders(session, now, node_ids)).items():
                if holder.replica_id != self.replica_id and holder.relay_url:
                    reachable[node_id] = holder.relay_url
        reachable.update(dict.fromkeys(self.hub.connected_nodes()))  # here wins
        return reachable

    async def _holder(self, node_id: str | None, now: datetime) -> str | None:
        """The relay address of the other process holding `node_id`'s channel, if any."""
        if self.peers is None or node_id is None or self.hub.connected(node_id):
            return None
        async with self.db.read() as session:
            held = await channels.holders(session, now, [node_id])
        holder = held.get(node_id)
        if holder is None or holder.replica_id == self.replica_id:
            return None
        return holder.relay_url

    # Tenants

    async def create(
        self,
        tenant_id: str,
        body: SessionCreate,
        *,
        origins: set[str],
        ctx: artifact_refs.LeaseContext,
    ) -> Session:
        try:
            return await self._create(tenant_id, body, origins=origins, ctx=ctx)
        except NotConnectedYet:
            await self.hub.wait_for_attach(CONNECT_GRACE_SEC)
        try:
            return await self._create(tenant_id, body, origins=origins, ctx=ctx)
        except NotConnectedYet:
            raise Unavailable(
                "the nodes that could hold this session are online but not reachable for "
                "sessions yet; retry shortly",
                code=ErrorCode.NO_CAPACITY,
                headers={"Retry-After": "5"},
            ) from None

    async def _create(
        self,
        tenant_id: str,
        body: SessionCreate,
        *,
        origins: set[str],
        ctx: artifact_refs.LeaseContext,
    ) -> Session:
        now = self.clock.now()
        req = requirements_of(body, gpus=max(body.gpus, 1))
        if body.webhook_url:
            events.check_url("webhook_url", body.webhook_url, self.settings)
        async with (
            spending_limits.mailing_refusals(self.db, tenant_id, self.settings, now),
            self.db.write() as session,
        ):
            if body.webhook_url:
                await events.require_secret(session, tenant_id, "webhook_url")
            model = await resolve_url(
                session,
                tenant_id,
                "model_url",
                body.model_url,
                body.model_checksum_sha256,
                origins,
                now,
            )
            ref = await artifact_refs.artifact_ref(
                session, body.model_url, model.artifact_id, model.sha256, now, ctx
            )
            assert ref is not None  # resolve_url refused expired artifacts already
            # The stored model's size; None for a model at the tenant's own URL.
            reserve_mb = memory_fit.session_reservation_mb(ref.size, req.min_vram_mb)
            # A whole-GPU session holds its GPUs, not a share of the node's memory.
            shared_mb = reserve_mb if body.gpus == 0 else 0
            if body.reservation_id is not None:
                reachable = await self._reachable(session, now)
                node = await reservation_holds.session_node(
                    session,
                    tenant_id,
                    body.reservation_id,
                    req,
                    shared_mb,
                    set(reachable),
                    now,
                )
                indices: list[int] | None = await gpus.in_reservation(
                    session,
                    node,
                    req,
                    body.gpus,
                    await reservation_holds.held_on(session, now, node.id),
                    body.reservation_id,
                )
            else:
                node, indices, reachable = await self._choose_node(
                    session, req, body.gpus, shared_mb, now, ctx.settings
                )
            row = SessionRow(
                id=new_id("ses"),
                tenant_id=tenant_id,
                node_id=node.id,
                status=SessionStatus.STARTING.value,
                runtime=body.runtime.value,
                model_url=body.model_url,
                model_artifact_id=model.artifact_id,
                model_sha256=model.sha256,
                idle_timeout_sec=body.idle_timeout_sec,
                max_batch=body.max_batch,
                max_concurrency=body.max_concurrency,
                reserved_mb=shared_mb,
                created_at=now,
                touched_at=now,
                forward_count=0,
                reservation_id=body.reservation_id,
                gpus=body.gpus,
                gpu_indices=indices or None,
                webhook_url=body.webhook_url,
            )
            await session_billing.open_billing(session, row, node, self.settings, now)
            session.add(row)
        opening = RelayedOpen(
            tenant_id=tenant_id,
            node_id=node.id,
            idle_timeout_sec=body.idle_timeout_sec,
            message=OpenSession(
                session_id=row.id,
                runtime=body.runtime,
                model=ref,
                max_batch=body.max_batch,
                max_concurrency=body.max_concurrency,
                max_answer_bytes=ctx.settings.max_forward_bytes,
                gpu_indices=indices or None,
            ),
        )
        relay_url = reachable.get(node.id)
        try:
            if relay_url is None or self.peers is None:
                await self.open_here(opening)
            else:
                await self.peers.open(relay_url, opening)
        except (PeerUnreachable, NotConnectedYet, ApiError) as exc:
            # ApiError: the holder refused (the channel left it just now)
            lost = SessionError(
                code=ErrorCode.NODE_LOST,
                message="the node's connection went away while the session was opened",
            )
            await closing.finish(
                self.db, self.hub, row.id, SessionStatus.FAILED, self.clock.now(), lost
            )
            raise Unavailable(
                "the node chosen for this session lost its connection as the session was "
                "opened; create it again",
                code=ErrorCode.NO_CAPACITY,
                headers={"Retry-After": "1"},
            ) from exc
        return await self.get(tenant_id, row.id)

    async def open_here(self, opening: RelayedOpen) -> None:
        """Open the session on a node whose channel this process holds; wait a moment for
        it to load (`CREATE_WAIT_SEC`). NotConnectedYet: the channel is gone."""
        if not self.hub.connected(opening.node_id):
            raise NotConnectedYet
        live = LiveSession(
            id=opening.message.session_id,
            tenant_id=opening.tenant_id,
            node_id=opening.node_id,
            idle_timeout_sec=opening.idle_timeout_sec,
            last_used=self.clock.now(),
        )
        await self.hub.open(live, opening.message)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(live.settled.wait(), CREATE_WAIT_SEC)

    async def _choose_node(
        self,
        session: AsyncSession,
        req: Requirements,
        whole: int,
        reserve_mb: int,
        now: datetime,
        settings: Settings,
    ) -> tuple[NodeRow, list[int] | None, dict[str, str | None]]:
        """The node for a session outside reservations, the whole GPUs it holds there, and
        the nodes reachable for sessions (`_reachable`)."""
        online = await nodes.live_nodes(session, now, settings)
        holds = await reservation_holds.held_on(session, now)
        # A session sharing the first GPU: not on a node where that GPU is reserved or held.
        whole_held = await gpu_assignment.session_held(session) if whole == 0 else {}
        live = [
            n
            for n in online
            if serves(n, req, now)
            and (
                whole > 0
                or not (
                    reservation_holds.sessions_barred(n, holds)
                    or gpus.first_gpu_held(n, whole_held)
                )
            )
        ]
        reachable = await self._reachable(session, now, [n.id for n in live])
        candidates = [n for n in live if n.id in reachable]
        if not candidates and live:
            raise NotConnectedYet
        if not candidates:
            raise no_capacity(req, online, now)
        reserved = await memory_fit.session_reservations(session)
        free = {
            n.id: memory_fit.capacity_mb(n, req.runtime.needs_gpu) - reserved.get(n.id, 0)
            for n in candidates
        }
        roomy = [n for n in candidates if free[n.id] >= reserve_mb]
        if not roomy:
            largest = max(free.values())
            raise Unavailable(
                f"every node that serves {req.runtime.value} is full: the largest has "
                f"{max(largest, 0)} MB free and this model needs about {reserve_mb} MB; "
                "close idle sessions or retry later",
                code=ErrorCode.NO_CAPACITY,
                details={"constraint": "memory"},
                headers={"Retry-After": "30"},
            )
        if whole == 0:
            # The best ranked node that has room (SPEC §4.1); the roomiest among equals.
            return max(roomy, key=lambda n: (ranking.rank(n), free[n.id])), None, reachable
        chosen = {n.id: await gpus.choose(session, n, req, holds) for n in roomy}
        fitting = [n for n in roomy if chosen[n.id] is not None]
        if not fitting:
            raise gpus.none_free(req)
        best = max(fitting, key=lambda n: (ranking.rank(n), free[n.id]))
        indices = await gpus.choose(session, best, req, holds, lock=True)  # again, locked
        if indices is None:
            raise gpus.none_free(req)  # a claim or a session took them meanwhile
        return best, indices, reachable

    async def get(self, tenant_id: str, session_id: str) -> Session:
        # The live state first: the hub forgets a session only after its row is final, so
        # a row read now is final whenever the hub no longer knew the session before it.
        live = self.hub.get(session_id)
        async with self.db.read() as session:
            row = await _owned(session, tenant_id, session_id)
        if live is not None and not live.status.open and SessionStatus(row.status).open:
            # It ended while the row was read: a session is ended in the hub after its
            # row is final (idle, deleted, unpaid), so the row now says why.
            async with self.db.read() as session:
                row = await _owned(session, tenant_id, session_id)
        return to_wire(row, live)

    async def list_for_tenant(
        self, tenant_id: str, *, include_closed: bool, limit: int
    ) -> list[Session]:
        query = select(SessionRow).where(SessionRow.tenant_id == tenant_id)
        if not include_closed:
            query = query.where(SessionRow.status.in_(OPEN_SESSION_VALUES))
        live = {held.id: held for held in self.hub.held()}  # before the read, as in `get`
        async with self.db.read() as session:
            rows = (await session.scalars(query.order_by(SessionRow.id.desc()).limit(limit))).all()
        return [to_wire(row, live.get(row.id)) for row in rows]

    async def delete(self, tenant_id: str, session_id: str) -> Session:
        async with self.db.read() as session:
            row = await _owned(session, tenant_id, session_id)
        now = self.clock.now()
        await closing.finish(self.db, self.hub, session_id, SessionStatus.CLOSED, now)
        reason = "the session was deleted by its tenant"
        relay_url = None if self.hub.get(session_id) else await self._holder(row.node_id, now)
        if relay_url is not None and self.peers is not None:
            with contextlib.suppress(PeerUnreachable):  # its holder is gone: so is the session
                await self.peers.close(relay_url, session_id, reason, SessionStatus.CLOSED)
        await self.hub.close(session_id, reason, status=SessionStatus.CLOSED)
        return await self.get(tenant_id, session_id)

    async def forward(
        self, tenant_id: str, session_id: str, fmt: str, payload: bytes
    ) -> ForwardAnswer:
        """Run the session's model on `payload`; timed and counted for /metrics."""
        started = time.perf_counter()
        outcome = "error"
        try:
            answer = await self._forward(tenant_id, session_id, fmt, payload)
            outcome = "ok"
            return answer
        finally:
            metrics.SESSION_FORWARDS.labels(outcome).inc()
            metrics.FORWARD_SECONDS.observe(time.perf_counter() - started)

    async def _forward(
        self, tenant_id: str, session_id: str, fmt: str, payload: bytes
    ) -> ForwardAnswer:
        if self.hub.get(session_id) is None and self.peers is not None:
            relay_url = await self._route(tenant_id, session_id)
            if relay_url is not None:
                try:
                    answer = await self.peers.forward(
                        relay_url, tenant_id, session_id, fmt, payload
                    )
                except PeerUnreachable as exc:
                    if self.routes is not None:
                        self.routes.pop(session_id)
                    if exc.gone:
                        raise await self._lost_with_holder(session_id) from exc
                    raise Unavailable(
                        "the coordinator process holding this session's connection does not "
                        "answer; retry (a session whose process died ends with NODE_LOST "
                        f"within {upkeep.STALE_AFTER_SEC:g} s)",
                        headers={"Retry-After": "1"},
                    ) from exc
                return ForwardAnswer(format=answer.format, body=answer.body)
        return await self.forward_here(tenant_id, session_id, fmt, payload)

    async def _route(self, tenant_id: str, session_id: str) -> str | None:
        """The relay address of the process holding the tenant's open session, when it is
        not this one (remembered: `SessionRoutes`); else None."""
        known = self.routes.get(session_id) if self.routes is not None else None
        if known is not None and known.tenant_id == tenant_id:
            return known.relay_url
        async with self.db.read() as session:
            row = await _owned(session, tenant_id, session_id)
        if not SessionStatus(row.status).open:
            return None
        relay_url = await self._holder(row.node_id, self.clock.now())
        if relay_url is not None and self.routes is not None:
            self.routes.put(session_id, Route(tenant_id, relay_url))
        return relay_url

    async def _lost_with_holder(self, session_id: str) -> ApiError:
        """The process holding the session is gone, and its node's channel with it: the
        session ends now, NODE_LOST (the agent stops its sessions when its channel drops)."""
        error = SessionError(
            code=ErrorCode.NODE_LOST,
            message="the coordinator process holding the session's connection went away",
        )
        await closing.finish(
            self.db, self.hub, session_id, SessionStatus.FAILED, self.clock.now(), error
        )
        async with self.db.read() as session:
            row = await session.get(SessionRow, session_id)
        assert row is not None
        if row.error_code:  # ended otherwise meanwhile: say what the row says
            error = SessionError(code=row.error_code, message=row.error_message or "")
        return ended(session_id, SessionStatus(row.status), error)

    async def forward_here(
        self, tenant_id: str, session_id: str, fmt: str, payload: bytes
    ) -> ForwardAnswer:
        """A forward to a session this process holds (else an answer that says why not)."""
        live = self.hub.get(session_id)
        if live is None or live.tenant_id != tenant_id:
            async with self.db.read() as session:
                row = await _owned(session, tenant_id, session_id)
            status = SessionStatus(row.status)
            if status.open:
                raise Unavailable(
                    "this coordinator does not hold the session's connection (it is pinned to "
                    "another replica or was lost in a restart); retry, or create a new session",
                    headers={"Retry-After": "1"},
                )
            error = (
                SessionError(code=row.error_code, message=row.error_message or "")
                if row.error_code
                else None
            )
            raise ended(row.id, status, error)
        if live.status is SessionStatus.STARTING:
            try:
                await asyncio.wait_for(live.settled.wait(), START_WAIT_SEC)
            except TimeoutError as exc:
                raise Unavailable(f"session {session_id} is still starting; retry") from exc
        if not live.status.open:
            raise ended(session_id, live.status, live.error)
        try:
            header, body = await self.hub.forward(live, fmt, payload, FORWARD_TIMEOUT_SEC)
        except ForwardFailed as exc:
            raise _forward_error(exc) from exc
        if not header.ok:
            error = header.error or SessionError(code=ErrorCode.RUNTIME_ERROR, message="failed")
            if error.code == ErrorCode.PAYLOAD_TOO_LARGE:
                raise PayloadTooLarge(error.message, details={"session": "still usable"})
            raise ApiError(
                error.message,
                code=ErrorCode.VALIDATION_ERROR,
                details={"code": error.code, "session": "still usable"},
            )
        return ForwardAnswer(format=header.format, body=body)

    # Agents

    async def on_ready(
        self, node_id: str, session_id: str, device: str, inputs: list[dict[str, object]]
    ) -> None:
        live = self.hub.get(session_id)
        if live is None or live.node_id != node_id:
            return
        now = self.clock.now()
        async with self.db.write() as session:
            opened = (
                await session.execute(
                    update(SessionRow)
                    .where(
                        SessionRow.id == session_id,
                        SessionRow.status == SessionStatus.STARTING.value,
                    )
                    .values(
                        status=SessionStatus.READY.value,
                        ready_at=now,
                        touched_at=now,
                        device=device,
                        inputs=inputs,
                    )
                    .returning(SessionRow.tenant_id, SessionRow.webhook_url)
                )
            ).one_or_none()
            if opened is not None and opened.webhook_url:
                await closing.tell(session, session_id, opened, "session.opened", {}, now)
        live.last_used = now
        self.hub.settle(session_id, SessionStatus.READY)

    async def on_failed(self, node_id: str, session_id: str, error: SessionError) -> None:
        live = self.hub.get(session_id)
        if live is None or live.node_id != node_id:
            return
        await closing.finish(
            self.db, self.hub, session_id, SessionStatus.FAILED, self.clock.now(), error
        )
        self.hub.settle(session_id, SessionStatus.FAILED, error)

    async def on_node_lost(self, lost: list[LiveSession]) -> None:
        """Record the failure; the hub keeps answering for these sessions until it is written."""
        now = self.clock.now()
        for live in lost:
            try:
                await closing.finish(
                    self.db, self.hub, live.id, SessionStatus.FAILED, now, live.error
                )
            except Exception:  # `upkeep` fails it later as unheld (STALE_AFTER_SEC)
                log.exception("could not record that session %s failed", live.id)
        self.hub.forget([live.id for live in lost])

    async def release_all(self) -> None:
        """This process stops: the sessions it holds end now (their nodes' channels go with
        it), NODE_LOST, rather than when another process finds them stale."""
        now = self.clock.now()
        error = SessionError(
            code=ErrorCode.NODE_LOST,
            message="the coordinator process holding the session stopped; open a new session",
        )
        for live in self.hub.held():
            try:
                await closing.finish(self.db, self.hub, live.id, SessionStatus.FAILED, now, error)
            except Exception:  # the upkeep of another process fails it as unheld
                log.exception("could not record that session %s ended", live.id)
        await self.hub.close_all("the coordinator is shutting down", error)
