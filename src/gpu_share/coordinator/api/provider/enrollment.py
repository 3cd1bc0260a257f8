"""A provider's enrollment tokens (Bearer gpu_pk_…): list them with the machines each
enrolled, issue one, rotate one (a new token, the old revoked in the same step), revoke
one. Tokens live `GPUSHARE_ENROLLMENT_TOKEN_DAYS`; the secret is in the issuing answer only.
The admin's routes (`api/admin/enrollment.py`) go through the same calls below."""

from typing import Annotated, Any

from fastapi import APIRouter, Path

from gpu_share.coordinator.api.auth import ProviderPrincipal
from gpu_share.coordinator.api.responses import AUTH, errors
from gpu_share.coordinator.core.ids import id_pattern
from gpu_share.coordinator.http.replica import ReplicaDep, install_base
from gpu_share.coordinator.replica.state import Replica
from gpu_share.coordinator.services.providers import enrollment_tokens
from gpu_share.protocol.providers import EnrollmentToken, IssuedEnrollmentToken

router = APIRouter(prefix="/v1/provider/enrollment-tokens", tags=["provider"])

TokenId = Annotated[
    str, Path(pattern=id_pattern("enr"), description="The enrollment token's id (enr_…)")
]
# A route answering with a new token (rotating: 404 unknown, 409 revoked already).
ISSUING: dict[str, Any] = {
    "status_code": 201,
    "response_model": IssuedEnrollmentToken,
    "responses": errors(*AUTH, 404, 409, 422),
}


async def listed(replica: Replica, provider_id: str) -> list[EnrollmentToken]:
    async with replica.db.read() as session:
        return await enrollment_tokens.list_tokens(session, provider_id, replica.clock.now())


async def issued(
    replica: Replica, provider_id: str, days: int | None = None, *, rotating: str | None = None
) -> IssuedEnrollmentToken:
    """A new token (in place of `rotating`, revoked in the same transaction), living `days`
    or the platform's lifetime; its install command points at the public URL."""
    valid_for = enrollment_tokens.lifetime(replica.settings.enrollment_token_days, days)
    async with replica.db.write() as session:
        now = replica.clock.now()
        if rotating is None:
            return await enrollment_tokens.issue_shown_once(
                session, provider_id, now, valid_for, install_base(replica)
            )
        return await enrollment_tokens.rotate(
            session, provider_id, rotating, now, valid_for, install_base(replica)
        )


async def revoked(replica: Replica, provider_id: str, token_id: str) -> EnrollmentToken:
    async with replica.db.write() as session:
        return await enrollment_tokens.revoke(session, provider_id, token_id, replica.clock.now())


@router.get("", response_model=list[EnrollmentToken], responses=errors(*AUTH))
async def list_tokens(provider: ProviderPrincipal, replica: ReplicaDep) -> list[EnrollmentToken]:
    """Newest first: prefix, state (active, expired, revoked) and machines enrolled."""
    return await listed(replica, provider.provider_id)


@router.post(
    "", status_code=201, response_model=IssuedEnrollmentToken, responses=errors(*AUTH, 409)
)
async def issue_token(provider: ProviderPrincipal, replica: ReplicaDep) -> IssuedEnrollmentToken:
    """A new token and its install command, shown this once (409 past 20 in force)."""
    return await issued(replica, provider.provider_id)


@router.post("/{token_id}/rotate", **ISSUING)
async def rotate_token(
    token_id: TokenId, provider: ProviderPrincipal, replica: ReplicaDep
) -> IssuedEnrollmentToken:
    """A new token in place of this one, which stops registering machines at once (409:
    it was revoked already). Machines registered with it keep working."""
    return await issued(replica, provider.provider_id, rotating=token_id)


@router.post(
    "/{token_id}/revoke", response_model=EnrollmentToken, responses=errors(*AUTH, 404, 422)
)
async def revoke_token(
    token_id: TokenId, provider: ProviderPrincipal, replica: ReplicaDep
) -> EnrollmentToken:
    """No machine registers with it any more; machines registered with it keep working."""
    return await revoked(replica, provider.provider_id, token_id)
