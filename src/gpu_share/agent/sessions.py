"""Sessions on this node: the agent's WebSocket to the coordinator and the model
processes it keeps loaded (SPEC §1.7).

Each session is a long-lived runtime process (`runtimes.onnx_session`) in the same
sandbox a job gets, listening on a unix socket in its folder. Forward frames from
the WebSocket go to the socket as they come and answers go back as they are ready,
so concurrent forwards pipeline. When the WebSocket drops, the coordinator fails
this node's sessions, so the agent stops them too and reconnects.

That makes the channel shared by every tenant's session on this node, so nothing one
session does may break it: an answer over the session's `max_answer_bytes` is
replaced by a PAYLOAD_TOO_LARGE result for that forward alone (the coordinator closes
the channel on a frame over its limit), and an answer naming another session is
dropped.
"""

import asyncio
import contextlib
import json
import logging
import os
import shutil
import socket
import struct
import sys
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from gpu_share.agent.failures import JobFailed
from gpu_share.agent.fetching import fetch
from gpu_share.agent.gpu import Gpu
from gpu_share.agent.jobcontext import JobContext
from gpu_share.agent.jobfiles import UnsafeJobFile, read_small
from gpu_share.agent.runtimes.jobspec import JobSpec, RuntimeResult
from gpu_share.agent.sandbox import SandboxedProcess, SandboxSpec
from gpu_share.backoff import Backoff
from gpu_share.protocol.errors import ErrorCode
from gpu_share.protocol.sessions import (
    CloseSession,
    ForwardHeader,
    OpenSession,
    SessionClosed,
    SessionError,
    SessionFailed,
    SessionReady,
    pack,
    unpack,
)

log = logging.getLogger(__name__)

SOCKET_NAME = "session.sock"
START_TIMEOUT_SEC = 300.0
SOCKET_READ_LIMIT = 16 * 1024 * 1024
# An answer's JSON header (ids, format, an error message); the coordinator allows 64 KiB.
MAX_ANSWER_HEADER = 16 * 1024
SKIP_CHUNK = 1 << 20


class BrokenAnswer(Exception):
    """The session process wrote something that is not an answer frame."""


@dataclass
class LocalSession:
    id: str
    process: SandboxedProcess
    directory: Path
    max_answer_bytes: int
    reader: asyncio.StreamReader | None = None
    writer: asyncio.StreamWriter | None = None
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    pinned: str | None = None

    async def stop(self) -> None:
        self.process.kill()
        if self.writer is not None:
            self.writer.close()
        for task in self.tasks:
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.process.wait(), 10)


class SessionHost:
    def __init__(self, ctx: JobContext, gpus: list[Gpu]) -> None:
        self.ctx = ctx
        self.gpu_uuids = [g.info.uuid for g in gpus]
        self.gpu_uuid_by_index = {g.info.index: g.info.uuid for g in gpus}
        self.sessions: dict[str, LocalSession] = {}
        self._send_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self._ws: ClientConnection | None = None
        self.connected = asyncio.Event()

    @property
    def url(self) -> str:
        server = self.ctx.client.server
        return "ws" + server.removeprefix("http") + "/v1/agent/sessions/ws"

    async def run(self, stop: asyncio.Event) -> None:
        delay = Backoff(first=0.5, cap=10.0)
        while not stop.is_set():
            try:
                async with connect(
                    self.url,
                    additional_headers={"Authorization": f"Bearer {self.ctx.client.key}"},
                    # The coordinator bounds every forward by its own limit before it
                    # builds the frame; a second, fixed limit here could only disagree
                    # with an operator's setting and drop every session on this node.
                    max_size=None,
                    compression=None,  # NPZ payloads gain little and cost CPU on both ends
                    ping_interval=10,
                    ping_timeout=20,
                    open_timeout=15,
                ) as ws:
                    self._ws = ws
                    self.connected.set()
                    log.info("session channel connected")
                    delay.reset()
                    await self._serve(ws, stop)
            # A refused handshake (the coordinator restarting, say) is the channel being
            # down, not a failure of this agent.
            except (OSError, ConnectionClosed, InvalidHandshake, TimeoutError) as exc:
                log.info("session channel down (%s); reconnecting in %.1fs", exc, delay.upcoming)
            except Exception:
                log.exception("session channel failed; reconnecting")
            finally:
                self._ws = None
                self.connected.clear()
                await self.stop_all()
            await delay.sleep(stop)  # at once when stopping

    async def _serve(self, ws: ClientConnection, stop: asyncio.Event) -> None:
        stopping = asyncio.create_task(stop.wait())
        try:
            while True:
                receiving = asyncio.create_task(ws.recv())
                done, _ = await asyncio.wait(
                    {receiving, stopping}, return_when=asyncio.FIRST_COMPLETED
                )
                if stopping in done:
                    receiving.cancel()
                    return
                message = receiving.result()
                if isinstance(message, bytes):
                    await self._forward(message)
                else:
                    self._control(message)
        finally:
            stopping.cancel()

    async def send(self, data: str | bytes) -> None:
        ws = self._ws
        if ws is None:
            return
        async with self._send_lock:
            with contextlib.suppress(ConnectionClosed):
                await ws.send(data)

    def _control(self, text: str) -> None:
        message = json.loads(text)
        kind = message.get("type")
        if kind == "open":
            self._spawn(self._open(OpenSession.model_validate(message)))
        elif kind == "close":
            self._spawn(self._close(CloseSession.model_validate(message).session_id))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _gpus_for(self, message: OpenSession) -> list[str]:
        """UUIDs of the GPUs the session gets: those the coordinator named (the model runs
        on the first), else the node's first; JobFailed naming any this node lacks."""
        if not message.runtime.needs_gpu:
            return []
        if message.gpu_indices is None:
            return self.gpu_uuids[:1]
        missing = [i for i in message.gpu_indices if i not in self.gpu_uuid_by_index]
        if missing or not message.gpu_indices:
            raise JobFailed(
                ErrorCode.AGENT_ERROR,
                f"this node was asked to open the session on GPUs {message.gpu_indices}; "
                f"it has no GPU {missing}; the session was not started",
            )
        return [self.gpu_uuid_by_index[i] for i in dict.fromkeys(message.gpu_indices)]

    async def _open(self, message: OpenSession) -> None:
        ctx = self.ctx
        directory = ctx.settings.jobs_dir / message.session_id
        cached = None
        try:
            gpus = self._gpus_for(message)
            cached = await fetch(
                message.model,
                "model_url",
                settings=ctx.settings,
                cache=ctx.cache,
                client=ctx.client,
                fetcher=ctx.fetcher,
            )
            (directory / "in").mkdir(parents=True, exist_ok=True)
            (directory / "out").mkdir(exist_ok=True)
            spec = JobSpec(
                runtime=message.runtime,
                model="in/model",
                inputs=None,
                outputs_dir="out",
                threads=ctx.threads,
                memory_limit_bytes=ctx.limits.memory_bytes if ctx.limits else None,
                max_inputs_expanded_bytes=ctx.settings.max_inputs_expanded_bytes,
                options={
                    "max_batch": message.max_batch,
                    "max_concurrency": message.max_concurrency,
                },
            )
            (directory / "spec.json").write_text(spec.model_dump_json())
            process = await ctx.sandbox.start(
                SandboxSpec(
                    argv=[
                        sys.executable,
                        "-m",
                        "gpu_share.agent.runtimes.onnx_session",
                        "spec.json",
                    ],
                    job_dir=directory,
                    inputs={"model": cached.path},
                    env={},
                    gpu_uuids=gpus,
                    cpu_threads=ctx.threads,
                )
            )
        except JobFailed as failure:
            if cached is not None:
                ctx.cache.unpin(cached.sha256)
            await asyncio.to_thread(shutil.rmtree, directory, True)
            await self._failed(message.session_id, failure.code, failure.message)
            return
        local = LocalSession(
            message.session_id,
            process,
            directory,
            max_answer_bytes=message.max_answer_bytes,
            pinned=cached.sha256,
        )
        self.sessions[message.session_id] = local
        local.tasks.add(asyncio.create_task(self._drain_output(local)))
        try:
            await self._connect(local)
            info = json.loads(read_small(directory, "out/session.json"))
        except (JobFailed, UnsafeJobFile, OSError, ValueError) as exc:
            code = exc.code if isinstance(exc, JobFailed) else ErrorCode.RUNTIME_ERROR
            message_text = exc.message if isinstance(exc, JobFailed) else str(exc)
            await self._failed(message.session_id, code, message_text)
            await self._discard(message.session_id)
            return
        local.tasks.add(asyncio.create_task(self._answers(local)))
        await self.send(
            SessionReady(
                session_id=message.session_id,
                device=info["device"],
                inputs=info["inputs"],
                outputs=info["outputs"],
            ).model_dump_json()
        )
        log.info("session %s ready on %s", message.session_id, info["device"])

    async def _connect(self, local: LocalSession) -> None:
        """Wait for the model to load (its socket appears, already listening: see
        `onnx_session.listen_unix`) or the process to give up."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_TIMEOUT_SEC
        exited = asyncio.create_task(local.process.wait())
        try:
            while not (local.directory / SOCKET_NAME).exists():
                if exited.done():
                    raise self._load_failure(local)
                if loop.time() > deadline:
                    raise JobFailed(ErrorCode.TIMEOUT, "the model did not load in time")
                await asyncio.sleep(0.02)
            # A unix socket path is limited to 108 bytes; reach it through a folder descriptor.
            folder = os.open(local.directory, os.O_RDONLY | os.O_DIRECTORY)
            try:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.setblocking(False)
                await loop.sock_connect(sock, f"/proc/self/fd/{folder}/{SOCKET_NAME}")
            finally:
                os.close(folder)
            local.reader, local.writer = await asyncio.open_unix_connection(
                sock=sock, limit=SOCKET_READ_LIMIT
            )
        finally:
            if not exited.done():
                exited.cancel()

    def _load_failure(self, local: LocalSession) -> JobFailed:
        try:
            result = RuntimeResult.model_validate_json(
                read_small(local.directory, "out/result.json")
            )
        except (OSError, UnsafeJobFile, ValueError):
            return JobFailed(
                ErrorCode.RUNTIME_ERROR, "the session process exited while loading the model"
            )
        error = result.error
        if error is None:
            return JobFailed(ErrorCode.RUNTIME_ERROR, "the session process stopped")
        return JobFailed(error.code, error.message)

    async def _forward(self, frame: bytes) -> None:
        try:
            header, _ = unpack(frame)
            session_id = str(header["session_id"])
            request_id = int(header["request_id"])
        except (ValueError, KeyError, TypeError):
            log.warning("dropped a malformed forward frame")
            return
        local = self.sessions.get(session_id)
        if local is None or local.writer is None:
            await self.send(
                pack(
                    ForwardHeader(
                        type="result",
                        request_id=request_id,
                        session_id=session_id,
                        format="npz",
                        ok=False,
                        error=SessionError(
                            code="NODE_LOST", message="the session is not on this node"
                        ),
                    )
                )
            )
            return
        local.writer.write(struct.pack(">I", len(frame)) + frame)
        await local.writer.drain()

    async def _answers(self, local: LocalSession) -> None:
        reason = "the session's model process stopped (out of memory?)"
        try:
            while True:
                answer = await self._next_answer(local)
                if answer is not None:
                    await self.send(answer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except BrokenAnswer as exc:
            reason = f"the session's model process broke the protocol: {exc}"
        if local.id in self.sessions:  # the process died under a live session
            await self._failed(local.id, ErrorCode.RUNTIME_ERROR, reason)
            await self._discard(local.id)

    async def _next_answer(self, local: LocalSession) -> bytes | None:
        """The next answer frame to send on, checked; None when it is not to be sent.

        Read header first, so an answer over the limit is skipped without being held.
        """
        reader = local.reader
        assert reader is not None
        (length,) = struct.unpack(">I", await reader.readexactly(4))
        if length < 4:
            raise BrokenAnswer(f"a frame of {length} bytes")
        prefix = await reader.readexactly(4)
        (header_length,) = struct.unpack(">I", prefix)
        if header_length > MAX_ANSWER_HEADER or header_length > length - 4:
            raise BrokenAnswer(f"an answer header of {header_length} bytes")
        head = await reader.readexactly(header_length)
        try:
            header = ForwardHeader.model_validate_json(head)
        except ValueError as exc:
            raise BrokenAnswer("an answer header that is not a result") from exc
        size = length - 4 - header_length
        if header.session_id != local.id:
            await _skip(reader, size)
            log.warning("session %s answered for another session; dropped", local.id)
            return None
        if size > local.max_answer_bytes:
            await _skip(reader, size)
            log.info(
                "session %s: a %d-byte answer is over the %d-byte limit",
                local.id,
                size,
                local.max_answer_bytes,
            )
            return pack(
                ForwardHeader(
                    type="result",
                    request_id=header.request_id,
                    session_id=local.id,
                    format=header.format,
                    ok=False,
                    error=SessionError(
                        code=ErrorCode.PAYLOAD_TOO_LARGE,
                        message=f"the outputs are {size} bytes, over this session's limit of "
                        f"{local.max_answer_bytes} bytes; send a smaller batch",
                    ),
                )
            )
        return prefix + head + await reader.readexactly(size)

    async def _drain_output(self, local: LocalSession) -> None:
        while line := await local.process.stdout.readline():
            log.debug("session %s: %s", local.id, line.decode(errors="replace").rstrip())

    async def _failed(self, session_id: str, code: str, message: str) -> None:
        log.info("session %s failed: %s", session_id, message)
        await self.send(
            SessionFailed(
                session_id=session_id, error=SessionError(code=code, message=message)
            ).model_dump_json()
        )

    async def _discard(self, session_id: str) -> None:
        local = self.sessions.pop(session_id, None)
        if local is None:
            return
        await local.stop()
        if local.pinned:
            self.ctx.cache.unpin(local.pinned)
        await asyncio.to_thread(shutil.rmtree, local.directory, True)

    async def _close(self, session_id: str) -> None:
        await self._discard(session_id)
        await self.send(SessionClosed(session_id=session_id).model_dump_json())

    async def stop_all(self) -> None:
        for session_id in list(self.sessions):
            await self._discard(session_id)


async def _skip(reader: asyncio.StreamReader, size: int) -> None:
    """Read past `size` bytes without keeping them."""
    while size > 0:
        chunk = await reader.read(min(size, SKIP_CHUNK))
        if not chunk:
            raise asyncio.IncompleteReadError(b"", size)
        size -= len(chunk)
