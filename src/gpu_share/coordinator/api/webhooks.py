"""The routes of signed webhooks (docs/webhooks.md), the same for tenants
(`tenant/webhooks`, /v1/webhooks) and providers (`provider/webhooks`,
/v1/provider/webhooks): the account's signing secret, its endpoints, and the delivery
log it reads and replays. Each account sees only its own; another's ids are not found."""

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import APIRouter, Depends, Query

from gpu_share.coordinator.api.responses import AUTH, errors
from gpu_share.coordinator.core.principals import Principal
from gpu_share.coordinator.http.replica import ReplicaDep
from gpu_share.coordinator.services.webhooks import deliveries, endpoints, signing_keys
from gpu_share.protocol.webhooks import (
    DeliveryStatus,
    WebhookDelivery,
    WebhookDeliveryDetail,
    WebhookEndpoint,
    WebhookEndpointCreate,
    WebhookEndpointCreated,
    WebhookSecret,
)


def build(prefix: str, caller: Callable[..., Awaitable[Principal]]) -> APIRouter:
    """The webhook routes under `prefix`, for the callers `caller` lets in."""
    router = APIRouter(prefix=prefix, tags=["webhooks"])
    Caller = Annotated[Principal, Depends(caller)]

    @router.post(
        "/secret/rotate", status_code=201, response_model=WebhookSecret, responses=errors(*AUTH)
    )
    async def rotate_secret(caller: Caller, replica: ReplicaDep) -> WebhookSecret:
        """Your signing secret, shown this once: the first, or a new one. After a rotation the
        previous secret signs deliveries too for 24 hours (`previous_valid_until`)."""
        owner = endpoints.account_of(caller).owner_id
        async with replica.db.write() as session:
            return await signing_keys.rotate(session, owner, replica.clock.now())

    @router.post(
        "/endpoints",
        status_code=201,
        response_model=WebhookEndpointCreated,
        responses=errors(*AUTH, 422),
    )
    async def create_endpoint(
        body: WebhookEndpointCreate, caller: Caller, replica: ReplicaDep
    ) -> WebhookEndpointCreated:
        """A URL that receives your account's events of the types named. Its answer carries
        your signing secret when this creates it (your first endpoint), never again."""
        async with replica.db.write() as session:
            return await endpoints.create(
                session, endpoints.account_of(caller), body, replica.settings, replica.clock.now()
            )

    @router.get("/endpoints", response_model=list[WebhookEndpoint], responses=errors(*AUTH))
    async def list_endpoints(caller: Caller, replica: ReplicaDep) -> list[WebhookEndpoint]:
        async with replica.db.read() as session:
            return await endpoints.list_for(session, endpoints.account_of(caller).owner_id)

    @router.delete("/endpoints/{endpoint_id}", status_code=204, responses=errors(*AUTH, 404))
    async def delete_endpoint(endpoint_id: str, caller: Caller, replica: ReplicaDep) -> None:
        """It takes no new event; deliveries already queued for it are still sent."""
        async with replica.db.write() as session:
            await endpoints.remove(session, endpoints.account_of(caller).owner_id, endpoint_id)

    @router.get("/deliveries", response_model=list[WebhookDelivery], responses=errors(*AUTH, 422))
    async def list_deliveries(
        caller: Caller,
        replica: ReplicaDep,
        status: DeliveryStatus | None = None,
        limit: Annotated[int, Query(ge=1, le=500)] = 100,
    ) -> list[WebhookDelivery]:
        """Your deliveries, newest first; `status` keeps pending, delivered or failed ones."""
        owner = endpoints.account_of(caller).owner_id
        async with replica.db.read() as session:
            return await deliveries.list_for(session, owner, status=status, limit=limit)

    @router.get(
        "/deliveries/{delivery_id}",
        response_model=WebhookDeliveryDetail,
        responses=errors(*AUTH, 404),
    )
    async def get_delivery(
        delivery_id: str, caller: Caller, replica: ReplicaDep
    ) -> WebhookDeliveryDetail:
        """The body sent and every attempt: when, the answer or the error, how long it took."""
        owner = endpoints.account_of(caller).owner_id
        async with replica.db.read() as session:
            return await deliveries.detail(session, owner, delivery_id)

    @router.post(
        "/deliveries/{delivery_id}/replay",
        status_code=202,
        response_model=WebhookDelivery,
        responses=errors(*AUTH, 404),
    )
    async def replay_delivery(
        delivery_id: str, caller: Caller, replica: ReplicaDep
    ) -> WebhookDelivery:
        """Send it again within seconds, with the same webhook-id (receivers drop duplicates
        by it), retried anew for the retry window if it fails."""
        owner = endpoints.account_of(caller).owner_id
        async with replica.db.write() as session:
            return await deliveries.replay(session, owner, delivery_id, replica.clock.now())

    return router
