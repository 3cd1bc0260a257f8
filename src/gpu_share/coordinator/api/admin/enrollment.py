"""The admin's hand on a provider's enrollment tokens (Bearer gpu_admin_…): the same list,
issue, rotate and revoke as the provider's own, with a lifetime of the admin's choosing."""

from typing import Annotated

from fastapi import APIRouter, Body, Path

from gpu_share.coordinator.api.auth import AdminPrincipal
from gpu_share.coordinator.api.provider.enrollment import (
    ISSUING,
    TokenId,
    issued,
    listed,
    revoked,
)
from gpu_share.coordinator.api.responses import AUTH, errors
from gpu_share.coordinator.core.ids import id_pattern
from gpu_share.coordinator.http.replica import ReplicaDep
from gpu_share.protocol.providers import (
    EnrollmentToken,
    EnrollmentTokenRequest,
    IssuedEnrollmentToken,
)

router = APIRouter(prefix="/v1/admin/providers/{provider_id}/enrollment-tokens", tags=["admin"])

ProviderId = Annotated[str, Path(pattern=id_pattern("prv"), description="The provider's id")]
Lifetime = Annotated[EnrollmentTokenRequest | None, Body()]


@router.get("", response_model=list[EnrollmentToken], responses=errors(*AUTH, 404, 422))
async def list_tokens(
    provider_id: ProviderId, _admin: AdminPrincipal, replica: ReplicaDep
) -> list[EnrollmentToken]:
    return await listed(replica, provider_id)


@router.post("", **ISSUING)
async def issue_token(
    provider_id: ProviderId, _admin: AdminPrincipal, replica: ReplicaDep, body: Lifetime = None
) -> IssuedEnrollmentToken:
    """A new token for the provider, shown this once; `lifetime_days` overrides the default."""
    return await issued(replica, provider_id, body.lifetime_days if body else None)


@router.post("/{token_id}/rotate", **ISSUING)
async def rotate_token(
    provider_id: ProviderId,
    token_id: TokenId,
    _admin: AdminPrincipal,
    replica: ReplicaDep,
    body: Lifetime = None,
) -> IssuedEnrollmentToken:
    days = body.lifetime_days if body else None
    return await issued(replica, provider_id, days, rotating=token_id)


@router.post(
    "/{token_id}/revoke", response_model=EnrollmentToken, responses=errors(*AUTH, 404, 422)
)
async def revoke_token(
    provider_id: ProviderId, token_id: TokenId, _admin: AdminPrincipal, replica: ReplicaDep
) -> EnrollmentToken:
    return await revoked(replica, provider_id, token_id)
