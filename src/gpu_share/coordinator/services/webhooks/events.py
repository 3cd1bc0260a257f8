"""Emitting an event: what other domains call, in the transaction of the change that
causes it (an outbox), so an event exists exactly when its change does.

    await events.emit(session, owner_id=tenant_id, event_type="topup.credited",
                      data={...}, cause=f"{transaction_id}:credited", now=now)

Each event goes to the `url` given (an invoke's, a session's or a reservation's own
webhook_url) and to every endpoint of the owner subscribed to its type. The same
`cause` never makes a second delivery to the same target (UNIQUE), so a retried
decision emits once. Sending is the loop's (`sender`), never inside a transaction.
"""

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.errors import field_error
from gpu_share.coordinator.core.ids import new_id
from gpu_share.coordinator.core.orm import WebhookDeliveryRow, WebhookEndpointRow
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.services.webhooks import signing_keys
from gpu_share.netguard import UrlForbidden, UrlPolicy
from gpu_share.protocol.webhooks import PROVIDER_EVENTS, TENANT_EVENTS, DeliveryStatus

OWN_URL = "url"  # the target of an object's own webhook_url
ENDPOINT_EVENTS = frozenset((*TENANT_EVENTS, *PROVIDER_EVENTS))


def check_url(field: str, url: str, settings: Settings) -> str:
    """422 for a URL the fetcher would refuse by its spelling alone (a private or loopback
    address, a credential, a port), as outputs_upload's; names resolved to private
    addresses are refused at each delivery, where the attempt says so."""
    try:
        UrlPolicy.from_strings(settings.url_allow_networks).check_url(url)
    except UrlForbidden as exc:
        raise field_error(field, f"refused: {exc.message}") from None
    return url


async def require_secret(session: AsyncSession, owner_id: str, field: str) -> None:
    """A webhook_url is accepted only once its receiver can verify what is sent."""
    if not await signing_keys.has_secret(session, owner_id):
        raise field_error(
            field,
            "your account has no webhook signing secret yet; create it first with "
            "POST /v1/webhooks/secret/rotate (shown once) so your receiver can verify "
            "deliveries",
        )


def body_of(event_type: str, data: Mapping[str, Any], now: datetime) -> str:
    """The JSON sent and signed (Standard Webhooks' type / timestamp / data)."""
    event = {"type": event_type, "timestamp": now.isoformat(), "data": dict(data)}
    return json.dumps(event, separators=(",", ":"))


async def emit(
    session: AsyncSession,
    *,
    owner_id: str,
    event_type: str,
    data: Mapping[str, Any],
    cause: str,
    now: datetime,
    url: str | None = None,
) -> list[str]:
    """Queue the event for `url` and the owner's subscribed endpoints; the ids of the
    deliveries written (none new when `cause` was already emitted)."""
    targets: list[tuple[str, str]] = [(OWN_URL, url)] if url else []
    if event_type in ENDPOINT_EVENTS:  # the invoke path never reads endpoints
        endpoints = await session.scalars(
            select(WebhookEndpointRow).where(WebhookEndpointRow.owner_id == owner_id)
        )
        targets += [(e.id, e.url) for e in endpoints if event_type in e.event_types]
    if not targets:
        return []
    known = set(
        await session.scalars(
            select(WebhookDeliveryRow.target).where(WebhookDeliveryRow.cause == cause)
        )
    )
    body = body_of(event_type, data, now)
    written = []
    for target, target_url in targets:
        if target in known:
            continue
        row = WebhookDeliveryRow(
            id=new_id("msg"),
            owner_id=owner_id,
            cause=cause,
            target=target,
            url=target_url,
            event_type=event_type,
            body=body,
            status=DeliveryStatus.PENDING.value,
            attempts=0,
            created_at=now,
            next_attempt_at=now,
            retry_from=now,
        )
        session.add(row)
        written.append(row.id)
    await session.flush()
    return written
