"""An account's webhook endpoints: created with the events they take, listed, deleted.
Another account's endpoint is not found (knowing an id grants nothing)."""

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.errors import NotFound, field_error
from gpu_share.coordinator.core.ids import new_id
from gpu_share.coordinator.core.orm import WebhookEndpointRow
from gpu_share.coordinator.core.principals import Principal, ProviderCaller, TenantCaller
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.services.webhooks import events, signing_keys
from gpu_share.protocol.webhooks import (
    PROVIDER_EVENTS,
    TENANT_EVENTS,
    WebhookEndpoint,
    WebhookEndpointCreate,
    WebhookEndpointCreated,
)

MAX_ENDPOINTS = 10


@dataclass(frozen=True)
class Account:
    """Whose webhooks: a tenant's or a provider's, and the events it may subscribe to."""

    owner_id: str
    events: tuple[str, ...]


def account_of(caller: Principal) -> Account:
    if isinstance(caller, TenantCaller):
        return Account(caller.tenant_id, TENANT_EVENTS)
    assert isinstance(caller, ProviderCaller), caller
    return Account(caller.provider_id, PROVIDER_EVENTS)


def to_wire(row: WebhookEndpointRow) -> WebhookEndpoint:
    return WebhookEndpoint(
        id=row.id, url=row.url, event_types=list(row.event_types), created_at=row.created_at
    )


async def create(
    session: AsyncSession,
    account: Account,
    body: WebhookEndpointCreate,
    settings: Settings,
    now: datetime,
) -> WebhookEndpointCreated:
    """The endpoint, and the account's signing secret when this creates it (shown once)."""
    unknown = sorted(set(body.event_types) - set(account.events))
    if unknown:
        raise field_error(
            "event_types",
            f"{', '.join(unknown)} cannot be subscribed here; this account's events are "
            f"{', '.join(account.events)}",
        )
    events.check_url("url", body.url, settings)
    count = await session.scalar(
        select(func.count())
        .select_from(WebhookEndpointRow)
        .where(WebhookEndpointRow.owner_id == account.owner_id)
    )
    if (count or 0) >= MAX_ENDPOINTS:
        raise field_error("url", f"an account has at most {MAX_ENDPOINTS} endpoints; delete one")
    row = WebhookEndpointRow(
        id=new_id("whe"),
        owner_id=account.owner_id,
        url=body.url,
        event_types=sorted(set(body.event_types)),
        created_at=now,
    )
    session.add(row)
    secret = await signing_keys.create_if_missing(session, account.owner_id, now)
    return WebhookEndpointCreated(**to_wire(row).model_dump(), secret=secret)


async def list_for(session: AsyncSession, owner_id: str) -> list[WebhookEndpoint]:
    rows = await session.scalars(
        select(WebhookEndpointRow)
        .where(WebhookEndpointRow.owner_id == owner_id)
        .order_by(WebhookEndpointRow.created_at, WebhookEndpointRow.id)
    )
    return [to_wire(row) for row in rows]


async def remove(session: AsyncSession, owner_id: str, endpoint_id: str) -> None:
    """Deliveries already queued for it are still sent; it takes no new event."""
    done = await session.execute(
        delete(WebhookEndpointRow).where(
            WebhookEndpointRow.id == endpoint_id, WebhookEndpointRow.owner_id == owner_id
        )
    )
    if done.rowcount != 1:  # type: ignore[attr-defined]
        raise NotFound(f"webhook endpoint {endpoint_id} not found")
