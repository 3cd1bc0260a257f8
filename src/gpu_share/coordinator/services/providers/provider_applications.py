"""Provider applications and their review (SPEC §3.1, §3.5), each decision mailed.

    submit ─▶ unconfirmed ── confirm (the mailed link) ──▶ pending ─┬─ approve (tier) ─▶ approved
                                                                 ├─ reject (reason) ─▶ rejected
                                                                 └─ request info ─▶ info_requested
    info_requested ── amend ──▶ pending

An application counts only once its email is confirmed: until then admins do not see
it, it blocks no one, and after `UNCONFIRMED_KEEP_DAYS` it is deleted. So anyone may
apply with any email and learns nothing of that email's other applications (submitting
answers the same either way); only the owner of the email, holding the link mailed to
it, hears that it already has an application under review.

The links (confirm, status) carry the application's id sealed by the coordinator
(`UrlSigner.seal`), each for its own purpose: every mail can repeat them, and nothing is
stored. The mail for each step is queued in the step's own transaction (`outbox`).
"""

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core import keys
from gpu_share.coordinator.core.errors import Conflict, NotFound, field_error
from gpu_share.coordinator.core.ids import new_id
from gpu_share.coordinator.core.orm import ProviderApplicationRow, ProviderRow
from gpu_share.coordinator.core.signing import UrlSigner
from gpu_share.coordinator.services.accounts.accounts import issue_key
from gpu_share.coordinator.services.mail import mails, outbox
from gpu_share.coordinator.services.nodes import gpu_catalog
from gpu_share.coordinator.services.providers import enrollment_tokens
from gpu_share.protocol import provider_applications as wire
from gpu_share.protocol.accounts import Role
from gpu_share.protocol.common import ApplicationSubmitted
from gpu_share.protocol.nodes import Tier

STATUS_TOKEN_PREFIX = "gpu_st_"  # noqa: S105 (a prefix, not a secret)
STATUS_PURPOSE = "application-status"
CONFIRM_TOKEN_PREFIX = "gpu_cf_"  # noqa: S105
CONFIRM_PURPOSE = "provider-application-email"
UNCONFIRMED_KEEP_DAYS = 7
CLAIM_TOKEN_PREFIX = "gpu_ct_"  # noqa: S105
CLAIM_VALID_DAYS = 14
OPEN = [s.value for s in wire.ApplicationStatus if s.open]
CONFIRMED = ProviderApplicationRow.email_confirmed_at.is_not(None)


def to_wire(row: ProviderApplicationRow) -> wire.ProviderApplication:
    return wire.ProviderApplication(
        id=row.id,
        status=wire.ApplicationStatus(row.status),
        full_name=row.full_name,
        email=row.email,
        company=row.company,
        gpus=[wire.GpuEntry.model_validate(gpu) for gpu in row.gpus],
        ups=row.ups,
        commitment_months=row.commitment_months,
        maintenance_notes=row.maintenance_notes,
        tier=Tier(row.tier) if row.tier else None,
        message=row.message,
        provider_id=row.provider_id,
        created_at=row.created_at,
        updated_at=row.updated_at,
        decided_at=row.decided_at,
    )


def _check_models(body: wire.ProviderApplicationCreate) -> None:
    for n, gpu in enumerate(body.gpus):
        if not gpu_catalog.is_known(gpu.model):
            raise field_error(
                f"gpus.{n}.model",
                f"{gpu.model!r} is not a supported model; pick one from "
                "GET /v1/provider/gpu-models, or 'other' and name it in other_model",
            )


def _normal_email(email: str) -> str:
    return email.strip().lower()


def _columns(body: wire.ProviderApplicationCreate) -> dict[str, object]:
    """What the applicant wrote, tidied, as the row stores it."""
    return {
        "full_name": body.full_name.strip(),
        "email": _normal_email(body.email),
        "company": (body.company or "").strip() or None,
        "gpus": [gpu.model_dump(mode="json") for gpu in body.gpus],
        "ups": body.ups,
        "commitment_months": body.commitment_months,
        "maintenance_notes": (body.maintenance_notes or "").strip() or None,
    }


def status_token(signer: UrlSigner, application_id: str) -> str:
    return STATUS_TOKEN_PREFIX + signer.seal(STATUS_PURPOSE, application_id)


def status_url(base_url: str, signer: UrlSigner, application_id: str) -> str:
    return f"{base_url}/apply/status/{status_token(signer, application_id)}"


def confirm_url(base_url: str, signer: UrlSigner, application_id: str) -> str:
    token = CONFIRM_TOKEN_PREFIX + signer.seal(CONFIRM_PURPOSE, application_id)
    return f"{base_url}/apply/confirm/{token}"


async def submit(
    session: AsyncSession,
    body: wire.ProviderApplicationCreate,
    now: datetime,
    base_url: str,
    signer: UrlSigner,
) -> ApplicationSubmitted:
    """Keep the application, unconfirmed, and mail its email the link that confirms it.

    Nothing here looks at other applications: the answer, and the time it takes, are
    the same whatever this email applied for before."""
    _check_models(body)
    row = ProviderApplicationRow(
        id=new_id("papp"),
        status=wire.ApplicationStatus.PENDING.value,
        created_at=now,
        updated_at=now,
        email_confirmed_at=None,
        **_columns(body),
    )
    session.add(row)
    await session.flush()
    url = confirm_url(base_url, signer, row.id)
    return await mails.ask_to_confirm(
        session, row.id, row.email, "to provide GPUs", url, UNCONFIRMED_KEEP_DAYS, now
    )


async def confirm(
    session: AsyncSession, signer: UrlSigner, token: str, now: datetime, base_url: str
) -> wire.ApplicationReceipt:
    """The applicant opened the mailed link: the application counts from now on, unless
    this email already has one under review. Opening the link again answers the same."""
    application_id = signer.unseal_token(CONFIRM_TOKEN_PREFIX, CONFIRM_PURPOSE, token)
    row = await session.get(ProviderApplicationRow, application_id) if application_id else None
    if row is None or (row.email_confirmed_at is None and _expired(row.created_at, now)):
        raise NotFound(
            "this link is not valid or has expired (an application not confirmed within "
            f"{UNCONFIRMED_KEEP_DAYS} days is deleted); apply again"
        )
    if row.email_confirmed_at is None:
        await _refuse_second_open(session, row.email, but=row.id)
        try:
            done = await session.execute(
                update(ProviderApplicationRow)
                .where(
                    ProviderApplicationRow.id == row.id,
                    ProviderApplicationRow.email_confirmed_at.is_(None),
                )
                .values(email_confirmed_at=now, updated_at=now)
            )
        except IntegrityError:  # another of this email's, confirmed at the same moment
            raise _second_open() from None
        await session.refresh(row)
        if done.rowcount == 1:  # type: ignore[attr-defined]
            url = status_url(base_url, signer, row.id)
            await outbox.enqueue(session, f"{row.id}:received", mails.received(row, url), now)
    return wire.ApplicationReceipt(
        **to_wire(row).model_dump(),
        status_token=status_token(signer, row.id),
        status_url=status_url(base_url, signer, row.id),
    )


def _expired(created_at: datetime, now: datetime) -> bool:
    return created_at <= now - timedelta(days=UNCONFIRMED_KEEP_DAYS)


async def forget_unconfirmed(session: AsyncSession, now: datetime) -> int:
    """Delete the applications whose email was not confirmed in time; how many."""
    gone = await session.execute(
        delete(ProviderApplicationRow).where(
            ProviderApplicationRow.email_confirmed_at.is_(None),
            ProviderApplicationRow.created_at <= now - timedelta(days=UNCONFIRMED_KEEP_DAYS),
        )
    )
    return int(gone.rowcount or 0)  # type: ignore[attr-defined]


async def _refuse_second_open(session: AsyncSession, email: str, *, but: str) -> None:
    existing = await session.scalar(
        select(ProviderApplicationRow.id).where(
            ProviderApplicationRow.email == email,
            ProviderApplicationRow.status.in_(OPEN),
            CONFIRMED,
            ProviderApplicationRow.id != but,
        )
    )
    if existing is not None:
        raise _second_open()


def _second_open() -> Conflict:
    return Conflict(
        "this email already has an application under review; follow it with the status "
        "link in the mail we sent when it was confirmed, instead of applying again"
    )


async def by_status_token(
    session: AsyncSession, signer: UrlSigner, token: str
) -> ProviderApplicationRow:
    sealed = (
        token.removeprefix(STATUS_TOKEN_PREFIX) if token.startswith(STATUS_TOKEN_PREFIX) else ""
    )
    application_id = signer.unseal(STATUS_PURPOSE, sealed)
    row = await session.get(ProviderApplicationRow, application_id) if application_id else None
    if row is None or row.email_confirmed_at is None:
        raise NotFound("no application has this status link; check the link in your mail")
    return row


async def amend(
    session: AsyncSession,
    signer: UrlSigner,
    token: str,
    body: wire.ProviderApplicationCreate,
    now: datetime,
) -> wire.ProviderApplication:
    """The applicant answers a request for more information; the application is pending again."""
    row = await by_status_token(session, signer, token)
    if row.status != wire.ApplicationStatus.INFO_REQUESTED.value:
        raise Conflict(
            f"this application is {row.status.replace('_', ' ')}; it can be changed only "
            "while more information is requested"
        )
    _check_models(body)
    if _normal_email(body.email) != row.email:
        # the email was confirmed; another one would be unconfirmed (and could be anyone's)
        raise field_error(
            "email", f"stays {row.email} on this application; to use another, apply again"
        )
    done = await session.execute(
        update(ProviderApplicationRow)
        .where(
            ProviderApplicationRow.id == row.id,
            ProviderApplicationRow.status == wire.ApplicationStatus.INFO_REQUESTED.value,
        )
        .values(status=wire.ApplicationStatus.PENDING.value, updated_at=now, **_columns(body))
    )
    if done.rowcount != 1:  # type: ignore[attr-defined]
        raise Conflict("the application changed meanwhile; reload it")
    await session.refresh(row)
    return to_wire(row)


async def list_applications(
    session: AsyncSession, status: wire.ApplicationStatus | None, limit: int = 200
) -> list[wire.ProviderApplication]:
    """The applications to review: those whose email is confirmed."""
    query = (
        select(ProviderApplicationRow)
        .where(CONFIRMED)
        .order_by(ProviderApplicationRow.id.desc())
        .limit(limit)
    )
    if status is not None:
        query = query.where(ProviderApplicationRow.status == status.value)
    return [to_wire(row) for row in (await session.scalars(query)).all()]


async def get(session: AsyncSession, application_id: str) -> wire.ProviderApplication:
    return to_wire(await _row(session, application_id))


async def _row(session: AsyncSession, application_id: str) -> ProviderApplicationRow:
    row = await session.get(ProviderApplicationRow, application_id)
    if row is None or row.email_confirmed_at is None:  # not an application yet
        raise NotFound(f"provider application {application_id} does not exist")
    return row


async def _decide(
    session: AsyncSession,
    application_id: str,
    leaving: list[str],
    now: datetime,
    **values: object,
) -> ProviderApplicationRow:
    """One guarded transition: two admins deciding at once cannot both win."""
    row = await _row(session, application_id)
    if row.status not in leaving:
        raise Conflict(
            f"provider application {application_id} is {row.status.replace('_', ' ')}; "
            "it cannot be decided again"
        )
    done = await session.execute(
        update(ProviderApplicationRow)
        .where(ProviderApplicationRow.id == row.id, ProviderApplicationRow.status.in_(leaving))
        .values(updated_at=now, decided_at=now, **values)
    )
    if done.rowcount != 1:  # type: ignore[attr-defined]
        raise Conflict(f"provider application {application_id} was decided meanwhile")
    await session.refresh(row)
    return row


async def approve(
    session: AsyncSession, application_id: str, tier: Tier, now: datetime, base_url: str
) -> wire.Approved:
    row = await _row(session, application_id)
    if tier is Tier.ENTERPRISE and not row.ups:
        raise field_error(
            "tier", "Enterprise needs a UPS and this application has none; approve as community"
        )
    provider = ProviderRow(
        id=new_id("prv"),
        name=row.company or row.full_name,
        email=row.email,
        tier=tier.value,
        created_at=now,
    )
    session.add(provider)
    await session.flush()
    claim = CLAIM_TOKEN_PREFIX + keys.generate_secret()
    provider.claim_token_hash = keys.hash_key(claim)
    provider.claim_expires_at = now + timedelta(days=CLAIM_VALID_DAYS)
    row = await _decide(
        session,
        application_id,
        OPEN,
        now,
        status=wire.ApplicationStatus.APPROVED.value,
        tier=tier.value,
        provider_id=provider.id,
        message=None,
    )
    url = claim_url(base_url, claim)
    await outbox.enqueue(
        session, f"{row.id}:approved", mails.approved(row, url, base_url, CLAIM_VALID_DAYS), now
    )
    return wire.Approved(application=to_wire(row), provider_id=provider.id, claim_url=url)


def claim_url(base_url: str, token: str) -> str:
    return f"{base_url}/provider/claim/{token}"


async def reject(
    session: AsyncSession, application_id: str, reason: str, now: datetime
) -> wire.ProviderApplication:
    row = await _decide(
        session,
        application_id,
        OPEN,
        now,
        status=wire.ApplicationStatus.REJECTED.value,
        message=reason.strip(),
    )
    await outbox.enqueue(session, f"{row.id}:rejected", mails.rejected(row), now)
    return to_wire(row)


async def request_info(
    session: AsyncSession,
    application_id: str,
    message: str,
    now: datetime,
    base_url: str,
    signer: UrlSigner,
) -> wire.ProviderApplication:
    row = await _decide(
        session,
        application_id,
        [wire.ApplicationStatus.PENDING.value],
        now,
        status=wire.ApplicationStatus.INFO_REQUESTED.value,
        message=message.strip(),
    )
    # Each request is its own mail: an applicant may be asked more than once.
    cause = f"{row.id}:info:{int(now.timestamp() * 1000)}"
    url = status_url(base_url, signer, row.id)
    await outbox.enqueue(session, cause, mails.info_requested(row, url), now)
    return to_wire(row)


class ClaimState(StrEnum):
    OPEN = "open"  # approved, not claimed yet: the page offers to show the key and token
    USED = "used"  # shown once already
    EXPIRED = "expired"
    UNKNOWN = "unknown"  # no such link (mistyped, cut short, or another coordinator's)


@dataclass(frozen=True)
class ClaimLink:
    """What a claim link's page says before it shows anything: opening it uses nothing up."""

    state: ClaimState
    used_at: datetime | None = None
    expires_at: datetime | None = None


async def claim_link(session: AsyncSession, token: str, now: datetime) -> ClaimLink:
    provider = await session.scalar(
        select(ProviderRow).where(ProviderRow.claim_token_hash == keys.hash_key(token))
    )
    if provider is None:
        return ClaimLink(ClaimState.UNKNOWN)
    expires_at = provider.claim_expires_at
    if provider.claimed_at is not None:
        return ClaimLink(ClaimState.USED, used_at=provider.claimed_at, expires_at=expires_at)
    if expires_at is None or expires_at <= now:
        return ClaimLink(ClaimState.EXPIRED, expires_at=expires_at)
    return ClaimLink(ClaimState.OPEN, expires_at=expires_at)


async def claim(
    session: AsyncSession, token: str, now: datetime, base_url: str, *, token_lifetime: timedelta
) -> wire.ProviderClaim:
    """The approved provider's first visit: their key and enrollment token, once."""
    provider = await session.scalar(
        select(ProviderRow).where(ProviderRow.claim_token_hash == keys.hash_key(token))
    )
    if provider is None:
        raise NotFound("this claim link is not valid; check the link in your approval mail")
    if provider.claimed_at is not None:
        raise Conflict(
            "this claim link was used already; the key was shown then. If it is lost, "
            "ask the platform admin for a new key"
        )
    if provider.claim_expires_at is None or provider.claim_expires_at <= now:
        raise Conflict("this claim link expired; ask the platform admin for a new one")
    done = await session.execute(
        update(ProviderRow)
        .where(ProviderRow.id == provider.id, ProviderRow.claimed_at.is_(None))
        .values(claimed_at=now)
    )
    if done.rowcount != 1:  # type: ignore[attr-defined]
        raise Conflict("this claim link was used already")
    _, api_key = await issue_key(session, Role.PROVIDER, now, provider_id=provider.id)
    _, enrollment = await enrollment_tokens.issue(session, provider.id, now, token_lifetime)
    return wire.ProviderClaim(
        provider_id=provider.id,
        api_key=api_key,
        enrollment_token=enrollment,
        install_command=mails.install_command(base_url, enrollment),
    )
