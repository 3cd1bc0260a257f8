"""The relay listener: a socket of this process's own, where its peers' links
(`relay_frames`) bring the requests for the sessions it holds, answered by a
`RelayHandler` (`api.relay`) in the coordinator's event loop. It is a socket of its own
so that peers reach this process's hub even when several processes share the public port
(`gpu-share server --workers N`)."""

import asyncio
import contextlib
import hmac
import logging
import secrets

from gpu_share.coordinator.core.errors import ApiError, Unauthorized
from gpu_share.coordinator.core.settings import FRAME_HEADER_ALLOWANCE
from gpu_share.coordinator.core.signing import UrlSigner
from gpu_share.coordinator.http.relay_frames import (
    HANDSHAKE_HEAD_BYTES,
    HELLO_TIMEOUT_SEC,
    VERSION,
    Frame,
    FrameError,
    keep_alive,
    read_frame,
    refusal_head,
    url_of,
    write_frame,
)
from gpu_share.coordinator.http.sockets import bound_tcp
from gpu_share.coordinator.replica.peers import PURPOSE, RelayCall, RelayHandler
from gpu_share.protocol.errors import ErrorCode

log = logging.getLogger(__name__)

STOP_GRACE_SEC = 5.0
"""At stop, requests in progress get this long to answer before the links close."""


class RelayListener:
    def __init__(
        self,
        handler: RelayHandler,
        signer: UrlSigner,
        host: str,
        port: int,
        advertise_host: str = "",
        *,
        max_body: int,
    ) -> None:
        self._handler = handler
        self._signer = signer
        self._max_body = max_body
        self._sock = bound_tcp(host, port)
        self.url = url_of(advertise_host or host, self._sock.getsockname()[1])
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.StreamWriter] = set()
        self._requests: set[asyncio.Task[None]] = set()

    @property
    def links(self) -> int:
        """Links open to this listener now, proven or not."""
        return len(self._links)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, sock=self._sock)

    async def stop(self) -> None:
        if self._server is None:
            self._sock.close()
            return
        self._server.close()  # no new links
        if self._requests:
            await asyncio.wait(set(self._requests), timeout=STOP_GRACE_SEC)
        for writer in list(self._links):
            writer.close()
        for request in list(self._requests):
            request.cancel()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._links.add(writer)
        keep_alive(writer)
        try:
            if await self._proven(reader, writer):
                await self._take_requests(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the peer went away: its requests in progress still end, unheard
        except FrameError as exc:
            log.warning("closed a relay link from %s: %s", _peer(writer), exc)
        finally:
            self._links.discard(writer)
            writer.close()

    async def _proven(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Whether the other end proves it holds the key every process shares."""
        nonce = secrets.token_urlsafe(24)
        write_frame(writer, Frame({"relay": VERSION, "nonce": nonce}))
        await writer.drain()
        try:
            async with asyncio.timeout(HELLO_TIMEOUT_SEC):
                proof = await read_frame(reader, max_head=HANDSHAKE_HEAD_BYTES, max_body=0)
        except TimeoutError:
            return False
        sealed = proof.head.get("proof")
        subject = self._signer.unseal(PURPOSE, sealed) if isinstance(sealed, str) else None
        if subject is None or not hmac.compare_digest(subject, nonce):
            log.warning("refused a relay link from %s: no peer's proof", _peer(writer))
            refused = Unauthorized("not a peer: a relay link needs the nonce sealed")
            write_frame(writer, Frame({"refusal": refusal_head(refused)}))
            await writer.drain()
            return False
        write_frame(writer, Frame({"welcome": True}))
        await writer.drain()
        return True

    async def _take_requests(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while True:
            frame = await read_frame(
                reader, max_head=FRAME_HEADER_ALLOWANCE, max_body=self._max_body
            )
            request = asyncio.create_task(self._answer(frame, writer))
            self._requests.add(request)
            request.add_done_callback(self._requests.discard)

    async def _answer(self, frame: Frame, writer: asyncio.StreamWriter) -> None:
        head = dict(frame.head)
        request_id = head.pop("id", None)
        action, session_id = head.pop("action", None), head.pop("session_id", None)
        try:
            if not isinstance(action, str) or not isinstance(session_id, str):
                raise ApiError(
                    "a relayed request names its action and session",
                    code=ErrorCode.VALIDATION_ERROR,
                )
            answer = await self._handler(RelayCall(action, session_id, head, frame.body))
            reply = Frame({"id": request_id, "format": answer.format}, answer.body)
        except ApiError as exc:
            reply = Frame({"id": request_id, "refusal": refusal_head(exc)})
        except Exception:
            reference = secrets.token_hex(6)
            log.exception("a relayed %s failed (reference %s)", action, reference)
            failed = ApiError(f"internal error; it has been logged (reference {reference})")
            reply = Frame({"id": request_id, "refusal": refusal_head(failed)})
        if writer.is_closing():
            return  # the peer that asked is gone
        try:
            write_frame(writer, reply)
        except (TypeError, ValueError):  # a refusal whose details are not JSON
            log.exception("a relayed %s's answer could not be written", action)
            failed = ApiError("internal error; the answer could not be relayed")
            write_frame(writer, Frame({"id": request_id, "refusal": refusal_head(failed)}))
        with contextlib.suppress(ConnectionError):
            await writer.drain()


def _peer(writer: asyncio.StreamWriter) -> str:
    name = writer.get_extra_info("peername")
    return f"{name[0]}:{name[1]}" if isinstance(name, tuple) else str(name)
