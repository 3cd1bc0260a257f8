"""The provider's enrollment tokens on their Machines page: issue one, rotate one, revoke
one (`web/enrollment.py`; the same services as `/v1/provider/enrollment-tokens`)."""

from functools import partial

from fastapi import APIRouter
from fastapi.responses import Response

from gpu_share.coordinator.web import enrollment
from gpu_share.coordinator.web.pages import SignedProvider, form_of
from gpu_share.coordinator.web.provider.machines import machines_view

router = APIRouter(prefix="/provider/enrollment-tokens", include_in_schema=False)


@router.post("")
async def issue(signed: SignedProvider) -> Response:
    browser, provider = signed
    await form_of(browser)
    page = partial(machines_view, browser, provider.provider_id)
    return await enrollment.issue(browser, page, provider.provider_id)


@router.post("/{token_id}/rotate")
async def rotate(token_id: str, signed: SignedProvider) -> Response:
    browser, provider = signed
    await form_of(browser)
    page = partial(machines_view, browser, provider.provider_id)
    return await enrollment.issue(browser, page, provider.provider_id, rotating=token_id)


@router.post("/{token_id}/revoke")
async def revoke(token_id: str, signed: SignedProvider) -> Response:
    browser, provider = signed
    await form_of(browser)
    page = partial(machines_view, browser, provider.provider_id)
    revoked = await enrollment.revoke(browser, page, provider.provider_id, token_id)
    if isinstance(revoked, Response):
        return revoked
    return browser.redirect(
        "/provider#enrollment-tokens",
        flash=f"Enrollment token {revoked.prefix}… is revoked: it registers no more machines. "
        "Machines it registered keep working.",
    )
