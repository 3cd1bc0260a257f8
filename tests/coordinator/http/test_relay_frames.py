"""The relay link's wire (`http/relay_frames.py`): frames, addresses, and the keep-alive
that tells a vanished peer."""

import asyncio
import socket
import struct

import pytest

from gpu_share.coordinator.http.relay_frames import (
    KEEP_ALIVE_PROBES,
    Frame,
    FrameError,
    address,
    keep_alive,
    read_frame,
    url_of,
    write_frame,
)


@pytest.mark.parametrize(
    ("host", "port"), [("127.0.0.1", 4100), ("coordinator-0.internal", 1), ("::1", 65535)]
)
def test_an_address_reads_back_as_it_was_written(host: str, port: int) -> None:
    assert address(url_of(host, port)) == (host, port)


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:80", "relay://127.0.0.1", "relay://:80", "relay://h:eighty", ""]
)
def test_anything_else_is_not_an_address(url: str) -> None:
    with pytest.raises(ValueError, match="relay://"):
        address(url)


async def test_frames_come_whole_however_the_bytes_arrive() -> None:
    reader = asyncio.StreamReader()
    writer_side: list[bytes] = []

    class Collect:
        def writelines(self, pieces: list[bytes]) -> None:
            writer_side.extend(pieces)

    frames = [Frame({"id": 1, "action": "forward"}, b"x" * 70_000), Frame({"welcome": True})]
    for frame in frames:
        write_frame(Collect(), frame)  # type: ignore[arg-type]
    wire = b"".join(writer_side)
    for start in range(0, len(wire), 4096):  # as a socket hands them over, in pieces
        reader.feed_data(wire[start : start + 4096])
    reader.feed_eof()
    for frame in frames:
        assert await read_frame(reader, max_head=1024, max_body=100_000) == frame
    with pytest.raises(asyncio.IncompleteReadError):
        await read_frame(reader, max_head=1024, max_body=100_000)


@pytest.mark.parametrize(("head", "why"), [(b"{not json", "not JSON"), (b"[1, 2]", "object")])
async def test_a_head_that_is_not_a_json_object_breaks_the_link(head: bytes, why: str) -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(struct.pack(">II", len(head), 0) + head)
    with pytest.raises(FrameError, match=why):
        await read_frame(reader, max_head=1024, max_body=0)


async def test_a_link_probes_a_silent_peer() -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    try:
        _reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
        keep_alive(writer)
        sock = writer.get_extra_info("socket")
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        if hasattr(socket, "TCP_KEEPIDLE"):
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == KEEP_ALIVE_PROBES[0]
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == KEEP_ALIVE_PROBES[2]
        writer.close()
    finally:
        server.close()
