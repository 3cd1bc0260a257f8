"""Enrollment tokens: what lets a provider's agents register machines (SPEC §3.8;
docs/operations.md, "Enrollment tokens").

A token registers any number of machines until it expires (`GPUSHARE_ENROLLMENT_TOKEN_DAYS`
after it was issued, unless the admin chose another lifetime) or is revoked. Rotating
issues a new one and revokes the old in one transaction. Machines already registered are
not affected: each holds its own node key. Only the token's hash is kept; the token is
shown once, when issued.
"""

from datetime import datetime, timedelta

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core import keys
from gpu_share.coordinator.core.errors import Conflict, NotFound, Unauthorized
from gpu_share.coordinator.core.ids import is_id, new_id
from gpu_share.coordinator.core.orm import EnrollmentTokenRow, NodeRow, ProviderRow
from gpu_share.coordinator.services.mail import mails
from gpu_share.protocol.providers import (
    EnrollmentToken,
    EnrollmentTokenState,
    IssuedEnrollmentToken,
)

# Tokens in force per provider: each registers machines, so a provider needs a few (one
# per site or team), not thousands.
MAX_ACTIVE = 20
WHERE_TO_GET_ONE = (
    "issue a new one on your Machines page (/provider) or with "
    "POST /v1/provider/enrollment-tokens, or ask the platform admin"
)


def lifetime(default_days: int, chosen_days: int | None = None) -> timedelta:
    """How long a new token works: the admin's choice, else the platform's setting."""
    return timedelta(days=chosen_days if chosen_days is not None else default_days)


def state_of(row: EnrollmentTokenRow, now: datetime) -> EnrollmentTokenState:
    if row.revoked_at is not None:
        return EnrollmentTokenState.REVOKED
    if row.expires_at is not None and row.expires_at <= now:
        return EnrollmentTokenState.EXPIRED
    return EnrollmentTokenState.ACTIVE


def _when(at: datetime) -> str:
    return at.strftime("%Y-%m-%d %H:%M UTC")


def to_wire(row: EnrollmentTokenRow, now: datetime, machines: int) -> EnrollmentToken:
    return EnrollmentToken(
        id=row.id,
        prefix=row.prefix,
        created_at=row.created_at,
        expires_at=row.expires_at,
        revoked_at=row.revoked_at,
        state=state_of(row, now),
        machines=machines,
    )


async def _machines(session: AsyncSession, token_ids: list[str]) -> dict[str, int]:
    if not token_ids:
        return {}
    rows = await session.execute(
        select(NodeRow.enrollment_token_id, func.count())
        .where(NodeRow.enrollment_token_id.in_(token_ids))
        .group_by(NodeRow.enrollment_token_id)
    )
    return {str(token_id): int(count) for token_id, count in rows.all()}


async def _provider(session: AsyncSession, provider_id: str) -> ProviderRow:
    provider = await session.get(ProviderRow, provider_id) if is_id("prv", provider_id) else None
    if provider is None:
        raise NotFound(f"provider {provider_id} does not exist")
    return provider


async def _token(session: AsyncSession, provider_id: str, token_id: str) -> EnrollmentTokenRow:
    """One of this provider's tokens; another provider's is as unknown as a made-up id."""
    row = await session.get(EnrollmentTokenRow, token_id) if is_id("enr", token_id) else None
    if row is None or row.provider_id != provider_id:
        raise NotFound(f"enrollment token {token_id} does not exist")
    return row


async def issue(
    session: AsyncSession, provider_id: str, now: datetime, valid_for: timedelta
) -> tuple[EnrollmentTokenRow, str]:
    """A new token: the row and the only copy of the secret."""
    await _provider(session, provider_id)
    active = await session.scalar(
        select(func.count()).where(
            EnrollmentTokenRow.provider_id == provider_id,
            EnrollmentTokenRow.revoked_at.is_(None),
            EnrollmentTokenRow.expires_at > now,
        )
    )
    if int(active or 0) >= MAX_ACTIVE:
        raise Conflict(
            f"this provider has {MAX_ACTIVE} enrollment tokens in force already; revoke or "
            "rotate one instead of issuing another"
        )
    token = keys.ENROLLMENT_PREFIX + keys.generate_secret()
    row = EnrollmentTokenRow(
        id=new_id("enr"),
        provider_id=provider_id,
        token_hash=keys.hash_key(token),
        prefix=keys.display_prefix(token),
        created_at=now,
        revoked_at=None,
        expires_at=now + valid_for,
    )
    session.add(row)
    await session.flush()
    return row, token


async def issue_shown_once(
    session: AsyncSession,
    provider_id: str,
    now: datetime,
    valid_for: timedelta,
    base_url: str,
    *,
    replaces: str | None = None,
) -> IssuedEnrollmentToken:
    row, token = await issue(session, provider_id, now, valid_for)
    return IssuedEnrollmentToken(
        **to_wire(row, now, 0).model_dump(),
        token=token,
        install_command=mails.install_command(base_url, token),
        replaces=replaces,
    )


async def list_tokens(
    session: AsyncSession, provider_id: str, now: datetime
) -> list[EnrollmentToken]:
    """Newest first, each with how many machines registered with it last."""
    await _provider(session, provider_id)
    rows = (
        await session.scalars(
            select(EnrollmentTokenRow)
            .where(EnrollmentTokenRow.provider_id == provider_id)
            .order_by(EnrollmentTokenRow.created_at.desc(), EnrollmentTokenRow.id.desc())
        )
    ).all()
    machines = await _machines(session, [row.id for row in rows])
    return [to_wire(row, now, machines.get(row.id, 0)) for row in rows]


async def _revoke(session: AsyncSession, row: EnrollmentTokenRow, now: datetime) -> bool:
    """Guarded: False when it was revoked already (by another request, perhaps just now)."""
    done = await session.execute(
        update(EnrollmentTokenRow)
        .where(EnrollmentTokenRow.id == row.id, EnrollmentTokenRow.revoked_at.is_(None))
        .values(revoked_at=now)
        .execution_options(synchronize_session=False)
    )
    await session.refresh(row)
    return bool(done.rowcount)  # type: ignore[attr-defined]


async def revoke(
    session: AsyncSession, provider_id: str, token_id: str, now: datetime
) -> EnrollmentToken:
    """No machine registers with it any more; revoking it again changes nothing."""
    row = await _token(session, provider_id, token_id)
    await _revoke(session, row, now)
    return to_wire(row, now, (await _machines(session, [row.id])).get(row.id, 0))


async def rotate(
    session: AsyncSession,
    provider_id: str,
    token_id: str,
    now: datetime,
    valid_for: timedelta,
    base_url: str,
) -> IssuedEnrollmentToken:
    """A new token in place of this one, which is revoked in the same transaction."""
    row = await _token(session, provider_id, token_id)
    if not await _revoke(session, row, now):
        raise Conflict(
            f"enrollment token {row.prefix}… is revoked already; issue a new token instead"
        )
    return await issue_shown_once(session, provider_id, now, valid_for, base_url, replaces=row.id)


async def renewed(
    session: AsyncSession, token: str, now: datetime, valid_for: timedelta
) -> str | None:
    """The token if it still works, else a new one for its provider (`gpu-share up` keeps
    its local agent's token on disk, and a week later it has expired); None: unknown."""
    row = await session.scalar(
        select(EnrollmentTokenRow).where(EnrollmentTokenRow.token_hash == keys.hash_key(token))
    )
    if row is None:
        return None
    if state_of(row, now) is EnrollmentTokenState.ACTIVE:
        return token
    _, fresh = await issue(session, row.provider_id, now, valid_for)
    return fresh


async def provider_for(
    session: AsyncSession, token: str, now: datetime
) -> tuple[ProviderRow, EnrollmentTokenRow]:
    """Whose machine is registering, if the token still works; the refusal says why not
    and where a new token comes from."""
    row = await session.scalar(
        select(EnrollmentTokenRow).where(EnrollmentTokenRow.token_hash == keys.hash_key(token))
    )
    if row is None:
        raise Unauthorized(f"this enrollment token is unknown; {WHERE_TO_GET_ONE}")
    if row.revoked_at is not None:
        raise Unauthorized(
            f"enrollment token {row.prefix}… was revoked on {_when(row.revoked_at)}; "
            f"{WHERE_TO_GET_ONE}",
            details={"reason": "revoked", "revoked_at": row.revoked_at.isoformat()},
        )
    if row.expires_at is not None and row.expires_at <= now:
        raise Unauthorized(
            f"enrollment token {row.prefix}… expired on {_when(row.expires_at)}; "
            f"{WHERE_TO_GET_ONE}. Machines registered with it keep working",
            details={"reason": "expired", "expired_at": row.expires_at.isoformat()},
        )
    provider = await session.get(ProviderRow, row.provider_id)
    assert provider is not None  # foreign key
    return provider, row
