"""One way to learn who is calling, for HTTP routes and WebSockets alike.

A Bearer key is resolved to a typed principal (`core.principals`) through the
replica's key cache; each role has one dependency that yields its principal type.
Missing, malformed, unknown or revoked key → 401; a valid key of another role → 403.
A WebSocket gets the same answers as a close with code 1008 before it is accepted.
"""

import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, TypeVar

from fastapi import Depends, Query, Security, WebSocketException
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.requests import HTTPConnection

from gpu_share.coordinator.api.paths import ArtifactId
from gpu_share.coordinator.core.errors import ApiError, Forbidden
from gpu_share.coordinator.core.principals import (
    ROLE_NAMES,
    AdminCaller,
    NodeCaller,
    Principal,
    ProviderCaller,
    TenantCaller,
)
from gpu_share.coordinator.http.principals import bearer_key, principal_of_connection
from gpu_share.coordinator.http.replica import ReplicaDep
from gpu_share.coordinator.replica.state import Replica

P = TypeVar("P", bound=Principal)

POLICY_VIOLATION = 1008  # the WebSocket close code for "not allowed"


def _role_check(principal: Principal, *kinds: type[Principal]) -> None:
    if not isinstance(principal, kinds):
        wanted = " or ".join(ROLE_NAMES[kind.role] for kind in kinds)
        raise Forbidden(
            f"this endpoint needs {wanted}; the key sent is {ROLE_NAMES[principal.role]}"
        )


# Declares the Bearer scheme in the OpenAPI document, so Swagger UI's "Authorize"
# sends the key; the checking itself is ours (`principal_of_connection`).
_BEARER = HTTPBearer(
    auto_error=False,
    scheme_name="bearerAuth",
    description="An API key: gpu_sk_… (tenant), gpu_pk_… (provider), gpu_ak_… (agent node) "
    "or gpu_admin_… (admin)",
)
Documented = Annotated[HTTPAuthorizationCredentials | None, Security(_BEARER)]


def _check(*kinds: type[Principal]) -> Callable[[HTTPConnection, Replica], Awaitable[Principal]]:
    async def check(connection: HTTPConnection, replica: Replica) -> Principal:
        principal = await principal_of_connection(connection, replica)
        _role_check(principal, *kinds)
        return principal

    return check


def require(kind: type[P]) -> Callable[..., Awaitable[P]]:
    """A dependency yielding the caller as `kind`, or answering 401/403."""
    check = _check(kind)

    async def dependency(connection: HTTPConnection, replica: ReplicaDep, _scheme: Documented) -> P:
        principal = await check(connection, replica)
        assert isinstance(principal, kind)
        return principal

    return dependency


def require_any(*kinds: type[Principal]) -> Callable[..., Awaitable[Principal]]:
    check = _check(*kinds)

    async def dependency(
        connection: HTTPConnection, replica: ReplicaDep, _scheme: Documented
    ) -> Principal:
        return await check(connection, replica)

    return dependency


def require_on_websocket(kind: type[P]) -> Callable[..., Awaitable[P]]:
    """The same check for a WebSocket: refusals close it (1008) with the same message."""
    check = _check(kind)

    async def dependency(connection: HTTPConnection, replica: ReplicaDep) -> P:
        try:
            principal = await check(connection, replica)
        except ApiError as exc:
            raise WebSocketException(POLICY_VIOLATION, reason=exc.message[:120]) from exc
        assert isinstance(principal, kind)
        return principal

    return dependency


async def _scraper(connection: HTTPConnection, replica: ReplicaDep, _scheme: Documented) -> None:
    """Prometheus, with the operator's metrics token (`GPUSHARE_METRICS_TOKEN`), or an admin."""
    token = replica.settings.metrics_token
    key = bearer_key(connection)
    if token is not None and hmac.compare_digest(key.encode(), token.get_secret_value().encode()):
        return
    principal = await principal_of_connection(connection, replica)
    _role_check(principal, AdminCaller)


TenantPrincipal = Annotated[TenantCaller, Depends(require(TenantCaller))]
ProviderPrincipal = Annotated[ProviderCaller, Depends(require(ProviderCaller))]
NodePrincipal = Annotated[NodeCaller, Depends(require(NodeCaller))]
AdminPrincipal = Annotated[AdminCaller, Depends(require(AdminCaller))]
TenantOrAdmin = Annotated[Principal, Depends(require_any(TenantCaller, AdminCaller))]
NodeChannel = Annotated[NodeCaller, Depends(require_on_websocket(NodeCaller))]
Scraper = Annotated[None, Depends(_scraper)]


@dataclass(frozen=True)
class SignedLink:
    """A download authorized by a signed token in the URL (handed to an agent with a job)."""

    artifact_id: str


async def artifact_reader(
    artifact_id: ArtifactId,
    connection: HTTPConnection,
    replica: ReplicaDep,
    _scheme: Documented,
    token: Annotated[
        str | None,
        Query(
            max_length=200, description="Signed token in URLs handed to agents (instead of a key)"
        ),
    ] = None,
) -> TenantCaller | SignedLink:
    """Who may read an artifact's bytes: its owner's key, or a signed link to it."""
    if token is not None:
        replica.signer.verify(token, artifact_id, replica.clock.now())
        return SignedLink(artifact_id)
    tenant = await _check(TenantCaller)(connection, replica)
    assert isinstance(tenant, TenantCaller)
    return tenant


ArtifactReader = Annotated[TenantCaller | SignedLink, Depends(artifact_reader)]
