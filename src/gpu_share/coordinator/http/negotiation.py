"""Who is asking: a person's browser gets an error as a page, everyone else as JSON.

The API's paths (`/v1/…`, the agent installer under `/agent/…`, `/health`, the API
document, the static assets) answer JSON whatever the client accepts: scripts, the SDK
and agents rely on the error shape of SPEC §1.8. Any other path is a page, and a page's
error is a page when the request prefers `text/html` to `application/json`, as a
browser's navigation does (`text/html,…,*/*;q=0.8`). A `fetch` or `curl` accepts `*/*`,
prefers neither, and keeps getting JSON.
"""

import re

from starlette.requests import HTTPConnection

API_PATH = re.compile(r"^/(v1|agent|static)(/|$)|^/(health|openapi\.json|openapi\.yaml)$")


def is_api_path(path: str) -> bool:
    return API_PATH.match(path) is not None


def wants_page(connection: HTTPConnection) -> bool:
    if is_api_path(connection.url.path):
        return False
    accept = connection.headers.get("accept", "")
    html = quality(accept, "text/html")
    return html > 0 and html > quality(accept, "application/json")


def quality(accept: str, media_type: str) -> float:
    """How much an `Accept` header wants `media_type`: the q of the most specific range
    that matches it (RFC 9110 §12.5.1), 0 when none does."""
    kind = media_type.split("/", 1)[0]
    best, best_q = -1, 0.0
    for entry in accept.split(","):
        media, *params = (part.strip() for part in entry.split(";"))
        specific = {media_type: 2, f"{kind}/*": 1, "*/*": 0}.get(media.lower())
        if specific is None or specific < best:
            continue
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = min(max(float(value), 0.0), 1.0)
                except ValueError:
                    q = 0.0
        if specific > best:
            best, best_q = specific, q
        else:
            best_q = max(best_q, q)
    return best_q
