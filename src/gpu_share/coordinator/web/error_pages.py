"""Errors as pages, for a person's browser (`http/negotiation.wants_page` says when).

The app's handlers (`app.py`) turn every error into one answer: the JSON of SPEC §1.8 for
the API and for scripts, or this page, with the same status and headers. The page says
in plain words what happened and offers a way on: home, sign in, the section the visitor
was in, or trying again. It shows the error's own message only where that was written
for people (`detail`); a 500's never, only a reference the log holds beside the trace.
"""

import logging
from collections.abc import Mapping
from urllib.parse import quote

from fastapi.responses import HTMLResponse
from starlette.requests import Request

from gpu_share.coordinator.replica.state import Replica
from gpu_share.coordinator.web.pages import Browser, browser_of

log = logging.getLogger("gpu_share.coordinator.web")

TEMPLATE = "public/error.html"

# (title, what happened) for each status a page can answer with; any other 4xx reads
# as 400, any other 5xx as 500.
WORDING: dict[int, tuple[str, str]] = {
    400: ("That request could not be read", "Your browser sent something this site cannot read."),
    401: ("Sign in first", "This page is for signed-in users; sign in with your API key."),
    402: ("Not enough balance", "Your balance cannot cover this; top it up and try again."),
    403: ("Not allowed", "You may not open this page or do this."),
    404: (
        "Page not found",
        "There is no page at this address. The link may be mistyped or incomplete, or what "
        "it showed is gone.",
    ),
    405: ("This page cannot be opened that way", "This address does not take that request."),
    409: (
        "That changed meanwhile",
        "What you acted on changed in the meantime; reload the page and try again.",
    ),
    410: ("Gone", "What this link showed is no longer here."),
    413: ("Too large", "What you sent is larger than this site takes."),
    415: ("That request could not be read", "What you sent is not of a kind this site takes."),
    422: (
        "Something was not valid",
        "Part of the address or the form is not valid. If you followed a link, check that "
        "you have all of it.",
    ),
    429: ("Too many requests", "You sent too many requests in a short time."),
    500: (
        "Something went wrong on our side",
        "The error is logged. Try again in a moment; if it keeps happening, tell the platform "
        "admin and give them the reference below.",
    ),
    503: (
        "Temporarily unavailable",
        "The site is busy or restarting; try again in a moment.",
    ),
}


async def render(
    request: Request,
    status: int,
    *,
    detail: str | None = None,
    headers: Mapping[str, str] | None = None,
    reference: str | None = None,
) -> HTMLResponse:
    """The error page for `status`; `detail`: the error's message, when written for people."""
    browser = await _visitor(request, status)
    title, text = WORDING.get(status) or WORDING[500 if status >= 500 else 400]
    retry_after = (headers or {}).get("Retry-After")
    response = browser.render(
        TEMPLATE,
        status=status,
        error_status=status,
        title=title,
        text=text,
        detail=_sentence(detail) if detail and status < 500 else None,
        retry_in=_duration(int(retry_after)) if retry_after and retry_after.isdigit() else None,
        reference=reference,
        actions=actions(browser, status),
    )
    for name, value in (headers or {}).items():
        response.headers[name] = value
    return response


def actions(browser: Browser, status: int) -> list[tuple[str, str, bool]]:
    """The ways on from the error: (href, label, primary), the likeliest first."""
    request = browser.request
    path = request.url.path
    here = path + (f"?{request.url.query}" if request.url.query else "")
    found: list[tuple[str, str, bool]] = []
    if browser.principal is None and status == 401:
        found.append((f"/signin?next={quote(path)}", "Sign in", True))
    if status in (429, 500, 503) and request.method == "GET":
        found.append((here, "Try again", True))
    section = browser.section_of(path)
    if section is not None and section[0] != browser.home and section[0] != path:
        found.append((section[0], f"Back to {section[1]}", not found))
    found.append((browser.home, f"Go to {browser.home_name}", not found))
    if browser.principal is None and status == 404:
        found.append(("/signin", "Sign in", False))
    return found


def _duration(seconds: int) -> str:
    """A wait as a person reads it: "40 seconds", "3 minutes", "2 hours"."""
    for unit, size in (("hour", 3600), ("minute", 60)):
        if seconds >= 2 * size:
            count = -(-seconds // size)
            return f"{count} {unit}s"
    return "1 second" if seconds == 1 else f"{seconds} seconds"


def _sentence(message: str) -> str:
    """An API message ("invoke … does not exist") as a sentence on a page."""
    message = message[:1].upper() + message[1:]
    return message if message.endswith((".", "?", "!")) else f"{message}."


async def _visitor(request: Request, status: int) -> Browser:
    """Who sees the page: the signed-in user where that can be told, else an anonymous
    visitor. A 503 is often the database itself, so it is not asked then."""
    replica: Replica = request.app.state.replica
    if status != 503:
        try:
            return await browser_of(request, replica)
        except Exception:  # the error page must come out whatever else is failing
            log.warning("the error page could not tell who the visitor is", exc_info=True)
    return Browser(replica=replica, request=request, principal=None, identity="anon:")
