"""Tenants, their keys and the admin key (tenants apply in `tenant_applications`)."""

import logging
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core import keys
from gpu_share.coordinator.core.db import Database, one_at_a_time
from gpu_share.coordinator.core.driver_sql import Sql
from gpu_share.coordinator.core.errors import Conflict, NotFound, Unauthorized, ValidationFailed
from gpu_share.coordinator.core.ids import new_id
from gpu_share.coordinator.core.orm import ApiKeyRow, TenantRow
from gpu_share.coordinator.core.principals import (
    AdminCaller,
    NodeCaller,
    Principal,
    ProviderCaller,
    TenantCaller,
)
from gpu_share.coordinator.services.accounts import browser_sessions
from gpu_share.protocol import accounts as wire

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Key:
    """A key's id, role and owners as read on the driver (what `principal_of` reads of an
    `ApiKeyRow`)."""

    id: str
    role: str
    tenant_id: str | None
    provider_id: str | None
    node_id: str | None


_KEY_IN_FORCE = Sql(
    "SELECT id, role, tenant_id, provider_id, node_id FROM api_keys"
    " WHERE key_hash = :key_hash AND revoked_at IS NULL"
)


async def authenticate(db: Database, key: str) -> Principal:
    """The principal of a key in force. Every request whose key the replica's cache lacks
    runs this — each agent's about once a `key_cache_ttl_sec`, which is its heartbeat
    interval — so it is one statement on the driver (`driver_sql`)."""
    async with db.driver_read() as tx:
        row = await tx.fetchrow(_KEY_IN_FORCE, key_hash=keys.hash_key(key))
    principal = None
    if row is not None:
        owners = (row["tenant_id"], row["provider_id"], row["node_id"])
        principal = principal_of(_Key(row["id"], row["role"], *owners))
    if principal is None:
        raise Unauthorized("API key is unknown or revoked; ask an admin for a new one")
    return principal


def principal_of(row: ApiKeyRow | _Key) -> Principal | None:
    """The key's typed principal; None for a row missing the owner its role needs."""
    match wire.Role(row.role):
        case wire.Role.TENANT if row.tenant_id:
            return TenantCaller(key_id=row.id, tenant_id=row.tenant_id)
        case wire.Role.PROVIDER if row.provider_id:
            return ProviderCaller(key_id=row.id, provider_id=row.provider_id)
        case wire.Role.AGENT if row.provider_id and row.node_id:
            return NodeCaller(key_id=row.id, provider_id=row.provider_id, node_id=row.node_id)
        case wire.Role.ADMIN:
            return AdminCaller(key_id=row.id)
    log.error("key %s (%s) has no owner; refusing it", row.id, row.role)
    return None


async def issue_key(
    session: AsyncSession,
    role: wire.Role,
    now: datetime,
    *,
    key: str | None = None,
    **owner: str | None,
) -> tuple[ApiKeyRow, str]:
    """A new key for `role`; returns the row and the only copy of the secret."""
    secret = key or keys.generate_key(role)
    row = ApiKeyRow(
        id=new_id("key"),
        role=role.value,
        key_hash=keys.hash_key(secret),
        prefix=keys.display_prefix(secret),
        created_at=now,
        revoked_at=None,
        **owner,
    )
    session.add(row)
    await session.flush()
    return row, secret


async def revoke_node_keys(session: AsyncSession, node_id: str, now: datetime) -> int:
    """End every key a node's agents hold: the machine registered again and was handed a
    new one. Returns how many were still in force."""
    done = await session.execute(
        update(ApiKeyRow)
        .where(ApiKeyRow.node_id == node_id, ApiKeyRow.revoked_at.is_(None))
        .values(revoked_at=now)
    )
    return int(done.rowcount)  # type: ignore[attr-defined]


async def ensure_admin_key(
    session: AsyncSession, now: datetime, configured: str | None
) -> str | None:
    """Install the configured admin key, or generate one when no admin key exists yet.

    Returns a newly generated key (to be printed once), else None. A configured key
    that was revoked stays revoked: its hash is already known. Processes starting
    together take turns here, so they install one key, never one each.
    """
    await one_at_a_time(session, "admin-key")
    if configured is not None:
        if keys.role_of(configured) is not wire.Role.ADMIN or len(configured) < 30:
            raise ValidationFailed(
                "GPUSHARE_ADMIN_KEY must start with 'gpu_admin_' "
                "and carry at least 20 random characters"
            )
        known = await session.scalar(
            select(ApiKeyRow.id).where(ApiKeyRow.key_hash == keys.hash_key(configured))
        )
        if known is None:
            await issue_key(session, wire.Role.ADMIN, now, key=configured)
        return None
    existing = await session.scalar(
        select(ApiKeyRow.id).where(ApiKeyRow.role == wire.Role.ADMIN.value).limit(1)
    )
    if existing is not None:
        return None
    _, secret = await issue_key(session, wire.Role.ADMIN, now)
    return secret


def key_info(row: ApiKeyRow) -> wire.KeyInfo:
    return wire.KeyInfo(
        id=row.id,
        role=wire.Role(row.role),
        prefix=row.prefix,
        tenant_id=row.tenant_id,
        created_at=row.created_at,
        revoked_at=row.revoked_at,
    )


async def create_tenant(
    session: AsyncSession, body: wire.TenantCreate, now: datetime
) -> wire.TenantWithKey:
    tenant = TenantRow(id=new_id("ten"), name=body.name, email=body.email, created_at=now)
    session.add(tenant)
    await session.flush()
    key_row, secret = await issue_key(session, wire.Role.TENANT, now, tenant_id=tenant.id)
    return wire.TenantWithKey(
        id=tenant.id, name=tenant.name, email=tenant.email, key_id=key_row.id, api_key=secret
    )


async def list_tenants(session: AsyncSession) -> list[wire.Tenant]:
    tenants = (await session.scalars(select(TenantRow).order_by(TenantRow.id))).all()
    key_rows = (
        await session.scalars(
            select(ApiKeyRow).where(ApiKeyRow.tenant_id.is_not(None)).order_by(ApiKeyRow.id)
        )
    ).all()
    by_tenant: dict[str, list[wire.KeyInfo]] = {}
    for row in key_rows:
        by_tenant.setdefault(row.tenant_id or "", []).append(key_info(row))
    return [
        wire.Tenant(
            id=t.id,
            name=t.name,
            email=t.email,
            created_at=t.created_at,
            keys=by_tenant.get(t.id, []),
        )
        for t in tenants
    ]


async def issue_tenant_key(session: AsyncSession, tenant_id: str, now: datetime) -> wire.IssuedKey:
    if await session.get(TenantRow, tenant_id) is None:
        raise NotFound(f"tenant {tenant_id} does not exist")
    row, secret = await issue_key(session, wire.Role.TENANT, now, tenant_id=tenant_id)
    return wire.IssuedKey(**key_info(row).model_dump(), api_key=secret)


async def list_keys(
    session: AsyncSession, role: wire.Role | None, *, tenant_id: str | None = None
) -> list[wire.KeyInfo]:
    query = select(ApiKeyRow).order_by(ApiKeyRow.id)
    if role is not None:
        query = query.where(ApiKeyRow.role == role.value)
    if tenant_id is not None:
        query = query.where(ApiKeyRow.tenant_id == tenant_id)
    return [key_info(row) for row in (await session.scalars(query)).all()]


async def revoke_key(
    session: AsyncSession,
    key_id: str,
    now: datetime,
    *,
    caller_key_id: str,
    tenant_id: str | None = None,
) -> wire.KeyInfo:
    """Revoke a key, and end the browser sessions it signed in; with `tenant_id`, only one
    of that tenant's own keys."""
    row = await session.get(ApiKeyRow, key_id)
    if row is None or (tenant_id is not None and row.tenant_id != tenant_id):
        raise NotFound(f"key {key_id} does not exist")
    if row.id == caller_key_id:
        raise Conflict("a key cannot revoke itself; sign in with another key to revoke this one")
    if row.revoked_at is None:
        row.revoked_at = now
    await browser_sessions.end_for_key(session, row.id, now)
    return key_info(row)
