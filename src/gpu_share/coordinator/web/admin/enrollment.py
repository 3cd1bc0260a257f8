"""A provider's enrollment tokens on the admin's page of its nodes: issue one with a
lifetime of the admin's choosing, rotate one, revoke one (`web/enrollment.py`; the same
services as `/v1/admin/providers/{id}/enrollment-tokens`)."""

from functools import partial

from fastapi import APIRouter
from fastapi.responses import Response

from gpu_share.coordinator.web import enrollment
from gpu_share.coordinator.web.admin.forms import validated
from gpu_share.coordinator.web.admin.nodes import nodes_view
from gpu_share.coordinator.web.pages import SignedAdmin, form_of, text
from gpu_share.protocol.providers import EnrollmentTokenRequest

router = APIRouter(
    prefix="/admin/providers/{provider_id}/enrollment-tokens", include_in_schema=False
)


@router.post("")
async def issue(provider_id: str, signed: SignedAdmin) -> Response:
    browser, _ = signed
    form = await form_of(browser)
    page = partial(nodes_view, browser, provider_id)
    days = text(form, "lifetime_days")
    errors: dict[str, str] = {}
    ids = {"lifetime_days": "lifetime_days"}
    chosen = validated(EnrollmentTokenRequest, {"lifetime_days": days} if days else {}, errors, ids)
    if chosen is None:
        return await page(token_errors=errors, status=422)
    return await enrollment.issue(browser, page, provider_id, days=chosen.lifetime_days)


@router.post("/{token_id}/rotate")
async def rotate(provider_id: str, token_id: str, signed: SignedAdmin) -> Response:
    browser, _ = signed
    await form_of(browser)
    page = partial(nodes_view, browser, provider_id)
    return await enrollment.issue(browser, page, provider_id, rotating=token_id)


@router.post("/{token_id}/revoke")
async def revoke(provider_id: str, token_id: str, signed: SignedAdmin) -> Response:
    browser, _ = signed
    await form_of(browser)
    page = partial(nodes_view, browser, provider_id)
    revoked = await enrollment.revoke(browser, page, provider_id, token_id)
    if isinstance(revoked, Response):
        return revoked
    return browser.redirect(
        f"/admin/nodes?provider={provider_id}#enrollment-tokens",
        flash=f"Enrollment token {revoked.prefix}… is revoked: it registers no more machines.",
    )
