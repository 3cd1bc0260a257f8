"""Every request has an id (`X-Request-Id`) that its log lines carry, with the invoke or
session its path names and the node that called; and is counted by its route's template."""

import io
import json
import logging
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from gpu_share import logs
from gpu_share.coordinator.core import metrics
from gpu_share.coordinator.http.principals import principal_for_key
from gpu_share.coordinator.http.request_context import RequestContextMiddleware
from gpu_share.logs import JsonFormatter
from gpu_share.testing.simulated_agent import AgentFactory

log = logging.getLogger("gpu_share.tests.request_context")


async def said(request: Request) -> PlainTextResponse:
    log.warning("handling %s", request.url.path)
    return PlainTextResponse("ok")


@pytest.fixture
def lines() -> Iterator[io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    logging.getLogger().addHandler(handler)
    try:
        yield out
    finally:
        logging.getLogger().removeHandler(handler)


@pytest.fixture
async def bare() -> AsyncIterator[httpx.AsyncClient]:
    app = Starlette(routes=[Route("/v1/gpu/invokes/{invoke_id}", said)])
    app.add_middleware(RequestContextMiddleware)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://testserver"
    ) as client:
        yield client


async def test_a_request_gets_an_id_its_log_lines_carry(
    bare: httpx.AsyncClient, lines: io.StringIO
) -> None:
    answer = await bare.get("/v1/gpu/invokes/inv_0123")
    request_id = answer.headers["x-request-id"]
    assert len(request_id) == 16 and int(request_id, 16) >= 0
    (line,) = [json.loads(x) for x in lines.getvalue().splitlines()]
    assert line["message"] == "handling /v1/gpu/invokes/inv_0123"
    assert (line["request_id"], line["invoke_id"]) == (request_id, "inv_0123")
    assert "node_id" not in line and "session_id" not in line
    again = await bare.get("/v1/gpu/invokes/inv_0123")
    assert again.headers["x-request-id"] != request_id  # one id per request


@pytest.mark.parametrize(
    ("sent", "kept"),
    [
        ("proxy-7f3a.19:2", True),
        ("x" * 64, True),
        ("x" * 65, False),
        ("two words", False),
        ("<script>", False),
    ],
)
async def test_the_callers_request_id_is_kept_only_when_it_is_a_plain_token(
    bare: httpx.AsyncClient, sent: str, kept: bool
) -> None:
    answer = await bare.get("/v1/gpu/invokes/inv_1", headers={"X-Request-Id": sent})
    assert (answer.headers["x-request-id"] == sent) is kept


async def test_requests_are_counted_by_route_template_never_by_the_ids_in_a_path(
    bare: httpx.AsyncClient,
) -> None:
    counter = metrics.HTTP_REQUESTS
    route = counter.labels("GET", "/v1/gpu/invokes/{invoke_id}", "200")
    missing = counter.labels("GET", "unmatched", "404")
    before, before_missing = route._value.get(), missing._value.get()
    await bare.get("/v1/gpu/invokes/inv_a")
    await bare.get("/v1/gpu/invokes/inv_b")
    await bare.get("/nothing/here")
    assert route._value.get() - before == 2
    assert missing._value.get() - before_missing == 1


async def test_the_coordinators_answers_name_their_request(client: httpx.AsyncClient) -> None:
    health = await client.get("/health")
    assert len(health.headers["x-request-id"]) == 16
    refused = await client.get("/v1/admin/tenants")  # refusals have one too
    assert refused.status_code == 401
    assert refused.headers["x-request-id"] != health.headers["x-request-id"]


async def test_a_node_once_known_is_named_on_the_lines_that_follow(
    app: FastAPI, sim_agent: AgentFactory, lines: io.StringIO
) -> None:
    agent = await sim_agent()
    replica = app.state.replica
    with logs.bound(request_id="r1", node_id=None):
        await principal_for_key(replica, agent.client.key or "", "127.0.0.1")
        log.warning("after the key")
    assert logs.node_id.get() is None  # bound for that request only
    (line,) = [json.loads(x) for x in lines.getvalue().splitlines()]
    assert (line["request_id"], line["node_id"]) == ("r1", agent.node_id)
