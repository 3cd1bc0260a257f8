"""An ONNX model kept loaded for a session (`python -m …runtimes.onnx_session spec.json`).

Loads the model once (one InferenceSession for the session's life), then listens on
the unix socket `session.sock` in its working directory for the agent. Requests
and answers are frames (`gpu_share.protocol.sessions.pack`: the header's length,
the JSON header, the payload) prefixed by their 4-byte length; they are packed here
with `json`, so that the process does not import the protocol's pydantic models.
Requests run in a thread pool of `max_concurrency`, so forwards pipeline rather than
queue behind one another (onnxruntime's `run` is thread-safe). A bad request answers
an error and leaves the session usable. A loading failure is reported in
`out/result.json`, like a one-shot job.
"""

import asyncio
import contextlib
import dataclasses
import json
import os
import socket
import struct
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from gpu_share.agent.runtimes.npz import NpzError, NpzTooLarge, load_npz_bytes, save_npz_bytes
from gpu_share.agent.runtimes.onnx import (
    CUDA_PROVIDER,
    feeds_from_arrays,
    node_type,
    open_session,
    output_array,
    run_model,
    tensor_dtype,
)
from gpu_share.agent.runtimes.runner import (
    DEFAULT_MAX_INPUTS_EXPANDED_BYTES,
    FailureCode,
    JobFailure,
    Result,
    Spec,
    inputs_cap,
    log,
    memory_limit,
    read_spec,
    write_result,
)

SOCKET_NAME = "session.sock"
MAX_FRAME = 1 << 30
# An answer's header stays small whatever onnxruntime says: the agent refuses (and stops
# the session on) a header over 16 KiB, and 2000 characters are at most 12 KB of JSON.
MAX_ERROR_CHARS = 2000


def session_error(code: str, message: str) -> dict[str, str]:
    """A `SessionError` of the protocol."""
    if len(message) > MAX_ERROR_CHARS:
        message = message[: MAX_ERROR_CHARS - 1] + "…"
    return {"code": code, "message": message}


def pack(header: dict[str, Any], payload: bytes = b"") -> bytes:
    """`gpu_share.protocol.sessions.pack` of a header given as its JSON fields."""
    head = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    return struct.pack(">I", len(head)) + head + payload


def unpack(frame: bytes) -> tuple[dict[str, Any], bytes]:
    """`gpu_share.protocol.sessions.unpack`: the header as a dict, and the payload."""
    if len(frame) < 4:
        raise ValueError("frame too short")
    (length,) = struct.unpack(">I", frame[:4])
    if length > len(frame) - 4:
        raise ValueError("frame header longer than the frame")
    header = json.loads(frame[4 : 4 + length])
    if not isinstance(header, dict):
        raise ValueError("frame header is not an object")
    return header, frame[4 + length :]


def listen_unix(path: str) -> socket.socket:
    """A listening unix socket at `path` that appears there only once it accepts connections.

    Binding creates the file and listening comes after: the agent, which connects as soon
    as it sees the file, would be refused in between. So bind and listen under another
    name, then rename, which is atomic.
    """
    pending = f"{path}.{os.getpid()}.pending"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(pending)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(pending)
        sock.listen()
        os.replace(pending, path)
    except BaseException:
        sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(pending)
        raise
    return sock


def describe(nodes: Sequence[Any]) -> list[dict[str, Any]]:
    return [{"name": n.name, "type": node_type(n), "shape": list(n.shape)} for n in nodes]


class ModelServer:
    def __init__(
        self,
        session: Any,
        *,
        max_batch: int | None,
        max_concurrency: int,
        max_bytes: int | None = None,
        cap: int = DEFAULT_MAX_INPUTS_EXPANDED_BYTES,
    ) -> None:
        """`max_bytes` (the session's memory) and `cap` (MAX_INPUTS_EXPANDED_BYTES): what
        a forward's NPZ body may expand to, judged from its headers before it is read."""
        self.session = session
        self.max_batch = max_batch
        self.max_bytes = max_bytes
        self.cap = cap
        self.inputs = {node.name: node for node in session.get_inputs()}
        self.pool = ThreadPoolExecutor(max_workers=max_concurrency)

    def _arrays_from_json(self, payload: bytes) -> dict[str, Any]:
        try:
            body = json.loads(payload)
        except ValueError as exc:
            raise JobFailure(
                FailureCode.INVALID_INPUTS, f"the body is not valid JSON: {exc}"
            ) from exc
        inputs = body.get("inputs") if isinstance(body, dict) else None
        if not isinstance(inputs, dict):
            raise JobFailure(
                FailureCode.INVALID_INPUTS,
                'the JSON body must be {"inputs": {"<input name>": nested list, …}}',
            )
        arrays = {}
        for name, value in inputs.items():
            node = self.inputs.get(name)
            dtype = tensor_dtype(node) if node is not None else None
            try:
                arrays[name] = np.asarray(value, dtype=dtype)
            except (TypeError, ValueError) as exc:
                wanted = node_type(node) if node is not None else "tensor"
                raise JobFailure(
                    FailureCode.INVALID_INPUTS, f'input "{name}": cannot read it as {wanted}: {exc}'
                ) from exc
        return arrays

    def forward(self, fmt: str, payload: bytes) -> bytes:
        if fmt == "json":
            arrays = self._arrays_from_json(payload)
        else:
            try:
                arrays = load_npz_bytes(payload, max_bytes=self.max_bytes, cap=self.cap)
            except NpzTooLarge as exc:
                raise JobFailure(FailureCode.RESOURCE_LIMIT, str(exc)) from exc
            except NpzError as exc:
                raise JobFailure(FailureCode.INVALID_INPUTS, str(exc)) from exc
        feeds = feeds_from_arrays(self.session, arrays)
        if self.max_batch is not None:
            for name, array in feeds.items():
                if array.ndim and array.shape[0] > self.max_batch:
                    raise JobFailure(
                        FailureCode.INVALID_INPUTS,
                        f'input "{name}" has a batch of {array.shape[0]}; '
                        f"this session allows at most max_batch={self.max_batch}",
                    )
        values = run_model(self.session, feeds)
        outputs = {
            node.name: output_array(node.name, value)
            for node, value in zip(self.session.get_outputs(), values, strict=True)
        }
        if fmt == "json":
            return json.dumps({"outputs": {k: v.tolist() for k, v in outputs.items()}}).encode()
        return save_npz_bytes(outputs)

    async def handle(self, header: dict[str, Any], payload: bytes) -> bytes:
        fmt = "json" if header.get("format") == "json" else "npz"
        # A `ForwardHeader` of the protocol, in its field order.
        answer: dict[str, Any] = {
            "type": "result",
            "request_id": int(header.get("request_id", 0)),
            "session_id": str(header.get("session_id", "")),
            "format": fmt,
            "ok": True,
        }
        try:
            loop = asyncio.get_running_loop()
            body = await loop.run_in_executor(self.pool, self.forward, fmt, payload)
        except JobFailure as failure:
            answer["ok"] = False
            answer["error"] = session_error(failure.code.value, failure.message)
            body = b""
        except Exception as exc:  # keep serving whatever one request did
            answer["ok"] = False
            answer["error"] = session_error(FailureCode.RUNTIME_ERROR.value, str(exc))
            body = b""
        return pack(answer, body)


async def serve(server: ModelServer) -> None:
    done = asyncio.Event()

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        lock = asyncio.Lock()
        tasks: set[asyncio.Task[None]] = set()

        async def answer(header: dict[str, Any], payload: bytes) -> None:
            frame = await server.handle(header, payload)
            async with lock:
                writer.write(struct.pack(">I", len(frame)) + frame)
                await writer.drain()

        try:
            while True:
                (length,) = struct.unpack(">I", await reader.readexactly(4))
                if length > MAX_FRAME:
                    break
                header, payload = unpack(await reader.readexactly(length))
                task = asyncio.create_task(answer(header, payload))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            for task in list(tasks):
                await task
            writer.close()
            done.set()  # one agent connection per session: when it goes, so do we

    unix = await asyncio.start_unix_server(connection, sock=listen_unix(SOCKET_NAME))
    log(f"serving on {SOCKET_NAME}")
    async with unix:
        await done.wait()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m gpu_share.agent.runtimes.onnx_session spec.json", file=sys.stderr)
        return 2
    spec: Spec | None = None
    try:
        spec = read_spec(Path(args[0]))
        options = dict(spec.options)
        max_batch = options.pop("max_batch", None)
        max_concurrency = int(options.pop("max_concurrency", 4))
        spec = dataclasses.replace(spec, options=options)
        session, load_ms = open_session(spec)
    except JobFailure as failure:
        outputs_dir = spec.outputs_dir if spec is not None else "out"
        write_result(outputs_dir, Result.failure(failure.code, failure.message))
        return 0
    provider = session.get_providers()[0]
    (Path(spec.outputs_dir) / "session.json").write_text(
        json.dumps(
            {
                "device": "cuda" if provider == CUDA_PROVIDER else "cpu",
                "execution_provider": provider,
                "load_ms": load_ms,
                "inputs": describe(session.get_inputs()),
                "outputs": describe(session.get_outputs()),
            }
        )
    )
    log(f"model loaded in {load_ms} ms on {provider}")
    server = ModelServer(
        session,
        max_batch=max_batch,
        max_concurrency=max_concurrency,
        max_bytes=memory_limit(spec),
        cap=inputs_cap(spec),
    )
    asyncio.run(serve(server))
    return 0


if __name__ == "__main__":
    sys.exit(main())
