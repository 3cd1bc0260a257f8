"""Browser sessions: a key, once, at sign-in; afterwards a signed cookie naming it.

The cookie holds the key's id and an expiry, sealed by the coordinator (nothing is
stored server-side); the key itself never enters a cookie. Every request re-checks
that the key still exists and is not revoked, so revoking a key ends its sessions.
A cookie that does not unseal, has expired or names a revoked key signs the browser
out.

Every form carries a CSRF token sealed for the browser: its session, or before
sign-in an anonymous random cookie. A POST whose token does not match is refused.
"""

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from starlette.requests import HTTPConnection
from starlette.responses import Response

from gpu_share.coordinator.core.signing import UrlSigner

SESSION_COOKIE = "gs_session"
ANON_COOKIE = "gs_anon"
SESSION_PURPOSE = "web-session"
CSRF_PURPOSE = "web-csrf"
SESSION_HOURS = 12


@dataclass(frozen=True)
class Cookie:
    key_id: str
    expires_at: datetime


def _secure(connection: HTTPConnection, public_base_url: str) -> bool:
    scheme = public_base_url.split(":", 1)[0] if public_base_url else connection.url.scheme
    return scheme == "https"


def start(
    response: Response,
    connection: HTTPConnection,
    signer: UrlSigner,
    key_id: str,
    now: datetime,
    public_base_url: str,
) -> None:
    expires = now + timedelta(hours=SESSION_HOURS)
    value = signer.seal(SESSION_PURPOSE, f"{key_id}~{int(expires.timestamp())}")
    response.set_cookie(
        SESSION_COOKIE,
        value,
        max_age=SESSION_HOURS * 3600,
        httponly=True,
        samesite="lax",
        secure=_secure(connection, public_base_url),
        path="/",
    )


def end(response: Response) -> None:
    response.delete_cookie(SESSION_COOKIE, path="/")


def read(connection: HTTPConnection, signer: UrlSigner, now: datetime) -> Cookie | None:
    """The session the browser holds, if its cookie is genuine and unexpired."""
    value = connection.cookies.get(SESSION_COOKIE)
    subject = signer.unseal(SESSION_PURPOSE, value) if value else None
    if subject is None:
        return None
    key_id, _, expiry = subject.partition("~")
    if not expiry.isdigit() or int(expiry) <= now.timestamp():
        return None
    return Cookie(key_id=key_id, expires_at=datetime.fromtimestamp(int(expiry), now.tzinfo))


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
