"""The Webhooks page, the same for tenants (/console/webhooks) and providers
(/provider/webhooks): the signing secret (rotated here, shown this once, never in a
redirect or a cookie), the endpoints (added and deleted), and the delivery log with
each attempt and a replay button. The same services as the API, so the page refuses
what the API refuses, and another account's ids are not found."""

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends
from fastapi.responses import Response
from pydantic import ValidationError

from gpu_share.coordinator.core.errors import NotFound, ValidationFailed
from gpu_share.coordinator.core.principals import Principal
from gpu_share.coordinator.services.webhooks import deliveries, endpoints, signing_keys
from gpu_share.coordinator.web.pages import Browser, form_of, text
from gpu_share.protocol.webhooks import DeliveryStatus, WebhookEndpointCreate, WebhookSecret

SHOWN = 50
STATUSES = {s.value for s in DeliveryStatus}


async def _page(
    browser: Browser,
    caller: Principal,
    at: str,
    *,
    status_filter: DeliveryStatus | None = None,
    secret: WebhookSecret | None = None,
    errors: dict[str, str] | None = None,
    values: dict[str, Any] | None = None,
    code: int = 200,
) -> Response:
    account = endpoints.account_of(caller)
    async with browser.replica.db.read() as db:
        has_secret = await signing_keys.has_secret(db, account.owner_id)
        hooks = await endpoints.list_for(db, account.owner_id)
        log = await deliveries.list_for(db, account.owner_id, status=status_filter, limit=SHOWN)
        attempts = await deliveries.attempts_of(db, [d.id for d in log])
    return browser.render(
        "webhooks.html",
        status=code,
        at=at,
        api_at="/v1/webhooks" if at.startswith("/console") else "/v1/provider/webhooks",
        has_secret=has_secret,
        secret=secret,
        endpoints=hooks,
        event_choices=account.events,
        deliveries=log,
        attempts=attempts,
        status_filter=status_filter.value if status_filter else "",
        statuses=[s.value for s in DeliveryStatus],
        errors=errors or {},
        values=values or {},
    )


def _not_found(browser: Browser, what: str) -> Response:
    return browser.render(
        "public/message.html",
        status=404,
        title="Not found",
        message=f"There is no {what} of yours with that id.",
    )


def build(at: str, signed: Callable[..., Awaitable[tuple[Browser, Any]]]) -> APIRouter:
    """The page's routes under `at`, for the signed-in callers `signed` lets in."""
    router = APIRouter(include_in_schema=False)
    Signed = Annotated[tuple[Browser, Principal], Depends(signed)]

    @router.get(at)
    async def webhooks_page(signed: Signed, status: str = "") -> Response:
        browser, caller = signed
        chosen = DeliveryStatus(status) if status in STATUSES else None
        return await _page(browser, caller, at, status_filter=chosen)

    @router.post(f"{at}/secret")
    async def rotate_secret(signed: Signed) -> Response:
        browser, caller = signed
        await form_of(browser)
        owner = endpoints.account_of(caller).owner_id
        async with browser.replica.db.write() as db:
            made = await signing_keys.rotate(db, owner, browser.now())
        return await _page(browser, caller, at, secret=made)  # shown once: rendered

    @router.post(f"{at}/endpoints")
    async def add_endpoint(signed: Signed) -> Response:
        browser, caller = signed
        form = await form_of(browser)
        values = {"url": text(form, "url"), "event_types": form.getlist("event_types")}
        try:
            body = WebhookEndpointCreate.model_validate(values)
            async with browser.replica.db.write() as db:
                made = await endpoints.create(
                    db,
                    endpoints.account_of(caller),
                    body,
                    browser.replica.settings,
                    browser.now(),
                )
        except ValidationError as exc:
            problem = exc.errors()[0]
            name = str(problem["loc"][0]) if problem["loc"] else "url"
            message = str(problem["msg"]).removeprefix("Value error, ")
            return await _page(browser, caller, at, errors={name: message}, values=values, code=422)
        except ValidationFailed as exc:
            name = exc.message.split(":", 1)[0]
            errors = {name if name in values else "url": exc.message.split(": ", 1)[-1]}
            return await _page(browser, caller, at, errors=errors, values=values, code=422)
        if made.secret is not None:
            secret = WebhookSecret(secret=made.secret, previous_valid_until=None)
            return await _page(browser, caller, at, secret=secret)
        return browser.redirect(f"{at}#endpoints", flash=f"Endpoint {made.url} added.")

    @router.post(f"{at}/endpoints/{{endpoint_id}}/delete")
    async def delete_endpoint(endpoint_id: str, signed: Signed) -> Response:
        browser, caller = signed
        await form_of(browser)
        try:
            async with browser.replica.db.write() as db:
                await endpoints.remove(db, endpoints.account_of(caller).owner_id, endpoint_id)
        except NotFound:
            return _not_found(browser, "webhook endpoint")
        return browser.redirect(f"{at}#endpoints", flash="Endpoint deleted.")

    @router.post(f"{at}/deliveries/{{delivery_id}}/replay")
    async def replay_delivery(delivery_id: str, signed: Signed) -> Response:
        browser, caller = signed
        await form_of(browser)
        owner = endpoints.account_of(caller).owner_id
        try:
            async with browser.replica.db.write() as db:
                await deliveries.replay(db, owner, delivery_id, browser.now())
        except NotFound:
            return _not_found(browser, "webhook delivery")
        return browser.redirect(
            f"{at}#deliveries", flash=f"Delivery {delivery_id} is sent again within seconds."
        )

    return router
