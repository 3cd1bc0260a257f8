"""Tenant applications (SPEC §1.1): anyone applies for tenant access; an admin approves
(a tenant and its first key) or rejects with a reason.

    submit ─▶ unconfirmed ─ confirm (the mailed link) ─▶ pending ─┬─ approve ─▶ approved
                                                                  └─ reject ──▶ rejected

As with providers' applications, one counts only once its email is confirmed by the
link mailed to it: until then admins do not see it, and after `UNCONFIRMED_KEEP_DAYS`
it is deleted. Submitting answers the same whatever the email applied for before; only
the owner of the email, opening the link, hears that it already has one under review.
"""

from datetime import datetime, timedelta

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.db import one_at_a_time
from gpu_share.coordinator.core.errors import Conflict, NotFound
from gpu_share.coordinator.core.ids import new_id
from gpu_share.coordinator.core.orm import TenantApplicationRow
from gpu_share.coordinator.core.signing import UrlSigner
from gpu_share.coordinator.services.accounts.accounts import create_tenant
from gpu_share.coordinator.services.mail import mails
from gpu_share.protocol import accounts as wire
from gpu_share.protocol.common import ApplicationSubmitted

CONFIRM_TOKEN_PREFIX = "gpu_cf_"  # noqa: S105 (a prefix, not a secret)
CONFIRM_PURPOSE = "tenant-application-email"
UNCONFIRMED_KEEP_DAYS = 7
CONFIRMED = TenantApplicationRow.email_confirmed_at.is_not(None)


def to_wire(row: TenantApplicationRow) -> wire.TenantApplication:
    return wire.TenantApplication(
        id=row.id,
        name=row.name,
        email=row.email,
        company=row.company,
        intended_use=row.intended_use,
        status=wire.ApplicationStatus(row.status),
        reason=row.reason,
        tenant_id=row.tenant_id,
        created_at=row.created_at,
        decided_at=row.decided_at,
    )


def confirm_url(base_url: str, signer: UrlSigner, application_id: str) -> str:
    token = CONFIRM_TOKEN_PREFIX + signer.seal(CONFIRM_PURPOSE, application_id)
    return f"{base_url}/apply/tenant/confirm/{token}"


async def submit(
    session: AsyncSession,
    body: wire.TenantApplicationCreate,
    now: datetime,
    base_url: str,
    signer: UrlSigner,
) -> ApplicationSubmitted:
    """Keep the application, unconfirmed, and mail its email the link that confirms it.
    Nothing here looks at other applications of the email."""
    row = TenantApplicationRow(
        id=new_id("tapp"),
        name=body.name,
        email=body.email.lower(),
        company=body.company,
        intended_use=body.intended_use,
        status=wire.ApplicationStatus.PENDING.value,
        created_at=now,
        email_confirmed_at=None,
    )
    session.add(row)
    await session.flush()
    url = confirm_url(base_url, signer, row.id)
    return await mails.ask_to_confirm(
        session, row.id, row.email, "for tenant access", url, UNCONFIRMED_KEEP_DAYS, now
    )


async def confirm(
    session: AsyncSession, signer: UrlSigner, token: str, now: datetime
) -> wire.TenantApplication:
    """The applicant opened the mailed link: the application is reviewed from now on,
    unless this email already has one under review. Opening it again answers the same."""
    application_id = signer.unseal_token(CONFIRM_TOKEN_PREFIX, CONFIRM_PURPOSE, token)
    row = await session.get(TenantApplicationRow, application_id) if application_id else None
    expired = now - timedelta(days=UNCONFIRMED_KEEP_DAYS)
    if row is None or (row.email_confirmed_at is None and row.created_at <= expired):
        raise NotFound(
            "this link is not valid or has expired (an application not confirmed within "
            f"{UNCONFIRMED_KEEP_DAYS} days is deleted); apply again"
        )
    if row.email_confirmed_at is None:
        await _one_at_a_time(session, row.email)
        under_review = await session.scalar(
            select(TenantApplicationRow.id).where(
                TenantApplicationRow.email == row.email,
                TenantApplicationRow.status == wire.ApplicationStatus.PENDING.value,
                CONFIRMED,
            )
        )
        if under_review is not None:
            raise Conflict(
                "this email already has an application under review; an admin will write "
                "to you about it, so there is no need to apply again"
            )
        await session.execute(
            update(TenantApplicationRow)
            .where(
                TenantApplicationRow.id == row.id, TenantApplicationRow.email_confirmed_at.is_(None)
            )
            .values(email_confirmed_at=now)
        )
        await session.refresh(row)
    return to_wire(row)


async def _one_at_a_time(session: AsyncSession, email: str) -> None:
    """Confirmations of one email wait for each other, so two at once make one open
    application (SQLite's write transactions already run one at a time)."""
    await one_at_a_time(session, email)


async def forget_unconfirmed(session: AsyncSession, now: datetime) -> int:
    """Delete the applications whose email was not confirmed in time; how many."""
    gone = await session.execute(
        delete(TenantApplicationRow).where(
            TenantApplicationRow.email_confirmed_at.is_(None),
            TenantApplicationRow.created_at <= now - timedelta(days=UNCONFIRMED_KEEP_DAYS),
        )
    )
    return int(gone.rowcount or 0)  # type: ignore[attr-defined]


async def list_applications(
    session: AsyncSession, status: wire.ApplicationStatus | None
) -> list[wire.TenantApplication]:
    """The applications to review: those whose email is confirmed."""
    query = select(TenantApplicationRow).where(CONFIRMED).order_by(TenantApplicationRow.id)
    if status is not None:
        query = query.where(TenantApplicationRow.status == status.value)
    return [to_wire(row) for row in (await session.scalars(query)).all()]


async def _pending(session: AsyncSession, application_id: str) -> TenantApplicationRow:
    row = await session.get(TenantApplicationRow, application_id, with_for_update=True)
    if row is None or row.email_confirmed_at is None:  # not an application yet
        raise NotFound(f"tenant application {application_id} does not exist")
    if row.status != wire.ApplicationStatus.PENDING.value:
        raise Conflict(f"tenant application {application_id} was already {row.status}")
    return row


async def approve(session: AsyncSession, application_id: str, now: datetime) -> wire.TenantWithKey:
    row = await _pending(session, application_id)
    tenant = await create_tenant(session, wire.TenantCreate(name=row.name, email=row.email), now)
    row.status = wire.ApplicationStatus.APPROVED.value
    row.tenant_id = tenant.id
    row.decided_at = now
    return tenant


async def reject(
    session: AsyncSession, application_id: str, reason: str, now: datetime
) -> wire.TenantApplication:
    row = await _pending(session, application_id)
    row.status = wire.ApplicationStatus.REJECTED.value
    row.reason = reason
    row.decided_at = now
    return to_wire(row)
