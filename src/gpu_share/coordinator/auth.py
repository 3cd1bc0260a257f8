"""Who is calling: Bearer keys resolved to a `Principal`, and one dependency per role.

Missing, malformed, unknown or revoked key → 401; a valid key of another role → 403.
"""

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Request

from gpu_share.coordinator.api.deps import get_runtime
from gpu_share.coordinator.errors import Forbidden, Unauthorized
from gpu_share.coordinator.keys import hash_key
from gpu_share.coordinator.runtime import Runtime
from gpu_share.coordinator.services.accounts import Principal, authenticate
from gpu_share.protocol.accounts import Role

_ROLE_NAMES = {
    Role.TENANT: "a tenant key (gpu_sk_…)",
    Role.PROVIDER: "a provider key (gpu_pk_…)",
    Role.AGENT: "an agent node key (gpu_ak_…)",
    Role.ADMIN: "an admin key (gpu_admin_…)",
}


def bearer_key(request: Request) -> str:
    header = request.headers.get("authorization")
    if not header:
        raise Unauthorized("missing Authorization header; send 'Authorization: Bearer <API key>'")
    scheme, _, key = header.partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key or " " in key:
        raise Unauthorized("malformed Authorization header; expected 'Bearer <API key>'")
    if len(key) > 200 or not key.isascii():
        raise Unauthorized("API key is unknown or revoked; ask an admin for a new one")
    return key


async def current_principal(
    request: Request, runtime: Annotated[Runtime, Depends(get_runtime)]
) -> Principal:
    key = bearer_key(request)
    key_hash = hash_key(key)
    if (cached := runtime.principals.get(key_hash)) is not None:
        return cached
    async with runtime.db.read() as session:
        principal = await authenticate(session, key)
    runtime.principals.put(key_hash, principal)
    return principal


def require(*roles: Role) -> Callable[..., Awaitable[Principal]]:
    wanted = " or ".join(_ROLE_NAMES[r] for r in roles)

    async def dependency(
        principal: Annotated[Principal, Depends(current_principal)],
    ) -> Principal:
        if principal.role not in roles:
            raise Forbidden(
                f"this endpoint needs {wanted}; the key sent is {_ROLE_NAMES[principal.role]}"
            )
        return principal

    return dependency


TenantPrincipal = Annotated[Principal, Depends(require(Role.TENANT))]
AdminPrincipal = Annotated[Principal, Depends(require(Role.ADMIN))]
ProviderPrincipal = Annotated[Principal, Depends(require(Role.PROVIDER))]
AgentPrincipal = Annotated[Principal, Depends(require(Role.AGENT))]
