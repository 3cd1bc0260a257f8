"""The account's webhooks (docs/webhooks.md) as flows: endpoints, the signing secret,
and the delivery log. Verifying a delivery is `_webhooks.verify_webhook`.

The secret is shown only in the answer that makes it, so neither adding the first
endpoint nor rotating is sent twice on its own: a retry after a lost answer would
rotate past the secret shown, or make a second endpoint that shows none. A replay may
be sent again: receivers drop the duplicate by its unchanged webhook-id.
"""

from collections.abc import Sequence

from gpu_share.protocol.webhooks import (
    TENANT_EVENTS,
    DeliveryStatus,
    WebhookDelivery,
    WebhookDeliveryDetail,
    WebhookEndpoint,
    WebhookEndpointCreate,
    WebhookEndpointCreated,
    WebhookSecret,
)
from gpu_share.sdk._api import _choice, _id, validated
from gpu_share.sdk._config import ClientConfig
from gpu_share.sdk._http import ApiRequest, Flow, parse, parse_list, send

PATH = "/v1/webhooks"


def add_endpoint(
    c: ClientConfig, url: str, events: Sequence[str] = TENANT_EVENTS
) -> Flow[WebhookEndpointCreated]:
    body = validated(WebhookEndpointCreate, {"url": url, "event_types": list(events)})
    request = ApiRequest("POST", f"{PATH}/endpoints", json=body.model_dump(mode="json"), safe=False)
    response = yield from send(request, c)
    return parse(response, WebhookEndpointCreated)


def list_endpoints(c: ClientConfig) -> Flow[list[WebhookEndpoint]]:
    response = yield from send(ApiRequest("GET", f"{PATH}/endpoints"), c)
    return parse_list(response, WebhookEndpoint)


def delete_endpoint(c: ClientConfig, endpoint_id: str) -> Flow[None]:
    # A second delete answers 404: not retried, so a lost answer to the first is not
    # reported as NotFound.
    request = ApiRequest("DELETE", f"{PATH}/endpoints/{_id(endpoint_id)}", safe=False)
    yield from send(request, c)


def rotate_secret(c: ClientConfig) -> Flow[WebhookSecret]:
    response = yield from send(ApiRequest("POST", f"{PATH}/secret/rotate", safe=False), c)
    return parse(response, WebhookSecret)


def list_deliveries(
    c: ClientConfig, *, status: DeliveryStatus | str | None = None, limit: int = 100
) -> Flow[list[WebhookDelivery]]:
    params: dict[str, str | int] = {"limit": limit}
    if status is not None:
        params["status"] = _choice(DeliveryStatus, status, "status").value
    response = yield from send(ApiRequest("GET", f"{PATH}/deliveries", params=params), c)
    return parse_list(response, WebhookDelivery)


def get_delivery(c: ClientConfig, delivery_id: str) -> Flow[WebhookDeliveryDetail]:
    response = yield from send(ApiRequest("GET", f"{PATH}/deliveries/{_id(delivery_id)}"), c)
    return parse(response, WebhookDeliveryDetail)


def replay_delivery(c: ClientConfig, delivery_id: str) -> Flow[WebhookDelivery]:
    request = ApiRequest("POST", f"{PATH}/deliveries/{_id(delivery_id)}/replay")
    response = yield from send(request, c)
    return parse(response, WebhookDelivery)
