"""The session model process's socket, served in-process on the example model.

The agent connects as soon as the socket file appears (`sessions.SessionHost._connect`),
so the file must appear only once the socket listens: binding creates it, listening
comes later, and a connection in between is refused.
"""

import asyncio
import io
import os
import socket
import struct
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from gpu_share.agent.runtimes import onnx_session
from gpu_share.agent.runtimes.npz import load_npz_bytes
from gpu_share.agent.runtimes.onnx_session import ModelServer
from gpu_share.agent.runtimes.runner import FailureCode, JobFailure
from gpu_share.examples import DIGITS_EXPECTED_LABELS, DIGITS_INPUTS, DIGITS_MODEL
from gpu_share.protocol.sessions import ForwardHeader, pack, unpack

SOCKET = onnx_session.SOCKET_NAME
MiB = 1024 * 1024
RealSocket = socket.socket


async def test_the_session_socket_accepts_a_connection_as_soon_as_it_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    refused: list[str] = []

    class AgentAtTheWorstMoment(RealSocket):
        """Connects to the socket file, if it is there, just before listening starts."""

        def listen(self, *args: Any) -> None:
            listening = self.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
            if not listening and os.path.exists(SOCKET):
                with RealSocket(socket.AF_UNIX, socket.SOCK_STREAM) as agent:
                    try:
                        agent.connect(SOCKET)
                    except ConnectionRefusedError as exc:
                        refused.append(str(exc))
            super().listen(*args)

    monkeypatch.setattr(socket, "socket", AgentAtTheWorstMoment)
    model = ort.InferenceSession(str(DIGITS_MODEL), providers=["CPUExecutionProvider"])
    serving = asyncio.create_task(
        onnx_session.serve(onnx_session.ModelServer(model, max_batch=None, max_concurrency=1))
    )
    while not os.path.exists(SOCKET):
        assert not serving.done(), serving
        await asyncio.sleep(0.01)
    reader, writer = await asyncio.open_unix_connection(SOCKET)
    request = pack(
        ForwardHeader(type="forward", request_id=7, session_id="ses_test", format="npz"),
        DIGITS_INPUTS.read_bytes(),
    )
    writer.write(struct.pack(">I", len(request)) + request)
    await writer.drain()
    (length,) = struct.unpack(">I", await reader.readexactly(4))
    header, payload = unpack(await reader.readexactly(length))
    writer.close()
    await asyncio.wait_for(serving, 60)  # one agent connection per session: it ends with it

    assert refused == [], "the socket file appeared before the socket listened"
    assert header["ok"] and header["request_id"] == 7, header
    assert load_npz_bytes(payload)["label"].tolist() == DIGITS_EXPECTED_LABELS
    assert sorted(os.listdir(tmp_path)) == [SOCKET]  # no temporary name left behind


def test_a_forward_whose_npz_would_expand_past_the_sessions_limits_is_refused_unread() -> None:
    """The session's memory and MAX_INPUTS_EXPANDED_BYTES bound a forward's NPZ body as
    they bound a job's inputs; the session serves the next forward."""
    model = ort.InferenceSession(str(DIGITS_MODEL), providers=["CPUExecutionProvider"])
    bomb = io.BytesIO()
    np.savez_compressed(bomb, input=np.zeros((64 * 1024, 1024), dtype=np.uint8))  # 64 MiB
    assert len(bomb.getvalue()) < 1024 * 1024
    for server, words in (
        (ModelServer(model, max_batch=None, max_concurrency=1, max_bytes=16 * MiB), "memory"),
        (ModelServer(model, max_batch=None, max_concurrency=1, cap=8 * MiB), "8 MiB this node"),
    ):
        with pytest.raises(JobFailure) as refused:
            server.forward("npz", bomb.getvalue())
        assert refused.value.code is FailureCode.RESOURCE_LIMIT
        assert "the inputs NPZ expands to 64 MiB" in refused.value.message
        assert words in refused.value.message
        answer = load_npz_bytes(server.forward("npz", DIGITS_INPUTS.read_bytes()))
        assert answer["label"].tolist() == DIGITS_EXPECTED_LABELS
