"""Dedicated reservations (SPEC §4.3) as flows: whole GPUs of one node for a period.

The request is checked with the coordinator's own `ReservationRequest` before it is
sent. Reserving and canceling move money, so neither is sent twice on its own: a
reservation made by a request whose answer was lost shows in `reservations()`.
"""

from datetime import datetime
from decimal import Decimal
from typing import TypedDict

from gpu_share.protocol.common import Page
from gpu_share.protocol.nodes import Tier
from gpu_share.protocol.reservations import Reservation, ReservationQuote, ReservationRequest
from gpu_share.sdk._api import _id, validated
from gpu_share.sdk._config import ClientConfig
from gpu_share.sdk._http import ApiRequest, Flow, parse, send

PATH = "/v1/reservations"


class ReservationFields(TypedDict, total=False):
    """The fields of `ReservationRequest`: `node_id` or filters, `gpus`, and the period as
    `hours` or `ends_at`, from `starts_at` (a whole minute, UTC) or now."""

    gpus: int
    node_id: str
    starts_at: datetime | str
    ends_at: datetime | str
    hours: int
    gpu_model: str
    min_vram_gb: float
    region: str
    tier: Tier | str
    max_price: Decimal | float | str
    min_reliability: float
    require_verified: bool  # default true: only a node whose hardware is all proven


def request_body(fields: ReservationFields) -> dict[str, object]:
    body = validated(ReservationRequest, fields)
    # require_verified left out at its default (true): a coordinator from before it accepts
    # the body, and one since applies the same default.
    unset = {"require_verified"} if body.require_verified else None
    return body.model_dump(mode="json", exclude_none=True, exclude=unset)


def quote_reservation(c: ClientConfig, fields: ReservationFields) -> Flow[ReservationQuote]:
    request = ApiRequest("POST", f"{PATH}/quote", json=request_body(fields))
    response = yield from send(request, c)
    return parse(response, ReservationQuote)


def reserve(c: ClientConfig, fields: ReservationFields) -> Flow[Reservation]:
    request = ApiRequest("POST", PATH, json=request_body(fields), safe=False)
    response = yield from send(request, c)
    return parse(response, Reservation)


def list_reservations(c: ClientConfig, *, limit: int = 100) -> Flow[Page[Reservation]]:
    response = yield from send(ApiRequest("GET", PATH, params={"limit": limit}), c)
    return parse(response, Page[Reservation])


def get_reservation(c: ClientConfig, reservation_id: str) -> Flow[Reservation]:
    response = yield from send(ApiRequest("GET", f"{PATH}/{_id(reservation_id)}"), c)
    return parse(response, Reservation)


def cancel_reservation(c: ClientConfig, reservation_id: str) -> Flow[Reservation]:
    # A second cancel answers 409 (already canceled): not retried, so a lost answer to
    # the first is not reported as that conflict.
    request = ApiRequest("POST", f"{PATH}/{_id(reservation_id)}/cancel", safe=False)
    response = yield from send(request, c)
    return parse(response, Reservation)
