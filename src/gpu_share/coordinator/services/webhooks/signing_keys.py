"""An account's signing secret: created once, rotated on request, never shown again.

It is an HMAC key the coordinator must use to sign, so it is stored as is (like the
SMTP password in the settings, unlike API keys, which are hashed); it never appears in a
log or in any answer but the one that creates or rotates it. After a rotation the
previous secret signs too for `GRACE`, so receivers can switch without losing a message.
"""

from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.orm import WebhookSecretRow
from gpu_share.coordinator.services.webhooks import signing
from gpu_share.protocol.webhooks import WebhookSecret

GRACE = timedelta(hours=24)


async def has_secret(session: AsyncSession, owner_id: str) -> bool:
    found = await session.scalar(
        select(WebhookSecretRow.owner_id).where(WebhookSecretRow.owner_id == owner_id)
    )
    return found is not None


async def create_if_missing(session: AsyncSession, owner_id: str, now: datetime) -> str | None:
    """The new secret when the account had none; None when it has one (not shown again)."""
    if await has_secret(session, owner_id):
        return None
    secret = signing.new_secret()
    session.add(WebhookSecretRow(owner_id=owner_id, secret=secret, created_at=now))
    await session.flush()
    return secret


async def rotate(session: AsyncSession, owner_id: str, now: datetime) -> WebhookSecret:
    """A new secret (or the first one); the one it replaces keeps signing for `GRACE`."""
    created = await create_if_missing(session, owner_id, now)
    if created is not None:
        return WebhookSecret(secret=created, previous_valid_until=None)
    row = await session.get(WebhookSecretRow, owner_id, with_for_update=True)
    assert row is not None
    secret = signing.new_secret()
    await session.execute(
        update(WebhookSecretRow)
        .where(WebhookSecretRow.owner_id == owner_id)
        .values(
            secret=secret,
            previous_secret=row.secret,
            previous_until=now + GRACE,
            rotated_at=now,
        )
    )
    return WebhookSecret(secret=secret, previous_valid_until=now + GRACE)


async def in_force(session: AsyncSession, owner_id: str, now: datetime) -> list[str]:
    """The secrets a delivery is signed with now: the current one first."""
    row = await session.get(WebhookSecretRow, owner_id)
    if row is None:
        return []
    signing_with = [row.secret]
    if row.previous_secret and row.previous_until and now < row.previous_until:
        signing_with.append(row.previous_secret)
    return signing_with
