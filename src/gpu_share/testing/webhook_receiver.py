"""A real HTTP receiver of webhooks on loopback: it records every request and answers as
the test says (a status per request, or no answer at all until the sender gives up)."""

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request, Response

from gpu_share.testing.servers import serve

HANG = -1  # an answer that never comes (the sender's timeout runs out)


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    base_url: str = ""
    received: list[Received] = field(default_factory=list)
    answers: list[int] = field(default_factory=list)  # next answers, in order; then 200
    _never: asyncio.Event = field(default_factory=asyncio.Event)

    def url(self, path: str = "/hook") -> str:
        return self.base_url + path

    async def answer(self, request: Request) -> Response:
        body = await request.body()
        self.received.append(Received(request.url.path, dict(request.headers), body))
        status = self.answers.pop(0) if self.answers else 200
        if status == HANG:
            await self._never.wait()
        return Response(status_code=status)


@asynccontextmanager
async def webhook_receiver() -> AsyncIterator[Receiver]:
    receiver = Receiver()
    app = FastAPI()
    app.add_api_route("/{path:path}", receiver.answer, methods=["POST"])
    async with serve(app, lifespan=False) as base_url:
        receiver.base_url = base_url
        yield receiver
        receiver._never.set()  # let a hung handler end, so the server stops at once
