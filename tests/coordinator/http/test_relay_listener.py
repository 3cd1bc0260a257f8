"""The relay listener (`http/relay_listener.py`): serves its app on a port of its own, and
keeps uvicorn's start and stop lines out of the log, where they would read as a second
server process starting and stopping."""

import logging

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from gpu_share.coordinator.http.relay_listener import RelayListener


async def test_it_serves_and_says_nothing_of_its_own_start_and_stop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def hello(_request: object) -> PlainTextResponse:
        return PlainTextResponse("relayed")

    app = Starlette(routes=[Route("/", hello)])
    listener = RelayListener(app, "127.0.0.1", 0, advertise_host="127.0.0.1")
    with caplog.at_level(logging.INFO):
        await listener.start()
        async with httpx.AsyncClient() as client:
            assert (await client.get(listener.url)).text == "relayed"
        await listener.stop()
        logging.getLogger("uvicorn.error").info("the public server's own line")
    lines = [r.getMessage() for r in caplog.records if r.name == "uvicorn.error"]
    assert lines == ["the public server's own line"], lines
    assert listener.url.startswith("http://127.0.0.1:")
