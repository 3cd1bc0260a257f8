"""The headers that keep pages to themselves, added to responses on their way out.

Every response says `X-Content-Type-Options: nosniff` (a browser takes a JSON answer or
an artifact for what it says it is, never for a page). A page (`text/html`) also gets:

- a content security policy: scripts, styles, fonts and fetches only from this server,
  images also as `data:` (charts, Swagger's icons), no plugins, no `<base>` elsewhere,
  forms only to this server, and no framing (`frame-ancestors 'none'`, with
  `X-Frame-Options: DENY` for older browsers), so no other site can dress a page of ours
  and have its buttons clicked. No inline script or style is allowed: the pages keep
  theirs in `/static`. A response that already carries a policy keeps it;
- `Referrer-Policy: no-referrer`: the links applicants and providers follow carry their
  secret in the path (`/apply/status/gpu_st_…`, `/provider/claim/gpu_ct_…`), and no
  request a page makes, to us or to anyone, repeats it.

Pure ASGI, so the JSON API's hot paths pay one look at the response's headers.
"""

from starlette.types import ASGIApp, Message, Receive, Scope, Send

PAGE_POLICY = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    )
)
PAGE_POLICY_BYTES = PAGE_POLICY.encode()
CSP = b"content-security-policy"
NOSNIFF = (b"x-content-type-options", b"nosniff")
PAGE_HEADERS = (
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
)


class SecurityHeadersMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = with_security_headers(message.get("headers", []))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def with_security_headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """`headers` and ours (a new list: a response may send its own list again)."""
    for name, value in headers:
        if name == b"content-type":
            if value.startswith(b"text/html"):
                policy = [] if any(n == CSP for n, _ in headers) else [(CSP, PAGE_POLICY_BYTES)]
                return [*headers, NOSNIFF, *PAGE_HEADERS, *policy]
            break
    return [*headers, NOSNIFF]
