"""Enrollment tokens as the provider's Machines page and the admin's page of a provider's
nodes both show them (`templates/_enrollment_tokens.html`): the list, and the issue,
rotate and revoke forms answered with the page again. A new token is shown on the page
this once; it never rides in a redirect or a cookie."""

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi.responses import Response

from gpu_share.coordinator.core.errors import ApiError
from gpu_share.coordinator.http.replica import install_base, public_url
from gpu_share.coordinator.services.providers import enrollment_tokens
from gpu_share.coordinator.web.pages import Browser
from gpu_share.protocol.providers import EnrollmentToken, IssuedEnrollmentToken

# The page again, given what the template's token section shows besides the list.
Page = Callable[..., Awaitable[Response]]


async def section(
    browser: Browser,
    provider_id: str,
    *,
    forms_at: str,
    ask_lifetime: bool,
    issued: IssuedEnrollmentToken | None,
    errors: dict[str, str] | None,
) -> dict[str, Any]:
    """What `_enrollment_tokens.html` reads: the tokens, where its forms post, whether the
    form asks for a lifetime (the admin's), the token just issued and the refusal."""
    replica = browser.replica
    async with replica.db.read() as db:
        tokens = await enrollment_tokens.list_tokens(db, provider_id, browser.now())
    return {
        "tokens": tokens,
        "enroll_at": forms_at,
        "token_days": replica.settings.enrollment_token_days,
        "token_lifetime": ask_lifetime,
        "token_errors": errors or {},
        "issued": issued,
        "public_url": public_url(replica),
    }


async def issue(
    browser: Browser,
    page: Page,
    provider_id: str,
    *,
    days: int | None = None,
    rotating: str | None = None,
) -> Response:
    """A new token (in place of `rotating`), shown on `page`; a refusal shown there too."""
    replica = browser.replica
    valid_for = enrollment_tokens.lifetime(replica.settings.enrollment_token_days, days)
    try:
        async with replica.db.write() as db:
            if rotating is None:
                made = await enrollment_tokens.issue_shown_once(
                    db, provider_id, browser.now(), valid_for, install_base(replica)
                )
            else:
                made = await enrollment_tokens.rotate(
                    db, provider_id, rotating, browser.now(), valid_for, install_base(replica)
                )
    except ApiError as exc:
        return await page(token_errors={"form": exc.message}, status=exc.status)
    return await page(issued=made)


async def revoke(
    browser: Browser, page: Page, provider_id: str, token_id: str
) -> EnrollmentToken | Response:
    """The revoked token, or `page` with the refusal."""
    try:
        async with browser.replica.db.write() as db:
            return await enrollment_tokens.revoke(db, provider_id, token_id, browser.now())
    except ApiError as exc:
        return await page(token_errors={"form": exc.message}, status=exc.status)
