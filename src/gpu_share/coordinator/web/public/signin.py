"""The landing page, and signing in and out with an API key: the session it starts (a row,
named by the cookie) sends each role to its home (the console, the provider dashboard,
the admin); signing out ends that row."""

from fastapi import APIRouter
from fastapi.responses import Response

from gpu_share.coordinator.core.errors import ApiError
from gpu_share.coordinator.http.principals import principal_for_key
from gpu_share.coordinator.http.replica import client_address
from gpu_share.coordinator.services.accounts import browser_sessions
from gpu_share.coordinator.services.nodes import gpu_catalog
from gpu_share.coordinator.web import session
from gpu_share.coordinator.web.pages import ROLE_HOME, BrowserDep, form_of, text

router = APIRouter(include_in_schema=False)


@router.get("/")
async def landing(browser: BrowserDep) -> Response:
    return browser.render("public/landing.html", models=gpu_catalog.SUPPORTED)


@router.get("/signin")
async def signin_page(browser: BrowserDep, next: str = "") -> Response:
    if browser.principal is not None:
        return browser.redirect(browser.home)
    return browser.render("public/signin.html", next=_safe_next(next), error=None)


@router.post("/signin")
async def signin(browser: BrowserDep) -> Response:
    form = await form_of(browser)
    key, next_url = text(form, "key"), _safe_next(text(form, "next"))
    replica = browser.replica
    try:
        principal = await principal_for_key(replica, key, client_address(browser.request))
    except ApiError as exc:
        status = exc.status if exc.status in (401, 429) else 400
        message = (
            "That key is unknown or revoked. Keys start with gpu_sk_, gpu_pk_ or gpu_admin_."
            if exc.status == 401
            else exc.message
        )
        return browser.render("public/signin.html", status=status, next=next_url, error=message)
    home = ROLE_HOME.get(type(principal))
    if home is None:  # an agent's node key signs nothing in
        return browser.render(
            "public/signin.html",
            status=403,
            next=next_url,
            error="Agent node keys cannot sign in; use your tenant, provider or admin key.",
        )
    async with replica.db.write() as db:
        if (previous := session.read(browser.request, replica.signer)) is not None:
            await browser_sessions.end(db, previous, browser.now())
        session_id = await browser_sessions.begin(db, principal.key_id, browser.now())
    response = browser.redirect(next_url if next_url.startswith(home) else home)
    session.start(
        response, browser.request, replica.signer, session_id, replica.settings.public_base_url
    )
    return response


def _safe_next(value: str) -> str:
    """Only a path on this site: never an absolute URL or a protocol-relative one."""
    if value.startswith("/") and not value.startswith("//") and "\\" not in value:
        return value[:300]
    return ""


@router.post("/signout")
async def signout(browser: BrowserDep) -> Response:
    """Ends the session itself, not only this browser's cookie: a copy of the cookie
    opens nothing afterwards, on any replica."""
    await form_of(browser)
    replica = browser.replica
    if (session_id := session.read(browser.request, replica.signer)) is not None:
        async with replica.db.write() as db:
            await browser_sessions.end(db, session_id, browser.now())
    response = browser.redirect("/", flash="You are signed out.")
    session.end(response)
    return response
