"""The tenant's Reservations page (SPEC §4.3, dedicated): quote, then confirm; the list
with each one's status; cancel. Same services and rules as `/v1/reservations`."""

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import ValidationError

from gpu_share.coordinator.core.errors import ApiError
from gpu_share.coordinator.core.ids import is_id
from gpu_share.coordinator.core.principals import TenantCaller
from gpu_share.coordinator.services.money import tenant_billing
from gpu_share.coordinator.services.rentals import reservation_billing, reservations
from gpu_share.coordinator.web.pages import Browser, SignedTenant, form_of, text, typed
from gpu_share.coordinator.web.tenant.invokes import not_found
from gpu_share.protocol.reservations import (
    MAX_HOURS,
    ReservationQuote,
    ReservationRequest,
    ReservationStatus,
)

router = APIRouter(include_in_schema=False)

FIELDS = ("node_id", "gpus", "hours", "starts_at", "gpu_model", "region", "max_price")


def _request(values: dict[str, str]) -> tuple[ReservationRequest | None, dict[str, str]]:
    """The form as a request, or what is wrong with each field."""
    given: dict[str, Any] = {k: v for k, v in values.items() if v}
    if "starts_at" in given and len(given["starts_at"]) == 16:  # <input type=datetime-local>
        given["starts_at"] += ":00Z"
    try:
        return ReservationRequest.model_validate(given), {}
    except ValidationError as exc:
        errors: dict[str, str] = {}
        for problem in exc.errors():
            name = str(problem["loc"][0]) if problem["loc"] else "form"
            errors.setdefault(name, str(problem["msg"]).removeprefix("Value error, "))
        return None, errors


def _problem(exc: ApiError) -> str:
    return exc.message


async def _page(
    browser: Browser,
    tenant: TenantCaller,
    *,
    values: dict[str, str] | None = None,
    errors: dict[str, str] | None = None,
    quote: ReservationQuote | None = None,
    problem: str | None = None,
    status: int = 200,
) -> Response:
    replica = browser.replica
    async with replica.db.read() as session:
        found = await reservations.list_for_tenant(session, tenant.tenant_id)
        balance = await tenant_billing.balance(session, tenant.tenant_id, replica.settings)
    return browser.render(
        "tenant/reservations.html",
        status=status,
        reservations=found,
        balance=balance,
        values=values or {"gpus": "1", "hours": "1"},
        errors=errors or {},
        quote=quote,
        problem=problem,
        max_hours=MAX_HOURS,
        live={ReservationStatus.PENDING, ReservationStatus.ACTIVE},
    )


@router.get("/console/reservations")
async def reservations_page(request: Request, signed: SignedTenant) -> Response:
    browser, tenant = signed
    if "quote" not in request.query_params:
        return await _page(browser, tenant)
    values = {name: request.query_params.get(name, "").strip() for name in FIELDS}
    values["max_price"] = request.query_params.get("max_price", "")  # money: as typed
    body, errors = _request(values)
    if body is None:
        return await _page(browser, tenant, values=values, errors=errors, status=422)
    try:
        async with browser.replica.db.read() as session:
            quote = await reservations.quote(
                session, tenant.tenant_id, body, browser.now(), browser.replica.settings
            )
    except ApiError as exc:
        return await _page(browser, tenant, values=values, problem=_problem(exc), status=exc.status)
    return await _page(browser, tenant, values=values, quote=quote)


@router.post("/console/reservations")
async def create_reservation(signed: SignedTenant) -> Response:
    browser, tenant = signed
    form = await form_of(browser)
    values = {name: text(form, name) for name in FIELDS}
    values["max_price"] = typed(form, "max_price")
    body, errors = _request(values)
    if body is None:
        return await _page(browser, tenant, values=values, errors=errors, status=422)
    try:
        made = await reservations.book(
            browser.replica.db, tenant.tenant_id, body, browser.now(), browser.replica.settings
        )
    except ApiError as exc:
        return await _page(browser, tenant, values=values, problem=_problem(exc), status=exc.status)
    return browser.redirect(
        "/console/reservations",
        flash=f"Reservation {made.id} is made: {made.gpus} GPU(s) of {made.node_id} for "
        f"{made.hours} h, {made.cost} USDC.",
    )


@router.post("/console/reservations/{reservation_id}/cancel")
async def cancel_reservation(reservation_id: str, signed: SignedTenant) -> Response:
    browser, tenant = signed
    await form_of(browser)
    if not is_id("rsv", reservation_id):
        return not_found(browser, "reservation")
    try:
        async with browser.replica.db.write() as session:
            canceled = await reservation_billing.cancel(
                session, tenant.tenant_id, reservation_id, browser.now()
            )
    except ApiError as exc:
        if exc.status == 404:
            return not_found(browser, "reservation")
        return await _page(browser, tenant, problem=_problem(exc), status=exc.status)
    return browser.redirect(
        "/console/reservations",
        flash=f"Reservation {canceled.id} is canceled; it cost {canceled.cost} USDC.",
    )
