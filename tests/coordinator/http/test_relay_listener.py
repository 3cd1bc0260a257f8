"""The relay listener (`http/relay_listener.py`): serves its app on a port of its own, and
keeps uvicorn's start and stop lines out of the log, where they would read as a second
server process starting and stopping."""

import contextlib
import logging
from collections.abc import Iterator

import httpx
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from gpu_share.coordinator.http.relay_listener import RelayListener


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


async def test_it_serves_and_says_nothing_of_its_own_start_and_stop() -> None:
    async def hello(_request: object) -> PlainTextResponse:
        return PlainTextResponse("relayed")

    with uvicorn_logging_at_info() as logger:
        seen = Lines()
        logger.addHandler(seen)
        try:
            app = Starlette(routes=[Route("/", hello)])
            listener = RelayListener(app, "127.0.0.1", 0, advertise_host="127.0.0.1")
            await listener.start()
            async with httpx.AsyncClient() as client:
                assert (await client.get(listener.url)).text == "relayed"
            await listener.stop()
            logger.info("the public server's own line")
        finally:
            logger.removeHandler(seen)
    assert seen.lines == ["the public server's own line"], seen.lines
    assert listener.url.startswith("http://127.0.0.1:")


@contextlib.contextmanager
def uvicorn_logging_at_info() -> Iterator[logging.Logger]:
    """uvicorn's logger as a server process leaves it: other tests' servers set its level,
    disable it, or disable logging below a level (and `isEnabledFor` caches the answer,
    which only `setLevel` clears)."""
    logger = logging.getLogger("uvicorn.error")
    level, disabled = logger.level, logger.disabled
    below = logging.root.manager.disable
    logging.disable(logging.NOTSET)
    logger.disabled = False
    logger.setLevel(logging.INFO)
    try:
        yield logger
    finally:
        logger.setLevel(level)
        logger.disabled = disabled
        logging.disable(below)
