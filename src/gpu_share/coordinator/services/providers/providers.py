"""Providers and the enrollment tokens their agents register with."""

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core import keys
from gpu_share.coordinator.core.errors import NotFound, Unauthorized
from gpu_share.coordinator.core.ids import new_id
from gpu_share.coordinator.core.orm import EnrollmentTokenRow, ProviderRow
from gpu_share.coordinator.services.accounts.accounts import issue_key
from gpu_share.protocol.accounts import Role
from gpu_share.protocol.nodes import Tier
from gpu_share.protocol.providers import Provider, ProviderCreate, ProviderWithCredentials


def to_wire(row: ProviderRow) -> Provider:
    return Provider(
        id=row.id, name=row.name, email=row.email, tier=Tier(row.tier), created_at=row.created_at
    )


async def create_provider(
    session: AsyncSession, body: ProviderCreate, now: datetime
) -> ProviderWithCredentials:
    row = ProviderRow(
        id=new_id("prv"), name=body.name, email=body.email, tier=body.tier.value, created_at=now
    )
    session.add(row)
    await session.flush()
    _, api_key = await issue_key(session, Role.PROVIDER, now, provider_id=row.id)
    token = await issue_enrollment_token(session, row.id, now)
    return ProviderWithCredentials(
        **to_wire(row).model_dump(), api_key=api_key, enrollment_token=token
    )


async def issue_enrollment_token(session: AsyncSession, provider_id: str, now: datetime) -> str:
    token = keys.ENROLLMENT_PREFIX + keys.generate_secret()
    session.add(
        EnrollmentTokenRow(
            id=new_id("enr"),
            provider_id=provider_id,
            token_hash=keys.hash_key(token),
            prefix=keys.display_prefix(token),
            created_at=now,
            revoked_at=None,
        )
    )
    await session.flush()
    return token


async def get(session: AsyncSession, provider_id: str) -> Provider:
    row = await session.get(ProviderRow, provider_id)
    if row is None:
        raise NotFound(f"provider {provider_id} does not exist")
    return to_wire(row)


async def list_providers(session: AsyncSession) -> list[Provider]:
    rows = (await session.scalars(select(ProviderRow).order_by(ProviderRow.id))).all()
    return [to_wire(row) for row in rows]


async def provider_for_enrollment(session: AsyncSession, token: str) -> ProviderRow:
    row = await session.scalar(
        select(EnrollmentTokenRow).where(EnrollmentTokenRow.token_hash == keys.hash_key(token))
    )
    if row is None or row.revoked_at is not None:
        raise Unauthorized("enrollment token is unknown or revoked; ask the platform admin")
    provider = await session.get(ProviderRow, row.provider_id)
    assert provider is not None  # foreign key
    return provider
