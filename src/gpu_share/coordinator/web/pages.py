"""What every page shares: who the browser is, its CSRF token, and rendering.

Routes take a `Browser` (the visitor, signed in or not) or one of the `Signed…`
dependencies, which send a visitor who is not signed in to /signin and answer a
signed-in user of another role with 403. Forms are read with `form_of`, which
refuses a missing or wrong CSRF token with 403 before anything else happens.
"""

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, TypeVar
from urllib.parse import quote, unquote

from fastapi import Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.datastructures import FormData

from gpu_share.coordinator.core.principals import (
    AdminCaller,
    Principal,
    ProviderCaller,
    TenantCaller,
)
from gpu_share.coordinator.http.replica import ReplicaDep
from gpu_share.coordinator.replica.state import Replica
from gpu_share.coordinator.services.accounts import accounts, browser_sessions
from gpu_share.coordinator.services.accounts.browser_sessions import Closed
from gpu_share.coordinator.services.money import billing
from gpu_share.coordinator.services.nodes import gpu_catalog
from gpu_share.coordinator.web import TEMPLATE_DIR, session
from gpu_share.coordinator.web.application_form import entry_indices, label_of
from gpu_share.coordinator.web.formatting import FILTERS

P = TypeVar("P", bound=Principal)
R = TypeVar("R", bound=Response)

ENV = Environment(
    loader=FileSystemLoader(TEMPLATE_DIR),
    autoescape=select_autoescape(["html"]),
    trim_blocks=True,
    lstrip_blocks=True,
)
ENV.filters.update(FILTERS)
ENV.filters["gpu_indices"] = entry_indices
ENV.filters["field_label"] = label_of
ENV.filters["gpu_name"] = gpu_catalog.display_name

FLASH_COOKIE = "gs_flash"
ROLE_HOME = {
    TenantCaller: "/console",
    ProviderCaller: "/provider",
    AdminCaller: "/admin",
}
# Each audience's sections, as the main navigation lists them (the first is its home).
NAV: dict[str | None, tuple[tuple[str, str], ...]] = {
    "admin": (
        ("/admin", "Overview"),
        ("/admin/applications", "Applications"),
        ("/admin/tenants", "Tenants"),
        ("/admin/providers", "Providers"),
        ("/admin/nodes", "Nodes"),
        ("/admin/incidents", "Incidents"),
        ("/admin/keys", "Keys"),
        ("/admin/payouts", "Payouts"),
        ("/admin/outbox", "Outbox"),
    ),
    "provider": (
        ("/provider", "Machines"),
        ("/provider/benchmarks", "Benchmarks"),
        ("/provider/pricing", "Pricing"),
        ("/provider/earnings", "Earnings"),
        ("/provider/payouts", "Payouts"),
        ("/provider/performance", "Performance"),
        ("/provider/webhooks", "Webhooks"),
    ),
    "tenant": (
        ("/console", "Overview"),
        ("/console/invokes", "Invokes"),
        ("/console/artifacts", "Artifacts"),
        ("/console/sessions", "Sessions"),
        ("/console/usage", "Usage"),
        ("/console/marketplace", "Marketplace"),
        ("/console/reservations", "Reservations"),
        ("/console/nodes", "Nodes"),
        ("/console/keys", "Keys"),
        ("/console/webhooks", "Webhooks"),
    ),
    None: (("/", "Home"), ("/apply", "Become a provider"), ("/docs", "API")),
}
HOME_NAME = {
    "/console": "your console",
    "/provider": "your dashboard",
    "/admin": "the admin overview",
    "/": "the home page",
}


class SignInRequired(Exception):
    def __init__(self, next_url: str) -> None:
        super().__init__(next_url)
        self.next_url = next_url


class PageForbidden(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass
class Browser:
    """The visitor of this request, and what its response must set."""

    replica: Replica
    request: Request
    principal: Principal | None
    identity: str  # what the CSRF token is sealed for: the session, else an anonymous id
    set_anonymous: str | None = None
    drop_session: bool = False
    flash: str | None = None
    flash_tone: str = "ok"  # the notice's class: ok, or warn for a session that is over

    @property
    def csrf(self) -> str:
        return session.csrf_token(self.replica.signer, self.identity)

    @property
    def home(self) -> str:
        return ROLE_HOME.get(type(self.principal), "/") if self.principal else "/"

    @property
    def home_name(self) -> str:
        return HOME_NAME.get(self.home, "the home page")

    @property
    def nav(self) -> tuple[tuple[str, str], ...]:
        role = self.principal.role.value if self.principal else None
        return NAV.get(role, NAV[None])

    def section_of(self, path: str) -> tuple[str, str] | None:
        """The section of the main navigation that `path` lies in, if any: (href, name)."""
        inside = [
            (href, name)
            for href, name in self.nav
            if href != "/" and (path == href or path.startswith(href + "/"))
        ]
        return max(inside, key=lambda item: len(item[0]), default=None)

    def now(self) -> datetime:
        return self.replica.clock.now()

    @property
    def demo_money(self) -> bool:
        """`gpu-share up`'s demo balance and prices: every signed-in page says so."""
        return self.principal is not None and billing.demo_money(self.replica.settings)

    def render(self, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        html = ENV.get_template(template).render(
            browser=self,
            principal=self.principal,
            role=self.principal.role.value if self.principal else None,
            csrf=self.csrf,
            flash=self.flash,
            path=self.request.url.path,
            now=self.now(),
            **context,
        )
        return self.finish(HTMLResponse(html, status_code=status))

    def redirect(self, url: str, flash: str | None = None) -> Response:
        response: Response = self.finish(RedirectResponse(url, status_code=303))
        if flash:
            response.set_cookie(FLASH_COOKIE, quote(flash), max_age=60, httponly=True, path="/")
        return response

    def finish(self, response: R) -> R:
        if self.set_anonymous:
            session.ensure_anonymous(response, self.request, self.set_anonymous)
        if self.drop_session:
            session.end(response)
        if self.flash is not None:
            response.delete_cookie(FLASH_COOKIE, path="/")
        return response


# What the next page says to a browser whose session cookie opens nothing any more.
SESSION_OVER = {
    Closed.EXPIRED: "Your session expired — sign in again.",
    Closed.ENDED: "Your session ended (signed out elsewhere, or its key was revoked) — "
    "sign in again.",
}
SESSION_INVALID = (
    "Your session was not valid (its cookie was changed, or was made by another server) — "
    "sign in again."
)


async def _session_of(replica: Replica, session_id: str) -> tuple[str, Principal] | Closed:
    """The open session's row id and principal, else why it is over: read on every page,
    never cached, so a sign-out or a revocation on any replica holds here from the next
    request."""
    now = replica.clock.now()
    async with replica.db.read() as db_session:
        found = await browser_sessions.find_open(db_session, session_id, now)
        principal = accounts.principal_of(found.key) if found is not None else None
        if found is not None and principal is not None:
            return found.row_id, principal
        return await browser_sessions.why_closed(db_session, session_id, now)


async def browser_of(request: Request, replica: ReplicaDep) -> Browser:
    cookie = request.cookies.get(session.SESSION_COOKIE)
    session_id = session.read(request, replica.signer)
    signed_in = await _session_of(replica, session_id) if session_id else None
    flash = request.cookies.get(FLASH_COOKIE)
    if isinstance(signed_in, tuple):
        row_id, principal = signed_in
        return Browser(
            replica=replica,
            request=request,
            principal=principal,
            identity=f"session:{row_id}",
            flash=_unquote(flash) if flash else None,
        )
    over = None if cookie is None else SESSION_OVER[signed_in] if signed_in else SESSION_INVALID
    anon = session.anonymous_id(request)
    set_anon = None if anon else session.new_anonymous_id()
    return Browser(
        replica=replica,
        request=request,
        principal=None,
        identity=f"anon:{anon or set_anon}",
        set_anonymous=set_anon,
        drop_session=over is not None,
        flash=_unquote(flash) if flash else over,
        flash_tone="warn" if over and not flash else "ok",
    )


def _unquote(text: str) -> str:
    return unquote(text)[:300]


BrowserDep = Annotated[Browser, Depends(browser_of)]


def signed_in(kind: type[P]) -> Callable[..., Awaitable[tuple[Browser, P]]]:
    async def dependency(browser: BrowserDep) -> tuple[Browser, P]:
        if browser.principal is None:
            raise SignInRequired(str(browser.request.url.path))
        if not isinstance(browser.principal, kind):
            raise PageForbidden(
                f"this page is for {kind.role.value}s; you are signed in as a "
                f"{browser.principal.role.value}"
            )
        return browser, browser.principal

    return dependency


SignedTenant = Annotated[tuple[Browser, TenantCaller], Depends(signed_in(TenantCaller))]
SignedProvider = Annotated[tuple[Browser, ProviderCaller], Depends(signed_in(ProviderCaller))]
SignedAdmin = Annotated[tuple[Browser, AdminCaller], Depends(signed_in(AdminCaller))]


async def form_of(browser: Browser) -> FormData:
    """The posted form, once its CSRF token is checked (403 otherwise)."""
    form = await browser.request.form()
    token = form.get("csrf")
    if not isinstance(token, str) or not session.csrf_ok(
        browser.replica.signer, browser.identity, token
    ):
        raise PageForbidden(
            "this form was not sent from this site, or it expired; reload the page and try again"
        )
    return form


def text(form: FormData, name: str) -> str:
    value = form.get(name)
    return value.strip() if isinstance(value, str) else ""


def typed(form: FormData, name: str) -> str:
    """A field exactly as typed, unstripped: an amount of money, which the one parser
    (protocol/money.py) refuses here as in the API rather than the page changing it."""
    value = form.get(name)
    return value if isinstance(value, str) else ""
