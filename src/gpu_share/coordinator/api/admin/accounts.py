"""Admin: tenants, keys and tenant applications (SPEC §1.1)."""

from fastapi import APIRouter

from gpu_share.coordinator.api.auth import AdminPrincipal
from gpu_share.coordinator.api.paths import KeyId, TenantApplicationId, TenantId
from gpu_share.coordinator.api.responses import AUTH, errors
from gpu_share.coordinator.http.replica import ReplicaDep
from gpu_share.coordinator.services.accounts import accounts, tenant_applications
from gpu_share.coordinator.services.providers import enrollment_tokens, providers
from gpu_share.protocol import accounts as wire
from gpu_share.protocol.providers import Provider, ProviderCreate, ProviderWithCredentials

router = APIRouter(prefix="/v1/admin", tags=["admin"])


@router.post(
    "/tenants", status_code=201, response_model=wire.TenantWithKey, responses=errors(*AUTH, 422)
)
async def create_tenant(
    body: wire.TenantCreate, _admin: AdminPrincipal, replica: ReplicaDep
) -> wire.TenantWithKey:
    """Create a tenant with its first key; the key is in this answer only."""
    async with replica.db.write() as session:
        return await accounts.create_tenant(session, body, replica.clock.now())


@router.get("/tenants", response_model=list[wire.Tenant], responses=errors(*AUTH))
async def list_tenants(_admin: AdminPrincipal, replica: ReplicaDep) -> list[wire.Tenant]:
    async with replica.db.read() as session:
        return await accounts.list_tenants(session)


@router.post(
    "/tenants/{tenant_id}/keys",
    status_code=201,
    response_model=wire.IssuedKey,
    responses=errors(*AUTH, 404),
)
async def issue_tenant_key(
    tenant_id: TenantId, _admin: AdminPrincipal, replica: ReplicaDep
) -> wire.IssuedKey:
    """Another key for the tenant, e.g. to rotate: issue, switch over, revoke the old one."""
    async with replica.db.write() as session:
        return await accounts.issue_tenant_key(session, tenant_id, replica.clock.now())


@router.get("/keys", response_model=list[wire.KeyInfo], responses=errors(*AUTH, 422))
async def list_keys(
    _admin: AdminPrincipal, replica: ReplicaDep, role: wire.Role | None = None
) -> list[wire.KeyInfo]:
    """Every key's id, role, owner and prefix; never the key itself."""
    async with replica.db.read() as session:
        return await accounts.list_keys(session, role)


@router.post(
    "/keys/{key_id}/revoke", response_model=wire.KeyInfo, responses=errors(*AUTH, 404, 409)
)
async def revoke_key(key_id: KeyId, admin: AdminPrincipal, replica: ReplicaDep) -> wire.KeyInfo:
    """Revoke any key; it answers 401 from the next request on. Revoking twice is harmless."""
    async with replica.db.write() as session:
        revoked = await accounts.revoke_key(
            session, key_id, replica.clock.now(), caller_key_id=admin.key_id
        )
    replica.key_cache.clear()
    return revoked


@router.get(
    "/tenant-applications",
    response_model=list[wire.TenantApplication],
    responses=errors(*AUTH, 422),
)
async def list_tenant_applications(
    _admin: AdminPrincipal, replica: ReplicaDep, status: wire.ApplicationStatus | None = None
) -> list[wire.TenantApplication]:
    """The applications whose email is confirmed (the others are nobody's yet)."""
    async with replica.db.read() as session:
        return await tenant_applications.list_applications(session, status)


@router.post(
    "/tenant-applications/{application_id}/approve",
    status_code=201,
    response_model=wire.TenantWithKey,
    responses=errors(*AUTH, 404, 409),
)
async def approve_tenant_application(
    application_id: TenantApplicationId, _admin: AdminPrincipal, replica: ReplicaDep
) -> wire.TenantWithKey:
    """Create the tenant; its first key is in this answer only."""
    async with replica.db.write() as session:
        return await tenant_applications.approve(session, application_id, replica.clock.now())


@router.post(
    "/tenant-applications/{application_id}/reject",
    response_model=wire.TenantApplication,
    responses=errors(*AUTH, 404, 409, 422),
)
async def reject_tenant_application(
    application_id: TenantApplicationId,
    body: wire.Rejection,
    _admin: AdminPrincipal,
    replica: ReplicaDep,
) -> wire.TenantApplication:
    async with replica.db.write() as session:
        return await tenant_applications.reject(
            session, application_id, body.reason, replica.clock.now()
        )


@router.post(
    "/providers",
    status_code=201,
    response_model=ProviderWithCredentials,
    responses=errors(*AUTH, 422),
)
async def create_provider(
    body: ProviderCreate, _admin: AdminPrincipal, replica: ReplicaDep
) -> ProviderWithCredentials:
    """A provider with its key and an agent enrollment token (both shown once)."""
    async with replica.db.write() as session:
        return await providers.create_provider(
            session,
            body,
            replica.clock.now(),
            token_lifetime=enrollment_tokens.lifetime(replica.settings.enrollment_token_days),
        )


@router.get("/providers", response_model=list[Provider], responses=errors(*AUTH))
async def list_providers(_admin: AdminPrincipal, replica: ReplicaDep) -> list[Provider]:
    async with replica.db.read() as session:
        return await providers.list_providers(session)
