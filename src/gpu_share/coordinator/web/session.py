"""Browser sessions: a key, once, at sign-in; afterwards a signed cookie naming a session.

The cookie holds a random session id, sealed by the coordinator; the session itself is a
row (`services/accounts/browser_sessions`), checked on every page, so signing out or
revoking the key ends it on every replica even for a copy of the cookie. The key itself
never enters a cookie. A cookie that does not unseal or names a session that is over
signs the browser out, and the page says which it was. The cookie outlives its session
by the day the row is kept (`KEEP_FOR`), so that a browser coming back after the
session's hours still shows it, and hears that its session expired rather than nothing.

Every form carries a CSRF token sealed for the browser: its session, or before
sign-in an anonymous random cookie. A POST whose token does not match is refused.
"""

import secrets

from starlette.requests import HTTPConnection
from starlette.responses import Response

from gpu_share.coordinator.core.signing import UrlSigner
from gpu_share.coordinator.services.accounts.browser_sessions import KEEP_FOR, SESSION_HOURS

SESSION_COOKIE = "gs_session"
ANON_COOKIE = "gs_anon"
SESSION_PURPOSE = "web-session"
COOKIE_MAX_AGE = SESSION_HOURS * 3600 + int(KEEP_FOR.total_seconds())
CSRF_PURPOSE = "web-csrf"


def _secure(connection: HTTPConnection, public_base_url: str) -> bool:
    scheme = public_base_url.split(":", 1)[0] if public_base_url else connection.url.scheme
    return scheme == "https"


def start(
    response: Response,
    connection: HTTPConnection,
    signer: UrlSigner,
    session_id: str,
    public_base_url: str,
) -> None:
    response.set_cookie(
        SESSION_COOKIE,
        signer.seal(SESSION_PURPOSE, session_id),
        max_age=COOKIE_MAX_AGE,
        httponly=True,
        samesite="lax",
        secure=_secure(connection, public_base_url),
        path="/",
    )


def end(response: Response) -> None:
    response.delete_cookie(SESSION_COOKIE, path="/")


def read(connection: HTTPConnection, signer: UrlSigner) -> str | None:
    """The session id the browser holds, if its cookie is genuine (whether that session is
    still open is the database's to say)."""
    value = connection.cookies.get(SESSION_COOKIE)
    return signer.unseal(SESSION_PURPOSE, value) if value else None


def anonymous_id(connection: HTTPConnection) -> str | None:
    value = connection.cookies.get(ANON_COOKIE)
    return value if value and value.isalnum() and len(value) == 32 else None


def ensure_anonymous(response: Response, connection: HTTPConnection, anon: str) -> None:
    if connection.cookies.get(ANON_COOKIE) != anon:
        response.set_cookie(
            ANON_COOKIE, anon, max_age=7 * 24 * 3600, httponly=True, samesite="lax", path="/"
        )


def new_anonymous_id() -> str:
    return secrets.token_hex(16)


def csrf_token(signer: UrlSigner, browser: str) -> str:
    """The token every form of this browser carries (`browser`: its session or anon id)."""
    return signer.seal(CSRF_PURPOSE, browser)


def csrf_ok(signer: UrlSigner, browser: str, token: str | None) -> bool:
    return bool(token) and signer.unseal(CSRF_PURPOSE, token or "") == browser
