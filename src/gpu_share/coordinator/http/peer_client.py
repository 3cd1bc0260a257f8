"""`Peers` over kept links: the hop to the coordinator process holding a session
(`replica.peers`; the wire is `relay_frames`, the other side `relay_listener`).

One link per holder, opened at the first request for one of its sessions and kept while
both processes live, carries every request to it at once. A relayed forward is then one
frame each way on an open connection: no connection pool, no HTTP to write or parse.
"""

import asyncio
import contextlib
import itertools
from typing import Any

from gpu_share.coordinator.core.settings import FRAME_HEADER_ALLOWANCE
from gpu_share.coordinator.core.signing import UrlSigner
from gpu_share.coordinator.http.relay_frames import (
    HANDSHAKE_HEAD_BYTES,
    HELLO_TIMEOUT_SEC,
    VERSION,
    Frame,
    FrameError,
    address,
    keep_alive,
    read_frame,
    refusal_error,
    write_frame,
)
from gpu_share.coordinator.replica.peers import PURPOSE, PeerAnswer, PeerUnreachable, RelayedOpen
from gpu_share.protocol.sessions import SessionStatus

CONNECT_TIMEOUT_SEC = 3.0
OPEN_TIMEOUT_SEC = 30.0  # the holder waits up to CREATE_WAIT_SEC for the model
FORWARD_TIMEOUT_SEC = 330.0  # beyond the holder's own (300 s), which answers 504 first
_LINK_FAILURES = (ConnectionError, asyncio.IncompleteReadError, FrameError, OSError)


class LinkPeers:
    def __init__(self, signer: UrlSigner, *, max_body: int) -> None:
        self._signer = signer
        self._max_body = max_body
        self._links: dict[str, asyncio.Task[_Link]] = {}

    async def aclose(self) -> None:
        for task in self._links.values():
            if task.done() and not task.cancelled() and task.exception() is None:
                await task.result().aclose()
            else:
                task.cancel()
        self._links.clear()

    async def open(self, relay_url: str, opening: RelayedOpen) -> None:
        head = {
            "action": "open",
            "session_id": opening.message.session_id,
            "tenant_id": opening.tenant_id,
            "node_id": opening.node_id,
            "idle_timeout_sec": opening.idle_timeout_sec,
            "message": opening.message.model_dump(mode="json"),
        }
        await self._call(relay_url, head, b"", OPEN_TIMEOUT_SEC)

    async def forward(
        self, relay_url: str, tenant_id: str, session_id: str, fmt: str, payload: bytes
    ) -> PeerAnswer:
        head = {
            "action": "forward",
            "session_id": session_id,
            "tenant_id": tenant_id,
            "format": fmt,
        }
        return await self._call(relay_url, head, payload, FORWARD_TIMEOUT_SEC)

    async def close(
        self, relay_url: str, session_id: str, reason: str, status: SessionStatus
    ) -> None:
        head = {
            "action": "close",
            "session_id": session_id,
            "reason": reason,
            "status": status.value,
        }
        await self._call(relay_url, head, b"", OPEN_TIMEOUT_SEC)

    async def _call(
        self, relay_url: str, head: dict[str, Any], body: bytes, timeout: float
    ) -> PeerAnswer:
        link = await self._link(relay_url)
        answer = await link.call(head, body, timeout)
        refusal = answer.head.get("refusal")
        if refusal is not None:
            raise refusal_error(relay_url, refusal)
        return PeerAnswer(format=str(answer.head.get("format") or ""), body=answer.body)

    async def _link(self, relay_url: str) -> "_Link":
        """The open link to `relay_url`, opened now if there is none (once, however many
        requests wait for it)."""
        task = self._links.get(relay_url)
        if task is None or _ended(task):
            for url, other in list(self._links.items()):  # holders gone for good, too
                if _ended(other):
                    del self._links[url]
            task = asyncio.create_task(self._connect(relay_url))
            self._links[relay_url] = task
        try:
            return await asyncio.shield(task)
        except PeerUnreachable:
            if self._links.get(relay_url) is task:
                del self._links[relay_url]
            raise

    async def _connect(self, relay_url: str) -> "_Link":
        try:
            host, port = address(relay_url)
        except ValueError as exc:
            raise PeerUnreachable(
                f"{relay_url}: not a relay address of this version; the process there is "
                "reached once it runs this version too"
            ) from exc
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_SEC):
                reader, writer = await asyncio.open_connection(host, port)
        except TimeoutError as exc:
            raise PeerUnreachable(
                f"{relay_url}: no connection in {CONNECT_TIMEOUT_SEC:g} s"
            ) from exc
        except OSError as exc:  # refused: no process there any more
            raise PeerUnreachable(f"{relay_url}: {exc!r}", gone=True) from exc
        keep_alive(writer)
        try:
            async with asyncio.timeout(HELLO_TIMEOUT_SEC):
                await self._prove(reader, writer)
        except (TimeoutError, *_LINK_FAILURES) as exc:
            writer.close()
            raise PeerUnreachable(f"{relay_url}: no relay link ({exc!r})") from exc
        except PeerUnreachable:
            writer.close()
            raise
        return _Link(relay_url, reader, writer, max_body=self._max_body)

    async def _prove(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hello = await read_frame(reader, max_head=HANDSHAKE_HEAD_BYTES, max_body=0)
        nonce = hello.head.get("nonce")
        if hello.head.get("relay") != VERSION or not isinstance(nonce, str):
            raise PeerUnreachable(f"the process there speaks another relay: {hello.head}")
        write_frame(writer, Frame({"proof": self._signer.seal(PURPOSE, nonce)}))
        await writer.drain()
        welcome = await read_frame(reader, max_head=HANDSHAKE_HEAD_BYTES, max_body=0)
        if welcome.head.get("welcome") is not True:
            raise PeerUnreachable(f"the process there refused this one as a peer: {welcome.head}")


class _Link:
    """One connection to a holder: requests written as they come, answers matched to them
    by id as they arrive. When it ends, every request still waiting on it fails."""

    def __init__(
        self,
        relay_url: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        max_body: int,
    ) -> None:
        self._url = relay_url
        self._reader = reader
        self._writer = writer
        self._max_body = max_body
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Frame]] = {}
        self.closed = False
        self._answers = asyncio.create_task(self._read_answers())

    async def call(self, head: dict[str, Any], body: bytes, timeout: float) -> Frame:
        if self.closed:
            raise PeerUnreachable(f"{self._url}: the relay link closed")
        request_id = next(self._ids)
        answer: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = answer
        try:
            write_frame(self._writer, Frame({"id": request_id, **head}, body))
            async with asyncio.timeout(timeout):
                await self._writer.drain()
                return await answer
        except TimeoutError as exc:
            raise PeerUnreachable(f"{self._url}: no answer in {timeout:g} s") from exc
        except _LINK_FAILURES as exc:
            raise PeerUnreachable(f"{self._url}: the relay link failed ({exc!r})") from exc
        finally:
            self._waiting.pop(request_id, None)

    async def aclose(self) -> None:
        self._answers.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._answers

    async def _read_answers(self) -> None:
        why = "closed"
        try:
            while True:
                frame = await read_frame(
                    self._reader, max_head=FRAME_HEADER_ALLOWANCE, max_body=self._max_body
                )
                answer = self._waiting.get(frame.head.get("id"))  # type: ignore[arg-type]
                if answer is not None and not answer.done():
                    answer.set_result(frame)
        except _LINK_FAILURES as exc:
            why = repr(exc)
        finally:
            self.closed = True
            self._writer.close()
            for answer in self._waiting.values():
                if not answer.done():
                    answer.set_exception(
                        PeerUnreachable(f"{self._url}: the relay link ended ({why})")
                    )


def _ended(link: "asyncio.Task[_Link]") -> bool:
    """Whether a link (or its opening) is over: failed, or closed since."""
    if not link.done():
        return False
    return link.cancelled() or link.exception() is not None or link.result().closed
