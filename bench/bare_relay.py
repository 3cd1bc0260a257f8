"""The baseline for bench/sessions.py: the same hops as a session forward, nothing else.

    client ──HTTP──▶ relay (bare ASGI app) ──WebSocket──▶ peer (runs the model in-process)

No database, no auth, no sandbox, no second process behind the peer. Run as:
    python bench/bare_relay.py peer  MODEL PORT THREADS
    python bench/bare_relay.py relay PEER_PORT PORT
"""

import asyncio
import io
import itertools
import struct
import sys
from collections.abc import Awaitable, Callable
from typing import Any

Scope = dict[str, Any]
Message = dict[str, Any]


def run_peer(model: str, port: int, threads: int) -> None:
    import numpy as np
    import onnxruntime as ort
    from websockets.asyncio.server import ServerConnection, serve

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]

    def infer(payload: bytes) -> bytes:
        with np.load(io.BytesIO(payload), allow_pickle=False) as archive:
            feeds = {name: archive[name] for name in archive.files}
        out = io.BytesIO()
        np.savez(out, **dict(zip(names, session.run(None, feeds), strict=True)))
        return out.getvalue()

    async def handler(ws: ServerConnection) -> None:
        async for frame in ws:
            assert isinstance(frame, bytes)
            request_id, payload = frame[:8], frame[8:]
            answer = await asyncio.to_thread(infer, payload)
            await ws.send(request_id + answer)

    async def main() -> None:
        async with serve(handler, "127.0.0.1", port, max_size=1 << 28, compression=None):
            await asyncio.Future()

    asyncio.run(main())


def relay_app(peer_port: int) -> Callable[[Scope, Any, Any], Awaitable[None]]:
    from websockets.asyncio.client import ClientConnection, connect

    state: dict[str, Any] = {}
    pending: dict[int, asyncio.Future[bytes]] = {}
    ids = itertools.count()

    async def reader(ws: ClientConnection) -> None:
        async for frame in ws:
            assert isinstance(frame, bytes)
            (request_id,) = struct.unpack(">Q", frame[:8])
            pending.pop(request_id).set_result(frame[8:])

    async def app(
        scope: Scope,
        receive: Callable[[], Awaitable[Message]],
        send: Callable[[Message], Awaitable[None]],
    ) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    ws = await connect(
                        f"ws://127.0.0.1:{peer_port}", max_size=1 << 28, compression=None
                    )
                    state["ws"] = ws
                    state["reader"] = asyncio.create_task(reader(ws))
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["method"] != "POST":  # a readiness probe
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        request_id = next(ids)
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        pending[request_id] = future
        await state["ws"].send(struct.pack(">Q", request_id) + body)
        answer = await future
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/octet-stream")],
            }
        )
        await send({"type": "http.response.body", "body": answer})

    return app


if __name__ == "__main__":
    if sys.argv[1] == "peer":
        run_peer(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        import uvicorn

        uvicorn.run(
            relay_app(int(sys.argv[2])),
            host="127.0.0.1",
            port=int(sys.argv[3]),
            log_level="warning",
        )
