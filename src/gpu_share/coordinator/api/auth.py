"""One way to learn who is calling, for HTTP routes and WebSockets alike.

A Bearer key is resolved to a typed principal (`core.principals`) through the
replica's key cache; each role has one dependency that yields its principal type.
Missing, malformed, unknown or revoked key → 401; a valid key of another role → 403.
A WebSocket gets the same answers as a close with code 1008 before it is accepted.
"""

import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Generic, TypeVar

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

P = TypeVar("P", bound=Principal)

POLICY_VIOLATION = 1008  # the WebSocket close code for "not allowed"


def _as_one_of(principal: Principal, kinds: tuple[type[P], ...]) -> P:
    """The principal, when it is one of `kinds`; else 403."""
    if isinstance(principal, kinds):
        return principal
    wanted = " or ".join(ROLE_NAMES[kind.role] for kind in kinds)
    raise Forbidden(f"this endpoint needs {wanted}; the key sent is {ROLE_NAMES[principal.role]}")


_SCHEME = "bearerAuth"
_KEYS = (
    "An API key: gpu_sk_… (tenant), gpu_pk_… (provider), gpu_ak_… (agent node) "
    "or gpu_admin_… (admin)"
)
# Declares the Bearer scheme in the OpenAPI document, so Swagger UI's "Authorize" sends
# the key, for the few routes whose check is not a `_Caller` (which declares it itself).
_BEARER = HTTPBearer(auto_error=False, scheme_name=_SCHEME, description=_KEYS)
Documented = Annotated[HTTPAuthorizationCredentials | None, Security(_BEARER)]


class _Caller(HTTPBearer, Generic[P]):
    """A dependency yielding the caller as one of `kinds`, or answering 401/403.

    It is the Bearer scheme itself, so the OpenAPI document declares the scheme for its
    routes with no dependency of its own: every authenticated request solved three
    dependencies for this (the check, the replica, the scheme's header parsing), and
    FastAPI's bookkeeping per dependency was a tenth of a heartbeat's CPU."""

    def __init__(self, *kinds: type[P]) -> None:
        super().__init__(auto_error=False, scheme_name=_SCHEME, description=_KEYS)
        self.kinds = kinds

    async def __call__(self, connection: HTTPConnection) -> P:  # type: ignore[override]
        principal = await principal_of_connection(connection, connection.app.state.replica)
        return _as_one_of(principal, self.kinds)


def require(kind: type[P]) -> Callable[..., Awaitable[P]]:
    """A dependency yielding the caller as `kind`, or answering 401/403."""
    return _Caller(kind)


def require_any(*kinds: type[Principal]) -> Callable[..., Awaitable[Principal]]:
    return _Caller(*kinds)


def require_on_websocket(kind: type[P]) -> Callable[..., Awaitable[P]]:
    """The same check for a WebSocket: refusals close it (1008) with the same message."""

    async def dependency(connection: HTTPConnection, replica: ReplicaDep) -> P:
        try:
            return _as_one_of(await principal_of_connection(connection, replica), (kind,))
        except ApiError as exc:
            raise WebSocketException(POLICY_VIOLATION, reason=exc.message[:120]) from exc

    return dependency


async def _scraper(connection: HTTPConnection, replica: ReplicaDep, _scheme: Documented) -> None:
    """Prometheus, with the operator's metrics token (`GPUSHARE_METRICS_TOKEN`), or an admin."""
    token = replica.settings.metrics_token
    key = bearer_key(connection)
    if token is not None and hmac.compare_digest(key.encode(), token.get_secret_value().encode()):
        return
    _as_one_of(await principal_of_connection(connection, replica), (AdminCaller,))


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
    return _as_one_of(await principal_of_connection(connection, replica), (TenantCaller,))


ArtifactReader = Annotated[TenantCaller | SignedLink, Depends(artifact_reader)]
