"""Who gets an error page: a browser navigating to a page's address; never the API's
clients, scripts' `fetch` (`*/*`) or anything on an API path."""

import pytest
from starlette.requests import Request

from gpu_share.coordinator.http.negotiation import quality, wants_page

CHROMIUM = (
    "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,"
    "image/apng,*/*;q=0.8,application/signed-exchange;v=b3;q=0.7"
)
FIREFOX = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"


def request(path: str, accept: str | None) -> Request:
    headers = [] if accept is None else [(b"accept", accept.encode())]
    return Request({"type": "http", "method": "GET", "path": path, "headers": headers})


@pytest.mark.parametrize("accept", [CHROMIUM, FIREFOX, "text/html", "text/*;q=0.5"])
@pytest.mark.parametrize("path", ["/", "/nothing-here", "/console/invokes/x", "/docs/x"])
def test_a_browser_navigating_to_a_page_address_gets_a_page(path: str, accept: str) -> None:
    assert wants_page(request(path, accept))


@pytest.mark.parametrize(
    "accept",
    [
        None,
        "*/*",
        "application/json",
        "application/json, text/html;q=0.9",
        "text/html;q=0.5, application/json",
        "text/html;q=0",
        "text/html, application/json",  # as much one as the other: the API's shape
        "text/css,*/*;q=0.1",  # a stylesheet the page asked for
    ],
)
def test_a_client_that_does_not_prefer_html_gets_json(accept: str | None) -> None:
    assert not wants_page(request("/nothing-here", accept))


@pytest.mark.parametrize(
    "path",
    [
        "/v1",
        "/v1/nothing-here",
        "/v1/gpu/invokes/inv_x",
        "/agent/install.sh",
        "/agent/nothing",
        "/health",
        "/openapi.json",
        "/openapi.yaml",
        "/static/missing.css",
    ],
)
def test_api_paths_answer_json_even_to_a_browser(path: str) -> None:
    assert not wants_page(request(path, CHROMIUM))


def test_the_most_specific_range_sets_the_quality() -> None:
    assert quality("text/*;q=0.3, text/html;q=0.7, */*;q=0.1", "text/html") == 0.7
    assert quality("text/*;q=0.3, */*;q=0.9", "text/html") == 0.3
    assert quality("*/*;q=0.2", "application/json") == 0.2
    assert quality("image/png", "text/html") == 0.0
    assert quality("text/html;q=oops", "text/html") == 0.0
    assert quality("TEXT/HTML;Q=0.4", "text/html") == 0.4
