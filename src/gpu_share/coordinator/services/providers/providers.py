"""Providers: the accounts behind the machines (their tokens: `enrollment_tokens`)."""

from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.errors import NotFound
from gpu_share.coordinator.core.ids import new_id
from gpu_share.coordinator.core.orm import ProviderRow
from gpu_share.coordinator.services.accounts.accounts import issue_key
from gpu_share.coordinator.services.providers import enrollment_tokens
from gpu_share.protocol.accounts import Role
from gpu_share.protocol.nodes import Tier
from gpu_share.protocol.providers import Provider, ProviderCreate, ProviderWithCredentials


def to_wire(row: ProviderRow) -> Provider:
    return Provider(
        id=row.id, name=row.name, email=row.email, tier=Tier(row.tier), created_at=row.created_at
    )


async def create_provider(
    session: AsyncSession, body: ProviderCreate, now: datetime, *, token_lifetime: timedelta
) -> ProviderWithCredentials:
    row = ProviderRow(
        id=new_id("prv"), name=body.name, email=body.email, tier=body.tier.value, created_at=now
    )
    session.add(row)
    await session.flush()
    _, api_key = await issue_key(session, Role.PROVIDER, now, provider_id=row.id)
    _, token = await enrollment_tokens.issue(session, row.id, now, token_lifetime)
    return ProviderWithCredentials(
        **to_wire(row).model_dump(), api_key=api_key, enrollment_token=token
    )


async def get(session: AsyncSession, provider_id: str) -> Provider:
    row = await session.get(ProviderRow, provider_id)
    if row is None:
        raise NotFound(f"provider {provider_id} does not exist")
    return to_wire(row)


async def list_providers(session: AsyncSession) -> list[Provider]:
    rows = (await session.scalars(select(ProviderRow).order_by(ProviderRow.id))).all()
    return [to_wire(row) for row in rows]
