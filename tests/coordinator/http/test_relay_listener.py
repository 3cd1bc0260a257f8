"""The relay listener (`http/relay_listener.py`): it answers only a peer that proves it
holds the shared key on this very connection, and it closes a link that breaks the wire.
What it answers and how a peer reads that: `test_peer_client.py`."""

import asyncio
import logging
import struct
from collections.abc import AsyncIterator

import pytest

from gpu_share.coordinator.core.signing import UrlSigner
from gpu_share.coordinator.http.relay_frames import (
    HANDSHAKE_HEAD_BYTES,
    VERSION,
    Frame,
    address,
    read_frame,
    write_frame,
)
from gpu_share.coordinator.http.relay_listener import RelayListener
from gpu_share.coordinator.replica.peers import PURPOSE, PeerAnswer, RelayCall

SIGNER = UrlSigner(b"k" * 32)
LIMIT = 1024 * 1024


async def echo(call: RelayCall) -> PeerAnswer:
    return PeerAnswer(format=call.action, body=call.body)


@pytest.fixture
async def listener() -> AsyncIterator[RelayListener]:
    listener = RelayListener(echo, SIGNER, "127.0.0.1", 0, max_body=LIMIT)
    await listener.start()
    yield listener
    await listener.stop()


async def connect(listener: RelayListener) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(*address(listener.url))


async def hello(reader: asyncio.StreamReader) -> str:
    frame = await read_frame(reader, max_head=HANDSHAKE_HEAD_BYTES, max_body=0)
    assert frame.head["relay"] == VERSION
    nonce = frame.head["nonce"]
    assert isinstance(nonce, str)
    assert len(nonce) >= 32
    return nonce


async def next_frame(reader: asyncio.StreamReader) -> Frame:
    return await asyncio.wait_for(read_frame(reader, max_head=LIMIT, max_body=LIMIT), 5)


async def assert_closed(reader: asyncio.StreamReader) -> None:
    assert await asyncio.wait_for(reader.read(), 5) == b""


async def test_a_peer_that_proves_the_key_is_answered(listener: RelayListener) -> None:
    reader, writer = await connect(listener)
    write_frame(writer, Frame({"proof": SIGNER.seal(PURPOSE, await hello(reader))}))
    assert (await next_frame(reader)).head == {"welcome": True}
    write_frame(writer, Frame({"id": 3, "action": "forward", "session_id": "ses_1"}, b"rows"))
    answer = await next_frame(reader)
    assert answer == Frame({"id": 3, "format": "forward"}, b"rows")
    writer.close()


@pytest.mark.parametrize(
    "proof",
    [
        pytest.param(lambda nonce: UrlSigner(b"x" * 32).seal(PURPOSE, nonce), id="another-key"),
        pytest.param(lambda nonce: SIGNER.seal("artifact", nonce), id="another-purpose"),
        pytest.param(lambda nonce: SIGNER.seal(PURPOSE, "an-older-nonce"), id="replayed"),
        pytest.param(lambda nonce: nonce, id="unsealed"),
        pytest.param(lambda nonce: 7, id="not-text"),
    ],
)
async def test_a_link_without_a_peers_proof_is_refused_and_closed(
    listener: RelayListener, proof: object, caplog: pytest.LogCaptureFixture
) -> None:
    reader, writer = await connect(listener)
    nonce = await hello(reader)
    write_frame(writer, Frame({"proof": proof(nonce)}))  # type: ignore[operator]
    refused = await next_frame(reader)
    assert refused.head["refusal"]["code"] == "UNAUTHORIZED"
    assert "not a peer" in refused.head["refusal"]["message"]
    await assert_closed(reader)
    assert "refused a relay link" in caplog.text


async def test_a_request_before_the_proof_is_refused_and_never_reaches_the_sessions(
    listener: RelayListener,
) -> None:
    calls: list[RelayCall] = []

    async def recording(call: RelayCall) -> PeerAnswer:
        calls.append(call)
        return await echo(call)

    own = RelayListener(recording, SIGNER, "127.0.0.1", 0, max_body=LIMIT)
    await own.start()
    try:
        reader, writer = await connect(own)
        await hello(reader)
        write_frame(writer, Frame({"id": 1, "action": "close", "session_id": "ses_1"}))
        assert (await next_frame(reader)).head["refusal"]["code"] == "UNAUTHORIZED"
        await assert_closed(reader)
    finally:
        await own.stop()
    assert calls == []


async def test_http_or_a_frame_over_the_limits_closes_the_link(
    listener: RelayListener, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    reader, writer = await connect(listener)
    await hello(reader)
    writer.write(b"POST /relay/sessions/ses_1/close HTTP/1.1\r\nHost: x\r\n\r\n")
    await assert_closed(reader)
    assert "over this link's limits" in caplog.text

    reader, writer = await connect(listener)
    write_frame(writer, Frame({"proof": SIGNER.seal(PURPOSE, await hello(reader))}))
    assert (await next_frame(reader)).head == {"welcome": True}
    writer.write(struct.pack(">II", 2, LIMIT + 1))  # a proven peer, a body over the limit
    await assert_closed(reader)


async def test_a_peer_that_never_proves_itself_is_let_go(
    listener: RelayListener, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gpu_share.coordinator.http.relay_listener.HELLO_TIMEOUT_SEC", 0.2)
    reader, _writer = await connect(listener)
    await hello(reader)
    await assert_closed(reader)


async def test_a_malformed_request_is_refused_and_the_link_still_serves(
    listener: RelayListener,
) -> None:
    reader, writer = await connect(listener)
    write_frame(writer, Frame({"proof": SIGNER.seal(PURPOSE, await hello(reader))}))
    await next_frame(reader)
    write_frame(writer, Frame({"id": 1, "action": "forward"}))  # no session
    refused = await next_frame(reader)
    assert refused.head["id"] == 1
    assert refused.head["refusal"]["code"] == "VALIDATION_ERROR"
    write_frame(writer, Frame({"id": 2, "action": "close", "session_id": "ses_1"}))
    assert (await next_frame(reader)).head == {"id": 2, "format": "close"}
    writer.close()
